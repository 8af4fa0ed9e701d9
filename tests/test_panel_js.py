"""The panel's ES module alone, in a blank Chromium page, with a small fake anywidget model; the server page's
module alone with a fake fetch; and the build of both from js/src/.

The module is served through ``page.route`` (Chromium refuses module imports from file://). Timers run on
Playwright's fake clock, stopped at NOW when a test starts, so the view's lease renewal (every 20 s), the idle
figures, the acknowledgement deadline of a click and the "kernel busy" banners are checked without waiting. No
Jupyter here: see test_browser.py for the real thing, where each point is checked again in JupyterLab and
Notebook 7.

js/panel.js and js/fleet.js are built (git-ignored) from js/src/ by js/build.mjs: tools/dev.py builds them before
the tests, and a test here rebuilds them and compares, so the modules every browser test loads are the sources'.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's one Chromium)
from panel_js_support import (  # noqa: F401  (page: the fixture)
    BIDI,
    CLOCK_LEAD_MS,
    FULL_EXTRAS,
    HARNESS,
    HOSTILE,
    NOW,
    ORIGIN,
    REPO,
    base_state,
    commands,
    header,
    mount,
    page,
    panel_text,
    report,
    sent,
    set_trait,
    thread,
)

pytestmark = pytest.mark.browser

# ------------------------------------------------------------------------------------------------ drawing
def test_renders_threads_by_cell_zombies_first_and_a_zombie_names_its_cell(page: Any) -> None:  # noqa: F811
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
    zombie = rows.nth(0)
    assert "leaked" in zombie.inner_text()
    # Point 2: the cell (number and first line) and the accumulated reasons, first cause first.
    info = zombie.locator(".nbc-info")
    assert info.inner_text() == "cell [1] was interrupted, then ignored a stop · start_leak() · non-daemon"
    title = str(info.get_attribute("title"))
    assert "its cell was interrupted (since" in title
    assert title.index("its cell was interrupted") < title.index("it ignored a stop request")
    assert "idle 42 s" in page.locator(".nbc-row[data-tid=t2]").inner_text()
    assert "active" in page.locator(".nbc-row[data-tid=t1]").inner_text()
    assert "21 native threads" in page.locator(".nbc-status").inner_text()
    text = panel.inner_text()
    for absent in ("Queues", "Memory", "Thread failures", "Last stop", "TensorFlow sessions"):
        assert absent not in text
    (view,) = commands(page, "view")
    assert view["action"] == "open"
    assert view["client_time"] == pytest.approx(NOW * 1000, abs=5000)


def test_draws_queues_memory_failures_sessions_with_ranges(page: Any) -> None:  # noqa: F811
    mount(page, base_state(**FULL_EXTRAS))
    text = panel_text(page)
    assert "input_queue" in text
    assert "7 / 10" in text
    assert "in 12.0/s · out 11.5/s" in text
    assert "2 runners" in text
    assert "MainThread has waited 12 s in sess.run" in text
    assert "3 (unbounded)" in text
    # Identical blocked sentences come merged from the kernel, with a count; the duration grows here.
    assert re.search(r"train blocked \d+\.\d s in dequeue of queue `input_queue` \(\u00d73\)", text), text
    first = blocked_seconds(text)
    assert 4 <= first < 5
    page.clock.run_for(2_000)
    assert blocked_seconds(panel_text(page)) == pytest.approx(first + 2, abs=0.2)
    assert "300.0 MiB resident" in text
    assert "GPU: no NVIDIA driver" in text
    assert "sleep 100" in text
    assert "ValueError: bad row" in text
    # Point 8: each sparkline says its current value and its range.
    assert page.locator(".nbc-q").first.locator("[data-range]").inner_text() == "now 7 · range 2\u20139"
    assert (
        page.locator(".nbc-mem").first.locator("[data-range]").inner_text()
        == "now 300.0 MiB · range 200.0 MiB\u2013300.0 MiB"
    )
    fill = page.locator(".nbc-q").first.locator("rect.nbc-bar")
    assert float(fill.get_attribute("width")) == pytest.approx(84.0)
    assert page.locator(".nbc-q").first.locator("path.nbc-spark").count() == 1
    # Point 8: the TensorFlow sessions, a stuck runner's sentence counting, and a restart button.
    sessions = page.locator("[data-section=sessions]")
    assert "session sess-1" in sessions.inner_text()
    assert "1 stuck" in sessions.inner_text()
    assert re.search(r"QueueRunnerThread-b is stuck: no enqueue for 3\d\.\d s", sessions.inner_text())
    assert "queue input_queue: 1 runner thread working" in sessions.inner_text()
    sessions.get_by_role("button", name="Restart runners").click()
    (restart,) = commands(page, "restart")
    assert restart["session"] == "sess-1"
    sessions.get_by_role("button", name="Restarting…").wait_for()
    set_trait(
        page,
        "outcome",
        {
            "kind": "restart",
            "ok": True,
            "session": "sess-1",
            "text": "restarted 2 runners",
            "click_ids": [restart["click_id"]],
            "started_at": NOW,
        },
    )
    sessions.get_by_role("button", name="Restart runners").wait_for()
    assert "restarted 2 runners" in page.locator("[data-section=outcome]").inner_text()
    # Cell memory: what a cell still holds, in words, in the memory section and on its group.
    assert "cell [2]: +2.1 GiB on the GPU, still held" in text
    assert "+2.1 GiB on the GPU, still held" in page.locator(".nbc-group[data-group=c2] .nbc-ghead").inner_text()
    # A failure's traceback opens on click.
    page.locator(".nbc-ghead", has_text="bad row").click()
    assert "Traceback (most recent call last)" in page.locator("[data-section=failures] .nbc-pre").inner_text()


def test_ledger_items_are_drawn_with_the_threads_of_their_cell(page: Any) -> None:  # noqa: F811
    item = {
        "id": "task-3",
        "kind": "task",
        "label": "Task poll_forever()",
        "cell": 2,
        "state": "waiting",
        "zombie": None,
        "reasons": [],
        "started_at": NOW - 50,
        "detail": "waits in asyncio.sleep",
        "pids": [],
    }
    groups = [
        {"key": "zombies", "cell": None, "threads": 1, "items": 0},
        {"key": "c2", "cell": 2, "threads": 2, "items": 1},
    ]
    mount(page, base_state(ledger=[item], groups=groups, header=header(items=1)))
    group = page.locator(".nbc-group[data-group=c2]")
    assert "2 threads, 1 task" in group.locator(".nbc-ghead").inner_text()
    row = group.locator(".nbc-row[data-item=task-3]")
    assert "Task poll_forever()" in row.inner_text()
    assert "waits in asyncio.sleep" in row.inner_text()
    assert row.get_by_role("button").count() == 0  # its stop is the cell's (or the zombies')
    group.get_by_role("button", name="stop cell").click()
    assert commands(page, "stop")[-1]["scope"] == "cell"


# ------------------------------------------------------------------------------------------- keyed updates
def test_an_update_touches_only_the_rows_that_changed(page: Any) -> None:  # noqa: F811
    rows = [thread(f"t{i}", f"worker-{i}", 2) for i in range(40)]
    groups = [{"key": "c2", "cell": 2, "threads": 40, "items": 0}]
    mount(page, base_state(threads=rows, groups=groups, header=header(threads=40, zombies=0)))
    # Open a stack, scroll the box, focus a stop button: all three must survive updates.
    page.locator(".nbc-row[data-tid=t5]").get_by_role("button", name="stack").click()
    set_trait(page, "stack", {"tid": "t5", "stack": ["a.py:1 in main"], "creation": [], "click_id": "x", "at": NOW})
    page.locator(".nbc-row[data-tid=t30]").get_by_role("button", name="stop").focus()
    page.evaluate("document.querySelector('.nbc-scroll').scrollTop = 120")
    page.evaluate(
        """() => { window.marks = new Map();
        for (const n of document.querySelectorAll('.nbc-unit')) { n.dataset.mark = '1'; }
        window.mutated = new Set();
        window.observer = new MutationObserver((records) => { for (const r of records) {
            const unit = (r.target.nodeType === 1 ? r.target : r.target.parentElement).closest('.nbc-unit');
            if (unit) window.mutated.add(unit.querySelector('.nbc-row').dataset.tid); } });
        window.observer.observe(document.querySelector('.nbc-scroll'),
            { subtree: true, childList: true, characterData: true, attributes: true }); }"""
    )
    changed = [dict(r) for r in rows]
    changed[7] = {**changed[7], "state": "waiting", "last_active": NOW - 30}
    set_trait(page, "threads", changed)
    page.evaluate("new Promise((resolve) => queueMicrotask(resolve))")
    mutated = page.evaluate("(() => { window.observer.takeRecords(); return [...window.mutated]; })()")
    assert mutated == ["t7"]
    assert page.evaluate("document.querySelectorAll('.nbc-unit:not([data-mark])').length") == 0  # no row rebuilt
    assert page.evaluate("document.querySelector('.nbc-scroll').scrollTop") == 120
    assert page.evaluate("document.activeElement.closest('.nbc-row').dataset.tid") == "t30"
    assert (
        "a.py:1 in main"
        in page.locator(".nbc-unit", has=page.locator("[data-tid=t5]")).locator(".nbc-pre").inner_text()
    )
    assert "idle 30 s" in page.locator(".nbc-row[data-tid=t7]").inner_text()



def rows_message(page: Any, message: dict[str, Any]) -> None:  # noqa: F811
    """A rows message from the kernel (nbcoord.ui.rowsync), and the view's redraw after it."""
    page.evaluate("(m) => window.model.custom(m)", message)
    page.evaluate("new Promise((resolve) => queueMicrotask(resolve))")


