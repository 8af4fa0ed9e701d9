"""One typed, JSON-serialisable picture of the kernel: the only thing that views (report, magics, panel) read.

Data flows one way: the registry and the registered sources (integrations, resource probes) feed
:func:`SnapshotBuilder.build`, and views render the result. Nothing here imports IPython or TensorFlow.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

from nbcoord.core.callbacks import Callbacks
from nbcoord.core.internals import WAITING_FUNCTIONS, calling_frame, current_frames
from nbcoord.core.records import CellInfo, ThreadFailure, ThreadRecord
from nbcoord.core.registry import Registry
from nbcoord.core.schema import WaitsReport

log = logging.getLogger("nbcoord")

SCHEMA_VERSION = 1


class CellRow(TypedDict):
    execution_count: int
    cell_id: str | None
    first_line: str
    started_at: float
    ended_at: float | None
    outcome: str
    error: str | None


class OwnerRow(TypedDict):
    kind: str
    label: str
    closed: bool


class ZombieReasonRow(TypedDict):
    reason: str  # cell-interrupted, cell-error, owner-closed, stop-ignored
    since: float  # when it began (time.time())


class ThreadRow(TypedDict):
    tid: str
    name: str
    ident: int | None
    native_id: int | None
    daemon: bool
    alive: bool
    started_at: float
    cell: int | None
    parent: str | None
    owners: list[OwnerRow]
    preexisting: bool
    user: bool  # started by a cell (or claimed by an integration): the only threads a stop ever touches
    state: str
    zombie: str | None  # the first reason, or None
    zombie_reasons: list[ZombieReasonRow]  # every reason, first cause first
    stop_requested_at: float | None
    last_active: float
    cpu_s: float | None
    creation_stack: list[str]
    stack: list[str] | None
    last_exception: str | None


class FailureRow(TypedDict):
    tid: str | None
    thread_name: str
    cell: int | None
    exc_type: str
    message: str
    traceback: str
    at: float
    notes: list[str]  # what an integration added to explain the error (PEP 678 notes)


class LedgerRow(TypedDict):
    """Something a cell left running that is not a thread: an asyncio task, a process pool, a data loader's
    workers, a child process. Integrations fill the ``ledger`` section (one module per kind under integrations/);
    views show the rows with the threads of their cell."""

    id: str  # issued by the kernel ("task-3", "pool-2"): the only ids commands may name
    kind: str  # "task", "pool", "loader", "process", ...
    label: str  # what it is, in words ("Task poll_forever()", "multiprocessing.Pool, 4 workers")
    cell: int | None  # the cell that started it
    state: str  # "running", "waiting", "cancelling", "done", ...
    started_at: float
    zombie: str | None  # the first reason, or None
    zombie_reasons: list[ZombieReasonRow]  # every reason, first cause first
    detail: str  # where it waits, or its role ("DataLoader worker 2 of cell [5]")
    pids: list[int]  # its processes (a pool's workers), if any


class CellMemoryRow(TypedDict):
    """What a cell did to memory: this process's RSS and GPU memory before and after it, and the peak while it ran
    (as sampled off the main thread)."""

    cell: int
    rss_before: int | None
    rss_after: int | None
    rss_peak: int | None
    gpu_before: int | None  # this process, all devices together
    gpu_after: int | None
    gpu_peak: int | None
    held: bool  # the growth is still there now


class CellGpuRow(TypedDict):
    """One GPU device's figures for one cell: this process's memory on it (NVML)."""

    index: int
    before: int | None
    after: int | None
    peak: int | None
    now: int | None


class CellMemory(CellMemoryRow):
    """A ``cell_memory`` row with what the ledger adds to :class:`CellMemoryRow`."""

    started_at: float  # time.time()
    ended_at: float | None  # None while it runs
    rss_now: int | None
    rss_peak_exact: bool  # the peak is the process's own high-water mark (else: the highest sample)
    rss_held: bool
    gpu_held: bool
    gpu_devices: list[CellGpuRow]
    summary: str  # "cell [7]: +2.1 GiB on GPU 0, still held"


class OutputThreadRow(TypedDict):
    """One thread whose text went to an area."""

    tid: str
    name: str
    cell: int | None  # the cell that started it (an earlier run of the area's cell, when that cell ran again)
    lines: int  # lines it wrote there
    failed: bool  # its uncaught exception's traceback is there


class OutputRow(TypedDict):
    """One output area: the background output of the threads a cell started, shown under that cell."""

    cell: int  # the run of the cell whose output holds the area (the cell that started the threads, or its rerun)
    cell_id: str | None  # the front end's id of that cell, when the request carried one (for a link)
    display_id: str | None  # the area's display id; None until a line could be shown
    lines: int  # lines routed there since the area was placed in this run
    shown: int  # lines the area shows now (at most NBCoord.output_lines)
    hidden: int  # lines written there that it no longer shows
    threads: list[OutputThreadRow]
    last_lines: list[str]  # the last few lines, for previews
    updated_at: float | None  # when the area was last sent (time.time()), None if never


class Snapshot(TypedDict):
    """The whole picture. Sections other than threads and cells are filled by registered sources."""

    schema: int
    taken_at: float
    pid: int
    threads: list[ThreadRow]
    cells: list[CellRow]
    failures: list[FailureRow]
    zombie_count: int
    queues: list[dict[str, Any]]
    blocked_runs: list[dict[str, Any]]
    sessions: list[dict[str, Any]]
    ledger: list[LedgerRow]
    cell_memory: list[CellMemory]  # CellMemoryRow and what the ledger adds (nbcoord/resources/memory.py)
    outputs: list[OutputRow]  # background output routed home, one row per output area (nbcoord/kernel/output.py)
    resources: dict[str, Any] | None
    last_stop: dict[str, Any] | None
    waits: WaitsReport | None  # what blocked threads wait on, and deadlocks: only when asked (Host.snapshot(waits=))


class SharedRow(dict):  # type: ignore[type-arg]
    """A snapshot row that later snapshots share while nothing in it changes (1000 threads: no copy of each row
    on every snapshot). Read-only at its top level, so that editing one snapshot cannot change the next:
    ``dict(row)`` is an editable copy, and so are ``row.copy()``, ``copy.copy(row)`` and a pickled and loaded row
    (the lists in it are shared too: ``copy.deepcopy(row)`` to edit those)."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise TypeError("a snapshot row is shared with later snapshots and read-only: edit dict(row) instead")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)


