"""The TensorFlow integration, scenario by scenario (S1-S8, as the demo notebooks name them), with real TensorFlow
in graph mode.

Three real kernels: one shared by most tests (nbcoord loaded first, TensorFlow imported later in the same cell
as the first Session), one where TensorFlow and its objects exist before the load (found by the scan; unload
restores every patch; the same scenario without nbcoord prints the errors nbcoord prevents), and one that is
shut down with live non-daemon runner threads. Each test on the shared kernel builds its own graph and stops
what it started.

Every kernel runs on each TensorFlow release the package claims (:data:`TF_KERNELS`): tensorflow-cpu 2.21 in
``.venv``, and the oldest claimed, 2.15, in ``.venv-tf215`` (``NBCOORD_TF215_PYTHON``; ``tools/dev.py test``
builds it); the TensorFlow test modules share their kernels' set-up through ``tf_support``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import CellResult, Kernel, marked_json, wait_until
from tf_support import collect_interrupted, shutdown_exit_status, submit_blocked, tf_kernel_params

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

#: Errors that runner threads outliving their session (or stopped badly) print.
RUNNER_ERRORS = (
    "closed Session",
    "Session has been closed",
    "Exception in QueueRunner",
    "Run call was cancelled",
    "Traceback",
    "CancelledError",
    "is closed",
)


def assert_quiet(result: CellResult) -> None:
    found = [word for word in RUNNER_ERRORS if word in result.text]
    assert not found, f"runner errors printed ({found}):\n{result.text}"


#: The module's kernel (conftest's ``kernel``): one per TensorFlow release, nbcoord loaded, shared by the tests of
#: this module that can share it.
KERNEL_OPTIONS = tf_kernel_params()


@pytest.fixture(scope="module")
def tf_setup(kernel: Kernel) -> tuple[Kernel, dict[str, Any]]:
    """The shared kernel once TensorFlow is imported there, in the same cell as the first Session."""
    result = kernel.run(
        textwrap.dedent("""
        import json, os, sys, threading, time
        import numpy as np
        import nbcoord
        from nbcoord.core import imports as _imports
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
        q0 = tf.compat.v1.FIFOQueue(7, tf.float32, name="first")
        sess0 = tf.compat.v1.Session()
        sess0.run(q0.enqueue(1.0))
        snap = nbcoord.snapshot()
        print("@@" + json.dumps({
            "sessions": snap["sessions"],
            "queues": snap["queues"],
            "hook_left": _imports.watching("tensorflow"),
        }))
        sess0.close()
        """),
    )
    return kernel, marked_json(result)


@pytest.fixture(scope="module")
def tf_kernel(tf_setup: tuple[Kernel, dict[str, Any]]) -> Kernel:
    return tf_setup[0]


def fresh_graph(kernel: Kernel) -> None:
    kernel.run("tf.compat.v1.reset_default_graph()")


def stop_all(kernel: Kernel) -> dict[str, Any]:
    report: dict[str, Any] = kernel.evaluate("nbcoord.stop_all(grace=2.0)")
    return report


# ------------------------------------------------------------------------------------------ registration
def test_loading_does_not_import_tensorflow(kernel: Kernel) -> None:
    """Runs before any test imports TensorFlow in the shared kernel (tests run in file order)."""
    hooked = "__import__('nbcoord.core.imports').core.imports.hook_installed()"
    assert kernel.evaluate("'tensorflow' in __import__('sys').modules") is False
    assert kernel.evaluate(hooked) is True
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate(hooked) is False, "unload removes the post-import hook"
    kernel.run("%load_ext nbcoord")
    assert kernel.evaluate(hooked) is True


def test_tensorflow_imported_after_load_in_the_same_cell_as_the_first_session(
    tf_setup: tuple[Kernel, dict[str, Any]],
) -> None:
    first = tf_setup[1]
    assert [s["closed"] for s in first["sessions"]] == [False]
    (queue,) = first["queues"]
    assert (queue["name"], queue["capacity"], queue["size"], queue["closed"]) == ("first", 7, 1, False)
    assert queue["session"] == first["sessions"][0]["id"]
    assert queue["cell"] == first["sessions"][0]["cell"] is not None
    # The finder itself stays while the ledger waits for other modules (joblib, torch): TensorFlow's hook is gone.
    assert first["hook_left"] is False, "the post-import hook for tensorflow must be forgotten once it fired"


def test_polling_ops_are_built_once_outside_the_users_context(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        counter = tf.compat.v1.get_variable("counter", initializer=0, use_resource=True)
        step = counter.assign_add(1)
        with tf.control_dependencies([step]), tf.name_scope("user_scope"):
            q = tf.compat.v1.FIFOQueue(5, tf.float32, name="under_deps")
        graph = tf.compat.v1.get_default_graph()
        every_op = type(graph).__mro__[1].get_operations  # TensorFlow's own list, under nbcoord's filter
        ours = [op for op in every_op(graph) if op.name.startswith("nbcoord/")]
        sess = tf.compat.v1.Session()
        before = len(every_op(graph))
        for _ in range(3):
            nbcoord.snapshot()
        print("@@" + json.dumps({
            "ops": [[op.name, op.type, step.op in op.control_inputs] for op in ours],
            "grown": len(every_op(graph)) - before,
        }))
        sess.close()
        """),
    )
    built = marked_json(result)
    types = sorted(op_type for _name, op_type, _deps in built["ops"])
    assert types == ["DestroyResourceOp", "QueueCloseV2", "QueueIsClosedV2", "QueueSizeV2"], built
    assert all(name.startswith("nbcoord/user_scope_under_deps_") for name, _t, _d in built["ops"]), built
    assert not any(deps for _n, _t, deps in built["ops"]), "no op of nbcoord's takes the user's control dependency"
    assert built["grown"] == 0, "polling adds nothing to the graph"


