"""What the registry records: cells, threads, their owners and failures (plain data, no locking of its own).

Owners are held by weak reference: a record must never keep a Session (and its GPU memory) or an executor alive.
Threads are held by weak reference too, so that a finished thread is forgotten once nobody else holds it.
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Literal

from nbcoord.core.internals import running_threads, starting_threads

#: The interpreter's own table of running threads (ident -> Thread), looked up by :func:`find_thread_tables`;
#: None where this Python has none (liveness then comes from ``Thread.is_alive()``).
_running: dict[int, threading.Thread] | None = None
#: The interpreter's table of threads being started (``start()`` has returned, the running table is next), looked up
#: with ``_running``; None where this Python has none.
_starting: dict[threading.Thread, threading.Thread] | None = None

CellOutcome = Literal["running", "ok", "error", "interrupted"]
ZombieReason = Literal["cell-interrupted", "cell-error", "stop-ignored", "owner-closed"]

#: How many frames of the starting code a record keeps. Short on purpose: it is taken on every Thread.start.
CREATION_STACK_DEPTH = 6
#: What Thread.start queues: the thread, its parent (the starting thread) and the parent's ident, the creation stack,
#: the owner, the cell then running, the time. Both threads by weak reference: a queued start must not keep a thread
#: that finished (nor its parent) alive until the next read (CPython's ``concurrent.futures.process`` keeps its
#: threads weakly, and its forked workers call what a dead thread left there).
PendingStart = tuple[
    "weakref.ref[threading.Thread]", "weakref.ref[threading.Thread]", int | None, list[Any], "Owner | None",
    "CellInfo | None", float,
]
#: Prefix of every thread nbcoord itself starts; they are internal and never shown or stopped as user threads.
INTERNAL_PREFIX = "nbcoord-"

@dataclass
class CellInfo:
    """One executed cell: its number, the front end's cell id if the request carried one, and its outcome."""

    execution_count: int
    cell_id: str | None
    first_line: str
    started_at: float
    ended_at: float | None = None
    outcome: CellOutcome = "running"
    error: str | None = None
    #: The snapshot's row of a finished cell (it no longer changes), made once.
    row_cache: dict[str, Any] | None = None


@dataclass
class Owner:
    """Something that owns a thread: an executor, a QueueRunner, a Session, a Coordinator.

    ``is_closed`` and ``stop`` are called with the live object; the object itself is only held through ``ref``.
    """

    kind: str
    label: str
    ref: weakref.ref[object] | None = None
    is_closed: Callable[[object], bool] | None = None
    #: How to stop this owner (an executor: shut down with pending work cancelled); called by the stop.
    stop: Callable[[object], None] | None = None

    def closed(self) -> bool:
        """True when the owner was closed, shut down, or garbage collected."""
        if self.ref is None:
            return False
        target = self.ref()
        if target is None:
            return True
        if self.is_closed is None:
            return False
        try:
            return bool(self.is_closed(target))
        except Exception:  # an owner's own state check must not break a report
            return False