#: A source returns a partial snapshot: list sections are appended, other sections replaced.
Source = Callable[[], dict[str, Any]]

_LIST_SECTIONS = ("queues", "blocked_runs", "sessions", "ledger", "cell_memory", "outputs")


def cell_row(cell: CellInfo) -> CellRow:
    """A cell as a row (a finished cell's row is made once and shared)."""
    if cell.row_cache is not None:
        return cell.row_cache  # type: ignore[return-value]
    row = SharedRow(
        execution_count=cell.execution_count,
        cell_id=cell.cell_id,
        first_line=cell.first_line,
        started_at=cell.started_at,
        ended_at=cell.ended_at,
        outcome=cell.outcome,
        error=cell.error,
    )
    if cell.ended_at is not None:
        cell.row_cache = row
    return row  # type: ignore[return-value]


def failure_row(failure: ThreadFailure) -> FailureRow:
    """A thread failure as a row."""
    return FailureRow(
        tid=failure.tid,
        thread_name=failure.thread_name,
        cell=failure.cell,
        exc_type=failure.exc_type,
        message=failure.message,
        traceback=failure.traceback,
        at=failure.at,
        notes=list(failure.notes),
    )


#: A source file's name -> the execution count of the cell whose code it holds (IPython compiles each cell from a
#: file of its own, ``ipykernel_<pid>/<hash>.py``), or None for any other file.
CellOfFile = Callable[[str], "int | None"]


def code_location(filename: str, line: int, function: str, cell_of: CellOfFile | None = None) -> str:
    """``cell [3], line 4 in work`` for a cell's code, ``file:line in function`` for any other."""
    cell = cell_of(filename) if cell_of is not None else None
    if cell is not None:
        return f"cell [{cell}], line {line} in {function}"
    return f"{filename}:{line} in {function}"


