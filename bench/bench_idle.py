"""What nbcoord costs while nothing happens, each figure against the same kernel without nbcoord, in one run.

A diagnostics extension is loaded into every kernel of a server; what it costs while the user does nothing is paid
by every idle kernel of a JupyterHub. Three fresh kernels, each left alone for ``--window`` seconds after a short
settling time:

- **without**: the kernel alone (the baseline);
- **loaded**: ``%load_ext nbcoord``, nothing registered changing;
- **panel**: loaded, and the panel shown with one view open (the comm message a page sends when the view is
  drawn), no thread changing;
- **steady**: loaded, with one thread a cell started alive and waiting: something live that changes nothing. The
  monitor keeps its interval while anything is live (stuck detection, idle times and zombie states rest on its
  ticks), so this row has no target: it says what a kernel with a leftover idle thread pays.

For each: the process's CPU over the window as a share of one core, summed from every thread's scheduler counter
(``/proc/<pid>/task/<tid>/schedstat``, nanoseconds: an idle kernel spends well under the 10 ms tick of
``/proc/<pid>/stat`` per second); its OS threads and the Python threads named ``nbcoord-...``; its RSS.

Then the load: the time from the execute request of ``%load_ext nbcoord`` to its reply in a fresh kernel
(TensorFlow not imported), median of ``--loads`` kernels, against the same request of an empty cell in the same
kernels just before: the span the user feels.

Targets (issue 26): idle CPU at most 2x the kernel without nbcoord, 3x with the panel open; nbcoord's own threads
while idle at most 1 without the panel, 2 with it; the load at most 100 ms; RSS added at most 5 MiB.

Every kernel runs with Python's bytecode cache, as a ``pip install`` leaves it (pip compiles every module at
install): ``PYTHONDONTWRITEBYTECODE`` is dropped for the kernels, their cache goes to a temporary folder
(``PYTHONPYCACHEPREFIX``: the checkout stays clean), and one kernel that loads nbcoord and shows the panel warms it
first. Without the cache every load compiles nbcoord's modules from source (about 70 ms of the load here), which no
installed nbcoord does.

Run: ``python bench/bench_idle.py [--window 30] [--loads 5]`` (about 3 minutes). Each figure is also printed as a
``RESULT`` line (bench/_results.py) for bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from _kernels import kernel_env, kernel_manager, run_cell, thread_cpu_ns
from _results import result
from jupyter_client.blocking.client import BlockingKernelClient

PROC = Path("/proc")
#: Seconds a kernel is left alone after its set-up before the window starts (the load's own work, the first ticks).
SETTLE_S = 5.0
SETUPS = {
    "without": "",
    "loaded": "%load_ext nbcoord",
    "panel": "%load_ext nbcoord\nimport nbcoord\np = nbcoord.panel()\nprint(p.comm.comm_id)",
    # Something live that changes nothing: a thread a cell started, waiting (no target: see the module docstring).
    "steady": "%load_ext nbcoord\nimport threading\nleft = threading.Event()\n"
    "threading.Thread(target=left.wait, daemon=True).start()",
}
CPU_TARGETS = {"loaded": 2.0, "panel": 3.0}
THREAD_TARGETS = {"loaded": 1, "panel": 2}
LOAD_TARGET_MS = 100.0
RSS_TARGET_MIB = 5.0
NBCOORD_THREADS = (
    "import json, threading\n"
    "print(json.dumps(sorted(t.name for t in threading.enumerate() if t.name.startswith('nbcoord'))))"
)


@dataclass
class Idle:
    cpu_share: float  # of one core, over the window
    os_threads: int
    nbcoord_threads: list[str]
    rss_mib: float


@contextmanager
def fresh_kernel() -> Iterator[tuple[BlockingKernelClient, int]]:
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-") as workdir:
        manager = kernel_manager(workdir)
        manager.start_kernel(env=kernel_env(IPYTHONDIR=workdir), cwd=workdir, stderr=subprocess.DEVNULL)
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            yield client, int(manager.provisioner.process.pid)  # type: ignore[union-attr]
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
            manager.cleanup_resources()


def cpu_ns(pid: int) -> int:
    """Nanoseconds every live thread of ``pid`` has spent on a CPU."""
    return sum(thread_cpu_ns(pid, task.name) or 0 for task in (PROC / str(pid) / "task").iterdir())


def open_view(client: BlockingKernelClient, comm_id: str) -> None:
    """The message a page's panel module sends when it draws a view."""
    view = f"v{uuid.uuid4().hex[:8]}"
    command = {"type": "view", "view_id": view, "action": "open", "click_id": f"{view}-0"}
    content = {"comm_id": comm_id, "data": {"method": "custom", "content": command}}
    client.shell_channel.send(client.session.msg("comm_msg", content))