def test_the_users_graph_stays_the_users_in_counts_and_exports(tf_kernel: Kernel, tmp_path: Path) -> None:
    """Part 5: nbcoord's polling ops are the session's; a graph with one FIFOQueue has one op, and exports it alone
    (``as_graph_def``, ``export_meta_graph``, ``write_graph``, a SavedModel). Before: 5 ops, all exported."""
    result = tf_kernel.run(
        textwrap.dedent(f"""
        graph = tf.Graph()
        with graph.as_default():
            q = tf.compat.v1.FIFOQueue(5, tf.float32, name="only")
            size = q.size()
        sess = tf.compat.v1.Session(graph=graph)
        size_before = int(sess.run(size))
        nbcoord.snapshot()  # nbcoord polls the queue through its own (hidden) ops
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
        tf.io.write_graph(graph, {str(tmp_path)!r}, "graph.pbtxt")
        builder = tf.compat.v1.saved_model.Builder({str(tmp_path / "saved")!r})
        with graph.as_default():
            builder.add_meta_graph_and_variables(sess, ["serve"])
        builder.save()
        loaded = tf.Graph()
        with loaded.as_default(), tf.compat.v1.Session(graph=loaded) as other:
            tf.compat.v1.saved_model.loader.load(other, ["serve"], {str(tmp_path / "saved")!r})
            saved_ops = sorted(op.type for op in loaded.get_operations())
        print("@@" + json.dumps({{
            "ops": sorted(op.name for op in graph.get_operations()),
            "graph_def": sorted(node.name for node in graph.as_graph_def().node),
            "meta": sorted(node.name for node in meta.graph_def.node),
            "meta_op_types": sorted(op.name for op in meta.meta_info_def.stripped_op_list.op),
            "saved_ops": saved_ops,
            "queue_row": [r for r in nbcoord.snapshot()["queues"] if r["name"] == "only"][0]["size"],
        }}))
        sess.close()
        """),
    )
    seen = marked_json(result)
    assert seen["ops"] == ["only", "only_Size"], seen
    assert seen["graph_def"] == seen["meta"] == ["only", "only_Size"], seen
    assert seen["meta_op_types"] == ["FIFOQueueV2", "QueueSizeV2"], seen
    assert "nbcoord" not in (tmp_path / "graph.pbtxt").read_text()
    assert not any("nbcoord" in str(path) for path in tmp_path.rglob("*"))
    assert seen["saved_ops"] == ["FIFOQueueV2", "QueueSizeV2"], seen
    assert seen["queue_row"] == 0, "the queue is still polled"


# ------------------------------------------------------------------------------------------------- S1