def drawn_tids(page: Any) -> list[str]:  # noqa: F811
    return list(page.evaluate("[...document.querySelectorAll('.nbc-row[data-tid]')].map((n) => n.dataset.tid)"))


def test_rows_come_by_difference_keyed_sorted_and_a_view_that_missed_one_asks_for_every_row(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    assert [c["action"] for c in commands(page, "view")] == ["open"]  # opening asks for every row
    group = {"key": "c2", "cell": 2, "threads": 3, "items": 0}
    # The order is not sent: zombies first, then by cell, then by start, then by tid (nbcoord.ui.rows.drawn_order).
    everything = [thread("t9", "late", 2, started_at=NOW - 5), thread("t4", "early", 2, started_at=NOW - 50),
                  thread("t5", "tied", 2, started_at=NOW - 5), thread("t7", "stuck", 4, zombie="stop-ignored")]
    full = {"type": "rows", "seq": 5, "base": None, "full": True, "threads": {"upsert": everything, "remove": []},
            "ledger": {"upsert": [], "remove": []}, "groups": [{"key": "zombies", "cell": None, "threads": 1,
            "items": 0}, group], "cells": []}  # fmt: skip
    rows_message(page, full)
    assert drawn_tids(page) == ["t7", "t4", "t5", "t9"]  # the model's rows are gone: the kernel's copy rules
    page.evaluate("for (const n of document.querySelectorAll('.nbc-row')) n.dataset.mark = '1'")
    renamed = {**everything[0], "name": "renamed"}
    rows_message(page, {"type": "rows", "seq": 6, "base": 5, "full": False,
                        "threads": {"upsert": [renamed], "remove": ["t4"]}})  # fmt: skip
    assert drawn_tids(page) == ["t7", "t5", "t9"]
    assert page.locator(".nbc-row[data-tid=t9] .nbc-name").text_content() == "renamed"
    assert page.evaluate("document.querySelectorAll('.nbc-row:not([data-mark])').length") == 0  # none rebuilt
    # A difference that does not follow (seq 7 missed) is not applied: the view asks for every row, once.
    gap = {"type": "rows", "seq": 8, "base": 7, "full": False, "threads": {"upsert": [], "remove": ["t9"]}}
    rows_message(page, gap)
    rows_message(page, {**gap, "seq": 9, "base": 8})
    assert drawn_tids(page) == ["t7", "t5", "t9"]
    assert [c["action"] for c in commands(page, "view")] == ["open", "rows"]
    page.clock.run_for(5_100)  # no full copy came: it asks again
    rows_message(page, {**gap, "seq": 10, "base": 9})
    assert [c["action"] for c in commands(page, "view")] == ["open", "rows", "rows"]
    # Malformed messages are ignored whole (never half applied); an old one is a no-op.
    for bad in ({"type": "rows", "seq": 11, "base": 6, "full": False, "threads": {"upsert": "t5", "remove": []}},
                {"type": "rows", "seq": -1, "full": True}, {"type": "rows", "seq": 11, "base": 6, "full": False,
                "threads": {"upsert": [{"tid": 5}], "remove": []}}, {**full, "seq": 3}):  # fmt: skip
        rows_message(page, bad)
    assert drawn_tids(page) == ["t7", "t5", "t9"]
    # The full copy it asked for replaces everything, whatever came before.
    rows_message(page, {**full, "seq": 12, "threads": {"upsert": [renamed], "remove": []}})
    assert drawn_tids(page) == ["t9"]
    rows_message(page, {"type": "rows", "seq": 13, "base": 12, "full": False, "groups": [group]})
    assert "3 threads" in page.locator(".nbc-group[data-group=c2] .nbc-ghead").inner_text()
    assert [c["action"] for c in commands(page, "view")] == ["open", "rows", "rows"]

# ----------------------------------------------------------------------------------------------- stops
def test_stop_all_interrupts_and_stop_background_work_does_not(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    page.get_by_role("button", name="Stop all").click()
    (stop,) = commands(page, "stop")
    assert (stop["scope"], stop["interrupt"]) == ("all", True)
    assert isinstance(stop["click_id"], str) and 0 < len(stop["click_id"]) <= 64
    assert stop["clicked_at"] == pytest.approx(NOW * 1000, abs=5000)
    page.get_by_role("button", name="Stopping…").wait_for()
    page.get_by_role("button", name="Stop background work").click()
    background = commands(page, "stop")[-1]
    assert background["scope"] == "all" and "interrupt" not in background
    alive = [{"tid": "t3", "name": "leaked", "cell": 1, "reason": "ignored the stop request at x.py:3 in run"}]
    last = report(stop["click_id"], alive=alive, alive_count=1, interrupt={"cell": 5, "sent": True, "why": None})
    set_trait(page, "last_stop", last)
    page.get_by_role("button", name="Stop all").wait_for()
    page.get_by_role("button", name="Stopping…").wait_for()  # the background stop still waits for its answer
    text = page.locator("[data-section=last-stop]").inner_text()
    assert "2 stopped, 1 still alive" in text
    assert "123 ms" in text
    assert "Interrupted cell [5], which was still running." in text
    assert "leaked (t3): ignored the stop request" in text
    page.get_by_role("button", name="force stop").click()
    force = commands(page, "stop")[-1]
    assert (force["scope"], force["force"]) == ("all", True)


def test_a_row_or_cell_stop_leaves_stop_all_alone(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    page.locator(".nbc-row[data-tid=t1]").get_by_role("button", name="stop").click()
    page.get_by_role("button", name="stop cell").click()
    page.get_by_role("button", name="stop zombies").click()
    scopes = [(c["scope"], c.get("tid"), c.get("cell")) for c in commands(page, "stop")]
    assert scopes == [("thread", "t1", None), ("cell", None, 2), ("zombies", None, None)]
    assert len({c["click_id"] for c in commands(page, "stop")}) == 3
    # Point 7: each clicked button waits; Stop all does not turn into "Stopping…".
    assert page.get_by_role("button", name="Stop all").is_visible()
    assert page.get_by_role("button", name="Stopping…", exact=True).count() == 0
    assert page.locator(".nbc-row[data-tid=t1]").get_by_role("button", name="stopping…").is_visible()
    # Stack on demand: a request, then the kernel's answer is drawn under the row, after the full name.
    page.locator(".nbc-row[data-tid=t2]").get_by_role("button", name="stack").click()
    (request,) = commands(page, "stack")
    assert request["tid"] == "t2"
    pre = page.locator(".nbc-unit", has=page.locator(".nbc-row[data-tid=t2]")).locator(".nbc-pre")
    assert "asking the kernel" in pre.inner_text()
    set_trait(page, "stack", {"tid": "t2", "stack": ["a.py:1 in main", "b.py:9 in wait"], "creation": ["c.py:4 in go"]})
    page.locator(".nbc-pre", has_text="b.py:9 in wait").wait_for()
    assert pre.inner_text().startswith("loader-1 (t2)")
    page.locator(".nbc-ghead", has_text="Cell [2]").locator(".nbc-caret").click()
    assert page.locator(".nbc-row[data-tid=t1]").is_hidden()


def test_counts_add_up_at_a_thousand_threads(page: Any) -> None:  # noqa: F811
    rows = [thread(f"t{i}", f"worker-{i}", 3) for i in range(1000)]
    groups = [{"key": "c3", "cell": 3, "threads": 1000, "items": 0}]
    cells = [{"n": 3, "line": "start(1000)", "outcome": "ok", "started_at": NOW - 10, "ended_at": NOW - 9}]
    mount(page, base_state(threads=rows, groups=groups, cells=cells, header=header(threads=1000, zombies=0)))
    assert "1000 threads" in page.locator(".nbc-head").inner_text()
    group = page.locator(".nbc-group[data-group=c3]")
    assert "1000 threads" in group.locator(".nbc-ghead").inner_text()
    assert page.locator(".nbc-row").count() == 50
    # What is cut is said once, with the true number, and can be expanded.
    assert panel_text(page).count("of 1000") == 1
    assert "Showing 50 of 1000." in group.locator(".nbc-more").inner_text()
    group.get_by_role("button", name="Show all 1000").click()
    assert page.locator(".nbc-row").count() == 1000
    assert "Showing" not in group.locator(".nbc-more").inner_text()
    # A filter by name, cell or state.
    page.get_by_role("searchbox").fill("worker-99")
    assert sorted(page.locator(".nbc-row .nbc-name").all_inner_texts()) == [
        "worker-99",
        *[f"worker-99{i}" for i in range(10)],
    ]
    assert "11 of 1000 threads match" in group.locator(".nbc-ghead").inner_text()
    page.get_by_role("searchbox").fill("nothing-like-it")
    assert 'No thread or task matches "nothing-like-it".' in panel_text(page)
    page.get_by_role("searchbox").fill("")
    # The kernel sent 2000 of 5000: said once, in the section title.
    set_trait(page, "header", header(threads=5000, threads_shown=1000, zombies=0))
    assert "the kernel lists the first 1000 of 5000" in page.locator("[data-section=threads]").inner_text()
    # After a stop: true counts, a scroll box for what is still alive, and what is cut said once.
    alive = [{"tid": f"t{i}", "name": f"worker-{i}", "cell": 3, "reason": "ignored the stop"} for i in range(200)]
    set_trait(page, "last_stop", report("x-1", stopped_count=700, alive_count=300, alive=alive))
    last = page.locator("[data-section=last-stop]")
    assert "700 stopped, 300 still alive" in last.inner_text()
    assert last.locator(".nbc-scroll .nbc-why").count() == 20
    assert "Showing 20 of 300 still alive." in last.inner_text()
    last.get_by_role("button", name="Show 200").click()
    assert last.locator(".nbc-scroll .nbc-why").count() == 200
    assert last.locator(".nbc-scroll").evaluate(
        "(n) => n.scrollHeight > n.clientHeight && getComputedStyle(n).overflowY"
    )
    set_trait(page, "threads", [])
    set_trait(page, "groups", [])
    set_trait(page, "last_stop", report("x-2", stopped_count=1000))
    assert "No thread started by a cell is running: the stop at" in panel_text(page)
    assert "stopped 1000 threads." in panel_text(page)


# ------------------------------------------------------------------------------------ busy, stale, clocks
def test_an_unanswered_click_says_busy_in_a_c_call_within_a_second(page: Any) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=5, running_since=NOW - 3)))
    banner = page.locator(".nbc-banner")
    page.get_by_role("button", name="Stop background work").click()
    page.clock.run_for(500)
    assert banner.is_hidden()
    page.clock.run_for(400)  # 0.9 s after the click: no acknowledgement came
    assert banner.is_visible()
    text = banner.inner_text()
    assert "busy in a C call, not answering since" in text
    assert "the stop will act when the call returns" in text
    assert re.search(r"since \d\d:\d\d:\d\d \(0\.\d s\)", text)
    (stop,) = commands(page, "stop")
    set_trait(page, "ack", {"click_id": stop["click_id"], "type": "stop", "at": NOW + 2, "route": "shell-channel"})
    page.clock.run_for(1_000)
    assert banner.is_hidden()  # taken: the kernel runs Python again


