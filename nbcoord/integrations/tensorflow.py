"""TensorFlow (graph mode, ``tf.compat.v1``): sessions, queues, queue runners and coordinators, accounted for.

nbcoord never imports TensorFlow. :func:`watch` installs this integration at once when TensorFlow is already
imported (objects that exist then are found by one garbage-collector scan), or right after the user imports it
(a post-import hook, so ``import tensorflow`` and the first Session may share a cell). Unload restores every
patched class attribute.

What it does, with the scenario of ``shared/SCENARIOS.md`` it serves:

- Patches class attributes: ``BaseSession.__init__``/``close``/``_call_tf_sessionrun``, ``QueueBase.__init__``,
  ``QueueRunner.create_threads``, ``Coordinator.__init__``/``request_stop``. Runner threads get their queue,
  runner, session and coordinator as owners in the registry.
- Queues, live (S6): capacity, size, closed, enqueue/dequeue rates and a short history, polled about once a
  second with one prepared callable per session.
- Blocked runs, explained (S1): "MainThread blocked 42 s in dequeue of queue `input` (0 of 100 elements, no live
  producer)".
- Interrupt that works (S1): SIGINT while the main thread is blocked in a run on a queue nobody is feeding (or
  draining) resets that queue (close, destroy; the next step creates it again, empty): the run fails at once,
  the cell gets ``KeyboardInterrupt``, and the session and the queue stay usable.
- Stopping (S3, S4, S6, S8): a stopper requests stop on every coordinator in scope, then closes the queues of the
  runners in scope with ``cancel_pending_enqueues=True``, and the queues their enqueue ops read from. Runners
  without a coordinator stop too: their runner is told to treat the cancelled enqueue as the end of input.
- Closing a session first stops and joins the runner threads bound to it (S2): no "Session has been closed".
- ``Coordinator.request_stop(exc)`` outside an ``except`` block works (TensorFlow 2.21 raises TypeError there
  and never stops); exceptions that reach a coordinator are kept with traceback, thread and cell (S5).
"""

from __future__ import annotations

import gc
import inspect
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .._fork import on_fork_child
from .._imports import when_imported
from .._registry import Owner
from ._tf_blocked import BlockedRuns
from ._tf_graph import RunAnalyzer
from ._tf_objects import QueueInfo, RunnerInfo, TFObjects, session_is_open
from ._tf_patches import ClassPatches
from ._tf_runs import InterruptWatcher, RunTracker
from ._tf_stopping import RunnerStopping

log = logging.getLogger("nbcoord")

#: The integration of the loaded extension (one per process), for tests, the bench and debugging.
_current: TensorFlowIntegration | None = None


def watch(extension: Any) -> Callable[[], None]:
    """Install the integration now if TensorFlow is imported, else when it is; returns the undo."""
    global _current
    integration = TensorFlowIntegration(extension)
    _current = integration
    already = "tensorflow" in sys.modules
    # Objects can only predate the integration when TensorFlow was imported before nbcoord was loaded.
    remove_hook = when_imported("tensorflow", lambda _module: integration.install(scan=already))

    def undo() -> None:
        global _current
        remove_hook()
        integration.uninstall()
        if _current is integration:
            _current = None

    return undo


def current() -> TensorFlowIntegration | None:
    """The TensorFlow integration of the loaded extension, if any (installed or waiting for the import)."""
    return _current


