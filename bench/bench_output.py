"""Output routing and memory: what they cost, and what reclaim gives back, against baselines from the same run.

Run: ``python bench/bench_output.py [--quick]`` (about 40 s on 2 cores; ``--quick`` about 25 s). Three figures, each
also a ``RESULT`` line (bench/_results.py) for bench/run_all.py:

1. Per-line cost of routed output: a thread started by a finished cell prints N lines while the kernel is idle, in
   a real kernel (ipykernel 7) with nbcoord's route; the thread times its own loop. Baseline: the same kernel, the
   same thread code, with routing off (``route_output``): the kernel's own ``OutStream`` path, IPython's per-cell
   wrapper included. Rounds alternate on / off; medians. Target: <= 2x.
2. The per-cell hooks with the memory ledger and the output route's cell listener on, 1000 live threads, in an
   in-process IPython shell (as bench_core.py measures the core hooks). Baseline: IPython ``run_cell('pass')``
   without nbcoord. Target (the core hooks' budget): <= 50 us. The core hooks alone are measured too.
3. RSS given back by ``reclaim(outputs=True)`` in the demo scenario (notebooks/15-output-and-memory.ipynb): a failed
   cell whose traceback keeps a 512 MiB PyTorch tensor, and a 256 MiB tensor left in the output cache. Baseline: the
   768 MiB those cells allocated. Needs PyTorch (``torch==2.13.0``, the test extra); left out without it.

Before the lead wires ``_output``/``_memory`` into the extension's load, this script installs them itself (the
``getattr(..., "output", None)`` lines); once wired, those lines do nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _kernels import kernel_env, kernel_manager
from _results import result

import nbcoord

LINE_TARGET = 2.0
CELL_TARGET_US = 50.0
COUNTS = {"lines": 20_000, "rounds": 5, "cell_reps": 3000}

SETUP = """%load_ext nbcoord
import json, threading, time, nbcoord
from nbcoord.kernel import output as _output
_ext = nbcoord._extension
_router = getattr(_ext, "output", None)
if _router is None:  # before the wiring
    _router = _output.install(_ext)
    _ext.host.add_undo(_router.uninstall)
def set_routing(on):
    if _ext.config.has_trait("route_output"):
        _ext.config.route_output = on
    else:
        _router._enabled = on
        _router._update_routing()
go, done, timing = threading.Event(), threading.Event(), []
def writer(n):
    while go.wait(60):
        go.clear()
        began = time.perf_counter()
        for i in range(n):
            print(f"line {i} of the background writer")
        timing.append(time.perf_counter() - began)
        done.set()
