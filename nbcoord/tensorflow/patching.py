"""The class patches of the TensorFlow integration: what replaces each patched attribute of TensorFlow's classes.

``BaseSession.__init__`` / ``close`` / ``run`` / ``_call_tf_sessionrun``, ``QueueBase.__init__`` and its
``enqueue`` / ``dequeue`` / ``close`` methods, ``QueueRunner.create_threads``, ``Coordinator.__init__`` /
``request_stop``, ``Graph.get_operations`` and the Graph's export funnel. Each replacement calls the original and
tells the integration; a failure of nbcoord's part is logged and never fails TensorFlow's call. Every patch goes
through the integration's :class:`~nbcoord.core.patches.ClassPatches`, which restores them at unload.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from nbcoord.core.internals import calling_frame
from nbcoord.core.patches import ClassPatches
from nbcoord.tensorflow.closes import CloseOps
from nbcoord.tensorflow.coordinators import Coordinators
from nbcoord.tensorflow.eager import DEQUEUE_METHODS, ENQUEUE_METHODS, EagerQueues
from nbcoord.tensorflow.graph import HiddenOps
from nbcoord.tensorflow.internals import TFClasses, graph_def_funnel, run_funnel
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import mark_closed
from nbcoord.tensorflow.registration import Registration
from nbcoord.tensorflow.runs import RunTracker
from nbcoord.tensorflow.sessions import SessionCloses

log = logging.getLogger("nbcoord")

Maker = Callable[[Callable[..., Any]], Callable[..., Any]]


class Patched(Protocol):
    """What the patches use of the integration (:class:`~nbcoord.tensorflow.integration.TensorFlowIntegration`)."""

    active: bool
    tf_dir: str
    run_wrapper: Callable[..., Any] | None
    patches: ClassPatches
    tracker: RunTracker
    objects: TFObjects
    hidden: HiddenOps
    eager: EagerQueues
    registration: Registration
    closes: CloseOps
    coordinators: Coordinators
    sessions: SessionCloses


def patch_all(integration: Patched, classes: TFClasses) -> None:
    """Patch every class attribute the integration follows (restored by ``integration.patches.restore()``)."""
    patches, tracker = integration.patches, integration.tracker
    session_cls, queue_cls = classes.base_session, classes.queue_base
    runner_cls, coord_cls, graph_cls = classes.queue_runner, classes.coordinator, classes.graph
    funnel = run_funnel(session_cls)
    if funnel is not None:
        patches.patch(session_cls, funnel, tracker.make_hook)
    patches.patch(session_cls, "run", tracker.make_run_wrapper)
    integration.run_wrapper = vars(session_cls)["run"]
    patches.patch(session_cls, "__init__", _after(integration, integration.objects.add_session))
    patches.patch(session_cls, "close", _session_close(integration))
    patches.patch(queue_cls, "__init__", _queue_init(integration))
    for method in (*ENQUEUE_METHODS, *DEQUEUE_METHODS, "close"):
        if callable(vars(queue_cls).get(method)):
            patches.patch(queue_cls, method, _queue_method(integration, method))
    patches.patch(coord_cls, "__init__", _coord_init(integration))
    patches.patch(coord_cls, "request_stop", _request_stop(integration))
    patches.patch(runner_cls, "create_threads", _create_threads(integration))
    patches.patch(graph_cls, "get_operations", _get_operations(integration), inherited=True)
    export = graph_def_funnel(graph_cls)
    patches.patch(graph_cls, export, _graph_def(integration, tuple_result=export == "_as_graph_def"))


def _after(integration: Patched, register: Callable[[Any], Any]) -> Maker:
    """A patch maker: run the original ``__init__``, then register the new object (never failing the init)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            original(obj, *args, **kwargs)
            if integration.active:
                try:
                    register(obj)
                except Exception:
                    log.warning("nbcoord: could not register %s", type(obj).__name__, exc_info=True)

        return __init__

    return make


def _queue_init(integration: Patched) -> Maker:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(queue: Any, *args: Any, **kwargs: Any) -> None:
            original(queue, *args, **kwargs)
            if integration.active:
                try:
                    integration.registration.queue_created(queue, calling_frame(1))
                except Exception:
                    log.warning("nbcoord: could not register %s", type(queue).__name__, exc_info=True)

        return __init__

    return make


def _coord_init(integration: Patched) -> Maker:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(coord: Any, *args: Any, **kwargs: Any) -> None:
            original(coord, *args, **kwargs)
            if integration.active:
                try:
                    maker = getattr(getattr(calling_frame(1), "f_code", None), "co_filename", "")
                    integration.objects.add_coordinator(coord, tensorflow_made=maker.startswith(integration.tf_dir))
                except Exception:
                    log.warning("nbcoord: could not register a Coordinator", exc_info=True)

        return __init__

    return make


def _queue_method(integration: Patched, method: str) -> Maker:
    """Eager calls are followed by the eager part; a graph-mode ``close()`` also remembers the op it built."""
    eager_wrapper = integration.eager.make_wrapper(method)
    if method != "close":
        return eager_wrapper

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        eager_close = eager_wrapper(original)

        def close(queue: Any, *args: Any, **kwargs: Any) -> Any:
            result = eager_close(queue, *args, **kwargs)
            if result is not None and integration.active:
                integration.closes.close_op_built(queue, result)
            return result

        return close

    return make


def _session_close(integration: Patched) -> Maker:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def close(session: Any) -> Any:
            if integration.active:
                try:
                    integration.sessions.before_close(session, calling_frame(1))
                except Exception:
                    log.warning("nbcoord: stopping the runner threads of a closing session failed", exc_info=True)
            try:
                return original(session)
            finally:
                mark_closed(session)

        return close

    return make


def _request_stop(integration: Patched) -> Maker:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def request_stop(coord: Any, ex: Any = None) -> Any:
            if integration.active:
                if ex is not None:
                    ex = integration.coordinators.exception(coord, ex)
                integration.coordinators.stopping(coord, ex)
            return original(coord, ex)

        return request_stop

    return make


def _create_threads(integration: Patched) -> Maker:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def create_threads(runner: Any, *args: Any, **kwargs: Any) -> Any:
            threads = original(runner, *args, **kwargs)
            if integration.active and threads:
                try:
                    bound = signature.bind(runner, *args, **kwargs)
                    bound.apply_defaults()
                    integration.registration.runner_threads_created(
                        runner, bound.arguments["sess"], bound.arguments.get("coord"), threads
                    )
                except Exception:
                    log.warning("nbcoord: could not register queue-runner threads", exc_info=True)
            return threads

        return create_threads

    return make


def _get_operations(integration: Patched) -> Maker:
    hidden = integration.hidden

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def get_operations(graph: Any) -> Any:
            return hidden.filter_operations(graph, original(graph))

        return get_operations

    return make


def _graph_def(integration: Patched, *, tuple_result: bool) -> Maker:
    hidden = integration.hidden

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def graph_def(graph: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(graph, *args, **kwargs)
            if tuple_result:
                return (hidden.filter_graph_def(graph, result[0]), *result[1:])
            return hidden.filter_graph_def(graph, result)

        return graph_def

    return make