def test_s1_blocked_dequeue_is_explained_and_interrupt_ends_it(tf_kernel: Kernel, tmp_path: Path) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(100, tf.float32, name="input")
        enq = q.enqueue(tf.constant(1.0))  # an enqueue op alone is not a runner: nothing feeds the queue
        deq = q.dequeue()
        sess = tf.compat.v1.Session()
        tf.compat.v1.train.start_queue_runners(sess)
        """),
    )
    cell, rows = submit_blocked(tf_kernel, tmp_path, "sess.run(deq)")
    (row,) = rows
    assert row["thread"] == "MainThread"
    assert row["queue_name"] == "input" and row["op"] == "dequeue"
    assert "MainThread blocked" in row["text"]
    assert "in dequeue of queue `input` (0 of 100 elements, no live producer)" in row["text"]

    tf_kernel.interrupt()
    result = collect_interrupted(tf_kernel, cell)
    assert result.status == "error"
    assert result.errors[0]["ename"] == "KeyboardInterrupt"
    assert "queue `input`" in result.errors[0]["evalue"]
    # Part 2: the traceback holds the cell's frames only: not TensorFlow's (IPython formats every frame, twice, with
    # its file's source: that was most of the time from Interrupt to the cell's end), nor nbcoord's wrapper.
    frames = "".join(result.errors[0]["traceback"])
    assert "tensorflow/python" not in frames and "nbcoord/" not in frames and "sess.run(deq)" in frames, frames
    print("interrupt to KeyboardInterrupt in the cell:", result.stdout.strip())
    # The session and the queue are still usable.
    after = tf_kernel.evaluate("[float(sess.run(q.enqueue(5.0)) or sess.run(deq)), int(sess.run(q.size()))]")
    assert after == [5.0, 0]
    tf_kernel.run("sess.close()")


def test_interrupt_ends_a_main_thread_blocked_enqueuing_into_a_full_queue(tf_kernel: Kernel, tmp_path: Path) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(3, tf.float32, name="nobody_reads")
        enq, deq = q.enqueue(1.0), q.dequeue()
        sess = tf.compat.v1.Session()
        """),
    )
    cell, rows = submit_blocked(tf_kernel, tmp_path, "for _ in range(4): sess.run(enq)")
    assert "in enqueue of queue `nobody_reads` (3 of 3 elements, no thread dequeuing)" in rows[0]["text"]
    tf_kernel.interrupt()
    result = collect_interrupted(tf_kernel, cell)
    assert result.errors and result.errors[0]["ename"] == "KeyboardInterrupt"
    assert "(3 elements dropped)" in result.errors[0]["evalue"]
    assert tf_kernel.evaluate("[sess.run(enq), int(sess.run(q.size())), float(sess.run(deq))]") == [None, 1, 1.0]
    tf_kernel.run("sess.close()")


PREPARED = """
import inspect, json
from pygments.lexers.python import PythonLexer
from stack_data.core import Source
from nbcoord.tensorflow import eager as _tf_eager
from nbcoord.tensorflow import runs as _tf_runs
def prepared(module):  # stack_data's cached properties become plain attributes once computed
    return "pieces" in vars(Source.for_filename(module.__file__, vars(module)))
print("@@" + json.dumps({
    "lexer": "_tokens" in vars(PythonLexer),  # compiled at the lexer's first use
    "modules_indexed": inspect.getabsfile(tf) in inspect.modulesbyfile,
    "sources": [prepared(_tf_runs), prepared(_tf_eager)],
}))
"""


@pytest.mark.parametrize(
    "own_kernel", tf_kernel_params(after="import json, threading, time\nimport nbcoord\nimport tensorflow as tf"),
    indirect=True,
)
def test_the_first_interrupts_traceback_is_prepared_right_after_tensorflows_import(
    own_kernel: Kernel, tmp_path: Path
) -> None:
    """The first Interrupt of a blocked run took 40-50 ms longer than the later ones (and up to 0.7 s longer when
    the press found the per-run preparation still running): IPython, formatting the first traceback through
    nbcoord's wrapper, compiled pygments' Python lexer, tokenized the wrapper's file and indexed every module.
    That is done once, on a thread of nbcoord's own, right after TensorFlow's import: before any cell has failed
    (in a fresh kernel nothing else does it), and with no thread of nbcoord's left when it is done."""
    kernel = own_kernel
    names = "[t.name for t in threading.enumerate() if t.name == 'nbcoord-tf-prepare']"
    wait_until(lambda: kernel.evaluate(names) == [], 30, what="the preparing thread to end")
    seen = marked_json(kernel.run(textwrap.dedent(PREPARED)))
    assert seen == {"lexer": True, "modules_indexed": True, "sources": [True, True]}, seen
    # The first Interrupt, with all that prepared, ends the cell as before.
    kernel.run(
        textwrap.dedent("""
        tf.compat.v1.disable_eager_execution()
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="input")
        deq = q.dequeue()
        sess = tf.compat.v1.Session()
        """),
    )
    cell, _rows = submit_blocked(kernel, tmp_path, "sess.run(deq)")
    kernel.interrupt()
    result = collect_interrupted(kernel, cell)
    assert result.errors and result.errors[0]["ename"] == "KeyboardInterrupt", result.errors
    frames = "".join(result.errors[0]["traceback"])
    assert "tensorflow/python" not in frames and "nbcoord/" not in frames and "sess.run(deq)" in frames, frames


