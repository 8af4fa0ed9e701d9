"""The TensorFlow objects nbcoord knows: sessions, queues, coordinators and queue-runner threads.

Everything is held by weak reference (a registry must never keep a Session, and its memory, alive). Queue fill
levels are polled per session with one prepared callable that fetches every queue's size and closed flag in one
step; a poll never waits (a session busy being polled or closed is skipped) and never touches a closed session.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._tf_graph import QueueOps, build_queue_ops, graph_of, queue_attrs
from ._tf_runs import RunTracker

log = logging.getLogger("nbcoord")

#: Points of fill-level history kept per queue and session (one per poll, about a second apart).
HISTORY_POINTS = 60
#: How long a snapshot waits for a poll of the same session already in flight.
POLL_WAIT_S = 0.1
#: Polls over which rates are computed (about five seconds).
RATE_WINDOW = 6


def session_is_open(session: Any) -> bool:
    """Whether a TensorFlow session is still usable (not closed, not being deleted)."""
    return not getattr(session, "_closed", True) and getattr(session, "_session", None) is not None


@dataclass(eq=False)
class SessionInfo:
    sid: str
    ref: weakref.ref[Any]
    target: str
    cell: int | None
    created_at: float
    preexisting: bool
    #: Held while this session is polled; closing the session waits for it, so a poll never meets a closing one.
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: bool = False
    poller: Poller | None = None

    def live_session(self) -> Any | None:
        """The session if it is still open and not being closed."""
        session = self.ref()
        if session is None or self.closing or not session_is_open(session):
            return None
        return session


@dataclass(eq=False)
class QueueState:
    """A queue inside one session: last polled size and closed flag, history, counts for rates."""

    size: int | None = None
    closed: bool | None = None
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    enqueued: int = 0
    enqueued_known: bool = True
    counted: dict[int, int] = field(default_factory=dict)
    window: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    def rates(self) -> tuple[float | None, float | None]:
        """Enqueue and dequeue rates (elements/s) over the window; None when the enqueues are not countable."""
        if len(self.window) < 2 or not self.enqueued_known:
            return None, None
        (t0, size0, enq0), (t1, size1, enq1) = self.window[0], self.window[-1]
        dt = t1 - t0
        if dt <= 0:
            return None, None
        enqueue_rate = (enq1 - enq0) / dt
        return enqueue_rate, max(0.0, enqueue_rate - (size1 - size0) / dt)


@dataclass(eq=False)
class QueueInfo:
    qid: str
    ref: weakref.ref[Any]
    graph_ref: weakref.ref[Any]
    name: str
    op_type: str
    capacity: int
    min_after_dequeue: int
    ops: QueueOps | None
    cell: int | None
    created_at: float
    preexisting: bool
    #: By session id.
    states: dict[str, QueueState] = field(default_factory=dict)

    def state(self, sid: str) -> QueueState:
        """This queue's state in a session (created on first use)."""
        state = self.states.get(sid)
        if state is None:
            state = self.states[sid] = QueueState()
        return state


@dataclass(eq=False)
class CoordInfo:
    cid: str
    ref: weakref.ref[Any]
    cell: int | None
    created_at: float
    preexisting: bool


@dataclass(eq=False)
class RunnerInfo:
    """One thread made by ``QueueRunner.create_threads``: an enqueue loop, or the close-on-stop helper."""

    thread_ref: weakref.ref[threading.Thread]
    runner_ref: weakref.ref[Any]
    session_ref: weakref.ref[Any]
    coord_ref: weakref.ref[Any] | None
    role: str  # "enqueue" or "close_on_stop"
    queue: QueueInfo | None
    per_run: int | None
    attached: bool = False

    def alive(self) -> bool:
        thread = self.thread_ref()
        return thread is not None and thread.is_alive()


@dataclass(eq=False)
class Poller:
    """One prepared callable that fetches (size, closed) of every queue of a session's graph.

    ``version`` is the registry's queue count version it was checked against; a new queue anywhere bumps it,
    and the poller is rebuilt only if its own graph's queues differ.
    """

    version: int
    queues: list[QueueInfo]
    fetch: Callable[[], Any] | None


