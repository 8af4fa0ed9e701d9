"""Whether a thread is working: the monitor's samples of where each thread is and how much CPU it used.

A thread that moved (its innermost frame or line changed) or used CPU since the last sample was active then; the
report and the panel show how long a thread has been still ("stuck").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nbcoord.core.internals import current_frames
from nbcoord.core.records import ThreadRecord


def where_threads_are() -> dict[int, tuple[int, int]]:
    """(code id, line) of each thread's innermost frame, by ident.

    Only that: holding the frames themselves (through the registry's lock, for the whole sample) would keep what
    they refer to alive and let it be finalized later, in another thread (Keras' enqueuer, whose ``__del__`` then
    swallowed the main thread's KeyboardInterrupt).
    """
    frames = current_frames()
    where = {ident: (id(frame.f_code), frame.f_lineno) for ident, frame in frames.items()}
    del frames
    return where


def note_moves(records: Iterable[ThreadRecord], where: Mapping[int, tuple[int, int]], now: float) -> bool:
    """Note which threads moved since the last sample, renamed threads, and owners seen closed (the moment a thread
    became a zombie for that reason), under the registry's lock; True when a thread was renamed."""
    renamed = False
    for record in records:
        thread = record.thread_ref()
        if thread is not None and thread.name != record.name:
            record.name = thread.name
            record.row_cache = None
            renamed = True
        signature = where.get(record.ident) if record.ident is not None else None
        if signature != record.activity_signature:
            record.activity_signature = signature
            record.last_active = now
            record.row_cache = None
        if record.owners and record.owner_closed_at is None and any(o.closed() for o in record.owners):
            record.owner_closed_at = now
    return renamed


def note_cpu(records: Iterable[ThreadRecord], cpu_by_native_id: Mapping[int, float], now: float) -> None:
    """Record threads' CPU times (by native id), under the registry's lock; a change counts as activity."""
    for record in records:
        cpu_s = cpu_by_native_id.get(record.native_id) if record.native_id is not None else None
        if cpu_s is None:
            continue
        if record.cpu_s is not None and cpu_s > record.cpu_s + 1e-3:
            record.last_active = now
        if cpu_s != record.cpu_s:
            record.cpu_s = cpu_s
            record.row_cache = None