# ------------------------------------------------------------------------------------------------- S2
def test_s2_closing_a_with_session_stops_its_runners_quietly(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="with_queue")
        enq = q.enqueue(tf.random.uniform([]))
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(q, [enq] * 2))
        with tf.compat.v1.Session() as sess:
            threads = tf.compat.v1.train.start_queue_runners(sess)  # no coordinator
            got = sess.run(q.dequeue())
        print("@@alive", sum(t.is_alive() for t in threads), len(threads))
        """),
    )
    assert "@@alive 0 2" in result.stdout
    assert_quiet(result)
    # The close went through the extension's one stop (which reports), not a stop of its own.
    closed = tf_kernel.evaluate("nbcoord.tensorflow.integration.current().last_close_report")
    assert closed["why"].startswith("close of session s") and closed["alive"] == [], closed
    names = [row["name"] for row in closed["stopped"]]
    assert names == ["QueueRunnerThread-with_queue-with_queue_enqueue"] * 2, closed
    assert tf_kernel.evaluate("nbcoord.snapshot()['last_stop']['scope']") == "threads"
    later = tf_kernel.run("print('next cell')")
    assert_quiet(later)
    assert "failed" not in later.stderr, later.stderr


def test_s2_with_a_coordinator_the_join_after_the_block_is_prompt(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="with_coord")
        qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 2)
        coord = tf.compat.v1.train.Coordinator()
        with tf.compat.v1.Session() as sess:
            threads = qr.create_threads(sess, coord=coord, start=True)
            sess.run(q.dequeue())
        coord.join(threads, stop_grace_period_secs=5)
        print("@@alive", sum(t.is_alive() for t in threads), len(threads), coord.should_stop())
        """),
    )
    assert "@@alive 0 3 True" in result.stdout
    assert_quiet(result)


# ------------------------------------------------------------------------------------------------- S3
def test_s3_join_without_stop_is_rescued_by_nbcoord_stop(tf_kernel: Kernel, tmp_path: Path) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(5, tf.float32, name="forever")
        qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 2)
        sess = tf.compat.v1.Session()
        threads = qr.create_threads(sess, start=True)  # no coordinator: nothing will ever ask them to stop
        """),
    )
    # The cell hangs in join(); while it does, `%nbcoord stop` runs off the main thread, as the panel's Stop
    # button runs it (the kernel reads no new cell while one runs). A signal is not used: a thread blocked in
    # join() only wakes for SIGINT when the kernel delivers it to the main thread.
    marker, trigger = tmp_path / "joining", tmp_path / "stop"
    hung = tf_kernel.submit(
        textwrap.dedent(
            f"""
            def rescue():
                while not os.path.exists({str(trigger)!r}):
                    time.sleep(0.01)
                get_ipython().run_line_magic("nbcoord", "stop")
            rescuer = threading.Thread(target=rescue, name="rescuer")
            rescuer.start()
            open({str(marker)!r}, "w").close()
            for t in threads:
                t.join()
            rescuer.join()
            print("@@joined", [t.is_alive() for t in threads])
            sess.close()
            """
        )
    )
    wait_until(marker.exists, 20, what="the cell to reach the join")
    trigger.touch()
    result = collect_interrupted(tf_kernel, hung)
    assert "@@joined [False, False]" in result.stdout, result.text
    assert "2 stopped, 0 still alive" in result.stdout, result.stdout
    assert_quiet(result)


# ------------------------------------------------------------------------------------------------- S4
def test_s4_the_coordinator_pattern_still_works(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(20, tf.float32, name="s4")
        qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 3)
        sess = tf.compat.v1.Session()
        coord = tf.compat.v1.train.Coordinator()
        threads = qr.create_threads(sess, coord=coord, start=True)
        for _ in range(20):
            sess.run(q.dequeue())
        coord.request_stop()
        coord.join(threads)
        print("@@alive", sum(t.is_alive() for t in threads))
        sess.close()
        """),
    )
    assert "@@alive 0" in result.stdout
    assert_quiet(result)


# ------------------------------------------------------------------------------------------- chained
def test_chained_pipeline_stops_within_the_grace_period(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        files = tf.compat.v1.FIFOQueue(4, tf.string, name="files")
        floats = tf.compat.v1.FIFOQueue(4, tf.float32, name="floats")
        orphan = tf.compat.v1.FIFOQueue(4, tf.float32, name="orphan")  # nobody feeds it
        reader = tf.compat.v1.train.QueueRunner(files, [files.enqueue(tf.constant("a.csv"))])
        parse = tf.strings.length(files.dequeue())
        preprocess = tf.compat.v1.train.QueueRunner(floats, [floats.enqueue(tf.cast(parse, tf.float32))] * 2)
        starved = tf.compat.v1.train.QueueRunner(floats, [floats.enqueue(orphan.dequeue())])
        sess = tf.compat.v1.Session()
        threads = [t for r in (reader, preprocess, starved) for t in r.create_threads(sess, start=True)]
        print([float(sess.run(floats.dequeue())) for _ in range(3)])
        """),
    )
    report = tf_kernel.evaluate("nbcoord.stop_all(grace=1.0)")
    assert report["alive"] == [], report["alive"]
    assert len(report["stopped"]) == 4
    assert report["took_s"] < report["grace"]
    assert tf_kernel.evaluate("[t.is_alive() for t in threads]") == [False] * 4
    quiet = tf_kernel.run("sess.close(); print('closed')")
    assert_quiet(quiet)


def test_a_queue_whose_python_object_is_gone_is_still_polled_and_closed(tf_kernel: Kernel) -> None:
    """A queue built inside a helper function lives in the graph after its Python object is collected: a runner
    reading from it is still stopped (its upstream queue closed), and the queue is still polled."""
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        import gc
        def build():
            raw = tf.compat.v1.FIFOQueue(10, tf.float32, name="dropped_raw")
            out = tf.compat.v1.FIFOQueue(10, tf.float32, name="kept_out")
            return tf.compat.v1.train.QueueRunner(out, [out.enqueue(raw.dequeue())])
        qr = build()
        gc.collect()
        sess = tf.compat.v1.Session()
        threads = qr.create_threads(sess, start=True)  # waits on dropped_raw, which nobody feeds
        print("@@" + json.dumps(sorted(q["name"] for q in nbcoord.snapshot()["queues"])))
        """),
    )
    assert marked_json(result) == ["dropped_raw", "kept_out"]
    report = stop_all(tf_kernel)
    assert report["alive"] == [] and len(report["stopped"]) == 1, report
    tf_kernel.run("sess.close()")


