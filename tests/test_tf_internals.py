"""Every TensorFlow internal the integration touches, removed one at a time: the fallback each one names.

In process, on real TensorFlow (CPU build), without a kernel: each test takes one private name away with
``monkeypatch`` (restored after the test) and checks what :mod:`nbcoord.tensorflow.internals` does instead,
and that :func:`degraded` says so.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nbcoord.core.fallbacks import Fallbacks
from nbcoord.tensorflow import internals
from nbcoord.tensorflow.graph import run_op_names
from nbcoord.tensorflow.records import mark_closed, session_is_open
from nbcoord.tensorflow.runs import warm_traceback

pytestmark = [pytest.mark.tensorflow]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


@pytest.fixture(autouse=True)
def fresh_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "_fallbacks", Fallbacks())
    monkeypatch.setattr(internals, "_op_name_fn", None)


@pytest.fixture
def graph_session(tf: Any) -> Iterator[tuple[Any, Any, Any]]:
    """A graph with a FIFOQueue, and a session on it."""
    graph = tf.Graph()
    with graph.as_default():
        queue = tf.compat.v1.FIFOQueue(3, tf.float32, name="q")
    session = tf.compat.v1.Session(graph=graph)
    try:
        yield graph, queue, session
    finally:
        session.close()


def test_the_classes_come_from_public_names(tf: Any) -> None:
    classes = internals.tf_classes(tf)
    assert classes.base_session.__name__ == "BaseSession" and issubclass(tf.compat.v1.Session, classes.base_session)
    assert classes.queue_base is tf.queue.QueueBase and classes.coordinator is tf.compat.v1.train.Coordinator
    assert internals.degraded() == {}


def test_run_funnel_missing_or_changed(tf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = internals.tf_classes(tf).base_session
    assert internals.run_funnel(base) == "_call_tf_sessionrun"
    original = vars(base)["_call_tf_sessionrun"]

    def changed(self: Any, *args: Any) -> Any:  # another release's signature
        return original(self, *args)

    monkeypatch.setattr(base, "_call_tf_sessionrun", changed)
    assert internals.run_funnel(base) is None
    assert "session runs are not tracked" in internals.degraded()["BaseSession._call_tf_sessionrun"]
    monkeypatch.delattr(base, "_call_tf_sessionrun")
    assert internals.run_funnel(base) is None


def test_session_closed_flag_missing(graph_session: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _graph, _queue, session = graph_session
    assert internals.session_closed(session) is False and session_is_open(session)
    monkeypatch.delattr(session, "_closed")
    assert internals.session_closed(session) is None
    assert session_is_open(session), "without the flag, open until nbcoord saw close()"
    mark_closed(session)
    assert not session_is_open(session)
    assert "BaseSession._closed" in internals.degraded()
    monkeypatch.undo()  # before the fixture closes the session


def test_session_target_missing(graph_session: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    session = graph_session[2]
    assert internals.session_target(session) == ""
    monkeypatch.delattr(session, "_target")
    assert internals.session_target(session) == ""
    assert "BaseSession._target" in internals.degraded()
    monkeypatch.undo()


def test_prepared_callable_missing(
    tf: Any, graph_session: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    graph, queue, session = graph_session
    with graph.as_default():
        close = queue.close()
    fn = internals.prepare_callable(session, [close.name])
    assert fn is not None
    fn()
    with graph.as_default():
        assert bool(session.run(queue.is_closed())), "the prepared step ran the close"
    monkeypatch.delattr(internals.tf_classes(tf).base_session, "_make_callable_from_options")
    assert internals.prepare_callable(session, [close.name]) is None
    assert "session.run" in internals.degraded()["BaseSession._make_callable_from_options"]


def test_runner_thread_functions_missing(tf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runner_cls = tf.compat.v1.train.QueueRunner
    run_fn, close_fn = internals.runner_thread_functions(runner_cls) or (None, None)
    assert run_fn is vars(runner_cls)["_run"] and close_fn is vars(runner_cls)["_close_on_stop"]
    monkeypatch.delattr(runner_cls, "_close_on_stop")
    assert internals.runner_thread_functions(runner_cls) is None
    assert "started before nbcoord was loaded are not found" in internals.degraded()["QueueRunner._run"]


def test_runner_private_state_missing(
    tf: Any, graph_session: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    graph, queue, session = graph_session
    with graph.as_default():
        runner = tf.compat.v1.train.QueueRunner(queue, [queue.enqueue(1.0)])
    own = internals.extend_closed_exception_types(runner, tf.errors.CancelledError)
    assert own == (tf.errors.OutOfRangeError,)
    assert runner.queue_closed_exception_types == (tf.errors.OutOfRangeError, tf.errors.CancelledError)
    internals.restore_closed_exception_types(runner, own)
    assert runner.queue_closed_exception_types == (tf.errors.OutOfRangeError,)
    assert internals.runner_active_in(runner, session) is False
    monkeypatch.delattr(runner, "_queue_closed_exception_types")
    monkeypatch.delattr(runner, "_runs_per_session")
    assert internals.extend_closed_exception_types(runner, tf.errors.CancelledError) is None
    assert internals.runner_active_in(runner, session) is None
    assert {"QueueRunner._queue_closed_exception_types", "QueueRunner._runs_per_session"} <= set(internals.degraded())


def test_coordinator_internals_missing(tf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coord = tf.compat.v1.train.Coordinator()
    worker = threading.Thread(target=lambda: None)
    coord.register_thread(worker)
    assert list(internals.registered_threads(coord)) == [worker]
    clean = tf.errors.OutOfRangeError(None, None, "end")
    assert internals.is_clean_stop(coord, clean, tf.errors.OutOfRangeError)
    assert not internals.is_clean_stop(coord, ValueError("bad"), tf.errors.OutOfRangeError)
    monkeypatch.delattr(coord, "_registered_threads")
    monkeypatch.delattr(tf.compat.v1.train.Coordinator, "_filter_exception")
    assert list(internals.registered_threads(coord)) == []
    assert internals.is_clean_stop(coord, clean, tf.errors.OutOfRangeError)
    assert not internals.is_clean_stop(coord, ValueError("bad"), tf.errors.OutOfRangeError)
    assert {"Coordinator._registered_threads", "Coordinator._filter_exception"} <= set(internals.degraded())


def test_graph_def_funnel_missing(tf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert internals.graph_def_funnel(tf.Graph) == "_as_graph_def"
    monkeypatch.delattr(tf.Graph, "_as_graph_def")
    assert internals.graph_def_funnel(tf.Graph) == "as_graph_def"
    assert "public as_graph_def" in internals.degraded()["Graph._as_graph_def"]


def test_op_names_missing(tf: Any, graph_session: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorflow.python.client import pywrap_tf_session

    graph, queue, _session = graph_session
    with graph.as_default():
        size = queue.size(name="size_of_q")
    handles = [size._as_tf_output()]
    assert run_op_names(handles, [size.op._c_op]) == ("size_of_q",)
    monkeypatch.delattr(pywrap_tf_session, "TF_OperationName")
    monkeypatch.setattr(internals, "_op_name_fn", None)
    assert run_op_names(handles, []) == ()
    assert "not analysed" in internals.degraded()["pywrap_tf_session.TF_OperationName"]


def test_queue_constructor_arguments_missing(tf: Any) -> None:
    seen: list[internals.QueueArgs] = []

    def constructor(capacity: int = 7, name: str = "input", min_after_dequeue: int = 2) -> None:
        seen.append(internals.queue_constructor_args(sys._getframe(0)))

    constructor()
    assert seen == [internals.QueueArgs("input", 7, 2)]
    assert internals.queue_constructor_args(None) == internals.QueueArgs(None, -1, 0)
    assert "eager queues show no capacity" in internals.degraded()["the arguments of TensorFlow's queue constructors"]


def test_thread_call_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def work(a: int, b: int = 0) -> None:
        return None

    thread = threading.Thread(target=work, args=(1,), kwargs={"b": 2})
    assert internals.thread_call(thread) == (work, (1,), {"b": 2})
    monkeypatch.delattr(thread, "_target")
    assert internals.thread_call(thread) == (None, (), {})
    assert "Thread._target" in internals.degraded()


def test_traceback_preparation_without_stack_data(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = sys._getframe(0)
    assert warm_traceback([frame, frame]) == 1
    monkeypatch.setitem(sys.modules, "stack_data.core", None)  # as if IPython's traceback library were missing
    assert warm_traceback([frame]) == 0
