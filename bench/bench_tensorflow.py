"""What the TensorFlow integration costs, and what it buys, measured with and without nbcoord in one process.

Run: ``python bench/bench_tensorflow.py [--quick]`` (about a minute on 2 cores; ``--quick``: fewer rounds).
nbcoord is loaded into an in-process IPython shell and unloaded again between measurements, so both sides run
in the same process, alternately:

1. a trivial ``sess.run`` (and a prepared callable, the QueueRunner path): the calling thread's CPU time per call
   plain, with only the run hook patched in, and with nbcoord loaded (target: <= 1 us added), in many alternating
   pairs of blocks; the figure is the median paired difference with its 95% interval (distribution-free, from
   the order statistics of the pairs). Wall time per call is printed too: on a shared machine its spread is
   several us, larger than the effect, which is why CPU time decides;
2. a QueueRunner pipeline: 2 runner threads enqueuing one element per run, the main thread dequeuing batches:
   elements/s and the process's CPU time per element, plain and with nbcoord, in alternating pairs of runs; the
   ratios' medians with their 95% intervals (target: throughput >= 0.99 x plain, decided only when the interval
   is on one side of it);
3. polling 1/10/100 queues: one prepared callable per session (nbcoord's poll) against ``sess.run`` of the size
   ops together and one by one;
4. stop latency, 10 runners x 4 threads blocked on full queues: nbcoord's stop (runners with and without a
   coordinator) against ``request_stop`` + ``join`` per coordinator, plain TensorFlow (target: <= 50 ms);
5. Interrupt latency for a main thread blocked in ``sess.run`` on an empty queue (plain: never; the bench then
   frees it by closing the queue after 1 s), in process (SIGINT to KeyboardInterrupt); the latency a user feels
   (the front end's interrupt request to the cell's reply) is ``bench/bench_tf_interrupt.py``;
6. restart of a stuck pipeline's queue runners (``restart_runners``), against what plain TensorFlow can restart:
   ``request_stop`` + ``join`` + ``create_threads`` with a fresh Coordinator, for runners a coordinator can stop.

The headline figures are also printed as ``RESULT`` lines (bench/_results.py) for bench/run_all.py.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import result
from IPython.core.interactiveshell import InteractiveShell

import nbcoord
from nbcoord.tensorflow import integration as tf_integration
from nbcoord.tensorflow.runs import RunTracker

shell = InteractiveShell.instance()
#: Repeat counts; --quick lowers them (the medians get noisier, the figures stay the same kind).
COUNTS = dict(
    hook_rounds=40, loaded_rounds=40, pipeline_pairs=10, pipeline_s=2.0, stop_rounds=5, interrupts=3, restarts=5
)
QUICK = dict(
    hook_rounds=16, loaded_rounds=10, pipeline_pairs=6, pipeline_s=1.0, stop_rounds=3, interrupts=1, restarts=3
)
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


# ------------------------------------------------------------------------------------------- intervals
def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the sample median and a distribution-free interval for the true median, from order
    statistics (the binomial distribution of how many values fall below it). Needs 6 values or more for 95%."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    k = 0  # the largest k with P(Binomial(n, 1/2) < k) <= tail
    while k + 1 <= n and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= tail:
        k += 1
    low, high = (ordered[k - 1], ordered[n - k]) if k >= 1 else (ordered[0], ordered[-1])
    return statistics.median(ordered), low, high


def interval_text(median: float, low: float, high: float, unit: str = "", digits: int = 2) -> str:
    return f"{median:+.{digits}f}{unit} [{low:+.{digits}f}, {high:+.{digits}f}]"


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


def per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(CPU time of the calling thread, wall time) per call, in us."""
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.thread_time() - cpu) / calls * 1e6, (time.perf_counter() - wall) / calls * 1e6


