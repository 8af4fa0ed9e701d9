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
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._imports import when_imported
from .._registry import Owner
from ._tf_graph import QueueUse, RunAnalyzer, run_op_names
from ._tf_objects import QueueInfo, QueueState, RunnerInfo, TFObjects, session_is_open
from ._tf_patches import ClassPatches
from ._tf_runs import InterruptWatcher, RunState, RunTracker, RunView

log = logging.getLogger("nbcoord")

#: A run in flight this long, waiting on a queue, is reported as blocked.
BLOCKED_AFTER_S = 1.0
#: A run in flight this long, not waiting on any known queue, is reported as a long run.
LONG_RUN_S = 10.0
#: A producer (or consumer) whose run has lasted longer than this is stuck, not progressing.
PROGRESS_S = 2.0
#: Snapshots poll sessions whose last poll is older than this.
SNAPSHOT_POLL_AGE_S = 0.5


#: The integration of the loaded extension (one per process), for tests, the bench and debugging.
_current: TensorFlowIntegration | None = None


def watch(extension: Any) -> Callable[[], None]:
    """Install the integration now if TensorFlow is imported, else when it is; returns the undo."""
    global _current
    integration = TensorFlowIntegration(extension)
    _current = integration
    remove_hook = when_imported("tensorflow", lambda _module: integration.install())

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


@dataclass(frozen=True)
class Blocking:
    """A queue operation that keeps a run waiting, with what was known when it was found."""

    use: QueueUse
    queue: QueueInfo
    state: QueueState | None


@dataclass(eq=False)
class _PreparedClose:
    runner_ref: weakref.ref[Any]
    session_ref: weakref.ref[Any]
    fn: Callable[[], Any]


@dataclass(eq=False)
class _PreparedAll:
    session_ref: weakref.ref[Any]
    keys: frozenset[tuple[int, int]]
    close: _PreparedClose


