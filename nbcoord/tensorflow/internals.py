"""Every private name of TensorFlow (and of CPython's ``Thread``) that the TensorFlow integration touches.

Each accessor looks its internal up when called, never at import time, and says what the integration does
instead when the internal is missing (another TensorFlow release): the fallback is named in the docstring and in
:func:`degraded`. Tests remove each internal (monkeypatch) and check the fallback (tests/test_tf_internals.py).

Public API is used wherever TensorFlow has one: ``tf.queue.QueueBase``, ``tf.compat.v1.Session``,
``tf.compat.v1.train.QueueRunner`` / ``Coordinator``, ``tf.errors``, ``tf.compat.v1.RunOptions``,
``tf.raw_ops``, ``tf.get_static_value``, the queues' own ``size`` / ``is_closed`` / ``close``.

- ``BaseSession._call_tf_sessionrun``: the one method every session run passes through (``run`` and prepared
  callables); patched to see runs in flight. Fallback: runs are not tracked (no blocked-run sentences, no
  Interrupt of a blocked ``sess.run``, no runner progress).
- ``BaseSession._closed`` / ``_session``: whether a session is usable. Fallback: closed once nbcoord saw its
  ``close()``.
- ``BaseSession._make_callable_from_options`` and ``config_pb2.CallableOptions``: a prepared step that has built
  its executor before it is needed. Fallback: nbcoord's closes and resets run through ``session.run`` (the first
  one builds an executor: tens of milliseconds on the Interrupt's path).
- ``QueueRunner._run`` / ``_close_on_stop``: recognise runner threads that predate nbcoord. Fallback: those are
  not found (runner threads started after loading are registered by the ``create_threads`` patch).
- ``QueueRunner._queue_closed_exception_types``: a runner without a coordinator ends quietly when nbcoord's stop
  cancels its enqueue. Fallback: it ends with a CancelledError, reported as a thread failure.
- ``QueueRunner._runs_per_session``: whether a runner still counts live threads in a session (a restart waits
  for it). Fallback: ``create_threads`` returning no thread says so.
- ``Coordinator._registered_threads``: the threads a coordinator joins. Fallback: coordinators are found through
  the runners they coordinate and the arguments of threads.
- ``Coordinator._filter_exception``: whether an exception is one the coordinator treats as a clean stop.
  Fallback: ``OutOfRangeError`` (TensorFlow's default) is clean.
- ``Graph._as_graph_def``: the funnel of every export (``as_graph_def``, meta graphs, ``write_graph``, summaries,
  SavedModels). Fallback: the public ``as_graph_def`` is filtered instead (the same exports go through it).
- ``pywrap_tf_session.TF_OperationName``: the name of an op a run fetches (the run hook sees pybind handles).
  Fallback: runs are not analysed (blocked runs are not explained and Interrupt cannot tell what a run waits on).
- ``BaseSession._target``: the session's target, for the report. Fallback: empty.
- The local variables of TensorFlow's queue constructors (``capacity``, ``name``, ``min_after_dequeue``): an
  eager queue's op keeps no attributes to read them from. Fallback: capacity unknown, a generic name.
- ``QueueBase._queue_ref``: a graph-mode queue's handle tensor, whose op and graph nbcoord polls. Fallback: the
  queue is not polled (no fill level).
- ``context.context_safe()._initialized`` (module ``tensorflow.python.eager.context``): whether TensorFlow's eager
  runtime has started, asked without starting it (the resource probe reads allocator figures only then).
  Fallback: not started (no allocator figures).
- ``Thread._target`` / ``_args`` / ``_kwargs`` (CPython): what a thread runs, to find its coordinator and to
  recognise pre-existing runner threads. Fallback: nothing is found that way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from nbcoord.core.fallbacks import RECORD

log = logging.getLogger("nbcoord")

#: What fell back, and to what.
_fallbacks = RECORD  # tests give a module a fresh record of its own

#: The signature nbcoord's run hook is written for.
RUN_FUNNEL = "_call_tf_sessionrun"
RUN_FUNNEL_ARGS = ("self", "options", "feed_dict", "fetch_list", "target_list", "run_metadata")


def _fall_back(name: str, fallback: str) -> None:
    _fallbacks.fall_back(name, fallback, "TensorFlow's ")


def degraded() -> dict[str, str]:
    """TensorFlow internals found missing so far, each with what the integration does instead."""
    return _fallbacks.found()


# ------------------------------------------------------------------------------------------- classes
@dataclass(frozen=True)
class TFClasses:
    """The TensorFlow classes and error types the integration patches or checks, found through public names."""

    base_session: type
    queue_base: type
    queue_runner: type
    coordinator: type
    graph: type
    op_error: type[BaseException]
    cancelled: type[BaseException]
    out_of_range: type[BaseException]
    deadline_exceeded: type[BaseException]
    run_options: Any
    operation: type
    tensor: type


def tf_classes(tf: Any) -> TFClasses:
    """The classes, from the public API of an imported ``tensorflow`` module.

    ``BaseSession`` is not public: it is the class in ``tf.compat.v1.Session``'s bases that defines the run
    funnel (``InteractiveSession`` derives from it too), or ``Session`` itself where no base does.
    """
    session = tf.compat.v1.Session
    base = next((cls for cls in session.__mro__ if RUN_FUNNEL in vars(cls)), session)
    return TFClasses(
        base_session=base,
        queue_base=tf.queue.QueueBase,
        queue_runner=tf.compat.v1.train.QueueRunner,
        coordinator=tf.compat.v1.train.Coordinator,
        graph=tf.Graph,
        op_error=tf.errors.OpError,
        cancelled=tf.errors.CancelledError,
        out_of_range=tf.errors.OutOfRangeError,
        deadline_exceeded=tf.errors.DeadlineExceededError,
        run_options=tf.compat.v1.RunOptions,
        operation=tf.Operation,
        tensor=tf.Tensor,
    )


# ------------------------------------------------------------------------------------------ sessions
def run_funnel(base_session: type) -> str | None:
    """``"_call_tf_sessionrun"`` when the session class defines it with the arguments nbcoord's hook expects.

    Fallback: None; session runs are not tracked.
    """
    import inspect

    method = vars(base_session).get(RUN_FUNNEL)
    try:
        params = tuple(inspect.signature(method).parameters) if method is not None else ()
    except (TypeError, ValueError):
        params = ()
    if params == RUN_FUNNEL_ARGS:
        return RUN_FUNNEL
    _fall_back(
        f"BaseSession.{RUN_FUNNEL}",
        "session runs are not tracked: no blocked-run sentences, no Interrupt of a blocked sess.run, "
        "no runner progress",
    )
    return None


def session_closed(session: Any) -> bool | None:
    """Whether a session is closed (or being deleted), from its private state; None when it cannot be read.

    Fallback: None; the caller counts a session as closed once it saw its ``close()``.
    """
    closed = getattr(session, "_closed", None)
    if not isinstance(closed, bool) or not hasattr(session, "_session"):
        _fall_back("BaseSession._closed", "a session counts as closed once nbcoord saw its close()")
        return None
    return closed or session._session is None


def session_target(session: Any) -> str:
    """The session's target (``""`` for an in-process session). Fallback: ``""``."""
    target = getattr(session, "_target", None)
    if target is None:
        _fall_back("BaseSession._target", "sessions are shown without their target")
        return ""
    return target.decode(errors="replace") if isinstance(target, bytes) else str(target)