def format_stack(frame: Any, limit: int = 30, cell_of: CellOfFile | None = None) -> list[str]:
    """A live thread's stack, innermost last, one location per line (no source lookups)."""
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        code = frame.f_code
        lines.append(code_location(code.co_filename, frame.f_lineno, code.co_name, cell_of))
        frame = frame.f_back
    lines.reverse()
    return lines


#: Cell outcomes that make the threads the cell left running zombies.
_FAILED = frozenset({"interrupted", "error"})


def thread_state(record: ThreadRecord, frame: Any) -> str:
    """A short state word: running, waiting (in a known blocking call), stopping, finished (no frame)."""
    if frame is None:
        return "finished"
    if record.stop_requested_at is not None:
        return "stopping"
    if frame.f_code.co_name in WAITING_FUNCTIONS:
        return "waiting"
    return "running"


def creation_lines(record: ThreadRecord, cell_of: CellOfFile | None = None) -> list[str]:
    """The record's creation stack as locations, formatted once."""
    if record.creation_lines is None:
        record.creation_lines = [code_location(*entry, cell_of) for entry in record.creation_frames()]
    return record.creation_lines


class SnapshotBuilder:
    """Builds snapshots from the registry and the registered sources."""

    def __init__(
        self, registry: Registry, grace_period: Callable[[], float], cell_of: CellOfFile | None = None
    ) -> None:
        self._registry = registry
        self._grace_period = grace_period
        self.cell_of = cell_of
        self._sources: Callbacks[Source] = Callbacks()
        self.last_stop: dict[str, Any] | None = None
        #: The last restart of a TensorFlow session's runners (for the panel), if any.
        self.last_restart: dict[str, Any] | None = None

    def add_source(self, name: str, source: Source) -> Callable[[], None]:
        """Register a source of snapshot sections; returns the function that removes it."""
        return self._sources.add(name, source)

    def thread_row(
        self,
        record: ThreadRecord,
        frame: Any,
        *,
        stacks: bool,
        grace: float,
        alive: bool | None = None,
        innermost: str | None = None,
    ) -> ThreadRow:
        """One registered thread as a row; ``frame`` is its current frame (None: not running; needed only with
        ``stacks`` when ``innermost``, the name of its innermost function, is given); ``alive``: if known.

        Built for every thread on every snapshot, so the common case costs nothing: the record keeps its last row
        (a :class:`SharedRow`) until the registry changes a field the row shows (it drops the row then). What the
        registry cannot see change is checked here every time: the state (from the frame), and, for threads with
        owners or a stop request (whose rows are never kept), the zombie reasons (an owner closes, a grace period
        runs out).
        """
        if alive is None:
            alive = record.is_alive()
        if innermost is None and frame is not None:
            innermost = frame.f_code.co_name
        if innermost is None:
            state = "finished"
        elif record.stop_requested_at is not None:
            state = "stopping"
        else:
            state = "waiting" if innermost in WAITING_FUNCTIONS else "running"
        cached = record.row_cache
        if cached is not None and cached["state"] == state and cached["alive"] == alive and not stacks:
            return cached  # type: ignore[return-value]
        # A row to keep is marked before the fields are read: a write from now on drops the mark (under the
        # registry's lock), and then the row made below, which may have missed it, is not kept. Rows never kept
        # (with stacks, owners or a stop request) leave the kept one alone.
        keep = not stacks and not record.owners and record.stop_requested_at is None
        building: dict[str, Any] = {"state": None}
        if keep:
            record.row_cache = building
        cell = record.cell
        failure = record.last_exception
        owners = record.owners
        user = not record.internal and (cell is not None or record.claimed)
        reasons: list[ZombieReasonRow] = []
        if user and (owners or record.stop_requested_at is not None or (cell is not None and cell.outcome in _FAILED)):
            reasons = [
                {"reason": reason, "since": since}
                for reason, since in self._registry.zombie_reasons(record, grace, alive=alive)
            ]
        # A dict literal, not ThreadRow(...): a keyword call costs twice as much.
        row: dict[str, Any] = {
            "tid": record.tid,
            "name": record.name,  # the monitor refreshes it from the Thread every second
            "ident": record.ident,
            "native_id": record.native_id,
            "daemon": record.daemon,
            "alive": alive,
            "started_at": record.started_at,
            "cell": cell.execution_count if cell is not None else None,
            "parent": record.parent_name,
            "owners": [{"kind": o.kind, "label": o.label, "closed": o.closed()} for o in owners] if owners else [],
            "preexisting": record.preexisting,
            "user": user,
            "state": state,
            "zombie": reasons[0]["reason"] if reasons else None,
            "zombie_reasons": reasons,
            "stop_requested_at": record.stop_requested_at,
            "last_active": record.last_active,
            "cpu_s": record.cpu_s,
            "creation_stack": creation_lines(record, self.cell_of),
            "stack": format_stack(frame, cell_of=self.cell_of) if stacks and frame is not None else None,
            "last_exception": f"{failure.exc_type}: {failure.message}" if failure is not None else None,
        }
        shared = SharedRow(row)
        if keep:
            self._registry.keep_row(record, building, shared)
        return shared  # type: ignore[return-value]

    def build(self, *, stacks: bool = False, include_internal: bool = False) -> Snapshot:
        """Take one snapshot. ``stacks`` adds every thread's current stack (slower)."""
        frames = current_frames()
        # This thread (the one taking the snapshot) is running, here; current_frames leaves it out.
        own = calling_frame(0)
        if own is not None:
            frames[threading.get_ident()] = own
        del own
        records = self._registry.records(include_internal=include_internal)
        grace = self._grace_period()
        threads: list[ThreadRow] = []
        append = threads.append
        # records() has just pruned the finished: every one is alive. The common case, a kept row whose state did
        # not change, is inlined here (the row itself, shared): 1000 threads in well under a millisecond.
        frame = None
        try:
            for record in records:
                ident = record.ident
                frame = frames.get(ident) if ident is not None else None
                cached = record.row_cache
                if cached is not None and not stacks:
                    co_name = frame.f_code.co_name if frame is not None else None
                    state = "finished" if frame is None else "waiting" if co_name in WAITING_FUNCTIONS else "running"
                    if cached["state"] == state:
                        append(cached)  # type: ignore[arg-type]
                        continue
                append(self.thread_row(record, frame, stacks=stacks, grace=grace, alive=True))
        finally:
            # Frames held longer would keep what they refer to alive, to be finalized later in this thread (see
            # Registry.sample_activity); this frame in the dict that this frame holds is a cycle until cleared.
            frames.clear()
            del frame
        snapshot = Snapshot(
            schema=SCHEMA_VERSION,
            taken_at=time.time(),
            pid=os.getpid(),
            threads=threads,
            cells=[cell_row(c) for c in self._registry.cells()],
            failures=[failure_row(f) for f in self._registry.failures()],
            zombie_count=sum(1 for row in threads if row["zombie"] is not None),
            queues=[],
            blocked_runs=[],
            sessions=[],
            ledger=[],
            cell_memory=[],
            outputs=[],
            resources=None,
            last_stop=self.last_stop,
            waits=None,
        )
        self._apply_sources(snapshot)
        snapshot["zombie_count"] += sum(1 for row in snapshot["ledger"] if row["zombie"] is not None)
        return snapshot

    def _apply_sources(self, snapshot: Snapshot) -> None:
        sources = self._sources.items()
        target: dict[str, Any] = snapshot  # type: ignore[assignment]
        for name, source in sources:
            try:
                part = source()
            except Exception:
                log.warning("nbcoord: snapshot source %r failed", name, exc_info=True)
                continue
            for key, value in part.items():
                if key in _LIST_SECTIONS:
                    target[key].extend(value)
                elif key in target:
                    target[key] = value
                else:
                    log.warning("nbcoord: snapshot source %r gave an unknown section %r", name, key)
