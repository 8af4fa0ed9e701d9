"""TF2's default mode (S10): eager ``tf.queue`` queues, in real kernels on real TensorFlow (CPU build).

Before nbcoord followed eager queues, Interrupt of a cell blocked in an eager ``q.dequeue()`` did nothing (only a
kernel restart freed it), and a thread blocked in ``q.enqueue()`` on a full eager queue "ignored the stop request
at gen_data_flow_ops.py ... queue_enqueue_v2", at ``%nbcoord stop`` and at shutdown alike.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import Kernel, marked_json, wait_until
from tf_support import collect_interrupted, shutdown_exit_status, submit_blocked, tf_kernel_params

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]


#: The module's kernel (conftest's ``kernel``), one per TensorFlow release: TensorFlow 2's default (eager) mode,
#: nbcoord loaded first.
KERNEL_OPTIONS = tf_kernel_params(
    after="""
    import json, threading, time
    import nbcoord
    import tensorflow as tf
    assert tf.executing_eagerly()
    """
)


def test_eager_queues_are_registered_like_graph_ones(kernel: Kernel) -> None:
    result = kernel.run(
        textwrap.dedent("""
        reg = tf.queue.FIFOQueue(10, tf.float32, name="registered")
        for value in (1.0, 2.0, 3.0):
            reg.enqueue(value)
        unnamed = tf.queue.RandomShuffleQueue(8, 2, tf.int32)
        rows = {r["name"]: r for r in nbcoord.snapshot()["queues"] if r["mode"] == "eager"}
        print("@@" + json.dumps(rows))
        """),
    )
    rows = marked_json(result)
    row = rows["registered"]
    assert (row["capacity"], row["size"], row["closed"], row["type"]) == (10, 3, False, "FIFOQueue"), row
    assert row["cell"] is not None and row["session"] is None and row["polled"] is True
    (shuffle,) = [r for name, r in rows.items() if name.startswith("RandomShuffleQueue q")]
    assert (shuffle["capacity"], shuffle["size"]) == (8, 0)
    report = kernel.run("%nbcoord").stdout
    assert "registered: 3 of 10 (open" in report, report


def test_interrupt_ends_a_main_thread_blocked_in_an_eager_dequeue(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run("starved = tf.queue.FIFOQueue(10, tf.float32, name='starved')")
    cell, (row,) = submit_blocked(kernel, tmp_path, "starved.dequeue()")
    assert row["thread"] == "MainThread" and row["queue_name"] == "starved", row
    assert "in dequeue of eager queue `starved` (0 of 10 elements, no live producer)" in row["text"], row
    kernel.interrupt()
    result = collect_interrupted(kernel, cell)
    assert result.errors and result.errors[0]["ename"] == "KeyboardInterrupt", result.errors
    sentence = result.errors[0]["evalue"]
    assert "dequeue of eager queue `starved`" in sentence and "is now closed" in sentence, sentence
    frames = "".join(result.errors[0]["traceback"])
    assert "tensorflow/python" not in frames and "nbcoord/" not in frames, "only the cell's frames"
    later = kernel.run("starved.enqueue(1.0)", allow_error=True)
    assert later.errors and later.errors[0]["ename"] == "CancelledError"
    text = "".join(later.errors[0]["traceback"])
    assert "nbcoord: eager queue `starved` was closed" in text and "Interrupt" in text, text


def test_stop_ends_threads_blocked_on_a_full_and_an_empty_eager_queue(kernel: Kernel) -> None:
    kernel.run(
        textwrap.dedent("""
        full = tf.queue.FIFOQueue(2, tf.float32, name="full")
        empty = tf.queue.FIFOQueue(2, tf.float32, name="empty")
        def produce():
            while True:
                full.enqueue(1.0)
        def consume():
            while True:
                empty.dequeue()
        def polite():  # the user's own handling of a closed queue keeps working
            try:
                while True:
                    full.enqueue(2.0)
            except tf.errors.CancelledError:
                print("polite producer ended on CancelledError")
        empty.enqueue(0.0)
        workers = [threading.Thread(target=f, name=f.__name__) for f in (produce, consume, polite)]
        for w in workers:
            w.start()
        """),
    )

    def blocked() -> list[str]:
        rows = kernel.evaluate("[r['thread'] for r in nbcoord.snapshot()['blocked_runs']]")
        return rows if {"produce", "consume", "polite"} <= set(rows) else []

    wait_until(blocked, 20, interval=0.2, what="three threads blocked on eager queues")
    stop = kernel.run("%nbcoord stop").stdout
    assert "3 stopped, 0 still alive" in stop, stop
    assert kernel.evaluate("[w.is_alive() for w in workers]") == [False, False, False]
    after = kernel.run("print('next')")
    assert "failed" not in after.stderr, "a thread nbcoord stopped is reported as stopped, not as failed"
    failures = kernel.evaluate("[f['thread_name'] for f in nbcoord.snapshot()['failures']]")
    assert not {"produce", "consume", "polite"} & set(failures), failures
    rows = {r["name"]: r for r in kernel.evaluate("nbcoord.snapshot()['queues']")}
    assert rows["full"]["closed"] and rows["empty"]["closed"]


#: A kernel without the diagnostics cell whose thread blocks on a full eager queue.
BLOCKED_ON_A_FULL_QUEUE = tf_kernel_params(
    setup="",
    after="""
    import threading
    import tensorflow as tf
    q = tf.queue.FIFOQueue(2, tf.float32)
    def produce():
        while True:
            q.enqueue(1.0)
    producer = threading.Thread(target=produce, name="producer")  # non-daemon
    producer.start()
    """,
)


@pytest.mark.parametrize("own_kernel", BLOCKED_ON_A_FULL_QUEUE, indirect=True)
def test_shutdown_with_a_thread_blocked_on_a_full_eager_queue_exits_cleanly(own_kernel: Kernel) -> None:
    assert shutdown_exit_status(own_kernel, "int(q.size())", 2) == 0
