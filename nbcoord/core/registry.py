"""The kernel-wide registry of threads, cells and owners.

It knows nothing of IPython or TensorFlow: the lifecycle layer tells it when a cell starts and ends, a patched
``Thread.start`` tells it when a thread starts, and integrations attach owners (an executor, a QueueRunner) to
threads. Everything that views show is derived from here at snapshot time.

What it records (cells, threads, owners, failures) is defined in :mod:`nbcoord.core.records`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

from nbcoord.core import activity, attribution, zombies
from nbcoord.core.records import (
    INTERNAL_PREFIX,
    CellInfo,
    CellOutcome,
    FailureLog,
    Owner,
    PendingStart,
    ThreadFailure,
    ThreadRecord,
    ZombieReason,
    creation_stack,
    find_thread_tables,
    is_starting,
    running_table,
)

log = logging.getLogger("nbcoord")

#: How many thread failures are kept; older ones are dropped first.
MAX_FAILURES = 100
#: Finished cells kept besides those something still refers to (a live thread, a child process, a stop report, an
#: on_stop callback): a long session runs thousands of cells, and every snapshot lists the cells it keeps.
RECENT_CELLS = 100
#: How far past RECENT_CELLS the table may grow before it is trimmed (trimming is a pass over every thread).
_CELL_SLACK = 50



class Registry:
    """Thread-safe record of threads and cells for one kernel."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        keep_cells: Callable[[], Iterable[int]] | None = None,
        kernel_classes: Callable[[], tuple[type, ...]] = tuple,
    ) -> None:
        find_thread_tables()
        self._clock = clock
        #: Execution counts of cells that something outside the registry still refers to (child processes, stop
        #: reports, callbacks): kept when old cells are forgotten.
        self.keep_cells = keep_cells
        #: The classes of the kernel's own threads (IPython's history saver, ipykernel's channel threads): a thread
        #: of one of them is the kernel's even when a cell's code started it (IPython restarts its history thread
        #: after a fork, from whichever thread forked). Asked once per drain: modules come and go.
        self._kernel_classes = kernel_classes
        self._kernel_classes_now: tuple[type, ...] = ()
        # Guards _threads, _by_ident, _cells, _current_cell and every record's mutable fields.
        self._lock = threading.RLock()
        self._threads: dict[str, ThreadRecord] = {}
        self._by_ident: dict[int, ThreadRecord] = {}
        # The idents of every record's thread, as the last full prune found them alive, and the version then: while
        # nothing was added or removed since, one C-speed comparison with threading's own table tells whether any
        # of them ended (see _none_ended). Idents, not threads: nothing here keeps a finished thread alive.
        self._alive_at_prune: tuple[int, set[int]] = (-1, set())
        self._cells: dict[int, CellInfo] = {}
        self._current_cell: CellInfo | None = None
        self.failure_log = FailureLog(MAX_FAILURES)
        self._ids = itertools.count(1)
        #: Threads started but not yet registered (see note_started); appended without the lock.
        self._pending: deque[PendingStart] = deque()
        #: Drains under way (under the lock; a counter, as drains nest): see _drain.
        self._draining = 0
        #: Records by the cell that started them (keyed by the CellInfo's id), for per-cell hooks.
        self._by_cell: dict[int, dict[str, ThreadRecord]] = {}
        #: Bumped whenever a record is added or pruned; keys the cached native-id -> name table.
        self._version = 0
        self._names: tuple[int, dict[int, str]] = (-1, {})

    # ----------------------------------------------------------------------------------------------- cells
    def cell_started(self, execution_count: int, cell_id: str | None, source: str) -> CellInfo:
        """Record that a cell began to run on the main thread."""
        first_line = next((line.strip() for line in source.splitlines() if line.strip()), "")
        cell = CellInfo(execution_count, cell_id, first_line[:120], self._clock())
        with self._lock:
            self._cells[execution_count] = cell
            self._current_cell = cell
        return cell

    def cell_finished(self, execution_count: int, outcome: CellOutcome, error: str | None = None) -> CellInfo | None:
        """Record a cell's outcome. The count may differ from the provisional one given at start."""
        with self._lock:
            cell = self._current_cell
            self._current_cell = None
            if cell is None:
                return None
            if cell.execution_count != execution_count:
                self._cells.pop(cell.execution_count, None)
                cell.execution_count = execution_count
                self._cells[execution_count] = cell
            cell.ended_at = self._clock()
            cell.outcome = outcome
            cell.error = error
            for record in self._by_cell.get(id(cell), {}).values():
                record.row_cache = None  # its cell number or outcome (a zombie reason) changed
            if len(self._cells) > RECENT_CELLS + _CELL_SLACK:
                self._forget_old_cells()
            return cell

    def _forget_old_cells(self) -> None:
        """Keep the recent cells, and the older ones something still refers to; forget the rest (under the lock)."""
        counts = list(self._cells)  # in the order they started
        keep = set(counts[-RECENT_CELLS:])
        keep.update(r.cell.execution_count for r in self._threads.values() if r.cell is not None)
        keep.update(entry[5].execution_count for entry in self._pending if entry[5] is not None)
        if self._current_cell is not None:
            keep.add(self._current_cell.execution_count)
        if self.keep_cells is not None:
            try:
                keep.update(self.keep_cells())
            except Exception:  # keep everything rather than forget what may be in use
                log.warning("nbcoord: could not tell which cells are in use", exc_info=True)
                return
        for count in counts:
            if count not in keep:
                del self._cells[count]

    def current_cell(self) -> CellInfo | None:
        """The cell running now, if any."""
        return self._current_cell

    def cells(self) -> list[CellInfo]:
        """Every cell seen, oldest first."""
        with self._lock:
            return sorted(self._cells.values(), key=lambda cell: cell.started_at)

    def cell(self, execution_count: int) -> CellInfo | None:
        """One cell by its execution count."""
        return self._cells.get(execution_count)

    # --------------------------------------------------------------------------------------------- threads
    def note_started(
        self,
        thread: threading.Thread,
        parent: threading.Thread,
        frame: FrameType | None,
        owner: Owner | None = None,
    ) -> PendingStart:
        """The hot path of ``Thread.start``, called just before the thread runs: queue what only the starting
        moment knows; the record is made on the next read of the registry.

        Reads drain the queue in order, so a parent is always registered before the threads it started; an entry
        whose thread has no ident yet (its start is still under way) waits for a later read. ``deque.append``
        needs no lock. The threads are queued by weak reference (``weakref.ref`` of an object returns the one
        basic reference it already has, so the record made later holds that same reference: see _parent_record).
        """
        entry = (
            weakref.ref(thread), weakref.ref(parent), parent.ident, creation_stack(frame), owner, self._current_cell,
            self._clock(),
        )
        self._pending.append(entry)
        return entry

    def forget_pending(self, entry: PendingStart) -> None:
        """Drop a queued start whose ``Thread.start`` failed."""
        with self._lock, contextlib.suppress(ValueError):
            self._pending.remove(entry)

    def _drain(self) -> None:
        # Both read without the lock, the queue first. A drain on another thread counts itself before it takes an
        # entry and uncounts once what it took is registered: a reader that finds the queue empty while such a
        # drain is under way waits for it below, instead of missing a thread that is being registered (one of
        # 1000 threads calling wait_for_stop() at once was told it was no cell's thread, and died of it).
        if not self._pending and not self._draining:
            return
        main = threading.main_thread()
        with self._lock:
            self._draining += 1
            try:
                waiting: list[PendingStart] = []
                gone: dict[int, ThreadRecord] = {}
                self._kernel_classes_now = self._kernel_classes()
                pending, register = self._pending, self._register
                while pending:
                    entry = pending.popleft()
                    thread = entry[0]()
                    if thread is None:
                        # It ran, ended and was freed before this read: no record (nothing to show or stop), but
                        # threads it started inherit its cell through what its record would have said.
                        gone[id(entry[0])] = self._record_of(entry, None, main, None)
                        continue
                    ident = thread.ident
                    if ident is None:
                        waiting.append(entry)
                        continue
                    register(entry, thread, main, ident, gone)
                self._pending.extendleft(reversed(waiting))
            finally:
                self._draining -= 1

    def _register(
        self,
        entry: PendingStart,
        thread: threading.Thread,
        main: threading.Thread,
        ident: int,
        gone: dict[int, ThreadRecord],
    ) -> ThreadRecord:
        """The record of a queued start (under the lock; paid once per thread, on the next read)."""
        record = self._record_of(entry, thread, main, ident, gone)
        self._add(record)
        return record

    def _record_of(
        self,
        entry: PendingStart,
        thread: threading.Thread | None,
        main: threading.Thread,
        ident: int | None,
        gone: dict[int, ThreadRecord] | None = None,
    ) -> ThreadRecord:
        """What a queued start's record says (``thread`` None: it is already gone; the record is not kept)."""
        parent_record = self._parent_record(entry[1], entry[2], gone)
        tid = f"t{next(self._ids)}" if thread is not None else ""
        return attribution.record_of(entry, thread, main, ident, parent_record, self._kernel_classes_now, tid)

    def _parent_record(
        self, parent_ref: weakref.ref[threading.Thread], parent_ident: int | None, gone: dict[int, ThreadRecord] | None
    ) -> ThreadRecord | None:
        """The record of the thread behind ``parent_ref``, also when that thread has ended and been freed since: the
        record holds the same weak reference (see note_started), and the OS reuses idents at once, so the ident
        alone is not enough."""
        record = self._by_ident.get(parent_ident) if parent_ident is not None else None
        if record is not None and record.thread_ref is parent_ref:
            return record
        return gone.get(id(parent_ref)) if gone else None

    def adopt_existing(self, *, internal: Callable[[threading.Thread], bool] = lambda _t: False) -> None:
        """Register threads that were running before the extension was loaded."""
        now = self._clock()
        for thread in threading.enumerate():
            if thread.ident is None or thread.ident in self._by_ident:
                continue
            ident, name = thread.ident, thread.name
            record = attribution.new_record(
                f"t{next(self._ids)}", thread, ident, name, now, None, None, None, [], True, internal(thread), False
            )
            with self._lock:
                self._add(record)

    def _add(self, record: ThreadRecord) -> None:
        # A finished thread's ident can be reused by the OS: the newer record wins.
        version, alive = self._alive_at_prune
        if version == self._version and record.ident is not None and record.ident not in alive:
            alive.add(record.ident)  # (an ident already there: the sizes differ now, and _prune looks closer)
            self._alive_at_prune = (version + 1, alive)
        self._version += 1
        self._threads[record.tid] = record
        if record.ident is not None:
            self._by_ident[record.ident] = record
        if record.cell is not None:
            self._by_cell.setdefault(id(record.cell), {})[record.tid] = record

    def _own_record(self, thread: threading.Thread) -> ThreadRecord | None:
        """The record of exactly this thread: the OS reuses idents at once, so the ident alone is not enough."""
        record = self._by_ident.get(thread.ident) if thread.ident is not None else None
        return record if record is not None and record.thread_ref() is thread else None

    def records_of_cell(self, cell: CellInfo) -> list[ThreadRecord]:
        """The live threads a cell started (directly or through its threads)."""
        self._drain()
        with self._lock:
            return [record for record in self._by_cell.get(id(cell), {}).values() if record.is_alive()]

    def add_owner(self, thread: threading.Thread, owner: Owner, *, claim: bool = False) -> None:
        """Attach an owner to a registered thread (integrations call this).

        ``claim``: the owner proves the thread is the user's work although no cell started it (a QueueRunner's
        thread found running when nbcoord loads); from then on it is stopped and judged like a cell's thread.
        """
        self._drain()
        record = self.for_thread(thread)
        if record is not None:
            with self._lock:
                record.owners.append(owner)
                if claim and not record.name.startswith(INTERNAL_PREFIX):
                    # Work an integration vouches for; nbcoord's own threads stay internal, but a thread that
                    # only inherited the flag (a runner restarted from the panel's thread) is the user's.
                    record.claimed = True
                    record.internal = False
                record.row_cache = None

    def for_thread(self, thread: threading.Thread) -> ThreadRecord | None:
        """The record of a Thread object, if registered."""
        self._drain()
        if thread.ident is None:
            return None
        record = self._by_ident.get(thread.ident)
        if record is None or record.thread is not thread:
            return None
        return record

    def for_ident(self, ident: int) -> ThreadRecord | None:
        """The record of the thread with this ident, if registered."""
        self._drain()
        return self._by_ident.get(ident)

    def get(self, tid: str) -> ThreadRecord | None:
        """A record by the id the registry issued."""
        self._drain()
        return self._threads.get(tid)

    def keep_row(self, record: ThreadRecord, building: dict[str, Any], row: dict[str, Any]) -> None:
        """Keep ``row`` as the record's snapshot row, unless a write dropped ``building`` (the mark the snapshot set
        before it read the record) meanwhile."""
        with self._lock:
            if record.row_cache is building:
                record.row_cache = row

    def records(self, *, include_internal: bool = False) -> list[ThreadRecord]:
        """Registered live threads, oldest first; finished ones are pruned."""
        with self._lock:
            self._drain()
            self._prune()
            if include_internal:
                return list(self._threads.values())
            return [record for record in self._threads.values() if not record.internal]

    def native_names(self) -> dict[int, str]:
        """Native thread id -> Python thread name of every registered thread (nbcoord's included), for labelling
        the OS's thread list. Rebuilt only when threads came or went; names are as the monitor last saw them."""
        with self._lock:
            self._drain()
            version, names = self._names
            if version != self._version:
                names = {r.native_id: r.name for r in self._threads.values() if r.native_id is not None}
                self._names = (self._version, names)
            return names

    def _none_ended(self, table: Mapping[int, threading.Thread]) -> bool:
        """True when no thread the last full prune found alive has ended and none was added or removed since: every
        one's ident still in threading's table (1000 threads: a few us, where the full check takes 100).

        An ident can only come back to the table through a thread's start, whose registration (which every read
        drains before it prunes) changes the version; the one exception, a foreign thread's ``_DummyThread``
        taking a dead thread's ident, leaves that record listed until the next registration (its thread reads as
        not alive meanwhile: ``ThreadRecord.is_alive`` checks the object).
        """
        version, alive = self._alive_at_prune
        if version != self._version or len(alive) != len(self._threads):
            return False
        return table.keys() >= alive

    def _prune(self) -> None:
        """Forget finished threads (called under the lock, on every read: the liveness test is inlined)."""
        table = running_table()
        if table is not None and self._none_ended(table):
            return
        dead: list[ThreadRecord] = []
        for record in self._threads.values():
            thread = record.thread_ref()
            if thread is None or record.ident is None:
                dead.append(record)
            elif table is not None:
                if table.get(record.ident) is not thread and not is_starting(thread):
                    dead.append(record)
            elif not thread.is_alive():
                dead.append(record)
        for record in dead:
            self._version += 1
            del self._threads[record.tid]
            if record.ident is not None and self._by_ident.get(record.ident) is record:
                del self._by_ident[record.ident]
            if record.cell is not None:
                siblings = self._by_cell.get(id(record.cell), {})
                siblings.pop(record.tid, None)  # a dict: O(1) where a cell started thousands of threads
                if not siblings:
                    self._by_cell.pop(id(record.cell), None)
        if table is not None:
            idents = {r.ident for r in self._threads.values() if r.ident is not None}
            self._alive_at_prune = (self._version, idents) if len(idents) == len(self._threads) else (-1, set())

    # --------------------------------------------------------------------------------------------- zombies
    def zombie_reasons(
        self, record: ThreadRecord, grace_period: float, *, alive: bool | None = None
    ) -> list[tuple[ZombieReason, float]]:
        """Every reason a live thread of the user's counts as a zombie, with when it began, first cause first
        (``alive``: if already known). Empty when it is not a zombie (the rules: :mod:`nbcoord.core.zombies`)."""
        return zombies.thread_reasons(record, grace_period, self._clock(), alive=alive)

    def item_zombie_reasons(
        self,
        cell: int | None,
        grace_period: float,
        *,
        closed_at: float | None = None,
        stop_requested_at: float | None = None,
    ) -> list[tuple[ZombieReason, float]]:
        """The same rules for something that is not a thread (a task, a pool) that cell ``cell`` started."""
        if cell is None:
            return []
        return zombies.item_reasons(
            self._cells.get(cell), grace_period, self._clock(), closed_at=closed_at,
            stop_requested_at=stop_requested_at,
        )

    def zombie_reason(
        self, record: ThreadRecord, grace_period: float, *, alive: bool | None = None
    ) -> ZombieReason | None:
        """The first reason a live thread counts as a zombie, or None when it does not."""
        reasons = self.zombie_reasons(record, grace_period, alive=alive)
        return reasons[0][0] if reasons else None

    # -------------------------------------------------------------------------------------------- stopping
    def request_stop(self, records: Iterable[ThreadRecord]) -> None:
        """Set the stop flag of these threads (``nbcoord.should_stop()`` turns True in them)."""
        now = self._clock()
        with self._lock:
            for record in records:
                if record.stop_requested_at is None:
                    record.stop_requested_at = now
                    record.row_cache = None
                if record.stop_event is not None:
                    record.stop_event.set()

    def stop_requested_for_current(self) -> bool:
        """Whether a stop was requested for the calling thread (False when it is not registered)."""
        self._drain()
        record = self._own_record(threading.current_thread())
        return record is not None and record.stop_requested_at is not None

    def stop_event_for_current(self) -> threading.Event | None:
        """The stop flag of the calling thread as an Event (made on first use), if the thread is registered."""
        self._drain()
        record = self._own_record(threading.current_thread())
        if record is None:
            return None
        with self._lock:
            if record.stop_event is None:
                record.stop_event = threading.Event()
                if record.stop_requested_at is not None:
                    record.stop_event.set()
            return record.stop_event

    # -------------------------------------------------------------------------------------------- failures
    def thread_failed(self, thread: threading.Thread | None, exc: BaseException) -> ThreadFailure:
        """Keep an exception that escaped a thread, with its traceback, thread and cell."""
        record = self.for_thread(thread) if thread is not None else None
        cell = record.cell.execution_count if record is not None and record.cell is not None else None
        failure = self.failure_log.add(record.tid if record is not None else None, thread, cell, exc, self._clock())
        with self._lock:
            if record is not None:
                record.last_exception = failure
                record.row_cache = None
        return failure

    def failures(self) -> list[ThreadFailure]:
        """Recent thread failures, oldest first."""
        return self.failure_log.recent()

    def take_unreported_failures(self) -> list[ThreadFailure]:
        """Failures not yet announced in a cell; marks them announced."""
        return self.failure_log.take_unreported()

    # -------------------------------------------------------------------------------------------- activity
    def sample_activity(self) -> bool:
        """Note which threads moved since the last sample and which owners closed (see
        :func:`nbcoord.core.activity.note_moves`). Also forgets finished threads, so the registry stays small when
        no view asks for snapshots. Returns whether a thread a cell started is alive (or still being registered):
        the monitor's reason to keep sampling."""
        where = activity.where_threads_are()
        now = self._clock()
        with self._lock:
            self._drain()
            self._prune()
            if activity.note_moves(self._threads.values(), where, now):
                self._version += 1  # a thread was renamed: the name table is out of date
            return bool(self._pending) or any(record.user for record in self._threads.values())

    def note_cpu(self, cpu_by_native_id: dict[int, float]) -> None:
        """Record threads' CPU times (by native id); a change counts as activity."""
        now = self._clock()
        with self._lock:
            activity.note_cpu(self._threads.values(), cpu_by_native_id, now)
