"""The panel's ES module alone, in a blank Chromium page, with a small fake anywidget model.

The module is served through ``page.route`` (Chromium refuses module imports from file://). Timers run on
Playwright's fake clock, so the view's lease renewal (every 20 s), the idle figures and the "kernel busy in
native code" banner are checked without waiting. No Jupyter here: see test_browser.py for the real thing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's one Chromium)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ORIGIN = "http://nbcoord.test"
HOSTILE = "<img src=x onerror=alert(1)>"

HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"></head><body>
<div id="host"></div>
<script type="module">
import panel, { sendCommand } from "/panel.js";
class FakeModel {
  constructor(state) {
    this.state = structuredClone(state);
    this.listeners = new Map();
    this.sent = [];
    this.control = [];
    const control = this.control;
    this.widget_manager = { kernel: {
      username: "u", clientId: "c",
      sendControlMessage(msg, expectReply, dispose) { control.push({ msg, expectReply, dispose }); return null; },
    } };
  }
  get(name) { return this.state[name]; }
  set(name, value) {
    this.state[name] = value;
    for (const cb of this.listeners.get(`change:${name}`) || []) cb();
  }
  on(event, cb) {
    if (!this.listeners.has(event)) this.listeners.set(event, []);
    this.listeners.get(event).push(cb);
  }
  off(event, cb) {
    const list = this.listeners.get(event) || [];
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  }
  send(content) { this.sent.push(structuredClone(content)); }
  listenerCount() { let n = 0; for (const l of this.listeners.values()) n += l.length; return n; }
}
window.mount = (state) => {
  const el = document.createElement("div");
  document.getElementById("host").appendChild(el);
  const model = new FakeModel(state);
  const cleanup = panel.render({ model, el });
  window.model = model;
  window.el = el;
  window.cleanup = cleanup;
  return true;
};
window.sendCommand = sendCommand;
window.harnessReady = true;
</script></body></html>"""

NOW = 1_800_000_000.0  # kernel seconds in the fixtures below; the fake clock starts there


def thread(tid: str, name: str, cell: int | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tid": tid,
        "name": name,
        "cell": cell,
        "state": "running",
        "zombie": None,
        "daemon": True,
        "owners": [],
        "started_at": NOW - 100,
        "last_active": NOW - 0.5,
        "cpu_s": 1.2,
        "stop_requested_at": None,
        "last_exception": None,
    }
    row.update(extra)
    return row


def base_state(**override: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "header": {
            "pid": 4242,
            "threads": 3,
            "threads_shown": 3,
            "kernel_threads": 8,
            "zombies": 1,
            "queues": 0,
            "running_cell": None,
            "running_since": None,
            "route": "shell-channel",
            "interval": 1.0,
        },
        "threads": [
            thread("t1", "loader-0", 2),
            thread("t2", "loader-1", 2, state="waiting", last_active=NOW - 42),
            thread("t3", "leaked", 1, zombie="cell-interrupted", daemon=False),
        ],
        "cells": [
            {"n": 1, "line": "start_leak()", "outcome": "interrupted", "started_at": NOW - 200, "ended_at": NOW - 150},
            {"n": 2, "line": "start_loaders()", "outcome": "ok", "started_at": NOW - 100, "ended_at": NOW - 99},
        ],
        "queues": [],
        "blocked": [],
        "resources": None,
        "failures": [],
        "history": {},
        "last_stop": None,
        "stack": None,
        "clock": None,
        "beat": None,
        "_fast_route": {"kind": "shell-channel", "comm_id": "abc"},
    }
    state.update(override)
    return state