def test_beats_that_stop_while_a_cell_runs_are_shown(page: Any) -> None:  # noqa: F811
    head = header(running_cell=5, running_since=NOW)
    mount(page, base_state(header=head))
    banner = page.locator(".nbc-banner")
    assert banner.is_hidden()
    page.clock.run_for(2_000)
    set_trait(page, "beat", {"at": NOW + 2, "every": 1.0})
    page.clock.run_for(2_000)
    assert banner.is_hidden()
    page.clock.run_for(3_000)  # 5 s without a beat at a 1 s interval
    assert "busy in native code" in banner.inner_text()
    set_trait(page, "beat", {"at": NOW + 7, "every": 1.0})
    page.clock.run_for(1_000)
    assert banner.is_hidden()
    set_trait(page, "beat", {"at": NOW + 8, "every": 4.0})  # a kernel that ticks less often says so
    page.clock.run_for(5_000)
    assert banner.is_hidden()
    page.clock.run_for(9_000)
    assert banner.is_visible()


def test_a_view_whose_kernel_is_gone_says_so_and_sends_nothing(page: Any) -> None:  # noqa: F811
    mount(page, base_state(last_stop=report("old-1", started_at=NOW - 5)))
    last = page.locator("[data-section=last-stop]")
    assert "5 s ago" in last.inner_text()
    # Relative times count in the browser, with nothing sent by the kernel.
    page.clock.run_for(3_000)
    assert "8 s ago" in last.inner_text()
    idle_before = idle_seconds(page, "t2")
    # The widget manager marks the view disconnected when the kernel restarts.
    page.evaluate("window.el.classList.add('jupyter-widgets-disconnected'); window.model.trigger('comm_live_update')")
    page.clock.run_for(100)
    banner = page.locator(".nbc-banner")
    assert "The kernel of this panel is gone" in banner.inner_text()
    assert "%nbcoord panel" in banner.inner_text()
    assert page.locator("[data-nbcoord=panel].stale").count() == 1
    buttons = page.locator("[data-nbcoord=panel] button")
    assert buttons.count() > 0
    assert all(buttons.nth(i).is_disabled() for i in range(buttons.count()))
    before = len(sent(page))
    page.evaluate("document.querySelector('[data-action=stop-all]').click()")
    page.clock.run_for(21_000)  # no lease renewal either
    assert len(sent(page)) == before
    assert idle_seconds(page, "t2") in (idle_before, idle_before + 1)  # idle times stop counting
    assert "kernel gone at" in page.locator(".nbc-status").inner_text()


