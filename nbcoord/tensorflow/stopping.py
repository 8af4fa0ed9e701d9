"""Stopping queue-runner threads: coordinators first, then their queues closed, pending enqueues cancelled.

A runner thread blocked enqueuing into a full queue (or dequeuing from an empty upstream one) only wakes when
that queue is closed; one with a coordinator also checks ``coord.should_stop()`` between runs. So a stop asks
every coordinator in scope to stop, tells each runner to treat a cancelled enqueue as the end of its input (the
``queue_closed_exception_types`` option TensorFlow documents, so that runners without a coordinator end quietly
too), and closes with ``cancel_pending_enqueues=True`` the queue of every runner in scope and every queue its
enqueue ops read from (a chained pipeline would otherwise leave its downstream runner blocked).

The closes run through callables prepared by the monitor tick: the first run of a new set of ops builds a
TensorFlow executor (tens of milliseconds on two cores), which a prepared callable has already done. A runner's
own ``session.run`` of its cancel op (its close-on-stop thread, once its coordinator stops) uses the same callable
where that runs exactly the cancel op: plain TensorFlow's stop of 10 runners spends most of its time building those.

Eager queues that threads in scope use are closed the same way (see :mod:`._tf_eager`). Every close nbcoord makes
is remembered with the queue (who closed it, when, from which stop), for the sentence of the errors that follow.

Closing a session first stops its runner threads through the one stop (so that it yields a report
like any other stop); only when that cannot run (a close from inside a stop) does it stop and join them here.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nbcoord.tensorflow.blocked import BlockedRuns
from nbcoord.tensorflow.graph import RunAnalyzer
from nbcoord.tensorflow.internals import (
    extend_closed_exception_types,
    prepare_callable,
    registered_threads,
    restore_closed_exception_types,
    thread_call,
)
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import CloseRecord, QueueInfo, QueueState, RunnerInfo, session_is_open
from nbcoord.tensorflow.runs import RunTracker

log = logging.getLogger("nbcoord")

#: Prepared closes built per monitor tick at most (each builds a TensorFlow executor: about 25 ms on 2 cores).
PREPARE_PER_TICK = 2


@dataclass(eq=False)
class _PreparedClose:
    runner_ref: weakref.ref[Any]
    session_ref: weakref.ref[Any]
    fn: Callable[[], Any]
    #: The queues it closes (for the record of who closed them).
    queues: tuple[QueueInfo, ...] = ()
    #: It runs exactly its runner's cancel op (the runner's enqueue ops read no other queue): it then also serves
    #: a plain ``session.run`` of that op, such as the close-on-stop thread's when the coordinator stops.
    exact: bool = False


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
    #: The queues closed, by session id (for the record of who closed them).
    queues: dict[int, tuple[Any, list[QueueInfo]]] = field(default_factory=dict)

    def add(self, session: Any, ops: list[Any], queues: list[QueueInfo]) -> None:
        self.by_session.setdefault(id(session), (session, []))[1].extend(ops)
        self.queues.setdefault(id(session), (session, []))[1].extend(queues)


class RunnerStopping:
    """Stops runner threads (and threads blocked on queues) through their coordinators and queues."""

    def __init__(
        self,
        objects: TFObjects,
        tracker: RunTracker,
        analyzer: RunAnalyzer,
        blocked: BlockedRuns,
        tf: dict[str, Any],
    ) -> None:
        self.objects = objects
        self.tracker = tracker
        self.analyzer = analyzer
        self.blocked = blocked
        #: TensorFlow classes by name, filled when the integration installs.
        self._tf = tf
        #: Runners whose queue-closed exception types nbcoord extended, with their own types to give back.
        self._closed_types: weakref.WeakKeyDictionary[Any, tuple[type, ...]] = weakref.WeakKeyDictionary()
        #: Prepared closes by (id(runner), id(session)); built and pruned by the monitor tick only.
        self._prepared: dict[tuple[int, int], _PreparedClose] = {}
        #: By id(session): one close for all the runners of a session, used when a stop ends them all.
        self._prepared_all: dict[int, _PreparedAll] = {}
        #: Keys whose close could not be prepared (they are closed with a plain run instead).
        self._failed: set[tuple[int, int]] = set()
        #: Closes the eager queues of threads in a stop (the eager part), set at install: (threads, scope, cell).
        self.close_eager: Callable[[list[threading.Thread], str, int | None], list[str]] = lambda _t, _s, _c: []
        #: The cell running now (for the record of a stop's closes).
        self.current_cell: Callable[[], int | None] = lambda: None

    def clear(self) -> None:
        """Forget the prepared closes and give every runner its own exception types back (at unload)."""
        self._prepared.clear()
        self._prepared_all.clear()
        self._failed.clear()
        for runner, types in list(self._closed_types.items()):
            restore_closed_exception_types(runner, types)
        self._closed_types.clear()

    def coordinators_of(self, threads: Iterable[threading.Thread]) -> dict[int, Any]:
        """Coordinators that coordinate these threads: as runners, registered, or passed to them."""
        coord_cls = self._tf["Coordinator"]
        wanted = set(threads)
        found: dict[int, Any] = {}
        for thread in wanted:
            runner = self.objects.runner(thread)
            coord = runner.coord_ref() if runner is not None and runner.coord_ref is not None else None
            if coord is not None:
                found[id(coord)] = coord
            target, args, kwargs = thread_call(thread)
            for value in (*args, *kwargs.values(), getattr(target, "__self__", None)):
                if isinstance(value, coord_cls):
                    found[id(value)] = value
        for _info, coord in self.objects.coordinators():
            registered: Iterable[threading.Thread] = registered_threads(coord)
            if wanted.intersection(registered):
                found[id(coord)] = coord
        return found

    def stop_threads(
        self, threads: list[threading.Thread], deadline: float, scope: str = "all", cell: int | None = None
    ) -> None:
        """Ask these threads (and every runner thread of their coordinators) to stop; does not join.

        ``scope`` and ``cell`` say which stop it is, for the record of the queues it closes.
        """
        coords = self.coordinators_of(threads)
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
        detail = f"the stop of {scope}" + (f" [{cell}]" if scope == "cell" and cell is not None else "")
        record = CloseRecord("nbcoord-stop", "nbcoord", self.current_cell(), time.time(), detail)
        self._run_closes(closes, deadline, record)
        self.close_eager(threads, scope, cell)

    def _close_ops(self, runner: Any, session: Any) -> tuple[list[Any], list[QueueInfo]]:
        """The ops that end a runner: close its queue, and the queues its enqueue ops read from, cancelling;
        with the queues they close."""
        ops = [runner.cancel_op]
        own = self.objects.queue_info(runner.queue)
        queues = [own] if own is not None else []
        for name in self.analyzer.upstream_queues(session.graph, list(runner.enqueue_ops)):
            upstream = self.objects.queue_by_op(session.graph, name)
            if upstream is not None and upstream.ops is not None:
                ops.append(upstream.ops.close)
                queues.append(upstream)
        return ops, queues

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
            closes.add(session, *self._close_ops(qr, session))

    def _blocked_closes(self, thread: threading.Thread, closes: _Closes) -> None:
        """For a thread in scope that is blocked in a run on a queue, the close of that queue."""
        state = self.tracker.state_of(thread)
        view = state.current() if state is not None else None
        if view is None or not session_is_open(view.session):
            return
        for blocking in self.blocked.blocking(view, fresh=True):
            if blocking.queue.ops is not None:
                closes.add(view.session, [blocking.queue.ops.close], [blocking.queue])

    def _treat_cancel_as_closed(self, runner: Any) -> None:
        """Make a runner end quietly when its enqueue is cancelled (TensorFlow's own documented option)."""
        if runner in self._closed_types:
            return
        own = extend_closed_exception_types(runner, self._tf["CancelledError"])
        if own is not None:
            self._closed_types[runner] = own

    def _record(self, session: Any, queues: Iterable[QueueInfo], record: CloseRecord) -> list[QueueState]:
        """Remember that nbcoord's stop closes these queues (unless something closed them before); before the
        close runs, so that a runner it wakes cannot claim the close. Returns the states to settle after it."""
        info = self.objects.session_info(session)
        if info is None:
            return []
        with self.objects.lock:
            states = [queue.state(info.sid) for queue in queues]
            return [state for state in states if not state.closed and state.note_close(record, in_flight=True)]

    def _settle(self, states: list[QueueState], record: CloseRecord) -> None:
        with self.objects.lock:
            for state in states:
                state.settle_close(record)

    def _run_closes(self, closes: _Closes, deadline: float, record: CloseRecord) -> None:
        recorded: list[QueueState] = []
        try:
            with self.tracker.own_runs():  # nbcoord's closes, not a user's close ops run on this thread
                self._close_all(closes, deadline, record, recorded)
        finally:
            self._settle(recorded, record)

    def _close_all(self, closes: _Closes, deadline: float, record: CloseRecord, recorded: list[QueueState]) -> None:
        for prepared in self._combine(closes.prepared):
            session = prepared.session_ref()
            if session is None or not session_is_open(session):
                continue
            recorded += self._record(session, prepared.queues, record)
            try:
                prepared.fn()
            except Exception:
                log.debug("nbcoord: a prepared close failed (a queue may be closed already)", exc_info=True)
        for session, queues in closes.queues.values():
            recorded += self._record(session, queues, record)
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

    def prepare_closes(self) -> None:
        """Build, off the user's path, one callable per runner and session that closes its queues.

        The first run of a new set of ops builds an executor (tens of ms); ``_make_callable_from_options``
        builds it now, so that a stop only runs it. A few are built per tick, so that a tick stays short.
        Callables are dropped once their runner has no live thread: they hold their session.
        """
        live: dict[tuple[int, int], tuple[Any, Any]] = {}
        for info in self.objects.runners():
            qr, session = info.runner_ref(), info.session_ref()
            if qr is not None and session is not None and session_is_open(session):
                live[(id(qr), id(session))] = (qr, session)
        for key in [key for key in self._prepared if key not in live]:
            del self._prepared[key]
        self._failed &= live.keys()
        by_session: dict[int, set[tuple[int, int]]] = {}
        for key, (_qr, session) in live.items():
            by_session.setdefault(id(session), set()).add(key)
        for sid in [sid for sid in self._prepared_all if sid not in by_session]:
            del self._prepared_all[sid]
        todo = [key for key in live if key not in self._prepared and key not in self._failed]
        for key in todo[:PREPARE_PER_TICK]:
            qr, session = live[key]
            close = self._prepare(qr, session, *self._close_ops(qr, session))
            if close is None:
                self._failed.add(key)
            else:
                self._prepared[key] = close
        if len(todo) > PREPARE_PER_TICK:
            return  # the session-wide closes wait until every runner has its own
        self._prepare_session_wide(by_session, live)

    def prepared_run(self, session: Any, op: Any) -> Callable[[], Any] | None:
        """A prepared callable that runs exactly ``op`` in ``session`` (a runner's cancel op), if one is ready.

        Asked only for a run of one close op alone (rare: a stop, a user's close), so a walk over the runners'
        closes is enough; the monitor's thread may change the dict meanwhile, hence the copy.
        """
        for close in list(self._prepared.values()):
            if close.exact and close.session_ref() is session:
                runner = close.runner_ref()
                if runner is not None and getattr(runner, "cancel_op", None) is op:
                    return close.fn
        return None

    def _prepare_session_wide(
        self, by_session: dict[int, set[tuple[int, int]]], live: dict[tuple[int, int], tuple[Any, Any]]
    ) -> None:
        """One close per session for all its runners, used when a stop ends them all."""
        for sid, keys in by_session.items():
            if len(keys) < 2 or (sid in self._prepared_all and self._prepared_all[sid].keys == keys):
                continue
            qr, session = live[next(iter(keys))]
            ops: list[Any] = []
            queues: list[QueueInfo] = []
            for key in sorted(keys):
                more_ops, more_queues = self._close_ops(live[key][0], session)
                ops += more_ops
                queues += more_queues
            close = self._prepare(qr, session, ops, queues)
            if close is not None:
                self._prepared_all[sid] = _PreparedAll(weakref.ref(session), frozenset(keys), close)

    def _prepare(self, runner: Any, session: Any, ops: list[Any], queues: list[QueueInfo]) -> _PreparedClose | None:
        try:
            fn = prepare_callable(session, [op.name for op in ops])
        except Exception:
            log.debug("nbcoord: could not prepare the close of a runner's queues", exc_info=True)
            return None
        if fn is None:
            return None
        exact = len(ops) == 1 and ops[0] is getattr(runner, "cancel_op", None)
        return _PreparedClose(weakref.ref(runner), weakref.ref(session), fn, tuple(queues), exact)

    def session_runners(self, session: Any) -> list[threading.Thread]:
        """The live runner threads bound to a session (other than the calling thread)."""
        me = threading.current_thread()
        runners = [r for r in self.objects.runners() if r.session_ref() is session and r.thread_ref() is not me]
        return [t for r in runners if (t := r.thread_ref()) is not None]

    def before_session_close(self, session: Any, grace: float) -> list[str]:
        """Stop and join (within ``grace`` seconds) the runner threads bound to a session before it closes (S2),
        without the one stop (the fallback when that cannot run); returns the names of those still running."""
        threads = self.session_runners(session)
        if not threads:
            return []
        deadline = time.monotonic() + max(grace, 0.1)
        self.stop_threads(threads, deadline, scope="session close")
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]

    def restore_closed_types(self) -> None:
        """Give runners whose threads have all ended their own queue-closed exception types back."""
        busy = {id(r.runner_ref()) for r in self.objects.runners()}
        for runner, types in list(self._closed_types.items()):
            if id(runner) not in busy:
                restore_closed_exception_types(runner, types)
                self._closed_types.pop(runner, None)