FULL_EXTRAS: dict[str, Any] = {
    "queues": [
        {
            "id": "q1",
            "name": "input_queue",
            "capacity": 10,
            "size": 7,
            "closed": False,
            "enqueue_rate": 12.0,
            "dequeue_rate": 11.5,
            "runners": ["t1", "t2"],
        },
        {"id": "q2", "name": "unbounded", "capacity": -1, "size": 3, "closed": True},
    ],
    "blocked": [
        {"text": "MainThread has waited 12 s in sess.run on dequeue of input_queue (0 of 10)"},
        {"text": "train blocked {duration} in dequeue of queue `input_queue`", "since": NOW - 4},
    ],
    "resources": {
        "host": {"rss": 300 << 20, "children_rss": 0, "available": 8 << 30, "total": 16 << 30},
        "gpu": {"available": False, "reason": "no NVIDIA driver", "devices": [], "tf_note": None},
        "native_threads": 21,
        "children": [{"pid": 77, "cmdline": "sleep 100", "status": "sleeping", "rss": 1 << 20, "cell": 2}],
    },
    "history": {
        "memory": [[NOW - 300, 200 << 20, None, None, 0], [NOW - 100, 300 << 20, None, None, 0]],
        "queues": {"q1": [[NOW - 60, 2], [NOW - 30, 9], [NOW - 5, 7]]},
    },
    "failures": [
        {
            "thread_name": "worker",
            "cell": 2,
            "exc_type": "ValueError",
            "message": "bad row",
            "traceback": "Traceback (most recent call last):\nValueError: bad row",
            "at": NOW - 20,
        }
    ],
}


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:  # noqa: F811
    module = (REPO / "js" / "panel.js").read_text(encoding="utf-8")
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    dialogs: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)

    def serve(route: Any) -> None:
        path = route.request.url.removeprefix(ORIGIN)
        if path == "/panel.js":
            route.fulfill(status=200, content_type="text/javascript", body=module)
        elif path in ("/", "/index.html"):
            route.fulfill(status=200, content_type="text/html", body=HARNESS)
        else:
            route.fulfill(status=404, body="")

    page.route(f"{ORIGIN}/**", serve)
    page.clock.install(time=NOW)
    page.goto(f"{ORIGIN}/index.html")
    page.wait_for_function("window.harnessReady === true")
    yield page
    assert errors == []
    assert dialogs == []
    context.close()


def mount(page: Any, state: dict[str, Any]) -> None:
    page.evaluate("(state) => window.mount(state)", state)


def set_trait(page: Any, name: str, value: Any) -> None:
    page.evaluate("([name, value]) => window.model.set(name, value)", [name, value])


def sent(page: Any) -> list[dict[str, Any]]:
    return list(page.evaluate("window.model.sent"))


def commands(page: Any, kind: str) -> list[dict[str, Any]]:
    return [c for c in sent(page) if c["type"] == kind]


def test_renders_threads_by_cell_zombies_first(page: Any) -> None:
    mount(page, base_state())
    panel = page.locator("[data-nbcoord=panel]")
    assert "kernel 4242" in panel.inner_text()
    assert page.locator(".nbc-chip", has_text="1 zombie").count() == 1
    groups = page.locator(".nbc-group .nbc-ghead").all_inner_texts()
    assert "Zombies" in groups[0]
    assert "Cell [2]" in groups[1]
    assert "start_loaders()" in groups[1]
    rows = page.locator(".nbc-row")
    assert rows.count() == 3
    assert "leaked" in rows.nth(0).inner_text()
    assert "zombie: cell interrupted" in rows.nth(0).inner_text()
    assert "its cell was interrupted" in str(rows.nth(0).locator(".nbc-info").get_attribute("title"))
    assert "idle 42 s" in page.locator(".nbc-row[data-tid=t2]").inner_text()
    assert "active" in page.locator(".nbc-row[data-tid=t1]").inner_text()
    # Sections with no data draw nothing.
    text = panel.inner_text()
    for absent in ("Queues", "Memory", "Thread failures", "Last stop"):
        assert absent not in text
    # The view announced itself, with its clock for skew correction.
    (view,) = commands(page, "view")
    assert view["action"] == "open"
    assert view["client_time"] == pytest.approx(NOW * 1000, abs=5000)


