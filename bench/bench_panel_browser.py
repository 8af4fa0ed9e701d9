"""The panel's front end: time to apply one update at 1000 threads, before and after keyed drawing.

In Debian's Chromium (the flags of tests/browser_support.py), the panel's module renders a state of 1000 threads in
four cells (250 each) with a small fake anywidget model, then receives ``--updates`` updates, each with one row
changed (a thread turns idle), as each module takes them: the whole ``threads`` trait for the first module, one rows
message with the changed row for today's (``nbcoord.ui.rowsync``: applied to its keyed rows, which it sorts again).
One update's time runs from the model's ``change:threads`` (or the message) to the end of the layout it causes (the
module draws in a microtask; the bench then reads a layout property, which makes Chromium compute style and layout).
Median over the updates.

- **before**: the module as it was (``bench/panel_before.js``, a copy of the first panel's ``js/panel.js``): one
  ``render()`` closure that rebuilt the whole DOM on every change, drawing up to 200 rows per group (800 here).
- **after**: ``js/panel.js``, keyed updates: only the changed row is touched. Its default view draws the first 50
  rows of each group (200 here, "show all" draws the rest); the bench measures it that way and with every group
  expanded (all 1000 rows drawn), so that the ratio is not only fewer rows.

Run: ``python bench/bench_panel_browser.py [--updates 30]`` (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from _results import result

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))

from browser_support import CHROMIUM, launch_chromium  # noqa: E402

ORIGIN = "http://nbcoord.bench"
NOW = 1_800_000_000.0

HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"></head><body style="width: 1200px">
<div id="host"></div>
<script type="module">
import panel from "/panel.js";
class FakeModel {
  constructor(state) { this.state = state; this.listeners = new Map(); }
  get(name) { return this.state[name]; }
  set(name, value) { this.state[name] = value; for (const cb of this.listeners.get(`change:${name}`) || []) cb(); }
  on(event, cb) { if (!this.listeners.has(event)) this.listeners.set(event, []); this.listeners.get(event).push(cb); }
  off(event, cb) { const l = this.listeners.get(event) || []; const i = l.indexOf(cb); if (i >= 0) l.splice(i, 1); }
  send() {}
  custom(content) { for (const cb of this.listeners.get("msg:custom") || []) cb(content, []); }
}
const tick = () => new Promise((resolve) => setTimeout(resolve, 0));
window.run = async (state, updates, expand) => {
  const el = document.createElement("div");
  document.getElementById("host").appendChild(el);
  const model = new FakeModel(structuredClone(state));
  const cleanup = panel.render({ model, el });
  // A module that takes the rows by difference (nbcoord.ui.rowsync) gets them so, as the kernel sends them: one
  // full copy, then one message per update with the changed row; the first module, whole threads traits.
  const byDifference = model.listeners.has("msg:custom");
  const keyed = (rows) => ({ upsert: rows, remove: [] });
  if (byDifference) {
    model.custom({ type: "rows", seq: 1, base: null, full: true, threads: keyed(structuredClone(state.threads)),
                   ledger: keyed([]), groups: state.groups, cells: state.cells });
  }
  await tick();
  if (expand) {
    for (const button of [...el.querySelectorAll("[data-action=expand-group]")]) button.click();
    await tick();
  }
  const drawn = el.querySelectorAll(".nbc-row").length;
  const times = [];
  for (let i = 0; i < updates; i++) {
    // A fresh array of fresh rows, as a JSON message gives: row i turns idle.
    const rows = structuredClone(state.threads);
    rows[i % rows.length].state = "waiting";
    rows[i % rows.length].last_active = state.now - 30 - i;
    await tick();
    const changed = JSON.parse(JSON.stringify(rows[i % rows.length]));  // as a JSON message gives it
    const start = performance.now();
    if (byDifference) model.custom({ type: "rows", seq: i + 2, base: i + 1, full: false, threads: keyed([changed]) });
    else model.set("threads", rows);
    await new Promise((resolve) => queueMicrotask(resolve));
    void el.getBoundingClientRect().height;  // style and layout, as the frame would need them
    void document.body.offsetHeight;
    times.push(performance.now() - start);
  }
  cleanup();
  el.remove();
  return { times, drawn, byDifference };
};
window.ready = true;
</script></body></html>"""


