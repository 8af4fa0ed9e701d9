"""A stuck input pipeline, found and restarted (S8), in real kernels on real TensorFlow (CPU build).

Before, nbcoord showed idle times and nothing more: no runner thread's last progress, no "stuck", and no way
to restart a session's queue runners but stopping them and re-running the cells that built them.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from helpers import Kernel, marked_json, wait_until
from tf_support import tf_kernel_params

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]


#: The module's kernel (conftest's ``kernel``), one per TensorFlow release: a graph-mode kernel whose runner threads
#: count as stuck after 1 s without progress.
KERNEL_OPTIONS = tf_kernel_params(
    after="""
    import json, threading, time
    import numpy as np
    import nbcoord
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    integration = nbcoord.tensorflow.integration.current()
    integration.stuck_after_s = 1.0
    def runner_rows():
        return [r for s in nbcoord.snapshot()["sessions"] for r in s.get("runners", [])]
    %nbcoord config monitor_interval=0.2
    """
)


def stuck_rows(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate("[r for r in runner_rows() if r['stuck']]")
    return rows


def test_a_runner_waiting_on_an_empty_upstream_queue_is_stuck_and_one_on_a_full_queue_is_not(kernel: Kernel) -> None:
    kernel.run(
        textwrap.dedent("""
        tf.compat.v1.reset_default_graph()
        raw = tf.compat.v1.FIFOQueue(10, tf.float32, name="raw")
        parsed = tf.compat.v1.FIFOQueue(10, tf.float32, name="parsed")
        full = tf.compat.v1.FIFOQueue(2, tf.float32, name="full")
        parse = tf.compat.v1.train.QueueRunner(parsed, [parsed.enqueue(raw.dequeue() * 2)])
        fill = tf.compat.v1.train.QueueRunner(full, [full.enqueue(1.0)])
        sess = tf.compat.v1.Session()
        coord = tf.compat.v1.train.Coordinator()
        threads = [t for r in (parse, fill) for t in r.create_threads(sess, coord=coord, start=True)]
        sess.run(raw.enqueue_many([[1.0, 2.0, 3.0]]))
        """),
    )
    (row,) = wait_until(lambda: stuck_rows(kernel), 20, interval=0.2, what="the parse runner to be stuck")
    assert row["name"].startswith("QueueRunnerThread-parsed") and row["runner"] == "parsed", row
    assert row["queue_name"] == "parsed" and row["coordinator"] is not None and row["runs"] == 3, row
    assert row["waits_on"].startswith("dequeue of queue `raw` (0 of 10 elements, no live producer"), row
    assert "is stuck: no enqueue for " in row["text"] and "while queue `parsed` had room" in row["text"], row
    assert row["last_progress"] <= row["since"] + 0.2
    rows = {r["name"]: r for r in kernel.evaluate("runner_rows()")}
    blocked_on_full = [r for name, r in rows.items() if name.startswith("QueueRunnerThread-full")]
    assert blocked_on_full and not any(r["stuck"] for r in blocked_on_full), "a full queue is its consumer's fault"
    queues = {q["name"]: q for q in kernel.evaluate("nbcoord.snapshot()['queues']")}
    assert queues["parsed"]["stuck_runners"] == 1 and queues["full"]["stuck_runners"] == 0
    session = kernel.evaluate("nbcoord.snapshot()['sessions']")[-1]
    assert session["stuck_runners"] == 1 and session["restartable"] is True
    kernel.run("nbcoord.stop_all(grace=2.0); sess.close()")


def test_a_runner_inside_a_slow_op_is_stuck_on_its_own_enqueue_op(kernel: Kernel) -> None:
    kernel.run(
        textwrap.dedent("""
        tf.compat.v1.reset_default_graph()
        release = threading.Event()
        def slow():
            release.wait(30)
            return np.float32(1.0)
        out = tf.compat.v1.FIFOQueue(10, tf.float32, name="slow_out")
        slowqr = tf.compat.v1.train.QueueRunner(
            out, [out.enqueue(tf.compat.v1.py_func(slow, [], tf.float32, stateful=True), name="read_slowly")]
        )
        sess = tf.compat.v1.Session()
        threads = slowqr.create_threads(sess, start=True)
        """),
    )
    (row,) = wait_until(lambda: stuck_rows(kernel), 20, interval=0.2, what="the slow runner to be stuck")
    assert row["waits_on"].startswith("`read_slowly` (no queue upstream explains the wait"), row
    kernel.run("release.set(); [t.join(5) for t in threads]; sess.close()")


def test_restart_stops_resets_and_starts_a_sessions_runners_with_a_fresh_coordinator(kernel: Kernel) -> None:
    kernel.run(
        textwrap.dedent("""
        tf.compat.v1.reset_default_graph()
        raw = tf.compat.v1.FIFOQueue(10, tf.float32, name="raw")
        parsed = tf.compat.v1.FIFOQueue(10, tf.float32, name="parsed")
        parse = tf.compat.v1.train.QueueRunner(parsed, [parsed.enqueue(raw.dequeue() * 2)] * 2)
        tf.compat.v1.train.add_queue_runner(parse)
        sess = tf.compat.v1.Session()
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
        feed = raw.enqueue_many([[1.0, 2.0, 3.0]])
        sess.run(feed)
        """),
    )
    wait_until(lambda: stuck_rows(kernel), 20, interval=0.2, what="the runner to be stuck")
    result = kernel.run(
        textwrap.dedent("""
        sid = nbcoord.snapshot()["sessions"][-1]["id"]
        report = integration.restart_runners(sid)
        print(report["text"])
        print("@@" + json.dumps(report))
        """),
    )
    report = marked_json(result)
    assert len(report["stopped"]) == 3 and report["alive"] == [] and report["errors"] == [], report
    reset = {q["queue"]: q for q in report["queues_reset"]}
    assert reset["parsed"] == {"queue": "parsed", "dropped": 3, "reopened": True}, reset
    assert reset["raw"]["reopened"] is True, reset
    (restarted,) = report["restarted"]
    assert restarted["runner"] == "parsed" and len(restarted["threads"]) == 3 and len(restarted["tids"]) == 3
    assert report["coordinator"] not in (None, kernel.evaluate("nbcoord.tensorflow.integration.current()"
                                                             ".objects.coord_info(coord).cid"))
    assert "QueueRunner `parsed`: QueueRunnerThread-parsed" in result.stdout, result.stdout
    assert kernel.evaluate("[t.is_alive() for t in threads]") == [False, False, False]
    assert kernel.evaluate("nbcoord.snapshot()['last_stop']['scope']") == "threads", "through the one stop"
    flows = kernel.evaluate("[sess.run(feed), [float(sess.run(parsed.dequeue())) for _ in range(3)]][1]")
    assert sorted(flows) == [2.0, 4.0, 6.0]
    fresh = kernel.evaluate(f"integration.coordinator({report['coordinator']!r}).should_stop()")
    assert fresh is False
    # The restarted runners wait on `raw` again: a coordinator's stop would not wake them (TensorFlow closes only
    # the runner's own queue), nbcoord's does.
    stop = kernel.evaluate("nbcoord.stop_all(grace=2.0)")
    assert len(stop["stopped"]) == 3 and stop["alive"] == [], stop
    kernel.run("sess.close()")
    bad = kernel.run("integration.restart_runners('s999')", allow_error=True)
    assert bad.errors and bad.errors[0]["ename"] == "ValueError" and "s999" in bad.errors[0]["evalue"]