def prepare_callable(session: Any, op_names: Iterable[str]) -> Callable[[], Any] | None:
    """A step that runs these ops (as targets), with its executor built now rather than on first use.

    Fallback: None; the caller runs the ops with ``session.run`` (the first run builds an executor).
    """
    make = getattr(session, "_make_callable_from_options", None)
    try:
        from tensorflow.core.protobuf import config_pb2

        options_cls = config_pb2.CallableOptions
    except (ImportError, AttributeError):
        options_cls = None
    if make is None or options_cls is None:
        _fall_back(
            "BaseSession._make_callable_from_options",
            "nbcoord's queue closes and resets run with session.run (the first one builds an executor)",
        )
        return None
    options = options_cls()
    options.target.extend(sorted(set(op_names)))
    fn: Callable[[], Any] = make(options)
    return fn


# ------------------------------------------------------------------------------------ queue runners
def runner_thread_functions(runner_cls: type) -> tuple[Any, Any] | None:
    """The functions a QueueRunner's threads run: (enqueue loop, close-on-stop). Fallback: None."""
    run_fn, close_fn = vars(runner_cls).get("_run"), vars(runner_cls).get("_close_on_stop")
    if not callable(run_fn) or not callable(close_fn):
        _fall_back("QueueRunner._run", "QueueRunner threads started before nbcoord was loaded are not found")
        return None
    return run_fn, close_fn


def extend_closed_exception_types(runner: Any, extra: type[BaseException]) -> tuple[type, ...] | None:
    """Let ``runner`` treat ``extra`` as the end of its input; returns its own types (to give back), or None
    when they were already included or cannot be set.

    Fallback: None; a runner without a coordinator ends with ``extra`` raised, which is reported as a failure.
    """
    types = getattr(runner, "_queue_closed_exception_types", None)
    if not isinstance(types, tuple):
        _fall_back(
            "QueueRunner._queue_closed_exception_types",
            "a runner without a coordinator ends with a CancelledError (reported as a failure) when stopped",
        )
        return None
    if extra in types:
        return None
    runner._queue_closed_exception_types = (*types, extra)
    return types


def restore_closed_exception_types(runner: Any, types: tuple[type, ...]) -> None:
    """Give a runner its own queue-closed exception types back."""
    if isinstance(getattr(runner, "_queue_closed_exception_types", None), tuple):
        runner._queue_closed_exception_types = types