def test_a_restarting_kernel_or_a_refused_send_turns_the_view_stale(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    page.evaluate("window.model.kernelStatus('restarting')")
    page.locator(".nbc-banner", has_text="the kernel restarted").wait_for()
    page.evaluate("window.cleanup()")
    mount(page, base_state())
    page.evaluate("window.model.refuse = true")
    page.get_by_role("button", name="Stop all").click()  # must not throw in the page (the fixture checks)
    page.locator(".nbc-banner", has_text="refused a message").wait_for()
    assert page.get_by_role("button", name="Stop all").is_disabled()


def test_idle_times_follow_the_kernel_clock(page: Any) -> None:  # noqa: F811
    skew = 3600.0  # the kernel's clock is an hour ahead of the browser's
    mount(page, base_state())
    (view,) = commands(page, "view")
    rows = [thread("t1", "loader-0", 2, last_active=NOW + skew - 30)]
    set_trait(page, "threads", rows)
    clock = {"view_id": view["view_id"], "client_time": view["client_time"], "kernel_time": NOW + skew}
    set_trait(page, "clock", clock)
    page.clock.run_for(1_000)
    first = idle_seconds(page, "t1")
    assert 30 <= first <= 32
    set_trait(page, "clock", {**clock, "view_id": "other", "kernel_time": NOW})
    page.clock.run_for(1_000)
    assert idle_seconds(page, "t1") in (first, first + 1, first + 2)


def test_without_a_fast_route_a_click_waits_for_the_cell_and_says_so(page: Any) -> None:  # noqa: F811
    head = header(running_cell=5, running_since=NOW, route="none")
    mount(page, base_state(header=head, _fast_route={"kind": "none", "comm_id": "abc"}))
    assert "no fast route" in page.locator(".nbc-status").inner_text()
    page.get_by_role("button", name="Stop all").click()
    banner = page.locator(".nbc-banner")
    for second in range(1, 7):  # beats keep coming: the kernel runs Python, the click waits for the cell
        page.clock.run_for(1_000)
        set_trait(page, "beat", {"at": NOW + second, "every": 1.0})
    assert "Stop will act when cell [5] ends" in banner.inner_text()
    assert page.evaluate("window.model.control.length") == 0


# ----------------------------------------------------------------------------------------------- safety
def test_hostile_names_are_inert_and_control_characters_shown_escaped(page: Any) -> None:  # noqa: F811
    state = base_state(**FULL_EXTRAS)
    state["threads"][1]["name"] = HOSTILE
    state["threads"][1]["owners"] = [{"kind": "x", "label": HOSTILE, "closed": False}]
    state["threads"][2]["name"] = BIDI
    state["cells"][1]["line"] = HOSTILE
    state["queues"][0]["name"] = HOSTILE
    state["blocked"] = [{"text": HOSTILE, "count": 1}]
    state["failures"][0]["message"] = HOSTILE
    state["resources"]["children"][0]["cmdline"] = HOSTILE
    mount(page, state)
    page.wait_for_timeout(50)  # on the fake clock: lets an onerror handler run, if one had been created
    assert page.locator("[data-nbcoord=panel] img").count() == 0
    assert page.locator(".nbc-row[data-tid=t1] .nbc-name").text_content() == HOSTILE
    assert page.inner_text("body").count(HOSTILE) >= 6
    # Bidi overrides and control characters are shown as escapes, never applied.
    name = page.locator(".nbc-row[data-tid=t2] .nbc-name")
    assert name.text_content() == "evil\\u202eexe.txt\\nnext\\u0000\\u200d"
    assert name.get_attribute("title") == "evil\\u202eexe.txt\nnext\\u0000\\u200d"
    everything = page.evaluate("document.querySelector('[data-nbcoord=panel]').textContent")
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200b-\u200f\x00-\x08]", everything)
    assert page.evaluate("window.safe('a\\u2067b\\tc', true)") == "a\\u2067b\tc"