def state(threads: int, cells: int) -> dict[str, Any]:
    per = threads // cells
    rows: list[dict[str, Any]] = [
        {
            "tid": f"t{i}",
            "name": f"worker-{i // per}-{i % per}",
            "cell": 1 + i // per,
            "state": "running",
            "zombie": None,
            "reasons": [],
            "daemon": True,
            "owners": [],
            "started_at": NOW - 100,
            "last_active": None,
            "cpu_s": 0.5,
            "stop_requested_at": None,
            "last_exception": None,
        }
        for i in range(threads)
    ]
    return {
        "now": NOW,
        "header": {
            "pid": 1,
            "threads": threads,
            "threads_shown": threads,
            "kernel_threads": 8,
            "zombies": 0,
            "queues": 0,
            "running_cell": None,
            "running_since": None,
            "route": "shell-channel",
            "interval": 1.0,
        },
        "threads": rows,
        "ledger": [],
        "groups": [{"key": f"c{c}", "cell": c, "threads": per, "items": 0} for c in range(1, cells + 1)],
        "cells": [
            {"n": c, "line": f"start_workers({per})", "outcome": "ok", "started_at": NOW - 200, "ended_at": NOW - 199}
            for c in range(1, cells + 1)
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
        "_fast_route": {"kind": "shell-channel", "comm_id": "c"},
    }


def measure(browser: Any, module: str, fixture: dict[str, Any], updates: int, expand: bool) -> tuple[float, int]:
    """(median ms per update, rows drawn) for one module."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()

    def serve(route: Any) -> None:
        path = route.request.url.removeprefix(ORIGIN)
        if path == "/panel.js":
            route.fulfill(status=200, content_type="text/javascript", body=module)
        else:
            route.fulfill(status=200, content_type="text/html", body=HARNESS)

    page.route(f"{ORIGIN}/**", serve)
    page.goto(f"{ORIGIN}/index.html")
    page.wait_for_function("window.ready === true")
    try:
        out = page.evaluate("([s, n, e]) => window.run(s, n, e)", [fixture, updates, expand])
    finally:
        context.close()
    times = list(out["times"])[2:]  # the first updates warm the JIT up
    return statistics.median(times), int(out["drawn"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--updates", type=int, default=30, help="updates measured per module")
    parser.add_argument("--threads", type=int, default=1000)
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"no Chromium at {CHROMIUM}")
    before = (BENCH / "panel_before.js").read_text(encoding="utf-8")
    after = (REPO / "js" / "panel.js").read_text(encoding="utf-8")
    fixture = state(args.threads, 4)
    json.dumps(fixture)  # plain JSON, as the kernel sends it
    with launch_chromium() as browser:
        old, old_rows = measure(browser, before, fixture, args.updates, expand=False)
        new, new_rows = measure(browser, after, fixture, args.updates, expand=False)
        full, full_rows = measure(browser, after, fixture, args.updates, expand=True)
    print(f"Time to apply one update of the threads trait at {args.threads} threads (median of {args.updates - 2})")
    print(f"{'module':>28} {'rows drawn':>10} {'ms':>8} {'before/after':>13}")
    print(f"{'before (rebuild everything)':>28} {old_rows:>10} {old:8.2f} {'':>13}")
    print(f"{'after, default view':>28} {new_rows:>10} {new:8.2f} {old / new:12.1f}x")
    print(f"{'after, every group expanded':>28} {full_rows:>10} {full:8.2f} {old / full:12.1f}x")
    result(
        f"panel update at {args.threads} threads, browser",
        new,
        old,
        "ms",
        "faster than before",
        new < old,
        vs=f"the first panel, which rebuilt its whole DOM ({old_rows} rows drawn)",
        note=f"keyed drawing, default view ({new_rows} rows drawn); every group expanded ({full_rows} rows): "
        f"{full:.2f} ms, {old / full:.1f}x",
    )


if __name__ == "__main__":
    main()
