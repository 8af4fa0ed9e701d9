"""What every panel section is shaped from: one snapshot, what the panel adds, and the selections sections share.

:class:`Shaping` holds the snapshot and what the controller adds to it (the fast route's kind, the interval, the
click data of the last stop, the native thread count read at this tick), and computes once, when a section first
asks, what several sections read: the live user threads and the ledger's items in the order they are drawn
(zombies first, then by cell), the rows sent (``MAX_THREAD_ROWS``, ``MAX_LEDGER_ROWS``), and the cells those rows
name. Every count is the true one: ``groups`` counts all rows, sent or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Final

from nbcoord.core.snapshot import LedgerRow, Snapshot, ThreadRow

#: Thread rows sent; the rest are counted in ``groups`` (Stop all and Stop cell still reach them).
MAX_THREAD_ROWS: Final = 2000
#: Ledger rows (tasks, pools, loaders) sent; likewise counted in ``groups``.
MAX_LEDGER_ROWS: Final = 500
#: Rows of what cells did to memory sent (the last ones).
MAX_CELL_MEMORY_ROWS: Final = 50


def _sort_key(row: Mapping[str, Any]) -> tuple[int, int, float]:
    cell = row["cell"]
    return (0 if row["zombie"] else 1, cell if cell is not None else 1 << 30, row["started_at"])


@dataclasses.dataclass(frozen=True)
class Shaping:
    """One snapshot and what the panel adds to it; the shared selections are computed once, on first use."""

    snapshot: Snapshot
    route: str = "none"
    interval: float = 1.0
    stop_extra: Mapping[str, Any] | None = None
    #: The process's OS threads read at this tick; None: the count of the probe's last list.
    native_threads: int | None = None

    @cached_property
    def user(self) -> list[ThreadRow]:
        """The live threads cells started, zombies first, then by cell."""
        return sorted((r for r in self.snapshot["threads"] if r["alive"] and r["user"]), key=_sort_key)

    @cached_property
    def shown(self) -> list[ThreadRow]:
        """The thread rows sent."""
        return self.user[:MAX_THREAD_ROWS]

    @cached_property
    def ledger(self) -> list[LedgerRow]:
        """The ledger's items, in the threads' order."""
        return sorted(self.snapshot["ledger"], key=_sort_key)

    @cached_property
    def ledger_shown(self) -> list[LedgerRow]:
        """The ledger rows sent."""
        return self.ledger[:MAX_LEDGER_ROWS]

    @cached_property
    def cell_memory(self) -> list[Any]:
        """The last rows of what cells did to memory."""
        return list(self.snapshot["cell_memory"][-MAX_CELL_MEMORY_ROWS:])

    @cached_property
    def native(self) -> int | None:
        """The native thread count: the one read at this tick, else the probe's list's length."""
        if self.native_threads is None and self.snapshot["resources"]:
            listed = self.snapshot["resources"].get("native_threads")
            return len(listed) if isinstance(listed, list) else None
        return self.native_threads

    @cached_property
    def wanted_cells(self) -> set[int]:
        """The cells the rows sent name: the cells section sends these (and the running one)."""
        wanted = {r["cell"] for r in self.shown if r["cell"] is not None}
        wanted |= {r["cell"] for r in self.ledger_shown if r["cell"] is not None}
        wanted |= {cell for r in self.cell_memory if isinstance(cell := r.get("cell"), int)}
        return wanted
