"""Cost of one resource sample (nbcoord.resources.probes) with 10/100/1000 threads and 0/10 child processes.

Run: ``python bench/bench_probes.py [--budget 1.5]`` (under a minute; ``--budget`` is the most seconds each
measurement may take). Prints, per configuration, the median cost of

* a **full** sample (every expensive read done: psutil's thread enumeration, /proc comm names, children,
  USS, NVML when present), as the panel pays once per ``min_native_interval`` (1 s by default), and
* a **cached** sample (inside the interval: RSS plus re-labelling the cached rows),

with ratios against baselines measured in the same run: a bare ``psutil.Process().memory_info()`` call, and
the full sample at 10 threads and no children. Target: a full sample <= 5 ms at 100 threads. The CPU share
column is what one full sample per second costs one core.

NVML: on a machine without an NVIDIA driver the probe learns that once and skips it, so GPU reads cost
nothing here; on a GPU machine they are included in the full sample.

The headline figures are also printed as ``RESULT`` lines (bench/_results.py) for bench/run_all.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import result

from nbcoord.resources import proc as _proc
from nbcoord.resources.probes import CellWindow, ResourceProbe

TARGET_MS = 5.0
BUDGET = {"s": 1.5}  # per measurement, at most (--budget)


def per_call_ms(fn: Callable[[], object], min_reps: int = 5, max_reps: int = 500) -> float:
    """Median milliseconds per call, over as many calls as fit in BUDGET_S (at least min_reps)."""
    times: list[float] = []
    deadline = time.perf_counter() + BUDGET["s"]
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


class Threads:
    """Idle Python threads (each a native thread), to reach a given count of OS threads."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def grow_to(self, total: int) -> None:
        # Counting OS threads reads /proc once per thread: count once per batch, not once per start.
        while (missing := total - len(psutil.Process().threads())) > 0:
            for _ in range(missing):
                t = threading.Thread(target=self.release.wait, daemon=True)
                t.start()
                self.threads.append(t)

    def stop(self) -> None:
        self.release.set()
        for t in self.threads:
            t.join()


def spawn_children(n: int) -> list[subprocess.Popen[bytes]]:
    args = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    return [subprocess.Popen(args, stdin=subprocess.PIPE) for _ in range(n)]


def stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
    for child in children:
        child.wait()


def measure(cells: list[CellWindow], names: dict[int, str]) -> tuple[float, float, float | None]:
    """(full sample ms, psutil-only full sample ms or None off Linux, cached sample ms) as things are now."""
    full_probe = ResourceProbe(min_native_interval=0, max_duty=None)
    cached_probe = ResourceProbe(min_native_interval=3600)
    try:
        full_probe.sample(cells, names)  # NVML's first start (or failure), outside the timings
        cached_probe.sample(cells, names)  # fills the cache with the current threads and children
        full = per_call_ms(lambda: full_probe.sample(cells, names))
        cached = per_call_ms(lambda: cached_probe.sample(cells, names), min_reps=200, max_reps=5000)
        psutil_only = None
        if _proc.HAS_PROC:
            _proc.HAS_PROC = False  # what the probe does off Linux: psutil's threads() and children()
            try:
                psutil_only = per_call_ms(lambda: full_probe.sample(cells, names))
            finally:
                _proc.HAS_PROC = True
    finally:
        full_probe.close()
        cached_probe.close()
    return full, cached, psutil_only


def report(rows: list[tuple[int, int, float, float, float | None]], baseline_ms: float) -> None:
    """The headline figures as RESULT lines: a full sample at about 100 and 1000 threads, a cached one at 100."""
    vs = "bare psutil.Process().memory_info()"
    for nominal, target in ((100, f"<= {TARGET_MS:g} ms"), (1000, None)):
        near = [row for row in rows if row[0] <= nominal * 1.1 and row[0] > nominal // 2]
        full = max(row[2] for row in near)
        result(
            f"resource sample, full, {nominal} threads",
            full,
            baseline_ms,
            "ms",
            target=target,
            met=full <= TARGET_MS,
            vs=vs,
            note=f"{near[0][0]} OS threads, worse of 0/10 children",
        )
    cached = max(row[3] for row in rows if 50 < row[0] <= 110)
    result("resource sample, cached, 100 threads", cached, baseline_ms, "ms", vs=vs, note="inside min_native_interval")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=BUDGET["s"], help="most seconds per measurement")
    BUDGET["s"] = parser.parse_args().budget
    started = time.perf_counter()
    me = psutil.Process()
    cells = [CellWindow(i, time.time() - 100 + i, time.time() - 99 + i) for i in range(20)]
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    baseline_ms = per_call_ms(me.memory_info, min_reps=1000, max_reps=20000)
    threads = Threads()
    rows: list[tuple[int, int, float, float, float | None]] = []
    try:
        for n_threads in (10, 100, 1000):
            threads.grow_to(n_threads)
            for n_children in (0, 10):
                children = spawn_children(n_children)
                try:
                    full, cached, psutil_only = measure(cells, names)
                finally:
                    stop_children(children)
                rows.append((len(me.threads()), n_children, full, cached, psutil_only))
    finally:
        threads.stop()

    reference = rows[0][2]
    print(
        f"nbcoord resource probe, {os.cpu_count()} CPUs, {len(psutil.pids())} processes on the machine, "
        f"python {sys.version.split()[0]}, psutil {psutil.__version__}"
    )
    print(f"baseline A: bare psutil.Process().memory_info(): {baseline_ms * 1000:.1f} us")
    print(f"baseline B: full sample, {rows[0][0]} threads, 0 children: {reference:.2f} ms")
    print("full: every expensive read; 1/s CPU %: one full sample a second, as a share of one core;")
    print("psutil: the same through psutil's threads()/children(), without thread names (the non-Linux path);")
    print("cached: a sample inside min_native_interval")
    print()
    header = ("threads", "children", "full ms", "x B", "1/s CPU %", "psutil ms", "x full", "cached ms", "x A")
    print("{:>8} {:>8} {:>8} {:>5} {:>9} {:>9} {:>6} {:>9} {:>6}".format(*header))
    for n_threads, n_children, full, cached, psutil_only in rows:
        ps = f"{psutil_only:>9.2f} {psutil_only / full:>6.1f}" if psutil_only is not None else f"{'-':>9} {'-':>6}"
        print(
            f"{n_threads:>8} {n_children:>8} {full:>8.2f} {full / reference:>5.1f} {full / 10:>9.2f} {ps} "
            f"{cached:>9.3f} {cached / baseline_ms:>6.1f}"
        )
    at_100 = max(full for n_threads, _, full, _, _ in rows if n_threads <= 110)
    verdict = "met" if at_100 <= TARGET_MS else "NOT met"
    worst = max(full for _, _, full, _, _ in rows)
    print()
    print(
        f"target: full sample <= {TARGET_MS:.0f} ms at 100 threads: {verdict} ({at_100:.2f} ms, worse of 0/10 children)"
    )
    print(
        f"default probe (1 s interval, max_duty 0.5 %): the slowest full read here ({worst:.1f} ms) "
        f"is spaced {max(1.0, worst / 1000 / 0.005):.1f} s apart"
    )
    report(rows, baseline_ms)
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