class TFObjects:
    """The registry of TensorFlow objects, with polling and rows for the snapshot."""

    def __init__(self, tracker: RunTracker, current_cell: Callable[[], int | None]) -> None:
        self._tracker = tracker
        self._current_cell = current_cell
        # Guards every dict and list below (an RLock: a Session.__del__ run by the garbage collector may close a
        # session, and so come back here, on a thread that already holds it).
        self.lock = threading.RLock()
        self._ids = {kind: itertools.count(1) for kind in ("s", "q", "c")}
        self._sessions: dict[int, SessionInfo] = {}
        self._queues: dict[int, QueueInfo] = {}
        self._queues_by_op: dict[tuple[int, str], QueueInfo] = {}
        self._coords: dict[int, CoordInfo] = {}
        self._runners: list[RunnerInfo] = []
        self._queue_version = 0

    def _next_id(self, kind: str) -> str:
        return f"{kind}{next(self._ids[kind])}"

    # --------------------------------------------------------------------------------------- registering
    def add_session(self, session: Any, *, preexisting: bool = False) -> SessionInfo:
        """Register a session (idempotent)."""
        with self.lock:
            info = self.session_info(session)
            if info is not None:
                return info
            target = getattr(session, "_target", b"") or b""
            info = SessionInfo(
                sid=self._next_id("s"),
                ref=weakref.ref(session, self._forget(self._sessions, id(session))),
                target=target.decode(errors="replace") if isinstance(target, bytes) else str(target),
                cell=None if preexisting else self._current_cell(),
                created_at=time.time(),
                preexisting=preexisting,
            )
            self._sessions[id(session)] = info
            return info

    def add_queue(self, queue: Any, *, preexisting: bool = False) -> QueueInfo | None:
        """Register a graph-mode queue and build its ops (idempotent); None for queues nbcoord cannot follow."""
        graph = graph_of(queue)
        if graph is None:
            return None
        with self.lock:
            known = self._queues.get(id(queue))
            if known is not None and known.ref() is queue:
                return known
        op = queue.queue_ref.op
        try:
            ops = build_queue_ops(queue)
        except Exception:
            log.warning("nbcoord: could not build the polling ops of queue %r", op.name, exc_info=True)
            ops = None
        capacity, min_after = queue_attrs(op)
        info = QueueInfo(
            qid="",
            ref=weakref.ref(queue, self._forget_queue(id(queue))),
            graph_ref=weakref.ref(graph),
            name=str(op.name),
            op_type=str(op.type),
            capacity=capacity,
            min_after_dequeue=min_after,
            ops=ops,
            cell=None if preexisting else self._current_cell(),
            created_at=time.time(),
            preexisting=preexisting,
        )
        with self.lock:
            info.qid = self._next_id("q")
            self._queues[id(queue)] = info
            self._queues_by_op[(id(graph), info.name)] = info
            self._queue_version += 1
        return info

    def add_coordinator(self, coord: Any, *, preexisting: bool = False) -> CoordInfo:
        """Register a Coordinator (idempotent)."""
        with self.lock:
            info = self._coords.get(id(coord))
            if info is not None and info.ref() is coord:
                return info
            info = CoordInfo(
                cid=self._next_id("c"),
                ref=weakref.ref(coord, self._forget(self._coords, id(coord))),
                cell=None if preexisting else self._current_cell(),
                created_at=time.time(),
                preexisting=preexisting,
            )
            self._coords[id(coord)] = info
            return info

    def add_runner_thread(
        self, thread: threading.Thread, runner: Any, session: Any, coord: Any, enqueue_op: Any | None
    ) -> RunnerInfo:
        """Register a thread made by ``QueueRunner.create_threads`` (``enqueue_op`` None: the close-on-stop one)."""
        queue = self.queue_info(runner.queue)
        if queue is None:
            queue = self.add_queue(runner.queue)
        per_run = None
        if enqueue_op is not None:
            from ._tf_graph import queue_use

            use = queue_use(enqueue_op)
            per_run = use.n if use is not None else None
        info = RunnerInfo(
            thread_ref=weakref.ref(thread),
            runner_ref=weakref.ref(runner),
            session_ref=weakref.ref(session),
            coord_ref=weakref.ref(coord) if coord is not None else None,
            role="enqueue" if enqueue_op is not None else "close_on_stop",
            queue=queue,
            per_run=per_run,
        )
        if coord is not None:
            self.add_coordinator(coord)
        self.add_session(session)
        with self.lock:
            self._runners.append(info)
        return info

    def _forget_queue(self, key: int) -> Callable[[Any], None]:
        def forget(ref: Any) -> None:
            with self.lock:
                info = self._queues.get(key)
                if info is None or info.ref is not ref:
                    return
                del self._queues[key]
                for op_key in [k for k, v in self._queues_by_op.items() if v is info]:
                    del self._queues_by_op[op_key]
                self._queue_version += 1

        return forget

    def _forget(self, table: dict[int, Any], key: int) -> Callable[[Any], None]:
        def forget(ref: Any) -> None:
            with self.lock:
                info = table.get(key)
                if info is not None and info.ref is ref:
                    del table[key]

        return forget

    # ------------------------------------------------------------------------------------------ lookups
    def session_info(self, session: Any) -> SessionInfo | None:
        with self.lock:
            info = self._sessions.get(id(session))
        return info if info is not None and info.ref() is session else None

    def queue_info(self, queue: Any) -> QueueInfo | None:
        with self.lock:
            info = self._queues.get(id(queue))
        return info if info is not None and info.ref() is queue else None

    def queue_by_op(self, graph: Any, op_name: str) -> QueueInfo | None:
        """The queue whose queue op is ``op_name`` in ``graph``."""
        with self.lock:
            info = self._queues_by_op.get((id(graph), op_name))
        return info if info is not None and info.graph_ref() is graph and info.ref() is not None else None

    def coord_info(self, coord: Any) -> CoordInfo | None:
        with self.lock:
            info = self._coords.get(id(coord))
        return info if info is not None and info.ref() is coord else None

    def sessions(self) -> list[SessionInfo]:
        with self.lock:
            return [info for info in self._sessions.values() if info.ref() is not None]

    def queues(self) -> list[QueueInfo]:
        with self.lock:
            return [info for info in self._queues.values() if info.ref() is not None]

    def coordinators(self) -> list[tuple[CoordInfo, Any]]:
        """Live coordinators with their info."""
        with self.lock:
            infos = list(self._coords.values())
        return [(info, coord) for info in infos if (coord := info.ref()) is not None]

    def runners(self, *, alive_only: bool = True) -> list[RunnerInfo]:
        """Queue-runner threads (the dead ones are dropped once no longer needed)."""
        with self.lock:
            self._runners = [r for r in self._runners if r.thread_ref() is not None]
            runners = list(self._runners)
        return [r for r in runners if r.alive()] if alive_only else runners

    def runner(self, thread: threading.Thread) -> RunnerInfo | None:
        with self.lock:
            return next((r for r in self._runners if r.thread_ref() is thread), None)

    def producers(self, queue: QueueInfo, session: Any) -> list[RunnerInfo]:
        """Live enqueue threads of runners that feed ``queue`` in ``session``."""
        return [r for r in self.runners() if r.role == "enqueue" and r.queue is queue and r.session_ref() is session]

    # ------------------------------------------------------------------------------------------ polling
    def poll_all(self, *, record: bool, wait: float = 0.0) -> None:
        """Poll every open session (``record``: also add a point to the history and the rate window)."""
        for info in self.sessions():
            self.poll(info, record=record, wait=wait)

    def poll(self, info: SessionInfo, *, record: bool = False, wait: float = POLL_WAIT_S) -> bool:
        """Poll one session's queues; False when skipped (closed, busy, nothing to poll, or failed).

        Only the monitor's regular polls ``record``: snapshots and interrupts poll for fresh values whenever
        they need them, and must not crowd the history. A poll already in flight (a poll takes well under a
        millisecond) is waited for up to ``wait`` seconds; the monitor does not wait.
        """
        session = info.live_session()
        if session is None:
            return False
        if not (info.lock.acquire(timeout=wait) if wait > 0 else info.lock.acquire(blocking=False)):
            return False
        try:
            if info.live_session() is None:
                return False
            poller = self._poller(info, session)
            if poller is None or poller.fetch is None:
                return False
            values = poller.fetch()
        except Exception:
            log.debug("nbcoord: polling the queues of session %s failed", info.sid, exc_info=True)
            return False
        finally:
            info.lock.release()
        self._update(info, session, poller.queues, values, record=record)
        return True

    def _poller(self, info: SessionInfo, session: Any) -> Poller | None:
        """The session's prepared callable, rebuilt only when the queues of its graph changed."""
        graph = session.graph
        with self.lock:
            version = self._queue_version
            poller = info.poller
            if poller is not None and poller.version == version:
                return poller
            queues = [q for q in self._queues.values() if q.graph_ref() is graph and q.ops is not None]
        if poller is not None and [id(q) for q in poller.queues] == [id(q) for q in queues]:
            poller.version = version  # queues came and went elsewhere: this graph's are the same
            return poller
        fetch = None
        if queues:
            tensors = [t for q in queues if q.ops is not None for t in (q.ops.size, q.ops.closed)]
            fetch = session.make_callable(tensors)
        info.poller = Poller(version, queues, fetch)
        return info.poller

    def _update(self, info: SessionInfo, session: Any, queues: list[QueueInfo], values: Any, *, record: bool) -> None:
        now_wall = time.time()
        now = time.monotonic()
        producers: dict[int, list[RunnerInfo]] = {}
        for runner in self.runners():
            if runner.role == "enqueue" and runner.queue is not None and runner.session_ref() is session:
                producers.setdefault(id(runner.queue), []).append(runner)
        with self.lock:
            for index, queue in enumerate(queues):
                state = queue.state(info.sid)
                state.size = int(values[2 * index])
                state.closed = bool(values[2 * index + 1])
                if record:
                    state.history.append((round(now_wall, 2), state.size))
                    self._count_enqueues(state, producers.get(id(queue), []))
                    state.window.append((now, state.size, state.enqueued))

    def _count_enqueues(self, state: QueueState, producers: list[RunnerInfo]) -> None:
        """Add the runs that producer threads completed since the last poll (times elements per run)."""
        for runner in producers:
            thread = runner.thread_ref()
            run_state = self._tracker.state_of(thread) if thread is not None else None
            if run_state is None or run_state.ident is None:
                continue
            done = run_state.runs - state.counted.get(run_state.ident, 0)
            state.counted[run_state.ident] = run_state.runs
            if runner.per_run is None:
                state.enqueued_known = False
            else:
                state.enqueued += done * runner.per_run

    # --------------------------------------------------------------------------------------------- rows
    def queue_rows(self) -> list[dict[str, Any]]:
        """Queue rows: one per queue and open session (and one for a queue not yet in any session)."""
        open_sessions = {info.sid: info for info in self.sessions() if info.live_session() is not None}
        rows: list[dict[str, Any]] = []
        for queue in self.queues():
            graph = queue.graph_ref()
            shown = False
            for sid, sinfo in open_sessions.items():
                session = sinfo.ref()
                if session is None or graph is None or session.graph is not graph:
                    continue
                state = queue.states.get(sid)
                if state is None and queue.states:
                    continue
                rows.append(self._queue_row(queue, sid, state, len(self.producers(queue, session))))
                shown = True
            if not shown and not queue.states:
                rows.append(self._queue_row(queue, None, None, 0))
        return rows

    def _queue_row(self, queue: QueueInfo, sid: str | None, state: QueueState | None, runners: int) -> dict[str, Any]:
        enqueue_rate, dequeue_rate = state.rates() if state is not None else (None, None)
        return {
            "id": queue.qid,
            "name": queue.name,
            "type": queue.op_type,
            "capacity": queue.capacity,
            "size": state.size if state is not None else None,
            "closed": state.closed if state is not None else None,
            "enqueue_rate": round(enqueue_rate, 2) if enqueue_rate is not None else None,
            "dequeue_rate": round(dequeue_rate, 2) if dequeue_rate is not None else None,
            "history": [list(point) for point in state.history] if state is not None else [],
            "session": sid,
            "runners": runners,
            "cell": queue.cell,
            "preexisting": queue.preexisting,
            "polled": queue.ops is not None,
        }

    def session_rows(self) -> list[dict[str, Any]]:
        """Session rows: id, target, closed, live runner threads, cell."""
        runners = self.runners()
        rows: list[dict[str, Any]] = []
        for info in self.sessions():
            session = info.ref()
            if session is None:
                continue
            rows.append(
                {
                    "id": info.sid,
                    "target": info.target,
                    "closed": not session_is_open(session),
                    "runner_threads": sum(1 for r in runners if r.session_ref() is session),
                    "cell": info.cell,
                    "preexisting": info.preexisting,
                }
            )
        return rows
