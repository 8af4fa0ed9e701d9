"""What the TensorFlow integration costs, and what it buys, measured with and without nbcoord in one process.

Run: ``python bench/bench_tensorflow.py`` (about a minute on 2 cores). nbcoord is loaded into an in-process
IPython shell and unloaded again between measurements, so both sides run in the same process, alternately:

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
"""

from __future__ import annotations

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

from IPython.core.interactiveshell import InteractiveShell

import nbcoord
from nbcoord.integrations import tensorflow as tf_integration
from nbcoord.integrations._tf_runs import RunTracker

shell = InteractiveShell.instance()


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
    for kind, fn in (("run", lambda: sess.run(c)), ("callable", callable_)):
        base, hook = paired(fn, "hook", rounds=80, calls=300)
        _, loaded = paired(fn, "nbcoord", rounds=20, calls=600)
        print(
            f"   {kind:9s} plain {base:6.2f} us;  added by the run hook {hook:+5.2f} us, "
            f"by nbcoord loaded {loaded:+5.2f} us (ratio {(base + loaded) / base:.3f})"
        )
    sess.close()

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
    ratios: list[float] = []
    for index in range(4):
        order = (False, True) if index % 2 == 0 else (True, False)
        got: dict[bool, float] = {}
        for on in order:
            with nbcoord_loaded(on):
                got[on] = pipeline_rate(settle=1.5, seconds=1.5)
        plain.append(got[False])
        ratios.append(got[True] / got[False])
    print("2. QueueRunner pipeline, 2 runner threads, elements/s (4 pairs of 1.5 s runs after 1.5 s, alternating)")
    print(
        f"   plain {statistics.median(plain):9.0f}  nbcoord/plain: median {statistics.median(ratios):.3f} "
        f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


# ------------------------------------------------------------------------------------------- 3. polling
def bench_polling() -> None:
    print("3. polling queue sizes (median ms per poll of all queues)")
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
    plain_ms: list[float] = []
    for _ in range(5):
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
        for _ in range(5):
            for with_coord in (True, False):
                sess, _coords, threads = blocked_runners(with_coord)
                report = nbcoord.stop_all(grace=2.0)
                ours[with_coord].append(report["took_s"] * 1000)
                assert not report["alive"], report["alive"]
                sess.close()
    plain = statistics.median(plain_ms)
    print("4. stop latency, 10 runners x 4 threads blocked on full queues (median of 5, ms)")
    print(f"   plain request_stop + join per coordinator      {plain:7.1f}")
    for with_coord, words in ((True, "with coordinators   "), (False, "without coordinators")):
        value = statistics.median(ours[with_coord])
        print(f"   nbcoord stop_all, runners {words} {value:7.1f}  ratio {value / plain:.2f}")


# ----------------------------------------------------------------------------------------- 5. interrupt
def interrupt_latency(on: bool) -> str:
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
    try:
        sess.run(deq)
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = f"KeyboardInterrupt after {(time.perf_counter() - sent[0]) * 1000:.1f} ms"
    except Exception as exc:
        outcome = f"{type(exc).__name__} after {(time.perf_counter() - sent[0]) * 1000:.0f} ms (freed by close)"
    try:
        helper.join()
    except KeyboardInterrupt:  # plain: the pending KeyboardInterrupt may land here
        helper.join()
    sess.close()
    return outcome


def bench_interrupt() -> None:
    print("5. Interrupt of a main thread blocked in sess.run on an empty queue")
    for on in (False, True):
        with nbcoord_loaded(on):
            outcomes = [interrupt_latency(on) for _ in range(1 if not on else 3)]
        print(f"   {label(on):7s}: " + "; ".join(outcomes))


def main() -> None:
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