def paired(fn: Callable[[], object], other: str, rounds: int, calls: int) -> dict[str, Any]:
    """Plain per-call figures and the paired differences ``other - plain``, CPU and wall, over ``rounds`` pairs.

    Each pair measures both sides back to back, in alternating order, so that the load of other processes
    (which changes over tenths of a second) falls on both alike.
    """
    plain_cpu: list[float] = []
    cpu: list[float] = []
    wall: list[float] = []
    for index in range(rounds):
        order = ("plain", other) if index % 2 == 0 else (other, "plain")
        got: dict[str, tuple[float, float]] = {}
        for name in order:
            with mode(name):
                # Loading scans every object for TensorFlow's and allocates: the garbage collection that follows
                # would land in the measured block. Collect first, on both sides: the steady state is measured.
                if other == "nbcoord":
                    gc.collect()
                per_call(fn, calls // 4)  # settle: caches refill
                got[name] = per_call(fn, calls)
        plain_cpu.append(got["plain"][0])
        cpu.append(got[other][0] - got["plain"][0])
        wall.append(got[other][1] - got["plain"][1])
    return {"plain_cpu": statistics.median(plain_cpu), "cpu": median_interval(cpu), "wall": median_interval(wall)}


def bench_trivial_runs() -> None:
    graph = tf.Graph()
    with graph.as_default():
        c = tf.constant(1.0)
        nop = tf.no_op()
    sess = tf.compat.v1.Session(graph=graph)
    callable_ = sess.make_callable(nop)
    for _ in range(1000):
        sess.run(c)
        callable_()
    print("1. trivial session runs: the calling thread's CPU time per call, plain, and added (median paired")
    print("   difference [95% interval]); wall time added for comparison")
    figures = []
    for kind, fn, calls in (("run", lambda: sess.run(c), 400), ("callable", callable_, 1500)):
        hook = paired(fn, "hook", rounds=int(COUNTS["hook_rounds"]), calls=calls)
        loaded = paired(fn, "nbcoord", rounds=int(COUNTS["loaded_rounds"]), calls=calls)
        print(
            f"   {kind:9s} plain {hook['plain_cpu']:6.2f} us CPU;  run hook {interval_text(*hook['cpu'], ' us')}, "
            f"nbcoord loaded {interval_text(*loaded['cpu'], ' us')};  "
            f"wall added {interval_text(*loaded['wall'], ' us')}"
        )
        figures.append((kind, loaded["plain_cpu"], hook, loaded))
    sess.close()
    for kind, base, hook, loaded in figures:
        added, low, high = loaded["cpu"]
        result(
            "trivial sess.run, CPU time per call"
            if kind == "run"
            else "trivial prepared callable (the QueueRunner path), CPU time per call",
            base + added,
            base,
            "us",
            target=f"<= {RUN_TARGET_US:g} us added",
            met=True if high <= RUN_TARGET_US else False if low > RUN_TARGET_US else None,
            vs="plain TensorFlow, same process, alternating pairs",
            note=f"added {added:+.2f} us [95%: {low:+.2f}, {high:+.2f}] over {COUNTS['loaded_rounds']} "
            f"pairs; the run hook alone {hook['cpu'][0]:+.2f} us; wall added {loaded['wall'][0]:+.2f} us "
            f"[{loaded['wall'][1]:+.2f}, {loaded['wall'][2]:+.2f}]",
        )

    def noop(*_args: object) -> None:
        return None

    hooked = RunTracker().make_hook(noop)
    bare = min(per_call(lambda: noop(None, None, {}, [], [], None), 200_000)[0] for _ in range(3))
    wrapped = min(per_call(lambda: hooked(None, None, {}, [], [], None), 200_000)[0] for _ in range(3))
    print(f"   the run hook alone around a no-op: {(wrapped - bare) * 1000:.0f} ns of CPU per run")


# ------------------------------------------------------------------------------------------ 2. pipeline
def pipeline_rate(settle: float, seconds: float) -> tuple[float, float]:
    """(elements/s, process CPU us per element) of a 2-runner pipeline, after ``settle`` seconds."""
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
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        take()
        count += 100
    rate = count / (time.perf_counter() - start)
    cpu_per = (time.process_time() - cpu) / count * 1e6
    coord.request_stop()
    coord.join(threads)
    sess.close()
    return rate, cpu_per


def bench_pipeline() -> None:
    plain: list[float] = []
    ours: list[float] = []
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    pairs, seconds = int(COUNTS["pipeline_pairs"]), COUNTS["pipeline_s"]
    for index in range(pairs):
        order = (False, True) if index % 2 == 0 else (True, False)
        got: dict[bool, tuple[float, float]] = {}
        for on in order:
            with nbcoord_loaded(on):
                got[on] = pipeline_rate(settle=min(1.0, seconds), seconds=seconds)
        plain.append(got[False][0])
        ours.append(got[True][0])
        ratios.append(got[True][0] / got[False][0])
        cpu_ratios.append(got[True][1] / got[False][1])
    ratio, low, high = median_interval(ratios)
    cpu_ratio, cpu_low, cpu_high = median_interval(cpu_ratios)
    print(
        f"2. QueueRunner pipeline, 2 runner threads ({pairs} alternating pairs of {seconds:g} s runs): plain "
        f"{statistics.median(plain):,.0f} elements/s"
    )
    print(f"   throughput nbcoord/plain: {ratio:.3f} [95%: {low:.3f}, {high:.3f}]")
    print(f"   CPU time per element nbcoord/plain: {cpu_ratio:.3f} [95%: {cpu_low:.3f}, {cpu_high:.3f}]")
    decided = low >= PIPELINE_TARGET or high < PIPELINE_TARGET
    result(
        "QueueRunner pipeline throughput, 2 runner threads",
        statistics.median(ours),
        statistics.median(plain),
        "elements/s",
        target=f">= {PIPELINE_TARGET:g} x plain",
        met=(low >= PIPELINE_TARGET) if decided else None,
        vs="plain TensorFlow, same process",
        ratio=ratio,
        note=f"ratio {ratio:.3f} [95%: {low:.3f}, {high:.3f}] over {pairs} alternating pairs"
        + ("" if decided else " (undecided: the interval straddles the target)")
        + f"; CPU time per element x{cpu_ratio:.3f} [{cpu_low:.3f}, {cpu_high:.3f}]",
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
    # A process started in the background by a shell without job control (nohup ... &) inherits SIGINT ignored,
    # and Python keeps it so: no Interrupt lands, with nbcoord or without (the run hung in sess.run until run_all's
    # timeout). This measures the Interrupt of a process that takes Ctrl-C, as a kernel does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    for on in (False, True):
        # Should an Interrupt with nbcoord never land, every thread's stack goes to the output run_all shows.
        faulthandler.dump_traceback_later(60, repeat=False)
        try:
            with nbcoord_loaded(on):
                runs = [interrupt_latency(on) for _ in range(1 if not on else int(COUNTS["interrupts"]))]
        finally:
            faulthandler.cancel_dump_traceback_later()
        print(f"   {label(on):7s}: " + "; ".join(outcome for outcome, _ in runs))
        latencies[on] = [latency for _, latency in runs]
    signal.signal(signal.SIGINT, previous)
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


# -------------------------------------------------------------------------------------------- 6. restart
def stuck_pipeline() -> tuple[Any, Any, list[threading.Thread]]:
    """A runner (2 threads) that waits on an empty upstream queue: stuck, as far as a coordinator can tell."""
    graph = tf.Graph()
    with graph.as_default():
        raw = tf.compat.v1.FIFOQueue(10, tf.float32, name="raw")
        parsed = tf.compat.v1.FIFOQueue(10, tf.float32, name="parsed")
        qr = tf.compat.v1.train.QueueRunner(parsed, [parsed.enqueue(raw.dequeue() * 2)] * 2)
        feed = raw.enqueue_many([[1.0, 2.0, 3.0]])
    sess = tf.compat.v1.Session(graph=graph)
    coord = tf.compat.v1.train.Coordinator()
    threads = qr.create_threads(sess, coord=coord, daemon=True, start=True)
    sess.run(feed)
    return sess, coord, threads


def bench_restart() -> None:
    rounds = int(COUNTS["restarts"])
    plain_ms: list[float] = []
    for _ in range(rounds):
        graph = tf.Graph()
        with graph.as_default():
            q = tf.compat.v1.FIFOQueue(2, tf.float32)
            qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(1.0)] * 2)
        sess = tf.compat.v1.Session(graph=graph)
        coord = tf.compat.v1.train.Coordinator()
        threads = qr.create_threads(sess, coord=coord, daemon=True, start=True)
        while sess.run(q.size()) < 2:
            time.sleep(0.005)
        start = time.perf_counter()
        coord.request_stop()
        coord.join(threads)
        fresh = tf.compat.v1.train.Coordinator()
        again = qr.create_threads(sess, coord=fresh, daemon=True, start=True)
        plain_ms.append((time.perf_counter() - start) * 1000)
        fresh.request_stop()
        with suppress(tf.errors.CancelledError):  # plain TensorFlow: the queue stays closed, the runners fail
            fresh.join(again)
        sess.close()
    ours_ms: list[float] = []
    with nbcoord_loaded(True):
        integration = tf_integration.current()
        assert integration is not None
        for _ in range(rounds):
            sess, _coord, _threads = stuck_pipeline()
            for _ in range(4):  # what the monitor does within its first seconds: prepares the runners' closes
                integration.tick()
            info = integration.objects.session_info(sess)
            assert info is not None
            report = integration.restart_runners(info.sid, grace=2.0)
            assert not report["alive"] and not report["errors"], report
            ours_ms.append(report["took_s"] * 1000)
            nbcoord.stop_all(grace=2.0)
            sess.close()
    plain, ours = statistics.median(plain_ms), statistics.median(ours_ms)
    print(f"6. restart of a session's queue runners (median of {rounds}, ms)")
    print(f"   plain request_stop + join + create_threads, runners on a full queue   {plain:7.1f}")
    print(f"   nbcoord restart_runners, runners stuck on an empty upstream queue      {ours:7.1f}")
    result(
        "restart a stuck pipeline's QueueRunners (2 threads): stop, reset the queues, start",
        ours,
        plain,
        "ms",
        vs="plain request_stop + join + create_threads of stoppable runners (a stuck one never stops there)",
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
    bench_restart()
    print(f"(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
