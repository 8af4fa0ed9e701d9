"""Interrupt as the user feels it: from the front end's interrupt request (jupyter_client's ``interrupt_kernel()``)
to the cell's ``execute_reply``, the first press in a fresh kernel and the later ones.

Run: ``python bench/bench_tf_interrupt.py [--quick]`` (about two minutes on 2 cores; ``--quick``: one kernel per
case). Each case starts fresh kernels; in each, a cell blocks, and after 1.5 s (a user's press comes later than
that) the kernel is interrupted; the first press and ``--later`` more are timed:

- graph: ``sess.run(q.dequeue())`` on an empty ``tf.compat.v1.FIFOQueue``, nbcoord loaded;
- eager: ``q.dequeue()`` on an empty eager ``tf.queue.FIFOQueue`` (TF2's default mode), nbcoord loaded;
- the baseline, measured in the same run: ``time.sleep(100)`` in a kernel without nbcoord, the floor of any
  Interrupt (ipykernel's signal, IPython's traceback of the cell, the reply);
- plain TensorFlow (no nbcoord), once: the blocked ``sess.run`` never replies (checked for 3 s).

Target: <= 100 ms, the first press too. The figures are also printed as ``RESULT`` lines (bench/_results.py).
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _kernels import kernel_env, kernel_manager
from _results import result

TARGET_MS = 100.0
#: Seconds a cell is blocked before it is interrupted.
BLOCKED_S = 1.5

SETUP = {
    "graph": """
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
q = tf.compat.v1.FIFOQueue(100, tf.float32, name="input")
deq = q.dequeue()
sess = tf.compat.v1.Session()
""",
    "eager": """
import tensorflow as tf
""",
    "sleep": "import time",
    "plain": """
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
q = tf.compat.v1.FIFOQueue(100, tf.float32, name="input")
deq = q.dequeue()
sess = tf.compat.v1.Session()
""",
}
#: The blocking cell, and the cell that prepares each press (eager queues close on Interrupt: a new one each time).
BLOCK = {"graph": "sess.run(deq)", "eager": "q.dequeue()", "sleep": "time.sleep(100)", "plain": "sess.run(deq)"}
BEFORE = {"eager": "q = tf.queue.FIFOQueue(100, tf.float32, name='input')"}


class Bench:
    """One kernel, driven through jupyter_client."""

    def __init__(self, nbcoord: bool) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nbcoord-bench-")
        self.km = kernel_manager(self._tmp.name)
        self.km.start_kernel(env=kernel_env(TF_CPP_MIN_LOG_LEVEL="2"), cwd=self._tmp.name)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        if nbcoord:
            self.run("%load_ext nbcoord")

    def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg: dict[str, Any] = self.kc.get_shell_msg(timeout=left)
            except queue.Empty:
                return None
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        return None

    def run(self, code: str) -> None:
        msg = self.reply(self.kc.execute(code), 120)
        if msg is None or msg["content"]["status"] != "ok":
            raise RuntimeError(f"setup cell failed: {code!r}: {msg and msg['content']}")

    def press(self, case: str, timeout: float = 20.0) -> float | None:
        """ms from interrupt_kernel() to the blocked cell's reply (None: no reply within ``timeout``)."""
        if case in BEFORE:
            self.run(BEFORE[case])
        # stop_on_error=False: after a cell's error, ipykernel 7 aborts the requests already queued, and the next
        # cell, sent the moment this one replies, could be one of them ('aborted', never run, nothing to interrupt).
        msg_id = self.kc.execute(BLOCK[case], stop_on_error=False)
        time.sleep(BLOCKED_S)
        started = time.monotonic()
        self.km.interrupt_kernel()
        msg = self.reply(msg_id, timeout)
        if msg is None:
            return None
        elapsed = (time.monotonic() - started) * 1000
        if msg["content"].get("ename") != "KeyboardInterrupt":
            raise RuntimeError(f"{case}: the cell did not end with KeyboardInterrupt: {msg['content']}")
        return elapsed

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._tmp.cleanup()


def measure(case: str, kernels: int, later: int) -> tuple[list[float], list[float]]:
    """(first presses, later presses) in ms, over fresh kernels."""
    first: list[float] = []
    rest: list[float] = []
    for _ in range(kernels):
        bench = Bench(nbcoord=case in ("graph", "eager"))
        try:
            bench.run(SETUP[case])
            for index in range(1 + later):
                ms = bench.press(case)
                if ms is None:
                    raise RuntimeError(f"{case}: no reply to Interrupt")
                (first if index == 0 else rest).append(ms)
        finally:
            bench.close()
    return first, rest


def plain_never_returns() -> bool:
    bench = Bench(nbcoord=False)
    try:
        bench.run(SETUP["plain"])
        return bench.press("plain", timeout=3.0) is None
    finally:
        bench.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one fresh kernel per case")
    parser.add_argument("--kernels", type=int, default=3, help="fresh kernels per case")
    parser.add_argument("--later", type=int, default=3, help="presses after the first, per kernel")
    args = parser.parse_args()
    kernels = 1 if args.quick else args.kernels
    started = time.perf_counter()
    print(f"Interrupt, front end's request to the cell's reply ({kernels} fresh kernel(s) per case, first press "
          f"and {args.later} later ones, {os.cpu_count()} CPUs)")
    figures: dict[str, tuple[list[float], list[float]]] = {}
    for case in ("sleep", "graph", "eager"):
        figures[case] = measure(case, kernels, args.later)
        first, rest = figures[case]
        print(f"   {case:6s} first press: {', '.join(f'{ms:.0f}' for ms in first)} ms;  later: "
              f"median {statistics.median(rest):.0f} ms (from {min(rest):.0f} to {max(rest):.0f})")
    never = plain_never_returns()
    print(f"   plain TensorFlow, sess.run blocked, no nbcoord: {'no reply in 3 s' if never else 'replied'}")
    base_first, base_later = (statistics.median(values) for values in figures["sleep"])
    for case, words in (("graph", "sess.run blocked on an empty queue"), ("eager", "eager dequeue on an empty queue")):
        first, rest = figures[case]
        for label, values, base in (("first press", first, base_first), ("later presses", rest, base_later)):
            value = statistics.median(values)
            result(
                f"Interrupt to the cell's reply, {words}, {label} (end to end)",
                value,
                base,
                "ms",
                target=f"<= {TARGET_MS:g} ms",
                met=value <= TARGET_MS,
                vs="Interrupt of time.sleep in a kernel without nbcoord (the floor)",
                note=f"{len(values)} presses, {min(values):.0f}-{max(values):.0f} ms"
                + ("; plain TensorFlow: no reply" if never else ""),
            )
    print(f"(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
