"""TensorFlow: sessions, queues (graph mode and TF2's eager mode), queue runners and coordinators, accounted for.

nbcoord never imports TensorFlow. :func:`watch` installs this integration at once when TensorFlow is already
imported (objects that exist then are found by one garbage-collector scan), or right after the user imports it
(a post-import hook, so ``import tensorflow`` and the first Session may share a cell). Unload restores every
patched class attribute. TensorFlow's private names it touches are in :mod:`._tf_internals`, each with its
fallback. Tested with tensorflow-cpu 2.21 and 2.15.

What it does, with the scenario it serves (S1-S10: the demo notebooks under notebooks/ are named by them):

- Patches class attributes: ``BaseSession.__init__`` / ``close`` / ``run`` / ``_call_tf_sessionrun``,
  ``QueueBase.__init__`` and its ``enqueue`` / ``dequeue`` / ``close`` methods, ``QueueRunner.create_threads``,
  ``Coordinator.__init__`` / ``request_stop``, ``Graph.get_operations`` and the Graph's export funnel. Runner
  threads get their queue, runner, session and coordinator as owners in the registry.
- Queues, live (S6, S10): capacity, size, closed, enqueue/dequeue rates and a short history, polled about once a
  second: one prepared callable per session for graph queues, the queue's own ``size()`` for eager ones. The
  ops nbcoord adds to a graph to poll it are hidden from the user's graph: not in ``get_operations()``, not in any
  export.
- Blocked runs and calls, explained (S1, S10): "MainThread blocked 42 s in dequeue of queue `input` (0 of 100
  elements, no live producer)".
- Interrupt that works (S1, S10): SIGINT while the main thread is blocked on a queue nobody is feeding (or
  draining) resets that graph queue (the session and the queue stay usable) or closes that eager queue; the
  cell ends with ``KeyboardInterrupt`` and one sentence, at once: what that needs is prepared on a thread of its
  own right after TensorFlow's import (what formatting the traceback needs) and when the run is first seen
  blocking (the resets), and the traceback holds only the cell's frames and nbcoord's one.
- Stopping (S3, S4, S6, S8, S10): a stopper requests stop on every coordinator in scope, then closes the queues
  of the runners in scope with ``cancel_pending_enqueues=True``, the queues their enqueue ops read from, and the
  eager queues that threads in scope use.
- Closing a session first stops the runner threads bound to it through the extension's one stop (S2).
- Stuck pipelines, found and restarted (S8): per runner thread its last progress and whether it is stuck (no
  enqueue for ``stuck_after`` seconds while its queue had room), with the op it waits on; a session's runners
  restart through the one stop, ``create_threads`` and a fresh Coordinator (:meth:`restart_runners`).
- TensorFlow's own errors explained (S7): one sentence added (as a note) to "Attempted to use a closed Session",
  a closed queue's ``OutOfRangeError`` / ``CancelledError`` and a dequeue's ``DeadlineExceededError``.
- Coordinators (S5): exceptions that worker threads pass to ``request_stop`` are kept with traceback, thread and
  cell (the main thread's own are not: it sees them itself). ``request_stop(exc)`` outside an ``except`` block,
  where TensorFlow itself raises ``TypeError`` and never stops, is passed on as that exception's ``exc_info``:
  the stop happens and ``join()`` re-raises ``exc``. Inside an ``except`` block it is passed on unchanged.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from nbcoord.core.fork import on_fork_child
from nbcoord.core.imports import when_imported
from nbcoord.core.internals import calling_frame
from nbcoord.core.patches import ClassPatches
from nbcoord.core.registry import Owner
from nbcoord.tensorflow import eager as _tf_eager
from nbcoord.tensorflow import runs as _tf_runs
from nbcoord.tensorflow.blocked import BLOCKED_AFTER_S, BlockedRuns
from nbcoord.tensorflow.eager import DEQUEUE_METHODS, ENQUEUE_METHODS, EagerQueues, as_stopped
from nbcoord.tensorflow.explain import Explainer, called_from, fetched_names, run_names
from nbcoord.tensorflow.graph import SCOPE, HiddenOps, RunAnalyzer, graph_of
from nbcoord.tensorflow.health import DEFAULT_STUCK_AFTER_S, Health, RestartReport
from nbcoord.tensorflow.internals import (
    TFClasses,
    graph_def_funnel,
    is_clean_stop,
    queue_constructor_args,
    run_funnel,
    runner_thread_functions,
    tf_classes,
    thread_call,
)
from nbcoord.tensorflow.objects import CloseRecord, QueueInfo, RunnerInfo, TFObjects, mark_closed, session_is_open
from nbcoord.tensorflow.runs import INTERNAL_PREFIX, InterruptWatcher, RunState, RunTracker, prepare_tracebacks
from nbcoord.tensorflow.stopping import RunnerStopping

log = logging.getLogger("nbcoord")

#: nbcoord's folder: frames of its files are nbcoord's wrappers (the class patches among them).
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # nbcoord/

#: The thread that prepares, at install, what the traceback of a cancelled run needs, and how long it waits first.
PREPARE_THREAD = f"{INTERNAL_PREFIX}tf-prepare"
PREPARE_AFTER_S = 0.5

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
        self.hidden = HiddenOps()
        self.objects = TFObjects(self.tracker, self._current_cell, self.hidden)
        self.patches = ClassPatches()
        self.watcher = InterruptWatcher(self._on_sigint)
        self._undo: list[Callable[[], None]] = []
        #: TensorFlow classes by name, filled at install (the same dict is shared with the stopping part).
        self._tf: dict[str, Any] = {}
        #: TensorFlow error types by short name, filled at install (shared with the eager and explaining parts).
        self._errors: dict[str, type[BaseException]] = {}
        self.classes: TFClasses | None = None
        #: TensorFlow's package folder: code there is TensorFlow's own.
        self._tf_dir = "\0"
        self.blocked = BlockedRuns(self.objects, self.tracker, self.analyzer, self.registry)
        self.stopping = RunnerStopping(self.objects, self.tracker, self.analyzer, self.blocked, self._tf)
        self.eager = EagerQueues(self.objects, self.registry, self._current_cell, self._errors)
        self.explainer = Explainer(self.objects, self.tracker, self.analyzer, self.registry, self._errors)
        self.health = Health(self.objects, self.tracker, self.blocked, self.registry)
        #: Seconds without an enqueue (while the queue has room) after which a runner thread is stuck; None: the
        #: extension's ``stuck_after`` setting where it has one, else DEFAULT_STUCK_AFTER_S.
        self.stuck_after_s: float | None = None
        #: Close ops of the users' queues (graph mode), by id: the op and its queue (who closed a queue).
        self._close_ops: dict[int, tuple[weakref.ref[Any], QueueInfo]] = {}
        self._run_wrapper: Callable[..., Any] | None = None
        self.active = False
        #: When the watcher last saw SIGINT (monotonic), for tests and the bench.
        self.last_sigint_at = 0.0
        #: The report of the last stop made for a closing session (merged over its runner threads).
        self.last_close_report: dict[str, Any] | None = None

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
        tf = sys.modules["tensorflow"]
        classes = self.classes = tf_classes(tf)
        # TensorFlow's package folder, from the file of a class of its own (``tensorflow/python/...``).
        self._tf_dir = os.path.dirname(os.path.abspath(inspect.getfile(classes.coordinator)))
        self._tf_dir = self._tf_dir.rsplit(os.sep + "python" + os.sep, 1)[0] + os.sep
        self._tf.update(
            {
                "BaseSession": classes.base_session,
                "QueueBase": classes.queue_base,
                "QueueRunner": classes.queue_runner,
                "Coordinator": classes.coordinator,
                "CancelledError": classes.cancelled,
                "RunOptions": classes.run_options,
            }
        )
        self._errors.update(
            {
                "cancelled": classes.cancelled,
                "out_of_range": classes.out_of_range,
                "deadline_exceeded": classes.deadline_exceeded,
                "op_error": classes.op_error,
            }
        )
        executing_eagerly = tf.executing_eagerly
        self.objects.executing_eagerly = executing_eagerly
        self.eager.executing_eagerly = executing_eagerly
        self.eager.explain = self.explainer.explain_eager
        self.stopping.close_eager = self.eager.close_for_stop
        self.blocked.traceback_file = self.eager.traceback_file = self._traceback_file
        self.stopping.current_cell = self._current_cell
        self.tracker.on_failure = self._on_run_failure
        self.tracker.on_run_error = self._on_run_error
        self.tracker.on_run_done = self._on_close_run
        self.tracker.prepared_run = self.stopping.prepared_run
        self.active = self.eager.active = True
        self._patch_all(classes)
        if scan:
            self._scan_existing()
        ext = self.extension
        self._undo.append(ext.snapshots.add_source("tensorflow", self._source))
        self._undo.append(ext.stopper.add_stopper("tensorflow", self._stop))
        self._undo.append(ext.monitor.add_task("tensorflow", self.tick))
        self._undo.append(on_fork_child(self._forget_in_child))
        if self.watcher.install():
            self._undo.append(self.watcher.uninstall)
            self._undo.append(on_fork_child(self.watcher.forget_in_child))
            self._start_preparing()

    def _start_preparing(self) -> None:
        """Prepare, off the user's time and once, what the first Interrupt's traceback needs (see
        :func:`prepare_tracebacks`): on a thread that only fills caches and ends by itself; an unload meanwhile
        stops it between two steps and joins it, so that no thread of nbcoord's outlives the unload, and a
        shutdown stops it between two steps (a process that exits right after importing TensorFlow would
        otherwise share the interpreter with it while it exits)."""
        stop = threading.Event()

        def prepare() -> None:
            # After a pause: the cell that imported TensorFlow usually goes on in Python (building a model), and
            # a script may exit at once; either would share the interpreter with this work.
            if not stop.wait(PREPARE_AFTER_S):
                prepare_tracebacks([_tf_runs, _tf_eager], stop)

        thread = threading.Thread(target=prepare, name=PREPARE_THREAD, daemon=True)
        self._undo.append(self.extension.add_own_stopper(stop.set))
        thread.start()

        def undo() -> None:
            stop.set()
            thread.join(timeout=2.0)

        self._undo.append(undo)

    def _forget_in_child(self) -> None:
        """In a forked child: every patch passes straight through (no lock taken, nothing stopped)."""
        self.active = self.eager.active = False

    def uninstall(self) -> None:
        """Undo :meth:`install`: every patched attribute restored, every registration removed."""
        self.active = self.eager.active = False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: a TensorFlow unload step failed", exc_info=True)
        self.patches.restore()
        self.stopping.clear()
        self.tracker.watched_ops = frozenset()

    def _patch_all(self, classes: TFClasses) -> None:
        session_cls, queue_cls = classes.base_session, classes.queue_base
        runner_cls, coord_cls, graph_cls = classes.queue_runner, classes.coordinator, classes.graph
        funnel = run_funnel(session_cls)
        if funnel is not None:
            self.patches.patch(session_cls, funnel, self.tracker.make_hook)
        self.patches.patch(session_cls, "run", self.tracker.make_run_wrapper)
        self._run_wrapper = vars(session_cls)["run"]
        self.patches.patch(session_cls, "__init__", self._after(self.objects.add_session))
        self.patches.patch(session_cls, "close", self._wrap_close)
        self.patches.patch(queue_cls, "__init__", self._wrap_queue_init)
        for method in (*ENQUEUE_METHODS, *DEQUEUE_METHODS, "close"):
            if callable(vars(queue_cls).get(method)):
                self.patches.patch(queue_cls, method, self._wrap_queue_method(method))
        self.patches.patch(coord_cls, "__init__", self._wrap_coord_init)
        self.patches.patch(coord_cls, "request_stop", self._wrap_request_stop)
        self.patches.patch(runner_cls, "create_threads", self._wrap_create_threads)
        self.patches.patch(graph_cls, "get_operations", self._wrap_get_operations, inherited=True)
        export = graph_def_funnel(graph_cls)
        self.patches.patch(graph_cls, export, self._wrap_graph_def(tuple_result=export == "_as_graph_def"))

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

    def _wrap_queue_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def __init__(queue: Any, *args: Any, **kwargs: Any) -> None:
            original(queue, *args, **kwargs)
            if integration.active:
                try:
                    integration.queue_created(queue, calling_frame(1))
                except Exception:
                    log.warning("nbcoord: could not register %s", type(queue).__name__, exc_info=True)

        return __init__

    def _wrap_coord_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def __init__(coord: Any, *args: Any, **kwargs: Any) -> None:
            original(coord, *args, **kwargs)
            if integration.active:
                try:
                    maker = getattr(getattr(calling_frame(1), "f_code", None), "co_filename", "")
                    integration.objects.add_coordinator(coord, tensorflow_made=maker.startswith(integration._tf_dir))
                except Exception:
                    log.warning("nbcoord: could not register a Coordinator", exc_info=True)

        return __init__

    def _wrap_queue_method(self, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Eager calls are followed by the eager part; a graph-mode ``close()`` also remembers the op it built."""
        eager_wrapper = self.eager.make_wrapper(method)
        if method != "close":
            return eager_wrapper
        integration = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            eager_close = eager_wrapper(original)

            def close(queue: Any, *args: Any, **kwargs: Any) -> Any:
                result = eager_close(queue, *args, **kwargs)
                if result is not None and integration.active:
                    integration.close_op_built(queue, result)
                return result

            return close

        return make

    def _wrap_close(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def close(session: Any) -> Any:
            if integration.active:
                try:
                    integration.before_session_close(session, calling_frame(1))
                except Exception:
                    log.warning("nbcoord: stopping the runner threads of a closing session failed", exc_info=True)
            try:
                return original(session)
            finally:
                mark_closed(session)

        return close

    def _wrap_request_stop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        integration = self

        def request_stop(coord: Any, ex: Any = None) -> Any:
            if integration.active:
                if ex is not None:
                    ex = integration.coordinator_exception(coord, ex)
                integration.coordinator_stopping(coord, ex)
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

    def _wrap_get_operations(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hidden = self.hidden

        def get_operations(graph: Any) -> Any:
            return hidden.filter_operations(graph, original(graph))

        return get_operations

    def _wrap_graph_def(self, *, tuple_result: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        hidden = self.hidden

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def graph_def(graph: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(graph, *args, **kwargs)
                if tuple_result:
                    return (hidden.filter_graph_def(graph, result[0]), *result[1:])
                return hidden.filter_graph_def(graph, result)

            return graph_def

        return make

    def _current_cell(self) -> int | None:
        cell = self.registry.current_cell()
        return cell.execution_count if cell is not None else None

    def _traceback_file(self, filename: str) -> bool:
        """Whether a frame of this file is in the traceback of a run nbcoord cancels: nbcoord's wrappers, cells."""
        return filename.startswith(_HERE) or self.extension.cell_of_file(filename) is not None

    # ------------------------------------------------------------------------------------ registration
    def queue_created(self, queue: Any, constructor: Any) -> QueueInfo | None:
        """Register a new queue: a graph-mode one (with its hidden polling ops), or an eager one."""
        if graph_of(queue) is None and callable(getattr(queue.queue_ref, "numpy", None)):
            return self.objects.add_queue(queue, eager_args=queue_constructor_args(constructor))
        return self.objects.add_queue(queue)

    def close_op_built(self, queue: Any, op: Any) -> None:
        """Remember a graph-mode close op of a user's queue (or of a QueueRunner), to know who ran it."""
        name = str(getattr(op, "name", ""))
        if name.startswith(SCOPE):
            return  # nbcoord's own: its runs are recorded where nbcoord makes them
        info = self.objects.queue_info(queue)
        if info is None:
            return
        with self.objects.lock:
            self._close_ops = {k: v for k, v in self._close_ops.items() if v[0]() is not None}
            self._close_ops[id(op)] = (weakref.ref(op), info)
            self.tracker.watched_ops = frozenset(self._close_ops)

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
                    self._add_existing_queue(obj)
                else:
                    self.objects.add_coordinator(obj, preexisting=True)
            except Exception:
                log.warning("nbcoord: could not register an existing %s", type(obj).__name__, exc_info=True)
        self._scan_runner_threads()
        log.debug("nbcoord: TensorFlow scan found %d objects in %.3f s", len(found), time.monotonic() - started)

    def _add_existing_queue(self, queue: Any) -> None:
        if graph_of(queue) is None and callable(getattr(queue.queue_ref, "numpy", None)):
            from nbcoord.tensorflow.internals import QueueArgs

            self.objects.add_queue(queue, preexisting=True, eager_args=QueueArgs(None, -1, 0))
        else:
            self.objects.add_queue(queue, preexisting=True)

    def _scan_runner_threads(self) -> None:
        functions = runner_thread_functions(self._tf["QueueRunner"])
        if functions is None:
            return
        run_fn, close_fn = functions
        for thread in threading.enumerate():
            target, args, _kwargs = thread_call(thread)
            func = getattr(target, "__func__", None)
            if func not in (run_fn, close_fn) or self.objects.runner(thread) is not None:
                continue
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
        """What ``request_stop(ex)`` passes on to TensorFlow, and the worker's exception kept (S5).

        TensorFlow reads ``sys.exc_info()`` when given an exception instance. Inside an ``except`` block that is
        what it documents, and ``ex`` is passed on unchanged. Outside one it is empty: TensorFlow then raises
        TypeError (formatting its own error message) and never stops; nbcoord passes ``ex``'s own exc_info
        instead, so the stop happens and ``join()`` re-raises ``ex``.

        An exception a background thread reports is kept with its traceback, thread and cell; the main thread's
        is not (it raised it itself, and ``join()`` raises it there again), nor one reported to a coordinator that
        TensorFlow's own code made (MirroredStrategy's replica threads, MonitoredSession's runners): TensorFlow
        re-raises those in the cell that called it.
        """
        exc = ex[1] if isinstance(ex, tuple) and len(ex) == 3 else ex
        if isinstance(ex, BaseException) and sys.exc_info()[1] is None:
            ex = (type(ex), ex, ex.__traceback__)
        try:
            thread = threading.current_thread()
            out_of_range = self._errors["out_of_range"]
            kept = isinstance(exc, BaseException) and not is_clean_stop(coord, exc, out_of_range)
            cinfo = self.objects.coord_info(coord)
            kept = kept and not (cinfo is not None and cinfo.tensorflow_made)
            if kept and thread is not threading.main_thread() and not coord.should_stop() and not coord.joined:
                # Thread.start queues a thread before it runs, so even one failing at once has its cell here.
                self.registry.thread_failed(thread, exc)
        except Exception:
            log.warning("nbcoord: could not record a coordinator's exception", exc_info=True)
        return ex

    def coordinator_stopping(self, coord: Any, ex: Any) -> None:
        """Remember who first asked a coordinator to stop, and why (for the sentence of a closed queue)."""
        try:
            if coord.should_stop():
                return
            cinfo = self.objects.coord_info(coord) or self.objects.add_coordinator(coord)
            if cinfo.stopped_by is not None:
                return
            thread = threading.current_thread()
            exc = ex[1] if isinstance(ex, tuple) and len(ex) == 3 else ex
            why = f"with {type(exc).__name__}: {str(exc)[:120]}" if isinstance(exc, BaseException) else ""
            if thread.name.startswith(INTERNAL_PREFIX) or self.extension.stopper.running() is not None:
                who, cell = "nbcoord's stop", self._current_cell()
            else:
                record = self.registry.for_thread(thread)
                who = "the main thread" if thread is threading.main_thread() else f"thread '{thread.name}'"
                cell = self._current_cell() if thread is threading.main_thread() else (
                    record.cell.execution_count if record is not None and record.cell is not None else None
                )
            cinfo.stopped_by = CloseRecord("coordinator", who, cell, time.time(), why)
        except Exception:
            log.debug("nbcoord: could not record a coordinator's stop", exc_info=True)

    # ------------------------------------------------------------------------------------- explanations
    def _on_run_failure(
        self, state: RunState, exc: BaseException, session: Any, fetch_list: Any, target_list: Any
    ) -> BaseException:
        """The run hook's failure path: a sentence for errors of prepared steps (``Session.run``'s get theirs in
        the run wrapper), and a stopped thread's error where nbcoord's stop caused it."""
        if not self.active or state.internal:
            return exc
        thread = threading.current_thread()
        runner = self.objects.runner(thread)
        queue_closed = isinstance(exc, (self._errors["cancelled"], self._errors["out_of_range"]))
        if not called_from(self._run_wrapper) and (runner is None or not queue_closed):
            # A runner ends quietly on a closed queue: explaining each would only slow a stop down.
            self.explainer.explain_run(exc, session, run_names(fetch_list, target_list))
        if queue_closed and runner is None and thread is not threading.main_thread():
            record = self.registry.for_thread(thread)
            if record is not None and record.stop_requested_at is not None:
                return as_stopped(exc)
        return exc

    def _on_run_error(self, session: Any, fetches: Any, exc: BaseException) -> None:
        """An error that reaches the caller of ``Session.run``: its sentence."""
        if self.active and not threading.current_thread().name.startswith(INTERNAL_PREFIX):
            self.explainer.explain_run(exc, session, fetched_names(fetches))

    def _on_close_run(self, session: Any, fetches: Any) -> None:
        """A run of a user's (or a QueueRunner's) close op completed: remember who closed the queue."""
        if not self.active:
            return
        sinfo = self.objects.session_info(session)
        thread = threading.current_thread()
        if sinfo is None or thread.name.startswith(INTERNAL_PREFIX):
            return
        items = fetches if isinstance(fetches, (list, tuple)) else [fetches]
        record = self._close_record(thread)
        with self.objects.lock:
            for op in items:
                entry = self._close_ops.get(id(op))
                if entry is None or entry[0]() is not op:
                    continue
                state = entry[1].state(sinfo.sid)
                state.note_close(record, in_flight=False)
                state.closed = True

    def _close_record(self, thread: threading.Thread) -> CloseRecord:
        runner = self.objects.runner(thread)
        now = time.time()
        if runner is not None:
            qr = runner.runner_ref()
            name = f"QueueRunner `{getattr(qr, 'name', '?')}`"
            coord = runner.coord_ref() if runner.coord_ref is not None else None
            cinfo = self.objects.coord_info(coord) if coord is not None else None
            if runner.role == "close_on_stop" and cinfo is not None and cinfo.stopped_by is not None:
                return self.explainer.coordinator_record(runner, cinfo.cid, cinfo.stopped_by)
            return CloseRecord("runner-end", thread.name, runner.cell, now, name)
        if thread is threading.main_thread():
            return CloseRecord("close-op", "MainThread", self._current_cell(), now)
        record = self.registry.for_thread(thread)
        cell = record.cell.execution_count if record is not None and record.cell is not None else None
        return CloseRecord("close-op", thread.name, cell, now)

    # -------------------------------------------------------------------------------------------- stops
    def _stop(self, scope: Any) -> None:
        """The stopper: coordinators first, then close the queues, so that the threads end in the join."""
        self._attach_pending()
        threads = [record.thread for record in scope.records if record.thread is not None]
        self.stopping.stop_threads(threads, scope.deadline, scope.kind, scope.cell)

    def stop_runner_threads(self, threads: Iterable[threading.Thread], grace: float, why: str) -> dict[str, Any]:
        """Stop these runner threads through the extension's one stop (one stop of scope "threads"), so that it
        yields a report, shows as the last stop and can force.

        Threads the one stop cannot take (not registered, or a stop that cannot run here: a session closed
        from inside a stop) are stopped and joined directly.
        """
        started, wall = time.monotonic(), time.time()
        deadline = started + max(grace, 0.1)
        threads = [t for t in threads if t.is_alive()]
        tids = {id(t): r.tid for t in threads if (r := self.registry.for_thread(t)) is not None and r.user}
        merged: dict[str, Any] = {
            "scope": "threads",
            "why": why,
            "cell": None,
            "grace": grace,
            "force": False,
            "started_at": wall,
            "took_s": 0.0,
            "stopped": [],
            "alive": [],
            "stopper_errors": [],
            "children": {"terminated": [], "killed": [], "alive": []},
        }
        direct = [thread for thread in threads if id(thread) not in tids]
        if tids:
            report = self.extension.stopper.stop(
                "threads", tids=tuple(tids.values()), grace=max(0.05, deadline - time.monotonic())
            )
            if any(err["error"].startswith("not run") for err in report["stopper_errors"]):
                direct += [thread for thread in threads if id(thread) in tids]
            else:
                merged["stopped"] += report["stopped"]
                merged["alive"] += report["alive"]
                merged["stopper_errors"] += report["stopper_errors"]
        if direct:
            self.stopping.stop_threads(direct, deadline, scope="session close")
            for thread in direct:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        reported = {row["tid"] for row in merged["stopped"] + merged["alive"]}
        for thread in threads:
            tid = tids.get(id(thread))
            if tid in reported:
                continue
            row = {"tid": tid, "name": thread.name, "cell": None, "reason": None, "stack": None}
            if thread.is_alive():
                row["reason"] = "did not stop in time"
                merged["alive"].append(row)
            else:
                merged["stopped"].append(row)
        merged["took_s"] = time.monotonic() - started
        return merged

    def before_session_close(self, session: Any, caller: Any = None) -> None:
        """Before a session closes: remember who closes it, and stop its runner threads (S2)."""
        if not session_is_open(session):
            return
        info = self.objects.session_info(session) or self.objects.add_session(session)
        code = getattr(getattr(caller, "f_code", None), "co_name", "")
        thread = threading.current_thread()
        source = "with-block" if code == "__exit__" else "close-call"
        info.closed_by = CloseRecord(source, thread.name, self._current_cell(), time.time())
        info.closing = True
        if info.lock.acquire(timeout=1.0):  # a poll in flight ends first
            info.lock.release()
        threads = self.stopping.session_runners(session)
        if not threads:
            return
        grace = float(self.extension.config.grace_period)
        report = self.stop_runner_threads(threads, grace, f"close of session {info.sid}")
        self.last_close_report = report
        left = [row["name"] for row in report["alive"]]
        if left:
            log.warning("nbcoord: session %s closes with %d runner thread(s) running: %s", info.sid, len(left), left)

    # ---------------------------------------------------------------------------------- stuck and restart
    def stuck_after(self) -> float:
        """Seconds without an enqueue (while its queue has room) after which a runner thread is stuck."""
        if self.stuck_after_s is not None:
            return float(self.stuck_after_s)
        configured = getattr(self.extension.config, "stuck_after", None)
        return float(configured) if isinstance(configured, (int, float)) else DEFAULT_STUCK_AFTER_S

    def restart_runners(self, session: Any, *, grace: float | None = None) -> RestartReport:
        """Restart a session's queue runners: stop them through the one stop, reset the queues that closed,
        start them again with ``create_threads`` and a fresh Coordinator. ``session``: the Session or its id.

        Raises
        ------
        ValueError
            No open session is known by that id, or it has no queue runners started.
        RuntimeError
            TensorFlow is not imported (or the integration is not installed).
        """
        if not self.active:
            raise RuntimeError("TensorFlow is not imported: there is no session to restart.")
        if not isinstance(session, str):
            info = self.objects.session_info(session)
            if info is None:
                raise ValueError("That session is not known to nbcoord.")
            session = info.sid
        self._attach_pending()
        return self.health.restart(
            session,
            grace=float(self.extension.config.grace_period if grace is None else grace),
            stop_threads=self.stop_runner_threads,
            coordinator_cls=self._tf["Coordinator"],
            current_cell=self._current_cell(),
        )

    def coordinator(self, cid: str) -> Any | None:
        """A live Coordinator by its id (a restart's report names the fresh one)."""
        return self.objects.coordinator_by_id(cid)

    # ------------------------------------------------------------------------------------------ interrupt
    def _on_sigint(self) -> None:
        """On the watcher thread: cancel the main thread's run (or eager queue call) if it waits on a queue nobody
        serves."""
        self.last_sigint_at = time.monotonic()
        if self.active and not self.blocked.cancel_main_run(self._tf["RunOptions"]):
            self.eager.cancel_main()

    # ------------------------------------------------------------------------------------ source and tick
    def _source(self) -> dict[str, Any]:
        self._attach_pending()
        self.objects.poll_all(record=False, wait=0.1)
        after = self.stuck_after()
        return {
            "queues": self.objects.queue_rows(lambda queue, sid: self.health.queue_extra(queue, sid, after)),
            "blocked_runs": self.blocked.rows() + self.eager.blocked_rows(BLOCKED_AFTER_S),
            "sessions": self.objects.session_rows(lambda info: self.health.session_extra(info, after)),
        }

    def tick(self) -> None:
        """The monitor task (about once a second): owners, polls, progress, prepared closes and resets. Tests and
        the bench call it."""
        self._attach_pending()
        self.objects.poll_all(record=True, wait=0.0)
        self.health.sample()
        self.blocked.prepare_main()
        self.eager.prepare_main()
        self.stopping.prepare_closes()
        self.stopping.restore_closed_types()