# ------------------------------------------------------------------------------------------------- S5
def test_s5_an_exception_in_a_worker_reaches_coord_join_with_its_cell(tf_kernel: Kernel) -> None:
    started = tf_kernel.run(
        textwrap.dedent("""
        coord = tf.compat.v1.train.Coordinator()
        def worker():
            try:
                raise ValueError("worker failed")
            except Exception as e:
                coord.request_stop(e)
        w = threading.Thread(target=worker, name="worker-1")
        w.start()
        try:
            coord.join([w])
        except ValueError as e:
            print("@@joined", e)
        """),
    )
    assert "@@joined worker failed" in started.stdout
    announced = tf_kernel.run("print('next')")
    assert "worker-1" in announced.stderr and "worker failed" in announced.stderr
    failure = tf_kernel.evaluate("[f for f in nbcoord.snapshot()['failures'] if f['thread_name'] == 'worker-1'][-1]")
    assert failure["exc_type"] == "ValueError" and "worker failed" in failure["traceback"]
    assert failure["cell"] is not None and f"cell [{failure['cell']}]" in announced.stderr


def test_s5_request_stop_outside_except_is_passed_on_not_a_type_error(tf_kernel: Kernel) -> None:
    result = tf_kernel.run(
        textwrap.dedent("""
        coord = tf.compat.v1.train.Coordinator()
        coord.request_stop(ValueError("outside an except block"))  # TensorFlow 2.21 alone: TypeError here
        print("@@stop", coord.should_stop())
        try:
            coord.join([])
        except ValueError as e:
            print("@@join", type(e).__name__, e)
        """),
    )
    assert "@@stop True" in result.stdout
    assert "@@join ValueError outside an except block" in result.stdout