def test_cleanup_removes_listeners_timers_and_says_goodbye(page: Any) -> None:  # noqa: F811
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


def test_control_route_also_sends_on_the_control_channel(page: Any) -> None:  # noqa: F811
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
    assert msg["content"]["data"]["content"] == ordinary


def test_reclaim_button_where_the_kernel_can(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    assert page.get_by_role("button", name="Reclaim memory").count() == 0
    set_trait(page, "header", header(reclaim=True))
    page.get_by_role("button", name="Reclaim memory").click()
    (command,) = commands(page, "reclaim")
    page.get_by_role("button", name="Reclaiming…").wait_for()
    set_trait(
        page,
        "outcome",
        {
            "kind": "reclaim",
            "ok": True,
            "text": "freed 1.2 GiB on GPU 0",
            "click_ids": [command["click_id"]],
            "started_at": NOW,
        },
    )
    page.get_by_role("button", name="Reclaim memory").wait_for()
    assert "freed 1.2 GiB on GPU 0" in page.locator("[data-section=outcome]").inner_text()


def test_follows_the_jupyterlab_theme(page: Any) -> None:  # noqa: F811
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


def test_module_shape(page: Any) -> None:  # noqa: F811
    kinds = page.evaluate(
        """async () => { const m = await import('/panel.js');
        return [typeof m.default.render, typeof window.cleanup]; }"""
    )
    assert kinds[0] == "function"
    mount(page, base_state())
    assert page.evaluate("typeof window.cleanup") == "function"
    assert json.loads(json.dumps(sent(page)))  # commands are plain JSON


def blocked_seconds(text: str) -> float:
    match = re.search(r"train blocked (\d+\.\d) s in dequeue", text)
    assert match, text
    return float(match.group(1))


def idle_seconds(page: Any, tid: str) -> int:  # noqa: F811
    text = page.locator(f".nbc-row[data-tid={tid}]").inner_text()
    match = re.search(r"idle (\d+) s", text)
    assert match, text
    return int(match.group(1))


# ------------------------------------------------------------------------------------------ build and sharing
JS = REPO / "js"


def test_the_built_modules_are_current(tmp_path: Path) -> None:
    # The wheel ships js/panel.js and js/fleet.js, and every test loads them: they must be the build of js/src/.
    if shutil.which("node") is None or not (REPO / "node_modules" / "esbuild").is_dir():
        pytest.fail("the JS build needs node and `npm ci` (tools/dev.py test does both, then builds)")
    subprocess.run(["node", str(JS / "build.mjs"), str(tmp_path)], check=True, cwd=REPO, timeout=120)
    for name in ("panel.js", "fleet.js"):
        built = (tmp_path / name).read_bytes()
        assert (JS / name).read_bytes() == built, f"js/{name} is stale: run `npm run build` (or tools/dev.py test)"


def test_the_shared_helpers_are_defined_once() -> None:
    # Escaping, elements with escaped text, bytes, durations and plurals: one definition, used by both pages.
    sources = {path: path.read_text(encoding="utf-8") for path in sorted((JS / "src").rglob("*.js"))}
    for helper in ("safe", "h", "isNum", "bytes", "duration", "coarseDuration", "plural"):
        defined = [path.relative_to(JS).as_posix() for path, text in sources.items()
                   if re.search(rf"^(export )?function {helper}\(", text, re.M)]  # fmt: skip
        assert defined == ["src/shared/text.js"], (helper, defined)
    for page_module in ("src/panel/index.js", "src/fleet/index.js"):
        assert 'from "../shared/text.js"' in sources[JS / page_module], page_module


def test_the_section_registry_draws_every_trait_the_widget_syncs() -> None:
    # A section is one draw module and one line in js/src/panel/sections.js, naming the traits it draws: every
    # state trait of the widget is drawn by some section, and no section names a trait the widget lacks.
    from nbcoord.ui.widget import STATE_TRAITS

    traits = list(STATE_TRAITS)
    script = (
        f"import({json.dumps((JS / 'src' / 'panel' / 'sections.js').as_uri())}).then((m) => console.log("
        "JSON.stringify({traits: m.TRAITS, sections: m.SECTIONS.map((s) => [s.name, s.traits])})))"
    )
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    registry = json.loads(out.stdout)
    drawn = {trait for _, traits in registry["sections"] for trait in traits}
    assert traits and drawn == set(traits), sorted(drawn ^ set(traits))
    assert set(registry["traits"]) == {*traits, "_fast_route"}
    names = [name for name, _ in registry["sections"]]
    assert len(names) == len(set(names)), names



def test_the_rows_sections_and_their_keys_are_the_kernels() -> None:
    # The rows travel by difference (nbcoord.ui.rowsync): the module keys them as the registry does.
    from nbcoord.ui import rowsync

    script = (
        f"import({json.dumps((JS / 'src' / 'panel' / 'rows.js').as_uri())}).then((m) => console.log("
        "JSON.stringify({traits: m.ROWS_TRAITS, keys: m.KEYS})))"
    )
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    assert json.loads(out.stdout) == {"traits": list(rowsync.TRAITS), "keys": rowsync.KEYS}

# -------------------------------------------------------------------------------------------- the server page
FLEET_HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"></head><body>
<main id="page"></main>
<script type="module">
import { render } from "/fleet.js";
window.mountFleet = (view) => {
  const fetch = async () => new Response(JSON.stringify(view), { headers: { "Content-Type": "application/json" } });
  window.cleanupFleet = render(document.getElementById("page"), { baseUrl: "/", interval: 3600, fetch });
  return true;
};
window.fleetReady = true;
</script></body></html>"""


def fleet_view(text: str) -> dict[str, Any]:
    """The server's answer for two kernels, every string of which is ``text``."""
    summary = {
        "threads": 3,
        "zombies": 1,
        "threads_by_state": {"running": 2, "waiting": 1},
        "zombie_reasons": {"cell-interrupted": 1},
        "cells": [{"cell": 4, "threads": 2, "zombies": 1}],
        "running_cell": 5,
        "running_since": NOW - 30,
        "blocked_runs": 1,
        "blocked_seconds": 12.0,
        "blocked": [{"text": text, "thread": text}],
        "last_stop": {"scope": "all", "cell": None, "stopped": 1, "alive": 1, "alive_names": [text],
                      "started_at": NOW - 60},
    }  # fmt: skip
    ok = {
        "id": "0b5e6f3c-0000-4000-8000-000000000001",
        "path": text,
        "name": text,
        "pid": 4242,
        "status": "ok",
        "attention": ["zombies"],
        "error": None,
        "execution_state": "busy",
        "rss": 300 << 20,
        "worker_processes": 0,
        "gpu": [],
        "answer_ms": 2.5,
        "nbcoord": summary,
    }
    failing = {**ok, "id": "0b5e6f3c-0000-4000-8000-000000000002", "status": "error", "attention": [],
               "error": text, "nbcoord": None}  # fmt: skip
    return {"kernels": [ok, failing], "gpu": {"available": False, "reason": text}, "took_ms": 3.0, "taken_at": NOW}


@pytest.fixture
def fleet_page(browser: Any) -> Iterator[Any]:  # noqa: F811
    module = (JS / "fleet.js").read_text(encoding="utf-8")
    context = browser.new_context()
    page = context.new_page()  # noqa: F811  (not the fixture: the fleet page's own)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    def serve(route: Any) -> None:
        path = route.request.url.removeprefix(ORIGIN)
        if path == "/fleet.js":
            route.fulfill(status=200, content_type="text/javascript", body=module)
        elif path in ("/", "/index.html"):
            route.fulfill(status=200, content_type="text/html", body=FLEET_HARNESS)
        else:
            route.fulfill(status=404, body="")

    page.route(f"{ORIGIN}/**", serve)
    page.goto(f"{ORIGIN}/index.html")
    page.wait_for_function("window.fleetReady === true")
    yield page
    assert errors == []
    context.close()


def test_the_server_page_shows_bidi_and_control_characters_in_names_escaped(fleet_page: Any) -> None:
    # The page's own escaping, whatever the server sent: a kernel or notebook name with a right-to-left override,
    # a newline, a NUL and a zero-width joiner is shown as escapes, in the text and in every tooltip.
    page = fleet_page  # noqa: F811
    page.evaluate("(view) => window.mountFleet(view)", fleet_view(BIDI + HOSTILE))
    page.locator("tr[data-kernel-id] .nbf-path").first.wait_for()
    shown = "evil\\u202eexe.txt\\nnext\\u0000\\u200d" + HOSTILE
    row = page.locator("tr[data-kernel-id='0b5e6f3c-0000-4000-8000-000000000001']")
    assert row.locator(".nbf-path").text_content() == shown
    assert row.locator(".nbf-path").get_attribute("title") == shown
    assert shown in (row.locator(".nbf-id").text_content() or "")
    failing = page.locator("tr[data-kernel-id='0b5e6f3c-0000-4000-8000-000000000002']")
    assert shown in (failing.locator("[data-col=status]").text_content() or "")
    assert failing.locator("[data-col=status]").get_attribute("title") == shown
    assert shown in page.locator(".nbf-summary").inner_text()
    assert page.locator("#page img").count() == 0
    everything = page.evaluate(
        """() => { const root = document.getElementById("page");
        return [root.textContent, ...[...root.querySelectorAll("[title]")].map((n) => n.title)].join("|"); }"""
    )
    assert "\\u202e" in everything
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200b-\u200f\x00-\x08]", everything)