def test_draws_queues_memory_failures_with_svg(page: Any) -> None:
    mount(page, base_state(**FULL_EXTRAS))
    text = page.locator("[data-nbcoord=panel]").inner_text()
    assert "input_queue" in text
    assert "7 / 10" in text
    assert "in 12.0/s · out 11.5/s" in text
    assert "2 runners" in text
    assert "MainThread has waited 12 s in sess.run" in text
    assert "3 (unbounded)" in text
    # The kernel leaves a blocked run's growing duration to the module, which counts it from "since".
    first = blocked_seconds(text)
    assert 4 <= first < 5
    page.clock.run_for(2_000)
    assert blocked_seconds(page.locator("[data-nbcoord=panel]").inner_text()) == pytest.approx(first + 2, abs=0.2)
    assert "300.0 MiB resident" in text
    assert "GPU: no NVIDIA driver" in text
    assert "21 native threads" in text
    assert "sleep 100" in text
    assert "ValueError: bad row" in text
    # Bars and sparklines are SVG: the 7/10 bar is 70 % filled, sparklines have a drawn path.
    fill = page.locator(".nbc-q").first.locator("rect.nbc-bar")
    assert float(fill.get_attribute("width")) == pytest.approx(84.0)
    assert page.locator(".nbc-q").first.locator("path.nbc-spark").count() == 1
    assert page.locator(".nbc-mem").first.locator("path.nbc-spark").count() == 1
    # A failure's traceback opens on click.
    page.locator(".nbc-ghead", has_text="bad row").click()
    assert "Traceback (most recent call last)" in page.locator(".nbc-pre").inner_text()


def test_redraws_when_a_trait_changes(page: Any) -> None:
    mount(page, base_state())
    rows = base_state()["threads"] + [thread("t9", "late-thread", 3)]
    set_trait(page, "cells", [*base_state()["cells"], {"n": 3, "line": "go()", "outcome": "running"}])
    set_trait(page, "threads", rows)
    page.locator(".nbc-row[data-tid=t9]").wait_for()
    assert "Cell [3]" in page.locator(".nbc-group").last.inner_text() or "Cell [3]" in page.inner_text("body")
    set_trait(page, "header", {**base_state()["header"], "zombies": 0})
    page.locator(".nbc-chip", has_text="0 zombies").wait_for()


def test_stop_all_sends_a_command_and_shows_its_report(page: Any) -> None:
    mount(page, base_state())
    button = page.get_by_role("button", name="Stop all")
    button.click()
    (stop,) = commands(page, "stop")
    assert stop["scope"] == "all"
    assert isinstance(stop["click_id"], str) and 0 < len(stop["click_id"]) <= 64
    assert stop["clicked_at"] == pytest.approx(NOW * 1000, abs=5000)
    page.get_by_role("button", name="Stopping…").wait_for()
    report: dict[str, Any] = {
        "scope": "all",
        "cell": None,
        "force": False,
        "started_at": NOW,
        "took_s": 0.123,
        "stopped_count": 2,
        "stopped": [],
        "alive": [{"tid": "t3", "name": "leaked", "cell": 1, "reason": "ignored the stop request at x.py:3 in run"}],
        "stopper_errors": [],
        "children": {"terminated": [], "killed": [], "alive": []},
        "click_id": stop["click_id"],
        "route": "shell-channel",
    }
    set_trait(page, "last_stop", report)
    page.get_by_role("button", name="Stop all").wait_for()
    last = page.locator("[data-section=last-stop]").inner_text()
    assert "2 stopped, 1 still alive" in last
    assert "123 ms" in last
    assert "leaked (t3): ignored the stop request" in last
    page.get_by_role("button", name="force stop").click()
    force = commands(page, "stop")[-1]
    assert (force["scope"], force["force"]) == ("all", True)


def test_row_and_cell_actions(page: Any) -> None:
    mount(page, base_state())
    page.locator(".nbc-row[data-tid=t1]").get_by_role("button", name="stop").click()
    page.get_by_role("button", name="stop cell").click()
    page.get_by_role("button", name="stop zombies").click()
    scopes = [(c["scope"], c.get("tid"), c.get("cell")) for c in commands(page, "stop")]
    assert scopes == [("thread", "t1", None), ("cell", None, 2), ("zombies", None, None)]
    assert len({c["click_id"] for c in commands(page, "stop")}) == 3
    # Stack on demand: a request, then the kernel's answer is drawn under the row.
    page.locator(".nbc-row[data-tid=t2]").get_by_role("button", name="stack").click()
    (request,) = commands(page, "stack")
    assert request["tid"] == "t2"
    assert "asking the kernel" in page.locator(".nbc-pre").inner_text()
    set_trait(page, "stack", {"tid": "t2", "stack": ["a.py:1 in main", "b.py:9 in wait"], "creation": ["c.py:4 in go"]})
    page.locator(".nbc-pre", has_text="b.py:9 in wait").wait_for()
    # Collapsing a group hides its rows.
    page.locator(".nbc-ghead", has_text="Cell [2]").locator(".nbc-caret").click()
    assert page.locator(".nbc-row[data-tid=t1]").count() == 0