class TensorFlowIntegration:
    """Patches, sources, stopper and monitor task of the TensorFlow integration, for one extension."""

    def __init__(self, extension: Any) -> None:
        self.extension = extension
        self.registry = extension.registry
        self.tracker = RunTracker()
        self.analyzer = RunAnalyzer()
        self.objects = TFObjects(self.tracker, self._current_cell)
        self.patches = ClassPatches()
        self.watcher = InterruptWatcher(self._on_sigint)
        self._undo: list[Callable[[], None]] = []
        #: TensorFlow classes by name, filled at install (the same dict is shared with the stopping part).
        self._tf: dict[str, Any] = {}
        self.blocked = BlockedRuns(self.objects, self.tracker, self.analyzer, self.registry)
        self.stopping = RunnerStopping(self.objects, self.tracker, self.analyzer, self.blocked, self._tf)
        self.active = False
        #: When the watcher last saw SIGINT (monotonic), for tests and the bench.
        self.last_sigint_at = 0.0

    # ------------------------------------------------------------------------------------- install / undo
    def install(self, *, scan: bool = True) -> None:
        """Patch TensorFlow's classes, find existing objects (``scan``), register source, stopper, monitor task."""
        if self.active:
            return
        try:
            self._install(scan)
        except Exception:
            log.warning("nbcoord: the TensorFlow integration could not be installed", exc_info=True)
            self.uninstall()

    def _install(self, scan: bool) -> None:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.client import session as session_module
        from tensorflow.python.framework import errors
        from tensorflow.python.ops import data_flow_ops
        from tensorflow.python.training import coordinator, queue_runner_impl

        self._tf.update(
            {
                "BaseSession": session_module.BaseSession,
                "QueueBase": data_flow_ops.QueueBase,
                "QueueRunner": queue_runner_impl.QueueRunner,
                "Coordinator": coordinator.Coordinator,
                "CancelledError": errors.CancelledError,
                "RunOptions": config_pb2.RunOptions,
                "CallableOptions": config_pb2.CallableOptions,
            }
        )
        self.active = True
        self._patch_all()
        if scan:
            self._scan_existing()
        ext = self.extension
        self._undo.append(ext.snapshots.add_source("tensorflow", self._source))
        self._undo.append(ext.stopper.add_stopper("tensorflow", self._stop))
        self._undo.append(ext.monitor.add_task("tensorflow", self.tick))
        if self.watcher.install():
            self._undo.append(self.watcher.uninstall)
            self._undo.append(on_fork_child(self.watcher.forget_in_child))

    def uninstall(self) -> None:
        """Undo :meth:`install`: every patched attribute restored, every registration removed."""
        self.active = False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: a TensorFlow unload step failed", exc_info=True)
        self.patches.restore()
        self.stopping.clear()

    def _patch_all(self) -> None:
        tf = self._tf
        session_cls, queue_cls = tf["BaseSession"], tf["QueueBase"]
        runner_cls, coord_cls = tf["QueueRunner"], tf["Coordinator"]
        self.patches.patch(session_cls, "_call_tf_sessionrun", self.tracker.make_hook)
        self.patches.patch(session_cls, "__init__", self._after(self.objects.add_session))
        self.patches.patch(session_cls, "close", self._wrap_close)
        self.patches.patch(queue_cls, "__init__", self._after(self.objects.add_queue))
        self.patches.patch(coord_cls, "__init__", self._after(self.objects.add_coordinator))
        self.patches.patch(coord_cls, "request_stop", self._wrap_request_stop)
        self.patches.patch(runner_cls, "create_threads", self._wrap_create_threads)

    def _after(self, register: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A patch maker: run the original ``__init__``, then register the new object (never failing the init)."""
        integration = self

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

    def _wrap_close(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def close(session: Any) -> Any:
            if integration.active:
                try:
                    integration.before_session_close(session)
                except Exception:
                    log.warning("nbcoord: stopping the runner threads of a closing session failed", exc_info=True)
            return original(session)

        return close

    def _wrap_request_stop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def request_stop(coord: Any, ex: Any = None) -> Any:
            if ex is not None and integration.active:
                ex = integration.coordinator_exception(coord, ex)
            return original(coord, ex)

        return request_stop

    def _wrap_create_threads(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self
        signature = inspect.signature(original)

        def create_threads(runner: Any, *args: Any, **kwargs: Any) -> Any:
            threads = original(runner, *args, **kwargs)
            if integration.active and threads:
                try:
                    bound = signature.bind(runner, *args, **kwargs)
                    bound.apply_defaults()
                    integration.runner_threads_created(
                        runner, bound.arguments["sess"], bound.arguments.get("coord"), threads
                    )
                except Exception:
                    log.warning("nbcoord: could not register queue-runner threads", exc_info=True)
            return threads

        return create_threads

    def _current_cell(self) -> int | None:
        cell = self.registry.current_cell()
        return cell.execution_count if cell is not None else None

    # ------------------------------------------------------------------------------------ registration
    def runner_threads_created(self, runner: Any, session: Any, coord: Any, threads: list[Any]) -> None:
        """Register what ``create_threads`` returned: one thread per enqueue op, then the close-on-stop one."""
        enqueue_ops = list(runner.enqueue_ops)
        for index, thread in enumerate(threads):
            op = enqueue_ops[index] if index < len(enqueue_ops) else None
            self.objects.add_runner_thread(thread, runner, session, coord, op)
        self._attach_pending()

    def _scan_existing(self) -> None:
        """Find the sessions, queues, coordinators and runner threads that existed before the install."""
        tf = self._tf
        kinds = (tf["BaseSession"], tf["QueueBase"], tf["Coordinator"])
        started = time.monotonic()
        found = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
        for obj in found:
            try:
                if isinstance(obj, tf["BaseSession"]):
                    self.objects.add_session(obj, preexisting=True)
                elif isinstance(obj, tf["QueueBase"]):
                    self.objects.add_queue(obj, preexisting=True)
                else:
                    self.objects.add_coordinator(obj, preexisting=True)
            except Exception:
                log.warning("nbcoord: could not register an existing %s", type(obj).__name__, exc_info=True)
        self._scan_runner_threads()
        log.debug("nbcoord: TensorFlow scan found %d objects in %.3f s", len(found), time.monotonic() - started)

    def _scan_runner_threads(self) -> None:
        runner_cls = self._tf["QueueRunner"]
        run_fn, close_fn = runner_cls.__dict__["_run"], runner_cls.__dict__["_close_on_stop"]
        for thread in threading.enumerate():
            target = getattr(thread, "_target", None)
            func = getattr(target, "__func__", None)
            if func not in (run_fn, close_fn) or self.objects.runner(thread) is not None:
                continue
            args = tuple(getattr(thread, "_args", ()))
            runner = getattr(target, "__self__", None)
            if func is run_fn and len(args) >= 2:
                coord = args[2] if len(args) > 2 else None
                self.objects.add_runner_thread(thread, runner, args[0], coord, args[1])
            elif func is close_fn and len(args) == 3:
                self.objects.add_runner_thread(thread, runner, args[0], args[2], None)
        self._attach_pending()

    def _attach_pending(self) -> None:
        """Give started runner threads their owners (a thread created with start=False is registered later)."""
        for runner in self.objects.runners(alive_only=False):
            if runner.attached:
                continue
            thread = runner.thread_ref()
            if thread is None or thread.ident is None:
                continue
            if self.registry.for_thread(thread) is None:
                continue
            runner.attached = True
            for owner in self._owners(runner):
                self.registry.add_owner(thread, owner, claim=True)  # a runner thread is always user work

    def _owners(self, runner: RunnerInfo) -> list[Owner]:
        owners: list[Owner] = []
        session = runner.session_ref()
        sinfo = self.objects.session_info(session) if session is not None else None
        queue = runner.queue
        qr = runner.runner_ref()
        if queue is not None and (queue_obj := queue.ref()) is not None:
            sid = sinfo.sid if sinfo is not None else ""

            def queue_closed(_queue: object, queue: QueueInfo = queue, sid: str = sid) -> bool:
                state = queue.states.get(sid)
                return bool(state is not None and state.closed)

            owners.append(Owner("queue", f"queue `{queue.name}`", weakref.ref(queue_obj), queue_closed))
        if qr is not None:
            owners.append(Owner("queue-runner", f"QueueRunner `{qr.name}`", weakref.ref(qr)))
        if session is not None and sinfo is not None:
            owners.append(
                Owner("session", f"Session {sinfo.sid}", weakref.ref(session), lambda s: not session_is_open(s))
            )
        coord = runner.coord_ref() if runner.coord_ref is not None else None
        if coord is not None:
            cinfo = self.objects.coord_info(coord) or self.objects.add_coordinator(coord)
            owners.append(
                Owner(
                    "coordinator",
                    f"Coordinator {cinfo.cid}",
                    weakref.ref(coord),
                    lambda c: bool(getattr(c, "joined", False)),
                )
            )
        return owners

    # ------------------------------------------------------------------------------------- coordinators
    def coordinator_exception(self, coord: Any, ex: Any) -> Any:
        """Pass a coordinator's exception on as ``exc_info`` and keep it with traceback, thread and cell (S5).

        TensorFlow 2.21 reads ``sys.exc_info()`` when given an exception instance, which outside an ``except``
        block is empty: the caller gets a TypeError and the stop is never requested. A tuple is always right.
        """
        exc = ex[1] if isinstance(ex, tuple) and len(ex) == 3 else ex
        if isinstance(ex, BaseException):
            ex = (type(ex), ex, ex.__traceback__)
        try:
            kept = isinstance(exc, BaseException) and coord._filter_exception(exc) is not None
            if kept and not coord.should_stop() and not coord.joined:
                # Thread.start queues a thread before it runs, so even one failing at once has its cell here.
                self.registry.thread_failed(threading.current_thread(), exc)
        except Exception:
            log.warning("nbcoord: could not record a coordinator's exception", exc_info=True)
        return ex

    # -------------------------------------------------------------------------------------------- stops
    def _stop(self, scope: Any) -> None:
        """The stopper: coordinators first, then close the queues, so that the threads end in the join."""
        self._attach_pending()
        threads = [record.thread for record in scope.records if record.thread is not None]
        self.stopping.stop_threads(threads, scope.deadline)

    def before_session_close(self, session: Any) -> None:
        """Stop and join the runner threads bound to a session before it closes (S2)."""
        self.stopping.before_session_close(session, float(self.extension.config.grace_period))

    # ------------------------------------------------------------------------------------------ interrupt
    def _on_sigint(self) -> None:
        """On the watcher thread: cancel the main thread's run if it is blocked on a queue nobody serves."""
        self.last_sigint_at = time.monotonic()
        if self.active:
            self.blocked.cancel_main_run(self._tf["RunOptions"])

    # ------------------------------------------------------------------------------------ source and tick
    def _source(self) -> dict[str, Any]:
        self._attach_pending()
        self.objects.poll_all(record=False, wait=0.1)
        return {
            "queues": self.objects.queue_rows(),
            "blocked_runs": self.blocked.rows(),
            "sessions": self.objects.session_rows(),
        }

    def tick(self) -> None:
        """The monitor task (about once a second): owners, polls, prepared closes. Tests and the bench call it."""
        self._attach_pending()
        self.objects.poll_all(record=True, wait=0.0)
        self.stopping.prepare_closes()
        self.stopping.restore_closed_types()