def test_s5_a_failing_runner_stops_the_group_and_join_reraises(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        def bad():
            raise RuntimeError("bad record")
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="bad_input")
        good = q.enqueue(tf.random.uniform([]))
        failing = q.enqueue(tf.compat.v1.py_func(bad, [], tf.float32, stateful=True))
        qr = tf.compat.v1.train.QueueRunner(q, [good, failing])
        sess = tf.compat.v1.Session()
        coord = tf.compat.v1.train.Coordinator()
        threads = qr.create_threads(sess, coord=coord, start=True)
        try:
            coord.join(threads, stop_grace_period_secs=5)
        except Exception as e:
            print("@@join", type(e).__name__, "bad record" in str(e))
        print("@@alive", sum(t.is_alive() for t in threads))
        sess.close()
        """),
    )
    assert "@@join UnknownError True" in result.stdout or "@@join InvalidArgumentError True" in result.stdout, (
        result.stdout
    )
    assert "@@alive 0" in result.stdout
    announced = tf_kernel.run("print('next')")
    assert "QueueRunnerThread-bad_input" in announced.stderr, announced.stderr
    failures = tf_kernel.evaluate("[f['thread_name'] for f in nbcoord.snapshot()['failures'] if 'bad' in f['message']]")
    assert any(name.startswith("QueueRunnerThread-bad_input") for name in failures), failures


def test_s5_the_main_threads_own_request_stop_is_not_a_thread_failure(tf_kernel: Kernel) -> None:
    """Part 5: the main thread reporting its own exception to a coordinator is not "thread 'MainThread' failed"."""
    result = tf_kernel.run(
        textwrap.dedent("""
        coord = tf.compat.v1.train.Coordinator()
        try:
            raise ValueError("the main thread's own")
        except ValueError as e:
            coord.request_stop(e)
        try:
            coord.join([])
        except ValueError as e:
            print("@@join", e)
        """),
    )
    assert "@@join the main thread's own" in result.stdout
    announced = tf_kernel.run("print('next')")
    assert "MainThread" not in announced.stderr, announced.stderr
    failures = tf_kernel.evaluate("[f['thread_name'] for f in nbcoord.snapshot()['failures']]")
    assert "MainThread" not in failures


def test_s5_request_stop_inside_except_keeps_tensorflows_semantics(tf_kernel: Kernel) -> None:
    """Inside an ``except`` block TensorFlow records the exception being handled (sys.exc_info()), even when
    another one is passed: nbcoord passes the call on unchanged there."""
    result = tf_kernel.run(
        textwrap.dedent("""
        coord = tf.compat.v1.train.Coordinator()
        try:
            raise KeyError("being handled")
        except KeyError:
            coord.request_stop(ValueError("passed"))
        try:
            coord.join([])
        except Exception as e:
            print("@@join", type(e).__name__)
        """),
    )
    assert "@@join KeyError" in result.stdout, result.stdout


def test_a_runner_whose_enqueue_op_is_a_tensor_is_registered_and_stopped(tf_kernel: Kernel) -> None:
    """Part 5: TensorFlow accepts a Tensor as a runner's "op" (``var.count_up_to(n)``, as its own tests and input
    helpers pass). Such a runner is registered and stopped by a stop; before, its threads were invisible (a
    warning: 'SymbolicTensor' object has no attribute 'type'). A count_up_to that never touches the queue only
    stops between runs, through its coordinator (as in TensorFlow itself)."""
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        var = tf.compat.v1.Variable(tf.constant(0, dtype=tf.int64), use_resource=False)
        counted = var.count_up_to(1_000_000_000)
        gate = tf.compat.v1.FIFOQueue(2, tf.int64, name="gate")
        qr = tf.compat.v1.train.QueueRunner(gate, [gate.enqueue(counted), counted])
        sess = tf.compat.v1.Session()
        sess.run(var.initializer)
        coord = tf.compat.v1.train.Coordinator()
        threads = qr.create_threads(sess, coord=coord, start=True)
        names = sorted(t["name"] for t in nbcoord.snapshot()["threads"] if t["name"].startswith("QueueRunnerThread"))
        print("@@" + json.dumps(names))
        """),
    )
    names = marked_json(result)
    assert "QueueRunnerThread-gate-CountUpTo:0" in names, names
    assert "could not register" not in result.text, result.text
    owners = tf_kernel.evaluate(
        "[t['owners'] for t in nbcoord.snapshot()['threads'] if t['name'].endswith('CountUpTo:0')][0]"
    )
    assert {o["kind"] for o in owners} == {"queue", "queue-runner", "session", "coordinator"}, owners
    report = stop_all(tf_kernel)
    assert report["alive"] == [] and len(report["stopped"]) == 3, report
    assert tf_kernel.evaluate("[t.is_alive() for t in threads]") == [False, False, False]
    tf_kernel.run("sess.close()")


