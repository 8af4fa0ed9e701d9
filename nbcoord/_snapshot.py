"""One typed, JSON-serialisable picture of the kernel: the only thing that views (report, magics, panel) read.

Data flows one way: the registry and the registered sources (integrations, resource probes) feed
:func:`SnapshotBuilder.build`, and views render the result. Nothing here imports IPython or TensorFlow.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

from ._callbacks import Callbacks
from ._registry import CellInfo, Registry, ThreadFailure, ThreadRecord

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
    zombie: str | None
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
    resources: dict[str, Any] | None
    last_stop: dict[str, Any] | None


#: A source returns a partial snapshot: list sections are appended, other sections replaced.
Source = Callable[[], dict[str, Any]]

_LIST_SECTIONS = ("queues", "blocked_runs", "sessions")


def cell_row(cell: CellInfo) -> CellRow:
    """A cell as a row."""
    return CellRow(
        execution_count=cell.execution_count,
        cell_id=cell.cell_id,
        first_line=cell.first_line,
        started_at=cell.started_at,
        ended_at=cell.ended_at,
        outcome=cell.outcome,
        error=cell.error,
    )


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
    )


def format_stack(frame: Any, limit: int = 30) -> list[str]:
    """A live thread's stack, innermost last, as ``file:line in function`` lines (no source lookups)."""
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        code = frame.f_code
        lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    lines.reverse()
    return lines


#: Innermost function names that mean a thread is waiting rather than working.
_WAITING = frozenset({"wait", "_wait_for_tstate_lock", "get", "acquire", "sleep", "select", "poll", "recv"})


def thread_state(record: ThreadRecord, frame: Any) -> str:
    """A short state word: running, waiting (in a known blocking call), stopping, finished (no frame)."""
    if frame is None:
        return "finished"
    if record.stop_requested_at is not None:
        return "stopping"
    if frame.f_code.co_name in _WAITING:
        return "waiting"
    return "running"


def creation_lines(record: ThreadRecord) -> list[str]:
    """The record's creation stack as ``file:line in function`` lines, formatted once."""
    if record.creation_lines is None:
        record.creation_lines = [f"{file}:{line} in {function}" for file, line, function in record.creation_stack]
    return record.creation_lines


class SnapshotBuilder:
    """Builds snapshots from the registry and the registered sources."""

    def __init__(self, registry: Registry, grace_period: Callable[[], float]) -> None:
        self._registry = registry
        self._grace_period = grace_period
        self._sources: Callbacks[Source] = Callbacks()
        self.last_stop: dict[str, Any] | None = None

    def add_source(self, name: str, source: Source) -> Callable[[], None]:
        """Register a source of snapshot sections; returns the function that removes it."""
        return self._sources.add(name, source)

    def thread_row(self, record: ThreadRecord, frame: Any, *, stacks: bool, grace: float) -> ThreadRow:
        """One registered thread as a row; ``frame`` is its current frame (None: not running)."""
        thread = record.thread
        alive = record.is_alive()
        cell = record.cell
        failure = record.last_exception
        # A dict literal, not ThreadRow(...): a keyword call costs twice as much, a thousand times a snapshot.
        row: ThreadRow = {
            "tid": record.tid,
            "name": thread.name if thread is not None else record.name,
            "ident": record.ident,
            "native_id": record.native_id,
            "daemon": record.daemon,
            "alive": alive,
            "started_at": record.started_at,
            "cell": cell.execution_count if cell is not None else None,
            "parent": record.parent_name,
            "owners": [{"kind": o.kind, "label": o.label, "closed": o.closed()} for o in record.owners],
            "preexisting": record.preexisting,
            "user": record.user,
            "state": thread_state(record, frame),
            "zombie": self._registry.zombie_reason(record, grace, alive=alive),
            "stop_requested_at": record.stop_requested_at,
            "last_active": record.last_active,
            "cpu_s": record.cpu_s,
            "creation_stack": creation_lines(record),
            "stack": format_stack(frame) if stacks and frame is not None else None,
            "last_exception": f"{failure.exc_type}: {failure.message}" if failure is not None else None,
        }
        return row

    def build(self, *, stacks: bool = False, include_internal: bool = False) -> Snapshot:
        """Take one snapshot. ``stacks`` adds every thread's current stack (slower)."""
        frames = sys._current_frames()
        records = self._registry.records(include_internal=include_internal)
        grace = self._grace_period()
        threads = [
            self.thread_row(r, frames.get(r.ident) if r.ident is not None else None, stacks=stacks, grace=grace)
            for r in records
        ]
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
            resources=None,
            last_stop=self.last_stop,
        )
        self._apply_sources(snapshot)
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
