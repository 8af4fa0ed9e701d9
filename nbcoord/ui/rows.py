"""The panel's rows: the threads and the other things cells left running, their groups, the cells, the header.

Figures that move on their own are not sent: idle times and ages are computed by the front end from the absolute
times sent here (``last_active``, ``started_at``), so that an idle kernel sends nothing and a view's "5 s ago"
keeps counting while nothing arrives. Thread rows are sent up to ``MAX_THREAD_ROWS`` (zombies first); ``groups``
gives each group's true count (threads and other items per cell, and the zombies), so that a view that shows fewer
rows says so once, with the true number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from nbcoord.core.internals import current_frames
from nbcoord.core.records import ThreadRecord
from nbcoord.core.snapshot import LedgerRow, ThreadRow, creation_lines, format_stack
from nbcoord.core.text import TEXT_CHARS
from nbcoord.ui.fields import name_cut, reasons, rounded, significant
from nbcoord.ui.source import Shaping

#: A thread that moved within this many seconds shows as active (its idle time counts from then on).
ACTIVE_WINDOW_S: Final = 3.0


def thread_row(row: ThreadRow, now: float) -> dict[str, Any]:
    """A snapshot row as the panel needs it: no stacks (sent on request), times that move only on a change.

    ``last_active`` is None while the thread is active (it moved in the last ``ACTIVE_WINDOW_S``), else the
    moment its idle period began: a thread that polls all the time, or sleeps all the time, sends nothing.
    """
    last_active = row["last_active"]
    return {
        "tid": row["tid"],
        "name": name_cut(row["name"]),
        "cell": row["cell"],
        "state": row["state"],
        "zombie": row["zombie"],
        "reasons": reasons(row["zombie_reasons"]),
        "daemon": row["daemon"],
        "owners": [
            {"kind": name_cut(o["kind"]), "label": name_cut(o["label"]), "closed": o["closed"]} for o in row["owners"]
        ],
        "started_at": rounded(row["started_at"]),
        "last_active": None if now - last_active < ACTIVE_WINDOW_S else rounded(last_active, 1),
        "cpu_s": significant(row["cpu_s"]),
        "stop_requested_at": rounded(row["stop_requested_at"]),
        "last_exception": name_cut(row["last_exception"], TEXT_CHARS),
    }


def ledger_row(row: LedgerRow) -> dict[str, Any]:
    """Something a cell left running that is not a thread (a task, a pool, a data loader)."""
    return {
        "id": row["id"],
        "kind": row["kind"],
        "label": name_cut(row["label"]),
        "cell": row["cell"],
        "state": row["state"],
        "zombie": row["zombie"],
        "reasons": reasons(row["zombie_reasons"]),
        "started_at": rounded(row["started_at"]),
        "detail": name_cut(row["detail"], TEXT_CHARS),
        "pids": list(row["pids"])[:20],
    }


def drawn_order(key: str) -> Callable[[Mapping[str, Any]], tuple[int, int, float, str]]:
    """The order rows are drawn in, from the fields sent (the order itself is not sent, see :mod:`.rowsync`): the
    kernel's (zombies first, then by cell, then by start), ties (a start rounded to 10 ms) broken by the row's key.
    The front end sorts by the same key (``js/src/panel/rows.js``)."""

    def order(row: Mapping[str, Any]) -> tuple[int, int, float, str]:
        cell, started = row.get("cell"), row.get("started_at")
        return (
            0 if row.get("zombie") else 1,
            cell if isinstance(cell, int) else 1 << 30,
            float(started) if isinstance(started, (int, float)) else 0.0,
            str(row.get(key)),
        )

    return order


def group_key(row: Mapping[str, Any]) -> str:
    """The group a row is drawn in: the zombies, its cell, or "none" (not started by a cell)."""
    if row.get("zombie"):
        return "zombies"
    cell = row.get("cell")
    return "none" if cell is None else f"c{cell}"


def groups(threads: Sequence[Mapping[str, Any]], ledger: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each group's true counts (all rows, sent or not), zombies first, then by cell."""
    counts: dict[str, dict[str, Any]] = {}
    for kind, rows in (("threads", threads), ("items", ledger)):
        for row in rows:
            key = group_key(row)
            group = counts.get(key)
            if group is None:
                group = counts[key] = {
                    "key": key,
                    "cell": None if key in ("zombies", "none") else row["cell"],
                    "threads": 0,
                    "items": 0,
                }
            group[kind] += 1
    rank = {"zombies": -1.0, "none": math.inf}
    return sorted(counts.values(), key=lambda g: rank.get(g["key"], g["cell"] if g["cell"] is not None else 0))


def stack_state(record: ThreadRecord, click_id: str, cell_of_file: Callable[[str], int | None]) -> dict[str, Any]:
    """A thread's stack as a view asked for it (a one-off answer), with where the thread was created."""
    frame = current_frames().get(record.ident) if record.ident is not None else None
    lines = format_stack(frame, cell_of=cell_of_file) if frame is not None else []
    return {
        "tid": record.tid,
        "name": name_cut(record.name),
        "click_id": click_id,
        "stack": [name_cut(line, TEXT_CHARS) for line in lines],
        "creation": [name_cut(line, TEXT_CHARS) for line in creation_lines(record, cell_of_file)],
        "at": round(time.time(), 3),
    }


# ------------------------------------------------------------------------------------ the sections' shaping
def shape_header(s: Shaping) -> dict[str, Any]:
    """The header: true counts, the running cell, the route clicks take and the interval of updates."""
    snapshot = s.snapshot
    running = next((c for c in reversed(snapshot["cells"]) if c["outcome"] == "running"), None)
    return {
        "pid": snapshot["pid"],
        "threads": len(s.user),
        "threads_shown": len(s.shown),
        "items": len(snapshot["ledger"]),
        "kernel_threads": sum(1 for r in snapshot["threads"] if r["alive"] and not r["user"]),
        "native_threads": s.native,
        "zombies": snapshot["zombie_count"],
        "queues": len(snapshot["queues"]),
        "running_cell": running["execution_count"] if running is not None else None,
        "running_since": rounded(running["started_at"]) if running is not None else None,
        "route": s.route,
        "interval": s.interval,
    }


def shape_threads(s: Shaping) -> list[dict[str, Any]]:
    """The thread rows sent, in the order the front end draws them."""
    return sorted((thread_row(r, s.snapshot["taken_at"]) for r in s.shown), key=drawn_order("tid"))


def shape_ledger(s: Shaping) -> list[dict[str, Any]]:
    """The ledger rows sent, in the order the front end draws them."""
    return sorted((ledger_row(r) for r in s.ledger_shown), key=drawn_order("id"))


def shape_groups(s: Shaping) -> list[dict[str, Any]]:
    """Every group's true counts."""
    return groups(s.user, s.ledger)


def shape_cells(s: Shaping) -> list[dict[str, Any]]:
    """The cells the rows sent name, and the running cell."""
    return [
        {
            "n": c["execution_count"],
            "line": name_cut(c["first_line"]),
            "outcome": c["outcome"],
            "started_at": rounded(c["started_at"]),
            "ended_at": rounded(c["ended_at"]),
        }
        for c in s.snapshot["cells"]
        if c["execution_count"] in s.wanted_cells or c["outcome"] == "running"
    ]
