"""The panel's ES module in a blank Chromium page, with a small fake anywidget model: the harness page, the
``page`` fixture, fixtures' states and helpers. Shared by tests/test_panel_js.py and tests/test_panel_stacks_js.py
(a test module never imports another)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's one Chromium)

REPO = Path(__file__).resolve().parents[1]
ORIGIN = "http://nbcoord.test"
HOSTILE = "<img src=x onerror=alert(1)>"
#: A name with a right-to-left override, a newline, a NUL and a zero-width joiner.
BIDI = "evil\u202eexe.txt\nnext\x00\u200d"

HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"></head><body>
<div id="host"></div>
<script type="module">
import panel, { sendCommand, safe } from "/panel.js";
class Signal {
  constructor() { this.slots = []; }
  connect(fn) { this.slots.push(fn); }
  disconnect(fn) { this.slots = this.slots.filter((f) => f !== fn); }
  emit(value) { for (const fn of this.slots) fn(this, value); }
}
class FakeModel {
  constructor(state) {
    this.state = structuredClone(state);
    this.listeners = new Map();
    this.sent = [];
    this.control = [];
    this.refuse = false;
    const control = this.control;
    this.kernel = {
      id: "k-1", username: "u", clientId: "c", status: "idle", statusChanged: new Signal(), anyMessage: new Signal(),
      interrupts: 0, restarts: 0,
      sendControlMessage(msg, expectReply, dispose) { control.push({ msg, expectReply, dispose }); return null; },
      interrupt() { this.interrupts += 1; return Promise.resolve(); },
      restart() { this.restarts += 1; return Promise.resolve(); },
    };
    this.widget_manager = { kernel: this.kernel };
  }
  get(name) { return this.state[name]; }
  set(name, value) {
    this.state[name] = value;
    this.trigger(`change:${name}`);
  }
  trigger(event) { for (const cb of this.listeners.get(event) || []) cb(); }
  custom(content) { for (const cb of this.listeners.get("msg:custom") || []) cb(structuredClone(content), []); }
  on(event, cb) {
    if (!this.listeners.has(event)) this.listeners.set(event, []);
    this.listeners.get(event).push(cb);
  }
  off(event, cb) {
    const list = this.listeners.get(event) || [];
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  }
  send(content) {
    if (this.refuse) throw new Error("Cannot send");
    this.sent.push(structuredClone(content));
  }
  kernelStatus(status) { this.kernel.status = status; this.kernel.statusChanged.emit(status); }
  listenerCount() {
    let n = this.kernel.statusChanged.slots.length;
    for (const l of this.listeners.values()) n += l.length;
    return n;
  }
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
window.safe = safe;
window.harnessReady = true;
</script></body></html>"""

NOW = 1_800_000_000.0  # kernel seconds in the fixtures below; the fake clock stands there when a test starts
#: How long before NOW the fake clock starts, in its unit (Playwright reads a number as milliseconds; the panel
#: learns the kernel's clock from the state, so only differences matter): more than a page ever takes to load.
CLOCK_LEAD_MS = 120_000


def thread(tid: str, name: str, cell: int | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tid": tid,
        "name": name,
        "cell": cell,
        "state": "running",
        "zombie": None,
        "reasons": [],
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


def header(**extra: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "pid": 4242,
        "threads": 3,
        "threads_shown": 3,
        "items": 0,
        "kernel_threads": 8,
        "native_threads": 21,
        "zombies": 1,
        "queues": 0,
        "running_cell": None,
        "running_since": None,
        "route": "shell-channel",
        "interval": 1.0,
        "reclaim": False,
    }
    value.update(extra)
    return value


def base_state(**override: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "header": header(),
        "threads": [
            thread(
                "t3",
                "leaked",
                1,
                zombie="cell-interrupted",
                reasons=[["cell-interrupted", NOW - 150], ["stop-ignored", NOW - 60]],
                daemon=False,
            ),
            thread("t1", "loader-0", 2),
            thread("t2", "loader-1", 2, state="waiting", last_active=NOW - 42),
        ],
        "ledger": [],
        "groups": [
            {"key": "zombies", "cell": None, "threads": 1, "items": 0},
            {"key": "c2", "cell": 2, "threads": 2, "items": 0},
        ],
        "cells": [
            {"n": 1, "line": "start_leak()", "outcome": "interrupted", "started_at": NOW - 200, "ended_at": NOW - 150},
            {"n": 2, "line": "start_loaders()", "outcome": "ok", "started_at": NOW - 100, "ended_at": NOW - 99},
        ],
        "cell_memory": [],
        "sessions": [],
        "queues": [],
        "blocked": [],
        "resources": None,
        "failures": [],
        "history": {},
        "last_stop": None,
        "outcome": None,
        "stack": None,
        "clock": None,
        "beat": None,
        "ack": None,
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
        {"text": "MainThread has waited 12 s in sess.run on dequeue of input_queue (0 of 10)", "count": 1},
        {"text": "train blocked {duration} in dequeue of queue `input_queue`", "since": NOW - 4, "count": 3},
    ],
    "resources": {
        "host": {"rss": 300 << 20, "children_rss": 0, "total": 16 << 30},
        "gpu": {"available": False, "reason": "no NVIDIA driver", "devices": [], "tf_note": None},
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
    "sessions": [
        {
            "id": "sess-1",
            "target": "",
            "closed": False,
            "cell": 2,
            "runner_threads": 2,
            "stuck_runners": 1,
            "restartable": True,
            "runners": [
                {
                    "tid": "t1",
                    "name": "QueueRunnerThread-a",
                    "role": "enqueue",
                    "queue_name": "input_queue",
                    "stuck": False,
                },
                {
                    "tid": "t2",
                    "name": "QueueRunnerThread-b",
                    "role": "enqueue",
                    "queue_name": "input_queue",
                    "stuck": True,
                    "text": "QueueRunnerThread-b is stuck: no enqueue for {duration}",
                    "since": NOW - 35,
                },
            ],
        }
    ],
    "cell_memory": [
        {
            "cell": 2,
            "held": True,
            "rss_before": 100 << 20,
            "rss_after": 100 << 20,
            "rss_peak": 100 << 20,
            "gpu_before": 0,
            "gpu_after": int(2.1 * (1 << 30)),
            "gpu_peak": 3 << 30,
        },
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
    page.nbc_errors = errors  # a test that causes an error on purpose takes it out

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
    # The fake clock starts before NOW and, once the page is ready, jumps to NOW and stops there: time moves only
    # by run_for. A clock left running would add the page's load time to every figure ("idle 30 s" read "idle
    # 31 s" on a loaded machine).
    page.clock.install(time=NOW - CLOCK_LEAD_MS)
    page.goto(f"{ORIGIN}/index.html")
    page.wait_for_function("window.harnessReady === true")
    page.clock.pause_at(NOW)
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


def panel_text(page: Any) -> str:
    return str(page.locator("[data-nbcoord=panel]").inner_text())


def report(click_id: str, **extra: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "scope": "all",
        "cell": None,
        "force": False,
        "started_at": NOW,
        "took_s": 0.123,
        "stopped_count": 2,
        "alive_count": 0,
        "stopped": [],
        "alive": [],
        "items_stopped": 0,
        "items_alive": [],
        "stopper_errors": [],
        "children": {"terminated": [], "killed": [], "alive": []},
        "click_id": click_id,
        "click_ids": [click_id],
        "route": "shell-channel",
    }
    value.update(extra)
    return value