"""


class KernelRunner:
    """One kernel through jupyter_client, cells run to their reply; stream text collected."""

    def __init__(self, workdir: str) -> None:
        self.km = kernel_manager(workdir)
        self.km.start_kernel(env=kernel_env(IPYTHONDIR=workdir), cwd=workdir)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> str:
        out: list[str] = []

        def keep(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id"):
                out.append(msg["content"]["text"])

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=keep)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {reply['content']}")
        return "".join(out)

    def value(self, expression: str) -> Any:
        text = self.run(f"print('@@' + json.dumps({expression}))")
        return json.loads(text.rpartition("@@")[2])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self.km.cleanup_resources()


# --------------------------------------------------------------------------------------- 1 per-line cost
def bench_lines(lines: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-output-") as workdir:
        kernel = KernelRunner(workdir)
        try:
            kernel.run(SETUP)
            kernel.run(f"threading.Thread(target=writer, args=({lines},), name='writer', daemon=True).start()")
            per_line: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for routed in (True, False):
                    kernel.run(f"set_routing({routed}); done.clear(); go.set()")  # the cell ends; the thread writes
                    kernel.run("done.wait(120)")
                    per_line[routed].append(kernel.value("timing[-1]") / lines)
            rows = kernel.value("_router.section()['outputs']")
        finally:
            kernel.close()
    routed, plain = statistics.median(per_line[True]), statistics.median(per_line[False])
    ratio = routed / plain
    shown = rows[0]["shown"] if rows else 0
    print("1. Per-line cost of a thread's print after its cell finished (ipykernel 7, kernel idle)")
    print(f"   routed home by nbcoord: {routed * 1e6:6.2f} us per line (median of {rounds} x {lines:,} lines)")
    print(f"   plain (routing off):    {plain * 1e6:6.2f} us per line; ratio x{ratio:.2f} (target <= {LINE_TARGET:g})")
    print(f"   the area kept {shown} lines of the {rounds * lines:,} routed")
    result(
        "routed output, per line, thread of a finished cell",
        routed * 1e6,
        plain * 1e6,
        "us",
        target=f"<= {LINE_TARGET:g} x plain",
        met=ratio <= LINE_TARGET,
        vs="the same print with routing off (the kernel's OutStream)",
    )


# --------------------------------------------------------------------------------------- 2 cell hooks
def median_time(fn: Any, reps: int, budget_s: float = 3.0) -> float:
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < reps and (len(times) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_cell_hooks(reps: int) -> None:
    import threading

    from IPython.testing import globalipapp

    from nbcoord.kernel import output as _output
    from nbcoord.resources import memory as _memory

    globalipapp.start_ipython()  # type: ignore[no-untyped-call]
    shell = globalipapp.get_ipython()  # type: ignore[no-untyped-call]
    baseline = median_time(lambda: shell.run_cell("pass", store_history=False), reps=2000)
    shell.run_line_magic("load_ext", "nbcoord")
    ext = nbcoord._extension
    release = threading.Event()
    threads: list[threading.Thread] = []
    try:
        shell.run_cell("pass", store_history=False)
        ext.cells.pre_run_cell(SimpleNamespace(raw_cell="start()", store_history=False, cell_id=None))
        for _ in range(1000):
            thread = threading.Thread(target=release.wait, daemon=True)
            thread.start()
            threads.append(thread)
        ext.cells.post_run_cell(SimpleNamespace(error_in_exec=None, error_before_exec=None, execution_count=0))
        info = SimpleNamespace(raw_cell="x = 1", store_history=True, cell_id="bench-cell", silent=False)
        ok = SimpleNamespace(error_in_exec=None, error_before_exec=None, execution_count=shell.execution_count)

        def cell() -> None:
            ext.cells.pre_run_cell(info)
            ext.cells.post_run_cell(ok)

        core = median_time(cell, reps)
        ledger = getattr(ext, "memory", None) or _memory.install(ext)
        # The route's cell listener (an in-process shell has no kernel streams to route: only the listener is
        # measured, with a request header as a kernel's shell holds it).
        router = getattr(ext, "output", None)
        remove_listener = None
        if router is None:
            router = _output.OutputRouter(ext)
            router._active = True
            router._shell = SimpleNamespace(parent_header={"header": {"msg_id": "bench"}})
            remove_listener = ext.host.add_cell_listener("output", router._on_cell)
        ext.host.monitor.tick()  # a probe sample for the ledger to read
        with_ledger = median_time(cell, reps)
        if remove_listener is not None:
            remove_listener()
        if getattr(ext, "memory", None) is None:
            ledger.uninstall()
        live = len(ext.host.registry.records())
    finally:
        release.set()
        for thread in threads:
            thread.join()
        shell.run_line_magic("unload_ext", "nbcoord")
    print("2. Per-cell hooks (_pre_run_cell + _post_run_cell, fake info/result objects)")
    print(f"   baseline: IPython run_cell('pass') without nbcoord: {baseline * 1e6:.0f} us; {live} live threads")
    print(f"   core hooks alone:                          {core * 1e6:6.1f} us")
    print(f"   with the memory ledger and output listener: {with_ledger * 1e6:6.1f} us "
          f"(+{(with_ledger - core) * 1e6:.1f} us; target <= {CELL_TARGET_US:g} us)")
    result(
        "per-cell hooks with the memory ledger and output listener, 1000 threads",
        with_ledger * 1e6,
        baseline * 1e6,
        "us",
        target=f"<= {CELL_TARGET_US:g} us",
        met=with_ledger * 1e6 <= CELL_TARGET_US,
        vs="IPython run_cell('pass') without nbcoord",
        note=f"core hooks alone {core * 1e6:.1f} us",
    )


# ------------------------------------------------------------------------------------------ 3 reclaim
DEMO = """import torch
from nbcoord.resources import reclaim as _reclaim
def train_step():
    activations = torch.ones(128 * 2**20)  # 512 MiB, kept alive by the traceback
    raise ValueError("loss is NaN")
"""


def bench_reclaim() -> None:
    if importlib.util.find_spec("torch") is None:
        print("3. reclaim: PyTorch is not installed here; left out")
        return
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-reclaim-") as workdir:
        kernel = KernelRunner(workdir)
        try:
            kernel.run("%load_ext nbcoord\nimport json, nbcoord\n" + DEMO)
            reply = kernel.kc.execute_interactive("train_step()", timeout=120, output_hook=lambda _msg: None)
            assert reply["content"]["status"] == "error"
            kernel.run("torch.ones(64 * 2**20)  # 256 MiB in the output cache")
            kernel.run("pass")
            report = kernel.value(
                "{k: v for k, v in (getattr(nbcoord, 'reclaim', None) or "
                "nbcoord._extension.reclaim)(outputs=True).items() "
                "if k in ('rss_freed', 'took_s', 'dropped')}"
            )
        finally:
            kernel.close()
    allocated = 768 * 2**20
    freed = report["rss_freed"]
    print("3. reclaim(outputs=True) in the demo scenario (failed cell's 512 MiB tensor + 256 MiB in Out)")
    print(f"   gave back {freed / 2**20:.1f} MiB of RSS of the {allocated / 2**20:.0f} MiB allocated, "
          f"in {report['took_s'] * 1000:.0f} ms")
    result(
        "RSS given back by reclaim --outputs, demo scenario",
        freed / 2**20,
        allocated / 2**20,
        "MiB",
        vs="what the demo's cells allocated (kept by a traceback and by Out)",
        note=f"{len(report['dropped'])} kinds of reference dropped; {report['took_s'] * 1000:.0f} ms",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer lines, rounds and repetitions")
    args = parser.parse_args()
    if args.quick:
        COUNTS.update(lines=5_000, rounds=3, cell_reps=1000)
    began = time.monotonic()
    print(f"nbcoord output and memory: python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    bench_lines(COUNTS["lines"], COUNTS["rounds"])
    print()
    bench_cell_hooks(COUNTS["cell_reps"])
    print()
    bench_reclaim()
    print(f"({time.monotonic() - began:.1f} s)")


if __name__ == "__main__":
    main()
