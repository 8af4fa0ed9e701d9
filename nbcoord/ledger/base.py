"""The ledger's common ground, which every kind imports: the :class:`Kind` protocol and the :class:`Ledger` that holds
the kinds of one extension (row ids, the cell of the calling code, the zombie rules of items, which stop selects
an item, the roles of worker processes), with its one snapshot source, its one stopper, its monitor task, its cell
listener and its fork-child action.

The stopper works in two phases, so that kinds stop in parallel within the one deadline: every kind first starts
its stops (tasks are cancelled on their loops, a pool's own ``terminate()`` runs in a helper thread), then the
ledger waits for all of them together (:func:`nbcoord.ledger.stopping.wait_all`), and escalates to signals where a
library's own API has not ended a worker by its share of the time. What is still alive at the deadline is in the
report, with why.

Which kinds there are is not known here: :mod:`nbcoord.ledger.ledger` installs them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from nbcoord.core.fork import on_fork_child
from nbcoord.core.host import Host
from nbcoord.core.records import CellInfo
from nbcoord.core.snapshot import LedgerRow, ZombieReasonRow
from nbcoord.core.stop import ItemOutcome, StopScope
from nbcoord.ledger.stopping import Pending, wait_all
from nbcoord.resources.probes import ResourceProbe

log = logging.getLogger("nbcoord")

#: Row ids a kind issues are "<prefix>-<n>", n counting from 1 for each prefix.
_PREFIXES = ("task", "pool", "loader", "process")


class Kind(Protocol):
    """One kind of item in the ledger."""

    name: str

    def rows(self) -> list[LedgerRow]:
        """The items alive now, as rows."""

    def begin_stop(self, scope: StopScope) -> list[Pending]:
        """Start stopping the items in scope (quickly: the waiting is the ledger's); returns what to wait for."""

    def tick(self) -> bool:
        """The monitor's periodic work (forget what ended); whether the kind holds live items (the monitor keeps
        its base interval while one does)."""
        return False

    def uninstall(self) -> None:
        """Undo exactly what the kind installed."""


#: How a kind is installed: given the ledger, it watches its library (adding itself with :meth:`Ledger.add_kind`
#: once that is imported) and returns its undo.
KindInstaller = Callable[["Ledger"], Callable[[], None]]


class Ledger:
    """The kinds of one extension, and their common ground: ids, cells, zombie rules, scopes, roles of processes."""

    def __init__(self, host: Host, probe: ResourceProbe) -> None:
        self.host = host
        #: The resource probe: the process kind reads its last sample (shared with the ``resources`` section).
        self.probe = probe
        self.registry = host.registry
        self.kinds: list[Kind] = []
        #: False once uninstalled, or in a forked child: every hook of every kind passes straight through.
        self.active = False
        self._counters = {prefix: itertools.count(1) for prefix in _PREFIXES}
        self._undo: list[Callable[[], None]] = []
        #: Callbacks of the kinds for cell events (the tasks' cell variable), run by the one listener.
        self.cell_listeners: list[Callable[[str, CellInfo], None]] = []
        #: Run in a forked child, after ``active`` is cleared (each kind makes its hooks inert there).
        self.child_actions: list[Callable[[], None]] = []

    # ------------------------------------------------------------------------------------ install / undo
    def install(self, kinds: Sequence[KindInstaller]) -> None:
        """Register the ledger's source, stopper, monitor task, cell listener and fork-child action with the host,
        then install each kind, in order (each installer returns its undo)."""
        ext = self.host
        self.active = True
        self._undo.append(on_fork_child(self._forget_in_child))
        self._undo.append(ext.add_cell_listener("ledger", self._cell_event))
        self._undo.append(ext.snapshots.add_source("ledger", self._source))
        self._undo.append(ext.stopper.add_stopper("ledger", self._stop))
        self._undo.append(ext.monitor.add_task("ledger", self._tick))
        # The cells of live items stay known (their zombie rules need them); the notice after a failed cell names
        # the items it left.
        self._undo.append(ext.add_cells_in_use("ledger", self.cells_in_use))
        self._undo.append(ext.add_leftovers("ledger", self.leftovers))
        for install in kinds:
            self._undo.append(install(self))

    def add_kind(self, kind: Kind) -> Callable[[], None]:
        """Add a kind (a kind module calls this once its library is imported); returns the remover."""
        self.kinds.append(kind)
        self.kinds.sort(key=lambda k: k.name == "process")  # processes last: they read the others' roles

        def remove() -> None:
            if kind in self.kinds:
                self.kinds.remove(kind)

        return remove

    def uninstall(self) -> None:
        """Undo everything, newest first; one failing step does not keep the others from running."""
        self.active = False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: a ledger unload step failed", exc_info=True)

    def _forget_in_child(self) -> None:
        """In a forked child (a pool's or a DataLoader's worker): nothing of the ledger acts there. Takes no lock."""
        self.active = False
        for action in self.child_actions:
            action()

    # -------------------------------------------------------------------------------------------- common
    def issue(self, prefix: str) -> str:
        """A fresh id for a row, such as ``"pool-2"``: the only ids commands may name."""
        return f"{prefix}-{next(self._counters[prefix])}"

    def grace(self) -> float:
        return float(self.host.config.grace_period)

    def cell_of_caller(self) -> CellInfo | None:
        """The cell the calling code belongs to (the running cell on the main thread, the cell that started the
        calling thread elsewhere), as the registry's CellInfo (its number can still change while it runs)."""
        me = threading.current_thread()
        if me is threading.main_thread():
            return self.registry.current_cell()
        record = self.registry.for_thread(me)
        return record.cell if record is not None else None

    def zombie_reasons(
        self, cell: CellInfo | None, *, closed_at: float | None = None, stop_requested_at: float | None = None
    ) -> list[ZombieReasonRow]:
        """The zombie rules of threads, applied to an item of ``cell``: first cause first."""
        if cell is None:
            return []
        reasons = self.registry.item_zombie_reasons(
            cell.execution_count, self.grace(), closed_at=closed_at, stop_requested_at=stop_requested_at
        )
        return [{"reason": reason, "since": since} for reason, since in reasons]

    def selects(self, scope: StopScope, cell: CellInfo | None, zombie: bool) -> bool:
        """Whether a stop of ``scope`` concerns an item of ``cell`` (``zombie``: it is one now). Items are
        stopped by stops of everything, of their cell, and of the zombies; never by a stop of threads."""
        if cell is None:
            return False  # not started by a cell: the kernel's, or from before nbcoord was loaded
        if scope.kind == "all":
            return True
        if scope.kind == "cell":
            return cell.execution_count == scope.cell
        if scope.kind == "zombies":
            return zombie
        return False

    def cells_in_use(self) -> set[int]:
        """The cells of the items alive now (the extension keeps them when it forgets old cells)."""
        used: set[int] = set()
        for kind in list(self.kinds):
            cells = getattr(kind, "cells_in_use", None)
            if cells is not None:
                used |= cells()
        return used

    def roles(self) -> dict[int, tuple[str, str, CellInfo | None]]:
        """pid -> (role in words, the owning row's id, its cell), from every kind that knows its workers."""
        found: dict[int, tuple[str, str, CellInfo | None]] = {}
        for kind in list(self.kinds):
            worker_roles = getattr(kind, "worker_roles", None)
            if worker_roles is None:
                continue
            try:
                found.update(worker_roles())
            except Exception:
                log.warning("nbcoord: the %s ledger could not name its workers", kind.name, exc_info=True)
        return found

    # ------------------------------------------------------------------------------------- the extension's
    def _cell_event(self, event: str, cell: CellInfo) -> None:
        if not self.active:
            return
        for listener in self.cell_listeners:
            listener(event, cell)

    def _source(self) -> dict[str, Any]:
        return {"ledger": self.rows()} if self.active else {}

    def rows(self, skip: Collection[str] = ()) -> list[LedgerRow]:
        """Every kind's rows but those of the kinds named in ``skip`` (a failed cell's line needs no process tree)."""
        rows: list[LedgerRow] = []
        for kind in list(self.kinds):
            if kind.name in skip:
                continue
            try:
                rows += kind.rows()
            except Exception:
                log.warning("nbcoord: the %s ledger failed", kind.name, exc_info=True)
        return rows

    def _tick(self) -> bool:
        if not self.active:
            return False
        live = False
        for kind in list(self.kinds):
            try:
                live = bool(kind.tick()) or live
            except Exception:
                live = True
                log.warning("nbcoord: the %s ledger's monitor task failed", kind.name, exc_info=True)
        return live

    def at_shutdown(self) -> bool:
        """Whether the stop running now is the kernel's shutdown stop."""
        return self.host.shutdown_ran()

    def leftovers(self, cell: int) -> list[str]:
        """The labels of the zombie items cell ``cell`` left (not the process tree)."""
        if not self.active:
            return []
        rows = self.rows(skip=("process",))
        return [row["label"] for row in rows if row["cell"] == cell and row["zombie"] is not None]

    def _stop(self, scope: StopScope) -> list[ItemOutcome] | None:
        """Start every kind's stops, then wait for them together against the stop's deadline; then what must end
        after them (at shutdown: the kernel-wide helpers, which the others may still use while they stop)."""
        if not self.active or scope.kind in ("thread", "threads"):
            return None
        started = time.monotonic()
        pending: list[Pending] = []
        failures: list[tuple[str, str]] = []
        for kind in list(self.kinds):
            try:
                pending += kind.begin_stop(scope)
            except Exception as exc:
                log.warning("nbcoord: stopping the %s ledger failed", kind.name, exc_info=True)
                failures.append((kind.name, f"{type(exc).__name__}: {exc}"))
        wait_all(pending, started, scope.deadline)
        last: list[Pending] = []
        for kind in list(self.kinds):
            after = getattr(kind, "after_stop", None)
            if after is None:
                continue
            try:
                last += after(scope)
            except Exception as exc:
                log.warning("nbcoord: stopping the %s ledger failed", kind.name, exc_info=True)
                failures.append((kind.name, f"{type(exc).__name__}: {exc}"))
        wait_all(last, time.monotonic(), scope.deadline)
        outcomes = [item.outcome() for item in pending + last]
        # A kind that failed is an item still alive, with its error (raising would lose the other kinds' outcomes).
        outcomes += [
            ItemOutcome(
                id=name, kind=name, label=f"the {name}s", cell=None, stopped=False, reason=f"the stop failed: {why}"
            )
            for name, why in failures
        ]
        return outcomes