def test_control_route_also_sends_on_the_control_channel(page: Any) -> None:
    mount(page, base_state(_fast_route={"kind": "control", "comm_id": "comm-1"}))
    page.get_by_role("button", name="Stop all").click()
    control = page.evaluate("window.model.control")
    stops = [c for c in control if c["msg"]["content"]["data"]["content"]["type"] == "stop"]
    assert len(stops) == 1
    msg = stops[0]["msg"]
    assert msg["channel"] == "control"
    assert msg["header"]["msg_type"] == "comm_msg"
    assert msg["content"]["comm_id"] == "comm-1"
    assert stops[0]["expectReply"] is False
    (ordinary,) = commands(page, "stop")
    assert msg["content"]["data"]["content"] == ordinary  # same command, same click id, both routes


def test_hostile_names_are_inert_text(page: Any) -> None:
    state = base_state(**FULL_EXTRAS)
    state["threads"][0]["name"] = HOSTILE
    state["threads"][0]["owners"] = [{"kind": "x", "label": HOSTILE, "closed": False}]
    state["cells"][1]["line"] = HOSTILE
    state["queues"][0]["name"] = HOSTILE
    state["blocked"] = [{"text": HOSTILE}]
    state["failures"][0]["message"] = HOSTILE
    state["resources"]["children"][0]["cmdline"] = HOSTILE
    mount(page, state)
    page.wait_for_timeout(50)  # on the fake clock: lets an onerror handler run, if one had been created
    assert page.locator("[data-nbcoord=panel] img").count() == 0
    assert page.locator(".nbc-row[data-tid=t1] .nbc-name").text_content() == HOSTILE
    assert page.inner_text("body").count(HOSTILE) >= 6
    # The page fixture asserts that no dialog opened and no script error occurred.


def test_cleanup_removes_listeners_timers_and_says_goodbye(page: Any) -> None:
    mount(page, base_state())
    assert page.evaluate("window.model.listenerCount()") > 0
    page.clock.run_for(21_000)
    assert [c["action"] for c in commands(page, "view")] == ["open", "alive"]
    page.evaluate("window.cleanup()")
    assert page.evaluate("window.model.listenerCount()") == 0
    assert page.evaluate("window.el.children.length") == 0
    assert [c["action"] for c in commands(page, "view")] == ["open", "alive", "close"]
    before = len(sent(page))
    page.clock.run_for(61_000)
    set_trait(page, "threads", [])
    assert len(sent(page)) == before


def test_unresponsive_kernel_is_shown_while_a_cell_runs(page: Any) -> None:
    header = {**base_state()["header"], "running_cell": 5, "running_since": NOW}
    mount(page, base_state(header=header))
    banner = page.locator(".nbc-banner")
    assert banner.is_hidden()
    page.clock.run_for(2_000)
    set_trait(page, "beat", {"at": NOW + 2, "every": 1.0})  # the kernel's sender is alive: no banner
    page.clock.run_for(2_000)
    assert banner.is_hidden()
    page.clock.run_for(3_000)  # 5 s without a beat at a 1 s interval
    assert banner.is_visible()
    assert "busy in native code" in banner.inner_text()
    assert "stop will act when it returns" in banner.inner_text()
    set_trait(page, "beat", {"at": NOW + 7, "every": 1.0})
    page.clock.run_for(1_000)
    assert banner.is_hidden()
    # A kernel that ticks less often (many threads) says so in its beat: 5 s of silence is then normal.
    set_trait(page, "beat", {"at": NOW + 8, "every": 4.0})
    page.clock.run_for(5_000)
    assert banner.is_hidden()
    page.clock.run_for(9_000)
    assert banner.is_visible()
    set_trait(page, "beat", {"at": NOW + 22, "every": 1.0})
    page.clock.run_for(1_000)
    # Idle kernel: silence is normal, but an unanswered click is not.
    set_trait(page, "header", {**header, "running_cell": None})
    page.clock.run_for(10_000)
    assert banner.is_hidden()
    page.get_by_role("button", name="Stop all").click()
    page.clock.run_for(5_000)
    assert banner.is_visible()


