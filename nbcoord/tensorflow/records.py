"""What nbcoord keeps of each TensorFlow object it knows: a session, a queue (and its state per session), a
coordinator, a queue-runner thread, a session's poller; who closed a queue; whether a session is open.

Plain records, each guarded by :attr:`TFObjects.lock <nbcoord.tensorflow.objects.TFObjects.lock>` where shared;
every TensorFlow object is held by weak reference.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbcoord.tensorflow.graph import QueueOps
from nbcoord.tensorflow.internals import session_closed

#: Points of fill-level history kept per queue and session (one per poll, about a second apart).
HISTORY_POINTS = 60
#: How long a snapshot waits for a poll of the same session already in flight.
POLL_WAIT_S = 0.1
#: Polls over which rates are computed (about five seconds).
RATE_WINDOW = 6
#: The state key of an eager queue (it lives outside any session).
EAGER = "eager"

#: Sessions whose close() nbcoord saw: where TensorFlow's own flag cannot be read, that is the one used.
_closed_seen: weakref.WeakSet[Any] = weakref.WeakSet()


def session_is_open(session: Any) -> bool:
    """Whether a TensorFlow session is still usable (not closed, not being deleted)."""
    closed = session_closed(session)
    if closed is None:
        return session not in _closed_seen
    return not closed


def mark_closed(session: Any) -> None:
    """Remember that a session's ``close()`` ran (the fallback of :func:`session_is_open`)."""
    with contextlib.suppress(TypeError):  # not weak-referenceable: TensorFlow's own flag is the only source
        _closed_seen.add(session)


@dataclass(frozen=True)
class CloseRecord:
    """Who closed a queue (or a session), when, and from where, for the sentences that explain TF's errors."""

    #: nbcoord-stop, coordinator, runner-end, close-op, with-block, close-call, eager-close
    source: str
    thread: str
    cell: int | None
    at: float  # time.time()
    #: The words that say the rest: "the stop of all", "Coordinator c1 was asked to stop by MainThread in cell
    #: [7]", "QueueRunner `files`".
    detail: str = ""


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
    #: The QueueRunners started in this session, with whether their threads were daemons (for a restart).
    started: weakref.WeakKeyDictionary[Any, bool] = field(default_factory=weakref.WeakKeyDictionary)
    closed_by: CloseRecord | None = None

    def live_session(self) -> Any | None:
        """The session if it is still open and not being closed."""
        session = self.ref()
        if session is None or self.closing or not session_is_open(session):
            return None
        return session


@dataclass(eq=False)
class QueueState:
    """A queue inside one session (or the eager context): last polled size and closed flag, history, rates."""

    size: int | None = None
    closed: bool | None = None
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    enqueued: int = 0
    enqueued_known: bool = True
    counted: dict[int, int] = field(default_factory=dict)
    window: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    #: Who closed the queue, when nbcoord knows (cleared when it is reset or seen open again).
    closed_by: CloseRecord | None = None
    #: When a poll first saw it closed (time.time()).
    closed_seen_at: float | None = None
    #: ``time.monotonic()`` from which a poll that reads the queue open clears ``closed_by``: a poll reads first
    #: and stores later, so one that began before the close ran may have read it open (inf while it runs).
    closed_by_settled_at: float = 0.0

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

    def observe_closed(self, closed: bool, read_at: float) -> None:
        """Store a poll's reading of the closed flag, made at ``read_at`` (``time.monotonic()``): a reading
        older than the close nbcoord knows of is ignored."""
        if not closed and self.closed_by is not None and read_at < self.closed_by_settled_at:
            return
        self.closed = closed
        if closed and self.closed_seen_at is None:
            self.closed_seen_at = time.time()
        elif not closed:
            self.closed_seen_at = None
            self.closed_by = None

    def note_close(self, record: CloseRecord, *, in_flight: bool) -> bool:
        """Remember who closes the queue, unless something closed it before; ``in_flight``: the close has not
        run yet (call ``settle_close`` once it has). Call with the objects' lock held."""
        if self.closed_by is not None:
            return False
        self.closed_by = record
        self.closed_by_settled_at = math.inf if in_flight else time.monotonic()
        return True

    def settle_close(self, record: CloseRecord) -> None:
        """The close recorded in flight has run: polls that begin from now on read it."""
        if self.closed_by is record:
            self.closed_by_settled_at = time.monotonic()


@dataclass(eq=False)
class QueueInfo:
    qid: str
    ref: weakref.ref[Any]
    graph_ref: weakref.ref[Any] | None
    name: str
    op_type: str
    capacity: int
    min_after_dequeue: int
    ops: QueueOps | None
    cell: int | None
    created_at: float
    preexisting: bool
    #: By session id (EAGER for an eager queue).
    states: dict[str, QueueState] = field(default_factory=dict)
    #: "graph" or "eager".
    mode: str = "graph"

    def alive(self) -> bool:
        """Whether the queue still exists: an eager queue while its Python object lives, a graph-mode one while its
        graph lives (the op runs in sessions whether or not anything still holds the Python object: a queue built
        inside a helper function and read only by a QueueRunner's enqueue op is still there)."""
        if self.graph_ref is not None:
            return self.graph_ref() is not None
        return self.ref() is not None

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
    #: Who asked it to stop first, and with which exception, once it was.
    stopped_by: CloseRecord | None = None
    #: Made by TensorFlow's own code (MirroredStrategy, MonitoredSession), which re-raises what its threads
    #: report in the caller itself.
    tensorflow_made: bool = False


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
    #: The name of the enqueue op it runs ("" for the close-on-stop thread or an op nbcoord cannot name).
    op_name: str = ""
    cell: int | None = None
    attached: bool = False
    #: Progress, sampled by the monitor: runs completed when last looked, and when that count last moved.
    seen_runs: int = -1
    progress_at: float = 0.0  # time.time()

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
