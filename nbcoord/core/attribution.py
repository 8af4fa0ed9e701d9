"""Whose a thread is: the cell that started it (directly, or through the threads it started), the kernel's, or
nbcoord's own. Paid once per thread, when the registry reads the start that ``Thread.start`` queued."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from nbcoord.core.records import INTERNAL_PREFIX, CellInfo, PendingStart, ThreadRecord


def record_of(  # noqa: PLR0917 (the registry's drain calls it once per thread)
    entry: PendingStart,
    thread: threading.Thread | None,
    main: threading.Thread,
    ident: int | None,
    parent_record: ThreadRecord | None,
    kernel_classes: tuple[type, ...],
    tid: str,
) -> ThreadRecord:
    """The record a queued start makes (``thread`` None: it is already gone; the record is not kept, but the threads
    it started inherit its cell through it). ``parent_record``: the starting thread's record, if any."""
    _, parent_ref, _parent_ident, stack, owner, main_cell, now = entry
    parent = parent_ref()
    name = thread.name if thread is not None else ""
    internal = name.startswith(INTERNAL_PREFIX)  # nbcoord names its threads when it makes them
    cell: CellInfo | None
    if parent_record is not None:
        cell = parent_record.cell
        if cell is None and parent is main:
            cell = main_cell
        preexisting = parent_record.preexisting and parent is not main
        internal = internal or parent_record.internal
        claimed = parent_record.claimed
        parent_tid: str | None = parent_record.tid
    else:
        cell = main_cell if parent is main else None
        preexisting = claimed = False
        parent_tid = None
    if cell is not None and thread is not None and isinstance(thread, kernel_classes):
        cell = None  # the kernel's own, wherever it was started (its threads then are the kernel's too)
    parent_name = parent.name if parent is not None else parent_record.name if parent_record is not None else None
    if thread is None:
        return ThreadRecord(
            "", entry[0], name, None, None, False, now, cell, parent_name, parent_tid, stack, preexisting,
            internal, claimed,
        )
    # Threads started by the kernel's own threads (or by nbcoord's) count as theirs, not the user's.
    record = new_record(
        tid, thread, ident, name, now, cell, parent_name, parent_tid, stack, preexisting, internal, claimed
    )
    if owner is not None:
        record.owners.append(owner)
    return record


def new_record(  # noqa: PLR0917 (positional on purpose: a keyword call costs twice as much, per thread)
    tid: str,
    thread: threading.Thread,
    ident: int | None,
    name: str,
    now: float,
    cell: CellInfo | None,
    parent_name: str | None,
    parent_tid: str | None,
    stack: list[Any],
    preexisting: bool,
    internal: bool,
    claimed: bool,
) -> ThreadRecord:
    """A record with what the Thread object itself says (its ident and name as the caller read them, once); the
    rest says where it came from."""
    record = ThreadRecord(
        tid, weakref.ref(thread), name, ident, thread.native_id, thread.daemon, now, cell, parent_name, parent_tid,
        stack, preexisting, internal, claimed,
    )
    record.last_active = now
    return record
