"""Stacks read from outside (issue 24): the time to a kernel's stacks, and how long a read pauses the kernel.

A real Jupyter server (bench_server's ``Server``, nbcoord's extension enabled by its config file) and one kernel with
nbcoord and ``--threads`` threads waiting on an Event, plus a watcher thread that wakes every 0.5 ms and records the
longest gap between two wake-ups: a read that stopped the kernel shows as a gap that long.

1. **Time to stacks**: ``GET /nbcoord/api/kernels/<id>/stacks`` from the request to the reply (what the panel and
   the page wait for), ``--reads`` times; median. Baseline: ``GET /api/kernels/<id>`` of the server itself, the
   cheapest request about that kernel. Target: <= 1 s with 100 threads.
2. **The kernel's longest pause during reads**: the watcher's longest gap over the reads, against its longest gap
   over as many seconds without reads (measured just before: the machine's own noise). Target: <= 50 ms for the
   default read (Python frames, which never stops the kernel). The native read (``?native=1``, a child process that
   stops the kernel with ptrace) is printed beside it, without a target: it stops every thread for the whole read.

Run: ``python bench/bench_stacks.py [--threads 100] [--reads 10]`` (under a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _results import result
from bench_server import Server, run
from jupyter_client import BlockingKernelClient

WATCHER = """\
import threading, time
_never = threading.Event()
for _i in range({threads}):
    threading.Thread(target=_never.wait, name=f"waiting-{{_i}}", daemon=True).start()
_gaps = {{"longest": 0.0}}
def _watch():
    last = time.monotonic()
    while True:
        time.sleep(0.0005)
        now = time.monotonic()
        _gaps["longest"] = max(_gaps["longest"], now - last)
        last = now
threading.Thread(target=_watch, name="gap-watcher", daemon=True).start()
"""


def longest_gap(client: BlockingKernelClient) -> float:
    """The watcher's longest gap (seconds) since the last call, read (and reset) through user_expressions."""
    expression = "(_gaps['longest'], _gaps.__setitem__('longest', 0.0))[0]"
    msg_id = client.execute("", user_expressions={"v": expression})
    while True:
        reply = client.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            return float(reply["content"]["user_expressions"]["v"]["data"]["text/plain"])


def timed_get(server: Server, path: str) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    status, body = server.get(path)
    elapsed = time.perf_counter() - started
    assert status == 200, (status, body[:300])
    parsed: dict[str, object] = json.loads(body)
    return elapsed, parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--reads", type=int, default=10)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-stacks-") as tmp:
        server = Server(Path(tmp))
        try:
            kernel_id = server.start_kernel(0)
            client = server.client(kernel_id)
            run(client, "%load_ext nbcoord")
            run(client, WATCHER.format(threads=options.threads))
            time.sleep(1.0)  # the threads started and waiting; the watcher's first gaps are the start's
            longest_gap(client)
            # The machine's noise: the watcher's longest gap over as long as the reads will take, without reads.
            base_times = []
            for _ in range(options.reads):
                elapsed, _ = timed_get(server, f"/api/kernels/{kernel_id}")
                base_times.append(elapsed)
                time.sleep(0.3)
            noise = longest_gap(client)
            read_times, threads = [], 0
            for _ in range(options.reads):
                elapsed, read = timed_get(server, f"/nbcoord/api/kernels/{kernel_id}/stacks")
                assert read["available"], read
                read_times.append(elapsed)
                threads = len(read["threads"])  # type: ignore[arg-type]
                time.sleep(0.3)
            pause = longest_gap(client)
            native_time, native = timed_get(server, f"/nbcoord/api/kernels/{kernel_id}/stacks?native=1")
            native_pause = longest_gap(client)
        finally:
            server.stop()
    median, baseline = statistics.median(read_times), statistics.median(base_times)
    print(f"\n{threads} threads read; {options.reads} reads")
    print(f"time to stacks (request to reply): median {median * 1000:.0f} ms, max {max(read_times) * 1000:.0f} ms; "
          f"GET /api/kernels/<id>: {baseline * 1000:.1f} ms")  # fmt: skip
    print(f"longest kernel pause: {pause * 1000:.1f} ms during Python reads, {noise * 1000:.1f} ms without reads; "
          f"native read: {native_time * 1000:.0f} ms, pause {native_pause * 1000:.0f} ms "
          f"(reported paused_ms {native.get('paused_ms')}, available {native.get('available')}, "
          f"{native.get('native_reason') or ''})")  # fmt: skip
    result(f"time to stacks, {options.threads} threads", median * 1000, baseline * 1000, "ms", "<= 1000 ms",
           median <= 1.0, vs="GET /api/kernels/<id>", note=f"max {max(read_times) * 1000:.0f} ms")  # fmt: skip
    result("longest kernel pause during stack reads", pause * 1000, noise * 1000, "ms", "<= 50 ms", pause <= 0.05,
           vs="longest gap without reads",
           note=f"native read (?native=1): {native_time * 1000:.0f} ms, pause {native_pause * 1000:.0f} ms, no "
                "target")  # fmt: skip


if __name__ == "__main__":
    main()