def test_idle_times_follow_the_kernel_clock(page: Any) -> None:
    skew = 3600.0  # the kernel's clock is an hour ahead of the browser's
    mount(page, base_state())
    (view,) = commands(page, "view")
    rows = [thread("t1", "loader-0", 2, last_active=NOW + skew - 30)]
    set_trait(page, "threads", rows)
    clock = {"view_id": view["view_id"], "client_time": view["client_time"], "kernel_time": NOW + skew}
    set_trait(page, "clock", clock)
    page.clock.run_for(1_000)
    # Without the correction this would read "active" (last_active is an hour in the browser's future).
    first = idle_seconds(page, "t1")
    assert 30 <= first <= 32
    # Another view's clock echo is not ours.
    set_trait(page, "clock", {**clock, "view_id": "other", "kernel_time": NOW})
    page.clock.run_for(1_000)
    assert idle_seconds(page, "t1") in (first, first + 1, first + 2)


def blocked_seconds(text: str) -> float:
    match = re.search(r"train blocked (\d+\.\d) s in dequeue", text)
    assert match, text
    return float(match.group(1))


def idle_seconds(page: Any, tid: str) -> int:
    text = page.locator(f".nbc-row[data-tid={tid}]").inner_text()
    match = re.search(r"idle (\d+) s", text)
    assert match, text
    return int(match.group(1))


def test_follows_the_jupyterlab_theme(page: Any) -> None:
    page.evaluate(
        """() => { const s = document.body.style;
        s.setProperty('--jp-layout-color1', 'rgb(17, 17, 17)');
        s.setProperty('--jp-ui-font-color1', 'rgb(230, 230, 230)');
        s.setProperty('--jp-error-color1', 'rgb(200, 30, 30)'); }"""
    )
    mount(page, base_state())
    styles = page.evaluate(
        """() => { const root = getComputedStyle(document.querySelector('.nbc'));
        const stop = getComputedStyle(document.querySelector('.nbc-btn.danger'));
        return [root.backgroundColor, root.color, stop.backgroundColor]; }"""
    )
    assert styles == ["rgb(17, 17, 17)", "rgb(230, 230, 230)", "rgb(200, 30, 30)"]


def test_module_shape(page: Any) -> None:
    # export default { render }, and render returns its cleanup.
    kinds = page.evaluate(
        """async () => { const m = await import('/panel.js');
        return [typeof m.default.render, typeof window.cleanup]; }"""
    )
    assert kinds[0] == "function"
    mount(page, base_state())
    assert page.evaluate("typeof window.cleanup") == "function"
    assert json.loads(json.dumps(sent(page)))  # commands are plain JSON


def test_without_a_fast_route_a_click_waits_for_the_cell_and_says_so(page: Any) -> None:
    header = {**base_state()["header"], "running_cell": 5, "running_since": NOW, "route": "none"}
    mount(page, base_state(header=header, _fast_route={"kind": "none", "comm_id": "abc"}))
    assert "no fast route" in page.locator(".nbc-status").inner_text()
    page.get_by_role("button", name="Stop all").click()
    banner = page.locator(".nbc-banner")
    for second in range(1, 7):  # beats keep coming: the kernel runs Python, the click waits for the cell
        page.clock.run_for(1_000)
        set_trait(page, "beat", {"at": NOW + second, "every": 1.0})
    assert banner.is_visible()
    assert "Stop will act when cell [5] ends" in banner.inner_text()
    assert page.evaluate("window.model.control.length") == 0  # no control-channel copy on this route