@dataclass(eq=False)
class _Closes:
    """What one stop closes: prepared callables, and ops to run per session."""

    prepared: dict[tuple[int, int], _PreparedClose] = field(default_factory=dict)
    by_session: dict[int, tuple[Any, list[Any]]] = field(default_factory=dict)

    def add(self, session: Any, ops: list[Any]) -> None:
        self.by_session.setdefault(id(session), (session, []))[1].extend(ops)


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


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
        self._closed_types: weakref.WeakKeyDictionary[Any, tuple[type, ...]] = weakref.WeakKeyDictionary()
        self._tf: dict[str, Any] = {}
        #: Prepared closes by (id(runner), id(session)); built and pruned by the monitor tick only.
        self._prepared: dict[tuple[int, int], _PreparedClose] = {}
        #: By id(session): one close for all the runners of a session, used when a stop ends them all.
        self._prepared_all: dict[int, _PreparedAll] = {}
        self.active = False
        self.installed_at: float | None = None
        #: When the watcher last saw SIGINT (monotonic), for tests and the bench.
        self.last_sigint_at = 0.0

    # ------------------------------------------------------------------------------------- install / undo
    def install(self) -> None:
        """Patch TensorFlow's classes, find existing objects, register source, stopper and monitor task."""
        if self.active:
            return
        try:
            self._install()
        except Exception:
            log.warning("nbcoord: the TensorFlow integration could not be installed", exc_info=True)
            self.uninstall()

    def _install(self) -> None:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.client import session as session_module
        from tensorflow.python.framework import errors
        from tensorflow.python.ops import data_flow_ops
        from tensorflow.python.training import coordinator, queue_runner_impl

        self._tf = {
            "BaseSession": session_module.BaseSession,
            "QueueBase": data_flow_ops.QueueBase,
            "QueueRunner": queue_runner_impl.QueueRunner,
            "Coordinator": coordinator.Coordinator,
            "CancelledError": errors.CancelledError,
            "RunOptions": config_pb2.RunOptions,
            "CallableOptions": config_pb2.CallableOptions,
        }
        self.active = True
        self._patch_all()
        self._scan_existing()
        ext = self.extension
        self._undo.append(ext.snapshots.add_source("tensorflow", self._source))
        self._undo.append(ext.stopper.add_stopper("tensorflow", self._stop))
        self._undo.append(ext.monitor.add_task("tensorflow", self.tick))
        if self.watcher.install():
            self._undo.append(self.watcher.uninstall)
        self.installed_at = time.time()

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
        self._prepared.clear()
        self._prepared_all.clear()
        for runner, types in list(self._closed_types.items()):
            runner._queue_closed_exception_types = types
        self._closed_types.clear()

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
                self.registry.add_owner(thread, owner)

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
                thread = threading.current_thread()
                self._wait_registered(thread)
                self.registry.thread_failed(thread, exc)
        except Exception:
            log.warning("nbcoord: could not record a coordinator's exception", exc_info=True)
        return ex

    def _wait_registered(self, thread: threading.Thread, timeout: float = 0.1) -> None:
        """Give ``Thread.start`` a moment to register a thread that failed right after it started.

        The patched ``Thread.start`` registers a thread once it runs; a worker that fails at once can reach its
        coordinator first, and its failure would then lose its cell.
        """
        if thread is threading.main_thread():
            return
        deadline = time.monotonic() + timeout
        while self.registry.for_thread(thread) is None and time.monotonic() < deadline:
            time.sleep(0.001)

    def _coordinators_of(self, threads: Iterable[threading.Thread]) -> dict[int, Any]:
        """Coordinators that coordinate these threads: as runners, registered, or passed to them."""
        coord_cls = self._tf["Coordinator"]
        wanted = set(threads)
        found: dict[int, Any] = {}
        for thread in wanted:
            runner = self.objects.runner(thread)
            coord = runner.coord_ref() if runner is not None and runner.coord_ref is not None else None
            if coord is not None:
                found[id(coord)] = coord
            args = list(getattr(thread, "_args", ()) or ()) + list((getattr(thread, "_kwargs", None) or {}).values())
            args.append(getattr(getattr(thread, "_target", None), "__self__", None))
            for value in args:
                if isinstance(value, coord_cls):
                    found[id(value)] = value
        for _info, coord in self.objects.coordinators():
            registered: Iterable[threading.Thread] = getattr(coord, "_registered_threads", ())
            if wanted.intersection(registered):
                found[id(coord)] = coord
        return found

    # -------------------------------------------------------------------------------------------- stops
    def _stop(self, scope: Any) -> None:
        """The stopper: coordinators first, then close the queues, so that the threads end in the join."""
        self._attach_pending()
        threads = [record.thread for record in scope.records if record.thread is not None]
        self.stop_threads(threads, scope.deadline)

    def stop_threads(self, threads: list[threading.Thread], deadline: float) -> None:
        """Ask these threads (and every runner thread of their coordinators) to stop; does not join."""
        coords = self._coordinators_of(threads)
        for coord in coords.values():
            try:
                coord.request_stop()
            except Exception:
                log.warning("nbcoord: request_stop failed", exc_info=True)
        runners = [self.objects.runner(t) for t in threads]
        group = [r for r in runners if r is not None]
        group += [
            r
            for r in self.objects.runners()
            if r not in group and r.coord_ref is not None and id(r.coord_ref()) in coords
        ]
        closes = _Closes()
        for runner in group:
            self._runner_closes(runner, closes)
        for thread in threads:
            if self.objects.runner(thread) is None:
                self._blocked_closes(thread, closes)
        self._run_closes(closes, deadline)

    def _close_ops(self, runner: Any, session: Any) -> list[Any]:
        """The ops that end a runner: close its queue, and the queues its enqueue ops read from, cancelling."""
        ops = [runner.cancel_op]
        for name in self.analyzer.upstream_queues(session.graph, list(runner.enqueue_ops)):
            upstream = self.objects.queue_by_op(session.graph, name)
            if upstream is not None and upstream.ops is not None:
                ops.append(upstream.ops.close)
        return ops

    def _runner_closes(self, info: RunnerInfo, closes: _Closes) -> None:
        qr = info.runner_ref()
        session = info.session_ref()
        if qr is None or session is None or not session_is_open(session):
            return
        self._treat_cancel_as_closed(qr)
        key = (id(qr), id(session))
        prepared = self._prepared.get(key)
        if prepared is not None and prepared.runner_ref() is qr and prepared.session_ref() is session:
            closes.prepared[key] = prepared
        else:
            closes.add(session, self._close_ops(qr, session))

    def _blocked_closes(self, thread: threading.Thread, closes: _Closes) -> None:
        """For a thread in scope that is blocked in a run on a queue, the close of that queue."""
        state = self.tracker.state_of(thread)
        view = state.current() if state is not None else None
        if view is None or not session_is_open(view.session):
            return
        for blocking in self.blocking(view, fresh=True):
            if blocking.queue.ops is not None:
                closes.add(view.session, [blocking.queue.ops.close])

    def _treat_cancel_as_closed(self, runner: Any) -> None:
        """Make a runner end quietly when its enqueue is cancelled (TensorFlow's own documented option)."""
        cancelled = self._tf["CancelledError"]
        types = tuple(runner.queue_closed_exception_types)
        if cancelled not in types:
            self._closed_types.setdefault(runner, types)
            runner._queue_closed_exception_types = (*types, cancelled)

    def _run_closes(self, closes: _Closes, deadline: float) -> None:
        for prepared in self._combine(closes.prepared):
            session = prepared.session_ref()
            if session is None or not session_is_open(session):
                continue
            try:
                prepared.fn()
            except Exception:
                log.debug("nbcoord: a prepared close failed (a queue may be closed already)", exc_info=True)
            self._repoll_soon(session)
        run_options = self._tf["RunOptions"]
        for session, ops in closes.by_session.values():
            unique = list({id(op): op for op in ops}.values())
            if not unique or not session_is_open(session):
                continue
            timeout_ms = max(50, int((deadline - time.monotonic()) * 1000))
            try:
                session.run(unique, options=run_options(timeout_in_ms=timeout_ms))
            except Exception:
                log.debug("nbcoord: closing queues failed (a queue may be closed already)", exc_info=True)
            self._repoll_soon(session)

    def _combine(self, prepared: dict[tuple[int, int], _PreparedClose]) -> list[_PreparedClose]:
        """Use one session-wide close where a stop ends every runner of a session (one step, not one each)."""
        chosen: list[_PreparedClose] = []
        covered: set[tuple[int, int]] = set()
        for sid, whole in list(self._prepared_all.items()):
            if whole.keys and whole.keys <= prepared.keys() and whole.session_ref() is not None:
                chosen.append(whole.close)
                covered |= whole.keys
                log.debug("nbcoord: one close for every runner of session %#x", sid)
        chosen += [close for key, close in prepared.items() if key not in covered]
        return chosen

    def _repoll_soon(self, session: Any) -> None:
        info = self.objects.session_info(session)
        if info is not None:
            info.polled_at = 0.0  # the next snapshot polls again and shows the queues closed

    def _prepare_closes(self) -> None:
        """Build, off the user's path, one callable per runner and session that closes its queues.

        The first run of a new set of ops builds an executor (tens of ms); ``_make_callable_from_options``
        builds it now, so that a stop only runs it. Callables are dropped once their runner has no live thread:
        they hold their session.
        """
        live: dict[tuple[int, int], tuple[Any, Any]] = {}
        for info in self.objects.runners():
            qr, session = info.runner_ref(), info.session_ref()
            if qr is not None and session is not None and session_is_open(session):
                live[(id(qr), id(session))] = (qr, session)
        for key in [key for key in self._prepared if key not in live]:
            del self._prepared[key]
        by_session: dict[int, set[tuple[int, int]]] = {}
        for key, (qr, session) in live.items():
            by_session.setdefault(id(session), set()).add(key)
            if key not in self._prepared:
                close = self._prepare(qr, session, self._close_ops(qr, session))
                if close is not None:
                    self._prepared[key] = close
        for sid in [sid for sid in self._prepared_all if sid not in by_session]:
            del self._prepared_all[sid]
        for sid, keys in by_session.items():
            if len(keys) < 2 or (sid in self._prepared_all and self._prepared_all[sid].keys == keys):
                continue
            qr, session = live[next(iter(keys))]
            ops = [op for key in sorted(keys) for op in self._close_ops(live[key][0], session)]
            close = self._prepare(qr, session, ops)
            if close is not None:
                self._prepared_all[sid] = _PreparedAll(weakref.ref(session), frozenset(keys), close)

    def _prepare(self, runner: Any, session: Any, ops: list[Any]) -> _PreparedClose | None:
        options = self._tf["CallableOptions"]()
        options.target.extend(sorted({op.name for op in ops}))
        try:
            fn = session._make_callable_from_options(options)
        except Exception:
            log.debug("nbcoord: could not prepare the close of a runner's queues", exc_info=True)
            return None
        return _PreparedClose(weakref.ref(runner), weakref.ref(session), fn)

    def before_session_close(self, session: Any) -> None:
        """Stop and join the runner threads bound to a session before it closes (S2)."""
        if not session_is_open(session):
            return
        info = self.objects.session_info(session)
        if info is not None:
            info.closing = True
            if info.lock.acquire(timeout=1.0):  # a poll in flight ends first
                info.lock.release()
        me = threading.current_thread()
        runners = [r for r in self.objects.runners() if r.session_ref() is session and r.thread_ref() is not me]
        if not runners:
            return
        grace = float(self.extension.config.grace_period)
        deadline = time.monotonic() + max(grace, 0.1)
        threads = [t for r in runners if (t := r.thread_ref()) is not None]
        self.stop_threads(threads, deadline)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = [t.name for t in threads if t.is_alive()]
        if left:
            sid = info.sid if info is not None else "?"
            log.warning("nbcoord: session %s closes with %d runner thread(s) still running: %s", sid, len(left), left)

    # --------------------------------------------------------------------------------------- blocked runs
    def blocking(self, view: RunView, *, fresh: bool) -> list[Blocking]:
        """The queue operations that keep this run waiting now (``fresh``: poll the session first)."""
        session = view.session
        sinfo = self.objects.session_info(session)
        if sinfo is None:
            return []
        if fresh:
            self.objects.poll(sinfo)
        graph = session.graph
        uses = self.analyzer.queue_uses(graph, run_op_names(view.fetches, view.targets))
        found: list[Blocking] = []
        for use in uses:
            queue = self.objects.queue_by_op(graph, use.queue_op)
            if queue is None:
                continue
            state = queue.states.get(sinfo.sid)
            if state is None or state.size is None or state.closed:
                continue
            count = use.n or 1
            if use.kind == "dequeue":
                # A RandomShuffleQueue also keeps min_after_dequeue elements back until it is closed.
                waiting = state.size - count < queue.min_after_dequeue
            else:
                waiting = queue.capacity > 0 and state.size + count > queue.capacity
            if waiting:
                found.append(Blocking(use, queue, state))
        return found

    def _partners(self, blocking: Blocking, session: Any, me: RunState | None) -> tuple[int, int]:
        """(live, progressing) producers of a blocked dequeue, or consumers of a blocked enqueue."""
        now = time.monotonic()
        if blocking.use.kind == "dequeue":
            live = 0
            progressing = 0
            for runner in self.objects.producers(blocking.queue, session):
                live += 1
                thread = runner.thread_ref()
                state = self.tracker.state_of(thread) if thread is not None else None
                since = state.since if state is not None else 0.0
                if since == 0.0 or now - since < PROGRESS_S:
                    progressing += 1
            return live, progressing
        live = progressing = 0
        for view in self.tracker.in_flight():
            if view.state is me or view.session is not session:
                continue
            uses = self.analyzer.queue_uses(session.graph, run_op_names(view.fetches, view.targets))
            if any(u.kind == "dequeue" and u.queue_op == blocking.queue.name for u in uses):
                live += 1
                progressing += int(now - view.since < PROGRESS_S)
        return live, progressing

    def describe(self, name: str, age: float, blocking: Blocking, session: Any, me: RunState | None) -> str:
        """The sentence of a blocked run."""
        queue, state = blocking.queue, blocking.state
        size = "?" if state is None or state.size is None else str(state.size)
        held = f"{size} of {queue.capacity} elements" if queue.capacity > 0 else f"{size} elements, unbounded"
        live, progressing = self._partners(blocking, session, me)
        if blocking.use.kind == "dequeue":
            partners = "no live producer" if live == 0 else _plural(live, "live producer")
        else:
            partners = "no thread dequeuing" if live == 0 else _plural(live, "thread") + " dequeuing"
        if live and not progressing:
            partners += ", all stuck"
        where = f"{blocking.use.describe()} of queue `{queue.name}`"
        return f"{name} blocked {_seconds(age)} s in {where} ({held}, {partners})"

    def blocked_rows(self) -> list[dict[str, Any]]:
        """One row per run in flight that waits on a queue (or runs unusually long)."""
        rows: list[dict[str, Any]] = []
        now, wall = time.monotonic(), time.time()
        for view in self.tracker.in_flight():
            age = now - view.since
            if age < BLOCKED_AFTER_S:
                continue
            thread = view.state.thread_ref()
            if thread is None:
                continue
            record = self.registry.for_thread(thread)
            sinfo = self.objects.session_info(view.session)
            try:
                found = self.blocking(view, fresh=False)
            except Exception:
                log.debug("nbcoord: could not analyse a run in flight", exc_info=True)
                found = []
            row: dict[str, Any] = {
                "thread": thread.name,
                "tid": record.tid if record is not None else None,
                "since": round(wall - age, 2),
                "seconds": round(age, 1),
                "session": sinfo.sid if sinfo is not None else None,
            }
            if found:
                first = found[0]
                row.update(
                    queue=first.queue.qid,
                    queue_name=first.queue.name,
                    op=first.use.describe(),
                    text=self.describe(thread.name, age, first, view.session, view.state),
                )
            elif age >= LONG_RUN_S:
                names = ", ".join(run_op_names(view.fetches, view.targets)[:3])
                row.update(
                    queue=None,
                    queue_name=None,
                    op="run",
                    text=f"{thread.name} in a session run for {_seconds(age)} s, not waiting on a known queue "
                    f"(running {names})",
                )
            else:
                continue
            rows.append(row)
        return rows

    # ------------------------------------------------------------------------------------------ interrupt
    def _on_sigint(self) -> None:
        """On the watcher thread: cancel the main thread's run if it is blocked on a queue nobody serves."""
        self.last_sigint_at = time.monotonic()
        if not self.active or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        state = self.tracker.state_of(threading.main_thread())
        view = state.current() if state is not None else None
        if state is None or view is None or not session_is_open(view.session):
            return
        session = view.session
        found = self.blocking(view, fresh=True)
        resets = [b for b in found if b.queue.ops is not None and b.queue.ops.reset is not None]
        resets = [b for b in resets if self._partners(b, session, state)[1] == 0]
        if not resets:
            log.info("nbcoord: Interrupt during a session run that is not stuck on a queue; it ends with the run")
            return
        age = time.monotonic() - view.since
        first = resets[0]
        dropped = sum(b.state.size or 0 for b in resets if b.state is not None)
        sentence = self.describe("the main thread", age, first, session, state)
        reset_words = f"reset ({_plural(dropped, 'element')} dropped)" if dropped else "reset"
        state.cancel_message = (
            f"nbcoord cancelled the session run: {sentence}. "
            f"Queue `{first.queue.name}` was {reset_words}; the session and its queues remain usable."
        )
        state.cancel_token = view.since
        if state.since != view.since:
            return  # the run ended by itself meanwhile
        ops = [b.queue.ops.reset for b in resets if b.queue.ops is not None]
        try:
            session.run(ops, options=self._tf["RunOptions"](timeout_in_ms=2000))
        except Exception:
            log.warning("nbcoord: could not reset the queue blocking the main thread", exc_info=True)
            return
        sinfo = self.objects.session_info(session)
        if sinfo is not None:
            self.objects.poll(sinfo)  # the next step creates the queue afresh: do it now, off the user's time

    # ------------------------------------------------------------------------------------ source and tick
    def _source(self) -> dict[str, Any]:
        self._attach_pending()
        self.objects.poll_all(max_age=SNAPSHOT_POLL_AGE_S)
        return {
            "queues": self.objects.queue_rows(),
            "blocked_runs": self.blocked_rows(),
            "sessions": self.objects.session_rows(),
        }

    def tick(self) -> None:
        """The monitor task (about once a second): owners, polls, prepared closes. Tests and the bench call it."""
        self._attach_pending()
        self.objects.poll_all()
        self._prepare_closes()
        self._restore_closed_types()

    def _restore_closed_types(self) -> None:
        """Give runners whose threads have all ended their own queue-closed exception types back."""
        busy = {id(r.runner_ref()) for r in self.objects.runners()}
        for runner, types in list(self._closed_types.items()):
            if id(runner) not in busy:
                runner._queue_closed_exception_types = types
                self._closed_types.pop(runner, None)

    # ------------------------------------------------------------------------------------------ for tests
    def patched_attributes(self) -> dict[str, Any]:
        """``Class.name`` -> original, for every attribute patched now."""
        return self.patches.originals()
