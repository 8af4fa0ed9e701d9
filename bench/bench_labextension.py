"""The JupyterLab extension's cost to the server (issue 25): server CPU added by 5 open JupyterLab pages.

A real Jupyter server with JupyterLab (bench_server's ``Server``: nbcoord's server extension enabled by its config
file), one notebook whose kernel has nbcoord and a few threads, and ``--pages`` JupyterLab pages in Debian's Chromium,
each showing that notebook, so that each page's status bar item polls ``GET /nbcoord/api/kernels``. The server
process's CPU time is read over ``--window`` seconds, once the pages are open and settled, twice:

- **baseline**: the same pages with nbcoord's JupyterLab extension disabled (``disabledExtensions`` in the server's
  ``labconfig/page_config.json``): JupyterLab's own polling (kernels, sessions, contents) and the server's;
- **with the extension**: the pages as a user has them.

The difference, as a share of one core, is what the extension adds. Target: < 0.5 %.

Run: ``python bench/bench_labextension.py [--pages 5] [--window 30]`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _results import result
from bench_server import Server, run

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))

from browser_support import launch_chromium  # noqa: E402

ITEM = "[data-nbcoord=status]"
KERNEL_SETUP = """%load_ext nbcoord
import threading, nbcoord
for _i in range(3):
    threading.Thread(target=nbcoord.wait_for_stop, name=f"kept-{_i}", daemon=True).start()
"""
NOTEBOOK = {"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "python3",
            "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}  # fmt: skip


def server_cpu(server: Server, window: float) -> float:
    """The server process's CPU over ``window`` seconds, as a share of one core (percent)."""
    process = psutil.Process(server.process.pid)
    before, started = process.cpu_times(), time.monotonic()
    time.sleep(window)
    after, took = process.cpu_times(), time.monotonic() - started
    return 100 * ((after.user - before.user) + (after.system - before.system)) / took


def measure(pages: int, window: float, extension: bool) -> tuple[float, int]:
    """Server CPU (% of a core) with ``pages`` JupyterLab pages open on one notebook; and how many of the pages
    showed the status item."""
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-labext-") as tmp:
        base = Path(tmp)
        server = Server(base)
        try:
            if not extension:  # read by JupyterLab for each page it serves
                labconfig = base / "jupyter_config_dir" / "labconfig"
                labconfig.mkdir()
                (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": {"nbcoord": True}}))
            (base / "root" / "bench.ipynb").write_text(json.dumps(NOTEBOOK))
            session = json.loads(server.get("/api/sessions", "POST", {"path": "bench.ipynb", "type": "notebook",
                                                                      "name": "bench.ipynb",
                                                                      "kernel": {"name": "python3"}})[1])  # fmt: skip
            client = server.client(session["kernel"]["id"])
            run(client, KERNEL_SETUP)
            shown = 0
            with launch_chromium() as browser:
                context = browser.new_context()
                opened = []
                for _ in range(pages):
                    page = context.new_page()
                    page.goto(f"{server.url}/lab/tree/bench.ipynb?token={server.token}")
                    opened.append(page)
                for page in opened:
                    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
                    if extension:
                        page.locator(ITEM).first.wait_for(timeout=30_000)
                        shown += 1
                    else:  # disabled: JupyterLab never loads it
                        assert page.locator(ITEM).count() == 0
                time.sleep(5.0)  # the pages' start-up requests are over
                cpu = server_cpu(server, window)
                context.close()
        finally:
            server.stop()
    return cpu, shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--window", type=float, default=30.0)
    options = parser.parse_args()
    baseline, _ = measure(options.pages, options.window, extension=False)
    with_item, shown = measure(options.pages, options.window, extension=True)
    added = with_item - baseline
    print(f"\nserver CPU with {options.pages} JupyterLab pages on one notebook, over {options.window:.0f} s:")
    print(f"  nbcoord's JupyterLab extension disabled: {baseline:.2f} % of a core")
    print(f"  enabled (the status item in {shown} pages):  {with_item:.2f} % (+{added:.2f} %)")
    result(f"server CPU added by {options.pages} JupyterLab pages", with_item, baseline, "% of a core",
           "< 0.5 % added", added < 0.5, vs="the same pages, nbcoord's lab extension disabled",
           note=f"added {added:.2f} %")  # fmt: skip


if __name__ == "__main__":
    main()