# ------------------------------------------------------------------------------------------------- S6
def test_s6_fill_levels_of_two_queues_change_over_time(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run("%nbcoord config monitor_interval=0.1")
    try:
        tf_kernel.run(
            textwrap.dedent("""
            def slow_one():
                time.sleep(0.01)
                return np.float32(1.0)
            filling = tf.compat.v1.FIFOQueue(1000, tf.float32, shapes=[[]], name="filling")
            draining = tf.compat.v1.FIFOQueue(1000, tf.float32, shapes=[[]], name="draining")
            qr = tf.compat.v1.train.QueueRunner(
                filling, [filling.enqueue(tf.compat.v1.py_func(slow_one, [], tf.float32, stateful=True))]
            )
            sess = tf.compat.v1.Session()
            sess.run(draining.enqueue_many([tf.zeros([300])]))
            coord = tf.compat.v1.train.Coordinator()
            threads = qr.create_threads(sess, coord=coord, start=True)
            take, left = draining.dequeue(), draining.size()
            def consumer():
                while not coord.should_stop() and sess.run(left) > 0:
                    sess.run(take)
                    time.sleep(0.005)
            drainer = threading.Thread(target=consumer, name="consumer")
            drainer.start()
            """),
        )

        def histories() -> dict[str, list[int]]:
            queues = tf_kernel.evaluate("nbcoord.snapshot()['queues']")
            sizes = {q["name"]: [point[1] for point in q["history"]] for q in queues}
            if all(len(sizes.get(name, [])) >= 8 for name in ("filling", "draining")):
                return sizes
            return {}

        sizes = wait_until(histories, 30, interval=0.2, what="eight polls of both queues")
        filling, draining = sizes["filling"], sizes["draining"]
        assert filling == sorted(filling) and filling[-1] > filling[0], filling
        assert draining == sorted(draining, reverse=True) and draining[-1] < draining[0], draining
        rows = {q["name"]: q for q in tf_kernel.evaluate("nbcoord.snapshot()['queues']")}
        assert rows["filling"]["enqueue_rate"] > 0 and rows["filling"]["runners"] == 1
        assert rows["draining"]["runners"] == 0
        report = tf_kernel.run("%nbcoord")
        assert "filling:" in report.stdout and "of 1000" in report.stdout
    finally:
        tf_kernel.run("coord.request_stop(); coord.join(threads + [drainer]); sess.close()")
        tf_kernel.run("%nbcoord config monitor_interval=1.0")


# ------------------------------------------------------------------------------------------------- S7
def test_s7_the_report_names_runner_threads_their_owners_and_queues(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="leaky")
        qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 2)
        sess = tf.compat.v1.Session()
        threads = qr.create_threads(sess, start=True)
        """),
    )
    cell = tf_kernel.evaluate(
        "threads and [t['cell'] for t in nbcoord.snapshot()['threads'] if t['name'] == threads[0].name][0]"
    )
    wait_until(lambda: tf_kernel.evaluate("int(sess.run(q.size()))") == 10, 20, what="the queue to fill")
    report = tf_kernel.run("%nbcoord").stdout
    assert f"Cell [{cell}]" in report
    assert "QueueRunnerThread-leaky-leaky_enqueue" in report
    assert "owner: queue `leaky`, QueueRunner `leaky`, Session s" in report
    assert "leaky: 10 of 10 (open" in report
    blocked = tf_kernel.evaluate("nbcoord.snapshot()['blocked_runs']")
    assert blocked == [] or all("enqueue of queue `leaky` (10 of 10 elements" in b["text"] for b in blocked)
    quiet = tf_kernel.run("sess.close(); print([t.is_alive() for t in threads])")
    assert "[False, False]" in quiet.stdout
    assert_quiet(quiet)


# ------------------------------------------------------------------------------------------------- S8
def test_s8_a_stuck_runner_is_reported_and_stopping_it_stops_its_coordinator_group(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    tf_kernel.run(
        textwrap.dedent("""
        a = tf.compat.v1.FIFOQueue(3, tf.float32, name="group_a")
        b = tf.compat.v1.FIFOQueue(3, tf.float32, name="group_b")
        runners = [tf.compat.v1.train.QueueRunner(x, [x.enqueue(tf.random.uniform([]))] * 2) for x in (a, b)]
        sess = tf.compat.v1.Session()
        coord = tf.compat.v1.train.Coordinator()
        threads = [t for r in runners for t in r.create_threads(sess, coord=coord, start=True)]
        """),
    )

    def stuck() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = tf_kernel.evaluate("nbcoord.snapshot()['blocked_runs']")
        return rows if len(rows) == 4 else []

    rows = wait_until(stuck, 20, interval=0.2, what="four runner threads blocked on full queues")
    assert all("(3 of 3 elements, no thread dequeuing)" in row["text"] for row in rows), rows
    tid = next(row["tid"] for row in rows if row["queue_name"] == "group_a")
    stop = tf_kernel.run(textwrap.dedent(f"%nbcoord stop --thread {tid}"))
    assert "1 stopped, 0 still alive" in stop.stdout, stop.stdout
    result = tf_kernel.run(
        textwrap.dedent("""
        coord.join(threads, stop_grace_period_secs=5)
        print("@@group", coord.should_stop(), sum(t.is_alive() for t in threads), len(threads))
        sess.close()
        """),
    )
    assert "@@group True 0 6" in result.stdout
    assert_quiet(result)


# ------------------------------------------------------------------------------ MonitoredTrainingSession
def test_monitored_training_session_with_a_finalized_graph(tf_kernel: Kernel) -> None:
    fresh_graph(tf_kernel)
    result = tf_kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(50, tf.float32, shapes=[[]], name="mts_input")
        tf.compat.v1.train.add_queue_runner(
            tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 2)
        )
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(tf.compat.v1.assign_add(step, 1), q.dequeue_many(4))
        with tf.compat.v1.train.MonitoredTrainingSession() as mon:
            for _ in range(20):
                mon.run(train)
            final = tf.compat.v1.get_default_graph().finalized
            rows = [r for r in nbcoord.snapshot()["queues"] if r["name"] == "mts_input"]
            runners = [t for t in threading.enumerate() if t.name.startswith("QueueRunnerThread-mts_input")]
        print("@@" + json.dumps({"final": final, "rows": rows, "runners": len(runners),
                                 "alive": sum(t.is_alive() for t in runners)}))
        """),
    )
    mts = marked_json(result)
    assert mts["final"] is True
    (row,) = mts["rows"]
    assert row["size"] is not None and row["capacity"] == 50 and row["runners"] == 2
    assert (mts["runners"], mts["alive"]) == (3, 0)
    assert_quiet(result)


