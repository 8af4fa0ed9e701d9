"""When something counts as a zombie: the one set of rules for threads and for the ledger's items.

A thing the user's cell started is a zombie while it runs and its cell was interrupted or failed, its owner (an
executor, a Session, a pool) was closed, or a stop asked it to end more than the grace period ago. Each reason
comes with the moment it began, first cause first.
"""

from __future__ import annotations

from nbcoord.core.records import CellInfo, ThreadRecord, ZombieReason

Reasons = list[tuple[ZombieReason, float]]


def _cell_reason(cell: CellInfo | None) -> Reasons:
    if cell is not None and cell.ended_at is not None and cell.outcome in ("interrupted", "error"):
        return [("cell-interrupted" if cell.outcome == "interrupted" else "cell-error", cell.ended_at)]
    return []


def thread_reasons(record: ThreadRecord, grace_period: float, now: float, *, alive: bool | None = None) -> Reasons:
    """Every reason a live thread of the user's counts as a zombie (``alive``: if already known)."""
    if not record.user or not (record.is_alive() if alive is None else alive):
        return []
    reasons = _cell_reason(record.cell)
    if record.owners and any(owner.closed() for owner in record.owners):
        if record.owner_closed_at is None:
            record.owner_closed_at = now  # first seen closed: an attribute store needs no lock
        reasons.append(("owner-closed", record.owner_closed_at))
    asked = record.stop_requested_at
    if asked is not None and now - asked > grace_period:
        reasons.append(("stop-ignored", asked))
    reasons.sort(key=lambda reason: reason[1])
    return reasons


def item_reasons(
    cell: CellInfo | None,
    grace_period: float,
    now: float,
    *,
    closed_at: float | None = None,
    stop_requested_at: float | None = None,
) -> Reasons:
    """The same rules for something that is not a thread (a task, a pool) whose cell is ``cell``: its owner closed
    at ``closed_at`` while it runs, a stop asked at ``stop_requested_at`` was ignored."""
    reasons = _cell_reason(cell)
    if closed_at is not None:
        reasons.append(("owner-closed", closed_at))
    if stop_requested_at is not None and now - stop_requested_at > grace_period:
        reasons.append(("stop-ignored", stop_requested_at))
    reasons.sort(key=lambda reason: reason[1])
    return reasons