@dataclass
class ThreadFailure:
    """An exception that escaped a thread's run()."""

    tid: str | None
    thread_name: str
    cell: int | None
    exc_type: str
    message: str
    traceback: str
    at: float
    reported: bool = False
    #: The exception's notes (PEP 678: an integration explains a library's error there), as text.
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ThreadRecord:
    """What the registry knows about one thread."""

    tid: str
    thread_ref: weakref.ref[threading.Thread]
    name: str
    ident: int | None
    native_id: int | None
    daemon: bool
    started_at: float
    cell: CellInfo | None
    parent_name: str | None
    parent_tid: str | None
    #: The starting code, innermost first, flat: [code, offset, code, offset, ...] (no tuple per frame, and the
    #: bytecode offset rather than the line, decoded only when shown: start() stays cheap); :meth:`creation_frames`
    #: gives (file, line, function) triples.
    creation_stack: list[Any]
    preexisting: bool = False
    internal: bool = False
    #: Claimed as the user's by an integration although no cell started it (a QueueRunner started before load).
    claimed: bool = False
    owners: list[Owner] = field(default_factory=list)
    #: creation_stack as text, made on the first view that asks and kept (it never changes).
    creation_lines: list[str] | None = None
    #: The last snapshot row made of this record while it had no owner and no stop request (a SharedRow). The
    #: registry's writes of a field the row shows drop it, under the registry's lock; a snapshot reuses it while it
    #: is there and the thread's state is unchanged, and marks it while making a new one: see
    #: SnapshotBuilder.thread_row.
    row_cache: dict[str, Any] | None = None
    #: Created on first use by wait_for_stop, so that Thread.start does not pay for an Event per thread.
    stop_event: threading.Event | None = None
    stop_requested_at: float | None = None
    #: When an owner of this thread was first seen closed (a reason to call it a zombie, with its moment).
    owner_closed_at: float | None = None
    last_exception: ThreadFailure | None = None
    last_active: float = 0.0
    activity_signature: tuple[int, int] | None = None
    cpu_s: float | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The live Thread object, or None once it is gone."""
        return self.thread_ref()

    def creation_frames(self) -> list[tuple[str, int, str]]:
        """Where the thread was started, innermost first, as (file, line, function)."""
        flat = self.creation_stack
        pairs = zip(flat[0::2], flat[1::2], strict=False)
        return [(code.co_filename, line_of(code, offset), code.co_name) for code, offset in pairs]

    @property
    def user(self) -> bool:
        """Whether this is the user's thread: started by a cell (or by a thread a cell started), or claimed by an
        integration. Only the user's threads are ever stopped, forced or called zombies; the kernel's own threads
        (started before nbcoord, or outside any cell) never are."""
        return not self.internal and (self.cell is not None or self.claimed)

    def is_alive(self) -> bool:
        """Whether the thread is still running.

        Asks the interpreter's table of running threads rather than ``Thread.is_alive()``: on CPython 3.11 a
        KeyboardInterrupt during ``join()`` marks a live thread as stopped, and the OS reuses idents at once.
        """
        thread = self.thread_ref()
        if thread is None or self.ident is None:
            return False
        table = _running
        if table is None:
            return thread.is_alive()
        return table.get(self.ident) is thread or is_starting(thread)


def is_starting(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in the interpreter's table of threads being started: its ``start()`` returned, and it
    is about to put itself in the running table (a registry read in that moment must not take it for ended: the
    thread, looking up its own record an instant later, was told it was no cell's thread and died)."""
    table = _starting
    if table is None:
        return False
    try:
        return thread in table
    except Exception:  # a Thread subclass whose __hash__ or __eq__ raises: not known to be starting
        return False


def creation_stack(frame: FrameType | None, depth: int = CREATION_STACK_DEPTH) -> list[Any]:
    """A short, cheap stack of the innermost frames, flat: [code, offset, code, offset, ...] (no source reads)."""
    stack: list[Any] = []
    for _ in range(depth):
        if frame is None:
            break
        stack.append(frame.f_code)
        stack.append(frame.f_lasti)
        frame = frame.f_back
    return stack


def line_of(code: CodeType, offset: int) -> int:
    """The source line of the instruction at ``offset`` (a frame's ``f_lasti``) in ``code``; 0 if none."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line if line is not None else code.co_firstlineno
    return code.co_firstlineno


def running_table() -> dict[int, threading.Thread] | None:
    """The interpreter's table of running threads, once :func:`find_thread_tables` looked it up (None: none)."""
    return _running


class FailureLog:
    """The recent exceptions that escaped threads, oldest first, at most ``keep`` of them."""

    def __init__(self, keep: int) -> None:
        self._lock = threading.Lock()  # guards _failures and each failure's ``reported``
        self._failures: deque[ThreadFailure] = deque(maxlen=keep)

    def add(
        self, tid: str | None, thread: threading.Thread | None, cell: int | None, exc: BaseException, at: float
    ) -> ThreadFailure:
        """Keep ``exc`` with its traceback as text (never the traceback object: it holds frames)."""
        failure = ThreadFailure(
            tid=tid,
            thread_name=thread.name if thread is not None else "?",
            cell=cell,
            exc_type=type(exc).__name__,
            message=str(exc)[:500],
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            at=at,
            notes=[str(note)[:500] for note in getattr(exc, "__notes__", None) or []][:5],
        )
        with self._lock:
            self._failures.append(failure)
        return failure

    def recent(self) -> list[ThreadFailure]:
        with self._lock:
            return list(self._failures)

    def take_unreported(self) -> list[ThreadFailure]:
        """Failures not yet announced in a cell; marks them announced."""
        with self._lock:
            pending = [failure for failure in self._failures if not failure.reported]
            for failure in pending:
                failure.reported = True
            return pending


def find_thread_tables() -> None:
    """Look up the interpreter's thread tables once (the first Registry does; :meth:`ThreadRecord.is_alive` reads
    them)."""
    global _running, _starting
    if _running is None:
        _running = running_threads()  # None again where this Python has no such table
        _starting = starting_threads()
