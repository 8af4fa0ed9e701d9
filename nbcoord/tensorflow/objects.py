"""The TensorFlow objects nbcoord knows: sessions, queues (graph and eager), coordinators, queue-runner threads;
registered, looked up and polled here (their records are :mod:`.records`, their snapshot rows :mod:`.rows`).

Everything is held by weak reference (a registry must never keep a Session, and its memory, alive). Graph-mode
queue fill levels are polled per session with one prepared callable that fetches every queue's size and closed
flag in one step; a poll never waits (a session busy being polled or closed is skipped) and never touches a
closed session. Eager queues are polled with their own ``size()`` and ``is_closed()`` (two eager ops, ~15 us each).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from nbcoord.tensorflow.graph import HiddenOps, as_operation, build_queue_ops, graph_of, queue_attrs, queue_use
from nbcoord.tensorflow.internals import QueueArgs, session_target
from nbcoord.tensorflow.records import (
    EAGER,
    POLL_WAIT_S,
    CoordInfo,
    Poller,
    QueueInfo,
    QueueState,
    RunnerInfo,
    SessionInfo,
)
from nbcoord.tensorflow.runs import RunTracker

log = logging.getLogger("nbcoord")


class TFObjects:
    """The registry of TensorFlow objects, and the polls of their queues."""

    def __init__(self, tracker: RunTracker, current_cell: Callable[[], int | None], hidden: HiddenOps) -> None:
        self._tracker = tracker
        self._current_cell = current_cell
        self.hidden = hidden
        # Guards every dict and list below (an RLock: a Session.__del__ run by the garbage collector may close a
        # session, and so come back here, on a thread that already holds it).
        self.lock = threading.RLock()
        self._ids = {kind: itertools.count(1) for kind in ("s", "q", "c")}
        self._sessions: dict[int, SessionInfo] = {}
        #: Every known queue by its id; by id() of its Python object (checked against ``ref``) for lookups.
        self._queues: dict[str, QueueInfo] = {}
        self._queues_by_object: dict[int, QueueInfo] = {}
        self._queues_by_op: dict[tuple[int, str], QueueInfo] = {}
        self._coords: dict[int, CoordInfo] = {}
        self._runners: list[RunnerInfo] = []
        self._queue_version = 0
        #: Counts of eager queue operations that completed, by queue id: (enqueued elements, dequeued elements).
        self.eager_counts: dict[str, list[int]] = {}
        #: Live threads that enqueue into (or dequeue from) an eager queue, by queue id: ident -> thread ref.
        self.eager_producers: dict[str, dict[int, weakref.ref[threading.Thread]]] = {}
        self.eager_consumers: dict[str, dict[int, weakref.ref[threading.Thread]]] = {}
        #: Polls eager queues where the calling thread executes eagerly (set at install).
        self.executing_eagerly: Callable[[], bool] = lambda: False

    def _next_id(self, kind: str) -> str:
        return f"{kind}{next(self._ids[kind])}"

    # --------------------------------------------------------------------------------------- registering
    def add_session(self, session: Any, *, preexisting: bool = False) -> SessionInfo:
        """Register a session (idempotent)."""
        with self.lock:
            info = self.session_info(session)
            if info is not None:
                return info
            info = SessionInfo(
                sid=self._next_id("s"),
                ref=weakref.ref(session, self._forget(self._sessions, id(session))),
                target=session_target(session),
                cell=None if preexisting else self._current_cell(),
                created_at=time.time(),
                preexisting=preexisting,
            )
            self._sessions[id(session)] = info
            return info

    def add_queue(
        self, queue: Any, *, preexisting: bool = False, eager_args: QueueArgs | None = None
    ) -> QueueInfo | None:
        """Register a queue (idempotent): a graph-mode one with its polling ops, or an eager one (``eager_args``
        given); None for queues nbcoord cannot follow (built inside a function)."""
        with self.lock:
            known = self._queues_by_object.get(id(queue))
            if known is not None and known.ref() is queue:
                return known
        if eager_args is not None:
            return self._add_eager_queue(queue, eager_args, preexisting)
        graph = graph_of(queue)
        if graph is None:
            return None
        op = queue.queue_ref.op
        try:
            ops = build_queue_ops(queue, self.hidden)
        except Exception:
            log.warning("nbcoord: could not build the polling ops of queue %r", op.name, exc_info=True)
            ops = None
        capacity, min_after = queue_attrs(op)
        info = QueueInfo(
            qid="",
            ref=weakref.ref(queue),
            graph_ref=weakref.ref(graph, self._forget_graph()),
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
            self._queues[info.qid] = info
            self._queues_by_object[id(queue)] = info
            self._queues_by_op[(id(graph), info.name)] = info
            self._queue_version += 1
        return info

    def _add_eager_queue(self, queue: Any, args: QueueArgs, preexisting: bool) -> QueueInfo:
        info = QueueInfo(
            qid="",
            ref=weakref.ref(queue, self._forget_queue()),
            graph_ref=None,
            name="",
            op_type=type(queue).__name__,
            capacity=args.capacity,
            min_after_dequeue=args.min_after_dequeue,
            ops=None,
            cell=None if preexisting else self._current_cell(),
            created_at=time.time(),
            preexisting=preexisting,
            mode="eager",
        )
        with self.lock:
            info.qid = self._next_id("q")
            # Eager queues have no op name; the constructor's name (TensorFlow drops it) or the id says which.
            info.name = args.name if args.name and args.name not in _DEFAULT_NAMES else f"{info.op_type} {info.qid}"
            self._queues[info.qid] = info
            self._queues_by_object[id(queue)] = info
            self.eager_counts[info.qid] = [0, 0]
            self._queue_version += 1
        return info

    def add_coordinator(self, coord: Any, *, preexisting: bool = False, tensorflow_made: bool = False) -> CoordInfo:
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
                tensorflow_made=tensorflow_made,
            )
            self._coords[id(coord)] = info
            return info

    def add_runner_thread(
        self, thread: threading.Thread, runner: Any, session: Any, coord: Any, enqueue_op: Any | None
    ) -> RunnerInfo:
        """Register a thread made by ``QueueRunner.create_threads`` (``enqueue_op`` None: the close-on-stop one).

        ``enqueue_op`` is whatever TensorFlow accepted in the runner's list: an Operation, a Tensor (TensorFlow's
        own input helpers pass ``var.count_up_to(n)``), or a stand-in with only a name.
        """
        queue = self.queue_info(runner.queue)
        if queue is None:
            queue = self.add_queue(runner.queue)
        per_run = None
        op_name = ""
        if enqueue_op is not None:
            use = queue_use(enqueue_op)
            per_run = use.n if use is not None and use.kind == "enqueue" else None
            op = as_operation(enqueue_op)
            op_name = str(op.name) if op is not None else str(getattr(enqueue_op, "name", "") or "")
        info = RunnerInfo(
            thread_ref=weakref.ref(thread),
            runner_ref=weakref.ref(runner),
            session_ref=weakref.ref(session),
            coord_ref=weakref.ref(coord) if coord is not None else None,
            role="enqueue" if enqueue_op is not None else "close_on_stop",
            queue=queue,
            per_run=per_run,
            op_name=op_name,
            cell=self._current_cell(),
            progress_at=time.time(),
        )
        if coord is not None:
            self.add_coordinator(coord)
        sinfo = self.add_session(session)
        try:
            sinfo.started[runner] = bool(thread.daemon)
        except TypeError:  # a runner that cannot be weakly referenced is not restartable
            log.debug("nbcoord: QueueRunner %r cannot be remembered for a restart", runner)
        with self.lock:
            self._runners.append(info)
        return info

    def _forget_queue(self) -> Callable[[Any], None]:
        """The weakref callback of an eager queue's Python object: the queue is gone with it."""

        def forget(ref: Any) -> None:
            with self.lock:
                self._drop([info for info in self._queues.values() if info.ref is ref])

        return forget

    def _forget_graph(self) -> Callable[[Any], None]:
        """The weakref callback of a graph-mode queue's graph: its queues are gone with it."""

        def forget(ref: Any) -> None:
            with self.lock:
                self._drop([info for info in self._queues.values() if info.graph_ref is ref])

        return forget

    def _drop(self, infos: list[QueueInfo]) -> None:
        """Forget these queues (under the lock)."""
        for info in infos:
            self._queues.pop(info.qid, None)
            for key in [k for k, v in self._queues_by_object.items() if v is info]:
                del self._queues_by_object[key]
            for op_key in [k for k, v in self._queues_by_op.items() if v is info]:
                del self._queues_by_op[op_key]
            for counts in (self.eager_counts, self.eager_producers, self.eager_consumers):
                counts.pop(info.qid, None)
        if infos:
            self._queue_version += 1

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

    def session_by_id(self, sid: str) -> SessionInfo | None:
        """A live session's info by the id nbcoord gave it."""
        return next((info for info in self.sessions() if info.sid == sid), None)

    def queue_info(self, queue: Any) -> QueueInfo | None:
        with self.lock:
            info = self._queues_by_object.get(id(queue))
        return info if info is not None and info.ref() is queue else None

    def queue_by_op(self, graph: Any, op_name: str) -> QueueInfo | None:
        """The queue whose queue op is ``op_name`` in ``graph``."""
        with self.lock:
            info = self._queues_by_op.get((id(graph), op_name))
        if info is None or info.graph_ref is None:
            return None
        return info if info.graph_ref() is graph else None

    def coord_info(self, coord: Any) -> CoordInfo | None:
        with self.lock:
            info = self._coords.get(id(coord))
        return info if info is not None and info.ref() is coord else None

    def sessions(self) -> list[SessionInfo]:
        with self.lock:
            return [info for info in self._sessions.values() if info.ref() is not None]

    def queues(self) -> list[QueueInfo]:
        with self.lock:
            return [info for info in self._queues.values() if info.alive()]

    def coordinators(self) -> list[tuple[CoordInfo, Any]]:
        """Live coordinators with their info."""
        with self.lock:
            infos = list(self._coords.values())
        return [(info, coord) for info in infos if (coord := info.ref()) is not None]

    def coordinator_by_id(self, cid: str) -> Any | None:
        """A live Coordinator by the id nbcoord gave it."""
        return next((coord for info, coord in self.coordinators() if info.cid == cid), None)

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

    def eager_threads(self, queue: QueueInfo, *, producers: bool) -> list[threading.Thread]:
        """Live threads that enqueued into (``producers``) or dequeued from an eager queue."""
        table = self.eager_producers if producers else self.eager_consumers
        with self.lock:
            refs = list(table.get(queue.qid, {}).values())
        return [t for ref in refs if (t := ref()) is not None and t.is_alive()]

    # ------------------------------------------------------------------------------------------ polling
    def poll_all(self, *, record: bool, wait: float = 0.0) -> None:
        """Poll every open session and the eager queues (``record``: also add a point to the history)."""
        for info in self.sessions():
            self.poll(info, record=record, wait=wait)
        self.poll_eager(record=record)

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
            read_at = time.monotonic()
            values = poller.fetch()
        except Exception:
            log.debug("nbcoord: polling the queues of session %s failed", info.sid, exc_info=True)
            return False
        finally:
            info.lock.release()
        self._update(info, session, poller.queues, values, read_at, record=record)
        return True

    def poll_eager(self, *, record: bool = False, only: QueueInfo | None = None) -> None:
        """Poll eager queues with their own ``size()`` and ``is_closed()`` (where this thread runs eagerly)."""
        queues = [only] if only is not None else [q for q in self.queues() if q.mode == "eager"]
        if not queues or not self.executing_eagerly():
            return
        now_wall = time.time()
        for info in queues:
            queue = info.ref()
            if queue is None:
                continue
            read_at = time.monotonic()
            try:
                size, closed = int(queue.size()), bool(queue.is_closed())
            except Exception:
                log.debug("nbcoord: polling eager queue %s failed", info.name, exc_info=True)
                continue
            with self.lock:
                state = info.state(EAGER)
                state.size = size
                state.observe_closed(closed, read_at)
                if record:
                    counts = self.eager_counts.get(info.qid, [0, 0])
                    state.history.append((round(now_wall, 2), size))
                    state.enqueued = counts[0]
                    state.window.append((read_at, size, state.enqueued))

    def _poller(self, info: SessionInfo, session: Any) -> Poller | None:
        """The session's prepared callable, rebuilt only when the queues of its graph changed."""
        graph = session.graph
        with self.lock:
            version = self._queue_version
            poller = info.poller
            if poller is not None and poller.version == version:
                return poller
            queues = [
                q
                for q in self._queues.values()
                if q.graph_ref is not None and q.graph_ref() is graph and q.ops is not None
            ]
            # A queue object whose Python object is gone (its op stays) keeps its place: the poller's list is
            # compared by identity below.
        if poller is not None and [id(q) for q in poller.queues] == [id(q) for q in queues]:
            poller.version = version  # queues came and went elsewhere: this graph's are the same
            return poller
        fetch = None
        if queues:
            tensors = [t for q in queues if q.ops is not None for t in (q.ops.size, q.ops.closed)]
            fetch = session.make_callable(tensors)
        info.poller = Poller(version, queues, fetch)
        return info.poller

    def _update(
        self, info: SessionInfo, session: Any, queues: list[QueueInfo], values: Any, read_at: float, *, record: bool
    ) -> None:
        now_wall = time.time()
        producers: dict[int, list[RunnerInfo]] = {}
        for runner in self.runners():
            if runner.role == "enqueue" and runner.queue is not None and runner.session_ref() is session:
                producers.setdefault(id(runner.queue), []).append(runner)
        with self.lock:
            for index, queue in enumerate(queues):
                state = queue.state(info.sid)
                state.size = int(values[2 * index])
                state.observe_closed(bool(values[2 * index + 1]), read_at)
                if record:
                    state.history.append((round(now_wall, 2), state.size))
                    self._count_enqueues(state, producers.get(id(queue), []))
                    state.window.append((read_at, state.size, state.enqueued))

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


#: The default names of TensorFlow's queue constructors: an eager queue with one of them is named by its id.
_DEFAULT_NAMES = frozenset(
    {"fifo_queue", "padding_fifo_queue", "random_shuffle_queue", "priority_queue", "Empty"}
)