# ------------------------------------------------------------------------- existing objects and unload
#: TensorFlow and its objects made before nbcoord is loaded (the kernel of the tests below loads it itself).
PRELOADED = """
import json, signal, sys, threading
import tensorflow as tf
from tensorflow.python.client.session import BaseSession
from tensorflow.python.ops.data_flow_ops import QueueBase
from tensorflow.python.training.queue_runner_impl import QueueRunner
from tensorflow.python.training.coordinator import Coordinator
tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
PATCHED = [(BaseSession, "__init__"), (BaseSession, "close"), (BaseSession, "_call_tf_sessionrun"),
           (BaseSession, "run"), (QueueBase, "__init__"), (QueueBase, "enqueue"),
           (QueueBase, "enqueue_many"), (QueueBase, "dequeue"), (QueueBase, "dequeue_many"),
           (QueueBase, "dequeue_up_to"), (QueueBase, "close"), (QueueRunner, "create_threads"),
           (Coordinator, "__init__"), (Coordinator, "request_stop"), (tf.Graph, "_as_graph_def"),
           (threading.Thread, "start")]
def attrs():
    return [cls.__dict__[name] for cls, name in PATCHED] + ["get_operations" in vars(tf.Graph)]
before = attrs()
meta_before = list(sys.meta_path)
old = tf.compat.v1.FIFOQueue(10, tf.float32, name="old")
old_sess = tf.compat.v1.Session()
old_sess.run(old.enqueue(2.0))
old_coord = tf.compat.v1.train.Coordinator()
"""
#: That kernel, once per TensorFlow release, shared by the tests below (conftest's ``kernel`` with these options).
PRELOADED_KERNELS = tf_kernel_params(setup=PRELOADED, nbcoord="off")


@pytest.mark.parametrize("kernel", PRELOADED_KERNELS, indirect=True)
def test_existing_objects_are_found_and_unload_restores_every_patch(kernel: Kernel) -> None:
    kernel.run("%load_ext nbcoord\nimport nbcoord")
    patched = kernel.evaluate("[a is b for a, b in zip(attrs(), before)]")
    assert patched == [False] * 17, "every attribute is patched while loaded"
    snap = kernel.evaluate("{k: nbcoord.snapshot()[k] for k in ('queues', 'sessions')}")
    (old,) = [q for q in snap["queues"] if q["name"] == "old"]
    assert old["size"] == 1 and old["cell"] is None, "an existing queue is found and polled"
    assert [s["cell"] for s in snap["sessions"]] == [None]
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate("[a is b for a, b in zip(attrs(), before)]") == [True] * 17
    assert kernel.evaluate("list(sys.meta_path) == meta_before")
    assert kernel.evaluate("signal.set_wakeup_fd(-1)") == -1
    assert kernel.evaluate("[t.name for t in threading.enumerate() if t.name.startswith('nbcoord')]") == []


@pytest.mark.parametrize("kernel", PRELOADED_KERNELS, indirect=True)
def test_without_nbcoord_the_with_trap_prints_runner_errors(kernel: Kernel) -> None:
    """The control for S2: the same cell, nbcoord unloaded, leaves failing runner threads behind."""
    result = kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="control")
        enq = q.enqueue(tf.random.uniform([]))
        qr = tf.compat.v1.train.QueueRunner(q, [enq] * 2)
        with tf.compat.v1.Session() as sess:
            threads = qr.create_threads(sess, start=True)
            sess.run(q.dequeue())
        for t in threads:
            t.join(5)
        """),
    )
    assert any(word in result.text for word in RUNNER_ERRORS), result.text


# -------------------------------------------------------------------------------------------- shutdown
#: A kernel without the diagnostics cell whose non-daemon runner threads, with no coordinator, keep a queue full.
RUNNERS_ON_A_FULL_QUEUE = tf_kernel_params(
    setup="",
    after="""
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    q = tf.compat.v1.FIFOQueue(4, tf.float32, name="full")
    qr = tf.compat.v1.train.QueueRunner(q, [q.enqueue(tf.random.uniform([]))] * 3)
    sess = tf.compat.v1.Session()
    threads = qr.create_threads(sess, start=True)  # non-daemon, no coordinator
    assert not any(t.daemon for t in threads)
    """,
)


@pytest.mark.parametrize("own_kernel", RUNNERS_ON_A_FULL_QUEUE, indirect=True)
def test_shutdown_with_live_non_daemon_runner_threads_exits_cleanly(own_kernel: Kernel) -> None:
    # The kernel must end by itself, with status 0, not hang on its runner threads until a front end kills it.
    assert shutdown_exit_status(own_kernel, "int(sess.run(q.size()))", 4) == 0