def runner_active_in(runner: Any, session: Any) -> bool | None:
    """Whether a QueueRunner still counts live threads in ``session`` (its create_threads would return none).

    Fallback: None (unknown); ``create_threads`` returning no thread says so.
    """
    runs: Any = getattr(runner, "_runs_per_session", None)  # a WeakKeyDictionary by session
    lock = getattr(runner, "_lock", None)
    if runs is None or not callable(getattr(runs, "get", None)) or lock is None:
        _fall_back("QueueRunner._runs_per_session", "a restart learns from create_threads that a runner is active")
        return None
    with lock:
        return bool(runs.get(session, 0) > 0)


# -------------------------------------------------------------------------------------- coordinators
def registered_threads(coord: Any) -> Iterable[threading.Thread]:
    """The threads a Coordinator will join. Fallback: none (found through runners and thread arguments)."""
    threads = getattr(coord, "_registered_threads", None)
    if threads is None:
        _fall_back("Coordinator._registered_threads", "coordinators are found through their runners only")
        return ()
    return list(threads)


def is_clean_stop(coord: Any, exc: BaseException, out_of_range: type[BaseException]) -> bool:
    """Whether the coordinator treats ``exc`` as a clean stop (ignored, never re-raised by ``join``).

    Fallback: ``OutOfRangeError`` is clean (TensorFlow's default ``clean_stop_exception_types``).
    """
    filter_exception = getattr(coord, "_filter_exception", None)
    if filter_exception is None:
        _fall_back("Coordinator._filter_exception", "OutOfRangeError counts as a coordinator's clean stop")
        return isinstance(exc, out_of_range)
    return filter_exception(exc) is None


# --------------------------------------------------------------------------------------------- graphs
def graph_def_funnel(graph_cls: type) -> str:
    """The Graph method every export passes through: ``_as_graph_def``, else the public ``as_graph_def``."""
    if callable(vars(graph_cls).get("_as_graph_def")):
        return "_as_graph_def"
    _fall_back("Graph._as_graph_def", "exports are filtered through the public as_graph_def")
    return "as_graph_def"


_op_name_fn: Callable[[Any], str] | None = None


def op_name_function() -> Callable[[Any], str] | None:
    """A function from a run's pybind handle (a ``TF_Output`` or a ``TF_Operation``) to the op's name.

    Fallback: None; runs are not analysed.
    """
    global _op_name_fn
    if _op_name_fn is not None:
        return _op_name_fn
    try:
        from tensorflow.python.client import pywrap_tf_session

        operation_name = pywrap_tf_session.TF_OperationName
    except (ImportError, AttributeError):
        _fall_back(
            "pywrap_tf_session.TF_OperationName",
            "session runs are not analysed: blocked runs are not explained, Interrupt cannot tell what they wait on",
        )
        return None

    def name_of(handle: Any) -> str:
        return str(operation_name(getattr(handle, "oper", handle)))

    _op_name_fn = name_of
    return name_of


# --------------------------------------------------------------------------------------- eager queues
@dataclass(frozen=True)
class QueueArgs:
    """What a queue's constructor was given, where its op cannot tell (eager queues)."""

    name: str | None
    capacity: int
    min_after_dequeue: int


def queue_constructor_args(frame: FrameType | None) -> QueueArgs:
    """The ``name``, ``capacity`` and ``min_after_dequeue`` a TensorFlow queue constructor (the frame that called
    ``QueueBase.__init__``) was given. Fallback: no name, capacity -1 (unknown), 0."""
    local = frame.f_locals if frame is not None else {}
    capacity = local.get("capacity")
    if not isinstance(capacity, int):
        _fall_back("the arguments of TensorFlow's queue constructors", "eager queues show no capacity or name")
        return QueueArgs(None, -1, 0)
    name = local.get("name")
    min_after = local.get("min_after_dequeue")
    return QueueArgs(
        name if isinstance(name, str) else None,
        capacity if capacity > 0 else -1,
        min_after if isinstance(min_after, int) else 0,
    )


# ------------------------------------------------------------------------------------------ threads
def thread_call(thread: threading.Thread) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """What a thread runs: (target, args, kwargs); CPython keeps them until run() ends.

    Fallback: (None, (), {}).
    """
    if not hasattr(thread, "_target"):
        _fall_back("Thread._target", "coordinators and runner threads are not found through thread arguments")
        return None, (), {}
    return (
        getattr(thread, "_target", None),
        tuple(getattr(thread, "_args", ()) or ()),
        dict(getattr(thread, "_kwargs", None) or {}),
    )


def queue_ref(queue: Any) -> Any | None:
    """A graph-mode queue's handle tensor. Fallback: None (the queue is not polled)."""
    if not hasattr(queue, "_queue_ref"):
        _fall_back("QueueBase._queue_ref", "graph-mode queues are not polled (no fill level)")
        return None
    return queue._queue_ref


def eager_runtime_started() -> bool:
    """Whether TensorFlow's eager context is initialised, asked without initialising it (and without importing
    TensorFlow). Fallback: False (allocator figures are not read)."""
    import sys

    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    context_safe = getattr(context, "context_safe", None)
    ctx = context_safe() if callable(context_safe) else None
    if ctx is None:
        return False
    if not hasattr(ctx, "_initialized"):
        _fall_back("eager Context._initialized", "TensorFlow's allocator figures are not read")
        return False
    return bool(ctx._initialized)
