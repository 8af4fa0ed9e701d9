"""What the TensorFlow integration costs, and what it buys, measured with and without nbcoord in one process.

Run: ``python bench/bench_tensorflow.py [--quick]`` (about a minute on 2 cores; ``--quick``: fewer rounds).
nbcoord is loaded into an in-process IPython shell and unloaded again between measurements, so both sides run
in the same process, alternately:

1. a trivial ``sess.run`` (and a prepared callable, the QueueRunner path): per-call cost plain, with only the
   run hook patched in, and with nbcoord loaded (target: <= 1 us added); plus the hook alone around a no-op.
   On a busy machine the spread between blocks is several us: compare the minima;
2. a QueueRunner pipeline: elements/s through a queue, 2 runner threads enqueuing one element per run, the main
   thread dequeuing batches, in pairs of runs (target: >= 99% of plain);
3. polling 1/10/100 queues: one prepared callable per session (nbcoord's poll) against ``sess.run`` of the size
   ops together and one by one;
4. stop latency, 10 runners x 4 threads blocked on full queues: nbcoord's stop (runners with and without a
   coordinator) against ``request_stop`` + ``join`` per coordinator, plain TensorFlow (target: <= 50 ms);
5. Interrupt latency for a main thread blocked in ``sess.run`` on an empty queue (plain: never; the bench then
   frees it by closing the queue after 1 s).

The headline figures are also printed as ``RESULT`` lines (bench/_results.py) for bench/run_all.py.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import result
from IPython.core.interactiveshell import InteractiveShell

import nbcoord
from nbcoord.integrations import tensorflow as tf_integration
from nbcoord.integrations._tf_runs import RunTracker

shell = InteractiveShell.instance()
#: Repeat counts; --quick lowers them (the medians get noisier, the figures stay the same kind).
COUNTS = dict(hook_rounds=80, loaded_rounds=20, pipeline_pairs=4, pipeline_s=1.5, stop_rounds=5, interrupts=3)
QUICK = dict(hook_rounds=20, loaded_rounds=6, pipeline_pairs=2, pipeline_s=1.0, stop_rounds=3, interrupts=1)
RUN_TARGET_US = 1.0
PIPELINE_TARGET = 0.99
STOP_TARGET_MS = 50.0


def tensorflow() -> Any:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    return tf


tf = tensorflow()


@contextmanager
def nbcoord_loaded(on: bool) -> Iterator[None]:
    if on:
        shell.run_line_magic("load_ext", "nbcoord")
    try:
        yield
    finally:
        if on:
            shell.run_line_magic("unload_ext", "nbcoord")


def label(on: bool) -> str:
    return "nbcoord" if on else "plain"


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


# ---------------------------------------------------------------------------------------------- 1. runs
@contextmanager
def mode(name: str) -> Iterator[None]:
    """plain: nothing; hook: only the run hook on the class; nbcoord: the whole extension loaded."""
    from tensorflow.python.client.session import BaseSession

    original = BaseSession.__dict__["_call_tf_sessionrun"]
    if name == "hook":
        BaseSession._call_tf_sessionrun = RunTracker().make_hook(original)
    try:
        with nbcoord_loaded(name == "nbcoord"):
            yield
    finally:
        BaseSession._call_tf_sessionrun = original


def paired(fn: Callable[[], object], other: str, rounds: int, calls: int) -> tuple[float, float]:
    """Median per-call us of plain, and the median paired difference ``other - plain`` over rounds.

    Each round measures both sides back to back, in alternating order, so that the load of other processes
    (which changes over tenths of a second) falls on both alike.
    """
    plain: list[float] = []
    diffs: list[float] = []
    for index in range(rounds):
        order = ("plain", other) if index % 2 == 0 else (other, "plain")
        got: dict[str, float] = {}
        for name in order:
            with mode(name):
                per_call_us(fn, calls)  # settle: loading scans and starts threads; caches refill
                got[name] = per_call_us(fn, calls)
        plain.append(got["plain"])
        diffs.append(got[other] - got["plain"])
    return statistics.median(plain), statistics.median(diffs)


def bench_trivial_runs() -> None:
    graph = tf.Graph()
    with graph.as_default():
        c = tf.constant(1.0)
    sess = tf.compat.v1.Session(graph=graph)
    callable_ = sess.make_callable(c)
    for _ in range(1000):
        sess.run(c)
        callable_()
    print("1. trivial session runs: plain us per call, and the median paired difference with the other side")
    figures = []
    for kind, fn in (("run", lambda: sess.run(c)), ("callable", callable_)):
        base, hook = paired(fn, "hook", rounds=int(COUNTS["hook_rounds"]), calls=300)
        _, loaded = paired(fn, "nbcoord", rounds=int(COUNTS["loaded_rounds"]), calls=600)
        print(
            f"   {kind:9s} plain {base:6.2f} us;  added by the run hook {hook:+5.2f} us, "
            f"by nbcoord loaded {loaded:+5.2f} us (ratio {(base + loaded) / base:.3f})"
        )
        figures.append((kind, base, hook, loaded))
    sess.close()
    for kind, base, hook, loaded in figures:
        result(
            "trivial sess.run" if kind == "run" else "trivial prepared callable (the QueueRunner path)",
            base + loaded,
            base,
            "us",
            target=f"<= {RUN_TARGET_US:g} us added",
            met=loaded <= RUN_TARGET_US,
            vs="plain TensorFlow, same process",
            note=f"added {loaded:+.2f} us (median paired difference); the run hook alone {hook:+.2f} us",
        )

    def noop(*_args: object) -> None:
        return None

    hooked = RunTracker().make_hook(noop)
    bare = min(per_call_us(lambda: noop(None, None, {}, [], [], None), 200_000) for _ in range(3))
    wrapped = min(per_call_us(lambda: hooked(None, None, {}, [], [], None), 200_000) for _ in range(3))
    print(f"   the run hook alone around a no-op: {(wrapped - bare) * 1000:.0f} ns per run")


# ------------------------------------------------------------------------------------------ 2. pipeline
def pipeline_rate(settle: float, seconds: float) -> float:
    graph = tf.Graph()
    with graph.as_default():
        q = tf.compat.v1.FIFOQueue(1000, tf.float32, shapes=[[]])
        qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.constant(1.0))] * 2)
        batch = q.dequeue_many(100)
    sess = tf.compat.v1.Session(graph=graph)
    coord = tf.compat.v1.train.Coordinator()
    threads = qr.create_threads(sess, coord=coord, start=True)
    take = sess.make_callable(batch)
    start = time.perf_counter()
    while time.perf_counter() - start < settle:  # past the monitor's first ticks (one-time preparations)
        take()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        take()
        count += 100
    rate = count / (time.perf_counter() - start)
    coord.request_stop()
    coord.join(threads)
    sess.close()
    return rate


def bench_pipeline() -> None:
    plain: list[float] = []
    ours: list[float] = []
    ratios: list[float] = []
    pairs, seconds = int(COUNTS["pipeline_pairs"]), COUNTS["pipeline_s"]
    for index in range(pairs):
        order = (False, True) if index % 2 == 0 else (True, False)
        got: dict[bool, float] = {}
        for on in order:
            with nbcoord_loaded(on):
                got[on] = pipeline_rate(settle=seconds, seconds=seconds)
        plain.append(got[False])
        ours.append(got[True])
        ratios.append(got[True] / got[False])
    print(
        f"2. QueueRunner pipeline, 2 runner threads, elements/s ({pairs} pairs of {seconds:g} s runs after "
        f"{seconds:g} s, alternating)"
    )
    print(
        f"   plain {statistics.median(plain):9.0f}  nbcoord/plain: median {statistics.median(ratios):.3f} "
        f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    ratio = statistics.median(ratios)
    result(
        "QueueRunner pipeline throughput, 2 runner threads",
        statistics.median(ours),
        statistics.median(plain),
        "elements/s",
        target=f">= {PIPELINE_TARGET:g} x plain",
        met=ratio >= PIPELINE_TARGET,
        vs="plain TensorFlow, same process",
        ratio=ratio,
        note=f"ratio: median of {pairs} alternating pairs",
    )


# ------------------------------------------------------------------------------------------- 3. polling
def bench_polling() -> None:
    print("3. polling queue sizes (median ms per poll of all queues)")
    figure = (math.nan, math.nan, math.nan)
    with nbcoord_loaded(True):
        integration = tf_integration.current()
        assert integration is not None
        for count in (1, 10, 100):
            graph = tf.Graph()
            with graph.as_default():
                queues = [tf.compat.v1.FIFOQueue(10, tf.float32, name=f"q{i}") for i in range(count)]
                sizes = [q.size() for q in queues]
            sess = tf.compat.v1.Session(graph=graph)
            info = integration.objects.session_info(sess)
            assert info is not None
            integration.objects.poll(info)  # builds the callable once

            def poll(info: Any = info) -> None:
                integration.objects.poll(info)

            ours = statistics.median(per_call_us(poll, 20) for _ in range(5)) / 1000

            def together_run(sess: Any = sess, sizes: list[Any] = sizes) -> None:
                sess.run(sizes)

            def one_by_one_run(sess: Any = sess, sizes: list[Any] = sizes) -> None:
                for size in sizes:
                    sess.run(size)

            together = statistics.median(per_call_us(together_run, 20) for _ in range(5)) / 1000
            one_by_one = statistics.median(per_call_us(one_by_one_run, 5) for _ in range(3)) / 1000
            print(
                f"   {count:3d} queues: nbcoord poll {ours:6.3f}  sess.run(all sizes) {together:6.3f}  "
                f"one by one {one_by_one:7.3f}  (ratio to one by one {ours / one_by_one:.3f})"
            )
            sess.close()
            if count == 100:
                figure = (ours, one_by_one, together)
    ours, one_by_one, together = figure
    result(
        "polling 100 queue sizes, nbcoord's prepared callable",
        ours,
        one_by_one,
        "ms",
        vs="sess.run of each size op, one by one",
        note=f"one sess.run of all 100 size ops: {together:.2f} ms",
    )


# ---------------------------------------------------------------------------------------------- 4. stop
def blocked_runners(with_coord: bool) -> tuple[Any, list[Any], list[threading.Thread]]:
    """10 runners x 4 threads, each blocked enqueuing into a full queue (capacity 2)."""
    graph = tf.Graph()
    with graph.as_default():
        runners = []
        for i in range(10):
            q = tf.compat.v1.FIFOQueue(2, tf.float32, name=f"full{i}")
            runners.append(tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.constant(1.0))] * 4))
        sizes = [r.queue.size() for r in runners]
    sess = tf.compat.v1.Session(graph=graph)
    coords: list[Any] = []
    threads: list[threading.Thread] = []
    for runner in runners:
        coord = tf.compat.v1.train.Coordinator() if with_coord else None
        threads += runner.create_threads(sess, coord=coord, daemon=True, start=True)
        if coord is not None:
            coords.append(coord)
    deadline = time.monotonic() + 20
    while min(sess.run(sizes)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # let every thread reach its blocked enqueue
    integration = tf_integration.current()
    if integration is not None and integration.active:
        for _ in range(6):  # what the monitor does within its first seconds: prepares the runners' closes
            integration.tick()
    return sess, coords, threads


def bench_stop() -> None:
    rounds = int(COUNTS["stop_rounds"])
    plain_ms: list[float] = []
    for _ in range(rounds):
        sess, coords, threads = blocked_runners(with_coord=True)
        start = time.perf_counter()
        for coord in coords:
            coord.request_stop()
        for coord in coords:
            coord.join(threads=None)
        plain_ms.append((time.perf_counter() - start) * 1000)
        assert not any(t.is_alive() for t in threads)
        sess.close()
    ours: dict[bool, list[float]] = {False: [], True: []}
    with nbcoord_loaded(True):
        for _ in range(rounds):
            for with_coord in (True, False):
                sess, _coords, threads = blocked_runners(with_coord)
                report = nbcoord.stop_all(grace=2.0)
                ours[with_coord].append(report["took_s"] * 1000)
                assert not report["alive"], report["alive"]
                sess.close()
    plain = statistics.median(plain_ms)
    print(f"4. stop latency, 10 runners x 4 threads blocked on full queues (median of {rounds}, ms)")
    print(f"   plain request_stop + join per coordinator      {plain:7.1f}")
    for with_coord, words in ((True, "with coordinators   "), (False, "without coordinators")):
        value = statistics.median(ours[with_coord])
        print(f"   nbcoord stop_all, runners {words} {value:7.1f}  ratio {value / plain:.2f}")
    for with_coord, words in ((True, "with"), (False, "without")):
        value = statistics.median(ours[with_coord])
        result(
            f"stop_all(), 10 QueueRunners x 4 threads blocked on full queues, {words} coordinators",
            value,
            plain,
            "ms",
            target=f"<= {STOP_TARGET_MS:g} ms",
            met=value <= STOP_TARGET_MS,
            vs="request_stop + join per coordinator, plain TensorFlow",
        )


# ----------------------------------------------------------------------------------------- 5. interrupt
def interrupt_latency(on: bool) -> tuple[str, float | None]:
    """What happened, and the ms from SIGINT to KeyboardInterrupt (None: no KeyboardInterrupt)."""
    graph = tf.Graph()
    with graph.as_default():
        q = tf.compat.v1.FIFOQueue(10, tf.float32)
        deq, close = q.dequeue(), q.close()
    sess = tf.compat.v1.Session(graph=graph)
    sent: list[float] = []

    def interrupt() -> None:
        time.sleep(0.3)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)
        if not on:
            sess.run(close)  # plain TensorFlow never returns: free the main thread

    helper = threading.Thread(target=interrupt, name="interrupter")
    helper.start()
    latency: float | None = None
    try:
        sess.run(deq)
        outcome = "returned"
    except KeyboardInterrupt:
        latency = (time.perf_counter() - sent[0]) * 1000
        outcome = f"KeyboardInterrupt after {latency:.1f} ms"
    except Exception as exc:
        outcome = f"{type(exc).__name__} after {(time.perf_counter() - sent[0]) * 1000:.0f} ms (freed by close)"
    try:
        helper.join()
    except KeyboardInterrupt:  # plain: the pending KeyboardInterrupt may land here
        helper.join()
    sess.close()
    return outcome, latency


def bench_interrupt() -> None:
    print("5. Interrupt of a main thread blocked in sess.run on an empty queue")
    latencies: dict[bool, list[float | None]] = {}
    for on in (False, True):
        with nbcoord_loaded(on):
            runs = [interrupt_latency(on) for _ in range(1 if not on else int(COUNTS["interrupts"]))]
        print(f"   {label(on):7s}: " + "; ".join(outcome for outcome, _ in runs))
        latencies[on] = [latency for _, latency in runs]
    ours = [latency for latency in latencies[True] if latency is not None]
    plain = latencies[False][0]
    result(
        "Interrupt of sess.run blocked on an empty queue",
        statistics.median(ours) if len(ours) == len(latencies[True]) else None,  # None: one never landed
        plain,
        "ms",
        vs="plain TensorFlow",
        note="plain: the interrupt never lands (freed by closing the queue after 1 s)" if plain is None else "",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter pipeline runs")
    if parser.parse_args().quick:
        COUNTS.update(QUICK)
    started = time.perf_counter()
    print(f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    bench_trivial_runs()
    bench_pipeline()
    bench_polling()
    bench_stop()
    bench_interrupt()
    print(f"(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