def measure_idle(mode: str, window: float) -> Idle:
    with fresh_kernel() as (client, pid):
        printed = run_cell(client, SETUPS[mode]) if SETUPS[mode] else ""
        if mode == "panel":
            open_view(client, printed.strip().splitlines()[-1])
        time.sleep(SETTLE_S)
        began, before = time.monotonic(), cpu_ns(pid)
        time.sleep(window)
        share = (cpu_ns(pid) - before) / 1e9 / (time.monotonic() - began)
        process = psutil.Process(pid)
        threads, rss = process.num_threads(), process.memory_info().rss / 2**20
        # Read after the window: a thread that starts late (the panel's sender, once the view's message is handled)
        # is counted, and the cell that reads them is not in the window.
        names = json.loads(run_cell(client, NBCOORD_THREADS).strip().splitlines()[-1])
        return Idle(share, threads, names, rss)


def measure_load() -> tuple[float, float]:
    """Milliseconds from the request to the reply: an empty cell, then ``%load_ext nbcoord``, in one fresh kernel."""
    with fresh_kernel() as (client, _pid):
        run_cell(client, "pass")  # the first cell's own costs (history, the event loop's first turn) go here
        began = time.perf_counter()
        run_cell(client, "")
        empty = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        run_cell(client, "%load_ext nbcoord")
        return (time.perf_counter() - began) * 1000, empty


def with_bytecode_cache(folder: str) -> None:
    """The kernels started from now on cache bytecode in ``folder``, as an installed package has it; warm it."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    with fresh_kernel() as (client, _pid):
        run_cell(client, SETUPS["panel"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=30.0, help="seconds each idle kernel is measured")
    parser.add_argument("--loads", type=int, default=5, help="fresh kernels for the load's median")
    args = parser.parse_args()
    began = time.monotonic()
    print(f"nbcoord idle costs: python {sys.version.split()[0]}, {psutil.cpu_count()} CPUs, {args.window:g} s windows")
    cache = tempfile.TemporaryDirectory(prefix="nbcoord-bench-pycache-")
    with_bytecode_cache(cache.name)
    idle = {mode: measure_idle(mode, args.window) for mode in SETUPS}
    base = idle["without"]
    print(f"{'kernel':<10} {'CPU % of a core':>16} {'OS threads':>11} {'RSS MiB':>8}  nbcoord's threads")
    for mode, figures in idle.items():
        print(
            f"{mode:<10} {figures.cpu_share * 100:>16.3f} {figures.os_threads:>11} {figures.rss_mib:>8.1f}  "
            f"{', '.join(figures.nbcoord_threads) or '-'}"
        )
    steady = idle["steady"]
    result(
        name="idle kernel CPU, nbcoord loaded, a cell's thread alive and waiting",
        value=steady.cpu_share * 100,
        baseline=base.cpu_share * 100,
        unit="% of a core",
        vs="the same kernel without nbcoord (an idle thread costs it nothing)",
        note=f"x{steady.cpu_share / base.cpu_share:.1f}; the monitor ticks every second while something is live"
        if base.cpu_share > 0
        else "",
    )
    for mode in ("loaded", "panel"):
        figures = idle[mode]
        ratio = figures.cpu_share / base.cpu_share if base.cpu_share > 0 else float("inf")
        label = "nbcoord loaded" if mode == "loaded" else "nbcoord loaded, the panel open"
        result(
            name=f"idle kernel CPU, {label}",
            value=figures.cpu_share * 100,
            baseline=base.cpu_share * 100,
            unit="% of a core",
            target=f"<= {CPU_TARGETS[mode]:g} x without",
            met=ratio <= CPU_TARGETS[mode],
            vs="the same kernel without nbcoord",
            note=f"x{ratio:.1f}; OS threads {figures.os_threads} vs {base.os_threads}",
        )
        result(
            name=f"nbcoord's threads while idle, {label}",
            value=len(figures.nbcoord_threads),
            baseline=None,
            unit="threads",
            target=f"<= {THREAD_TARGETS[mode]}",
            met=len(figures.nbcoord_threads) <= THREAD_TARGETS[mode],
            note=", ".join(figures.nbcoord_threads),
        )
    added = idle["loaded"].rss_mib - base.rss_mib
    result(
        name="RSS added by %load_ext nbcoord, idle",
        value=idle["loaded"].rss_mib,
        baseline=base.rss_mib,
        unit="MiB",
        target=f"<= +{RSS_TARGET_MIB:g} MiB",
        met=added <= RSS_TARGET_MIB,
        vs="the same kernel without nbcoord",
        note=f"added {added:+.1f} MiB",
    )
    loads = [measure_load() for _ in range(args.loads)]
    load = statistics.median(ours for ours, _ in loads)
    empty = statistics.median(base for _, base in loads)
    print(f"%load_ext nbcoord, request to reply: {', '.join(f'{ours:.0f}' for ours, _ in loads)} ms")
    result(
        name="%load_ext nbcoord, request to reply, fresh kernel",
        value=load,
        baseline=empty,
        unit="ms",
        target=f"<= {LOAD_TARGET_MS:g} ms",
        met=load <= LOAD_TARGET_MS,
        vs="an empty cell in the same kernel",
        note=f"median of {args.loads} fresh kernels",
    )
    print(f"({time.monotonic() - began:.1f} s)")
    cache.cleanup()


if __name__ == "__main__":
    main()
