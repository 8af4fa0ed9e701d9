"""PyTorch DataLoader iterators in the ledger (S12): an iterator with worker processes (``num_workers > 0``) is
listed with its cell, its workers and whether they persist; the one stop shuts them down the way PyTorch does.

Installed when the user imports PyTorch (the post-import hook on ``torch.utils.data.dataloader``, which
``import torch`` imports); nbcoord never imports it. ``DataLoader.__iter__`` is wrapped on the class (restored
exactly at unload): the iterator it returns, if it has workers, is registered once (with ``persistent_workers``
the same iterator comes back every epoch) with the cell that asked for it, by weak reference: PyTorch shuts the
workers down when the iterator is collected, and nbcoord must not keep it alive. Its pin-memory thread, where it
has one (only with an accelerator), gets the iterator as its owner.

Why a notebook leaks them: an interrupted or failed cell's traceback keeps its frames, and so the iterator a
``for`` loop was reading, alive (and ``persistent_workers`` keeps one set per DataLoader made, one per re-run).

Stop: PyTorch's own shutdown of the iterator (``_shutdown_workers``: the pin-memory thread first, then each
worker told to exit and joined), in a helper thread; a worker still busy in the dataset's code is then terminated
through its ``multiprocessing`` object, after being taken out of PyTorch's SIGCHLD check (which would otherwise
raise in the main thread).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from nbcoord.core.imports import when_imported
from nbcoord.core.patches import ClassPatches
from nbcoord.core.records import CellInfo, Owner
from nbcoord.core.snapshot import LedgerRow
from nbcoord.core.stop import ItemOutcome, StopScope
from nbcoord.ledger import internals
from nbcoord.ledger.base import Ledger
from nbcoord.ledger.stopping import Pending, WorkerStop, worker_pid, worker_state

log = logging.getLogger("nbcoord")

MODULE = "torch.utils.data.dataloader"


@dataclass(eq=False)
class _Iterator:
    ref: weakref.ref[Any]
    cell: CellInfo
    created_at: float
    id: str
    label: str
    persistent: bool
    stop_requested_at: float | None = None
    owned: set[int] = field(default_factory=set)


class LoaderLedger:
    """The DataLoader kind."""

    name = "loader"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()  # guards _iterators
        self._iterators: dict[int, _Iterator] = {}
        #: ``DataLoader.__iter__`` wrapped, restored exactly at unload.
        self._patches = ClassPatches()
        self._iterator_class: type | None = None

    def install(self, module: ModuleType) -> bool:
        """Wrap ``DataLoader.__iter__``; False where this PyTorch has no iterator class nbcoord knows."""
        loader_class = getattr(module, "DataLoader", None)
        self._iterator_class = internals.loader_iterator_class(module)
        if not isinstance(loader_class, type) or "__iter__" not in vars(loader_class) or self._iterator_class is None:
            return False
        kind = self

        def wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
            def __iter__(loader: Any) -> Any:
                iterator = original(loader)
                if kind.ledger.active and isinstance(iterator, kind._iterator_class or ()):
                    try:
                        kind.seen(iterator, loader)
                    except Exception:
                        log.warning("nbcoord: could not register a DataLoader iterator", exc_info=True)
                return iterator

            return __iter__

        self._patches.patch(loader_class, "__iter__", wrap)
        return True

    def uninstall(self) -> None:
        self._patches.restore()
        with self._lock:
            self._iterators.clear()

    # --------------------------------------------------------------------------------------- iterators
    def seen(self, iterator: Any, loader: Any) -> None:
        key = id(iterator)
        with self._lock:
            known = self._iterators.get(key)
            if known is not None and known.ref() is iterator:
                return  # persistent workers: the same iterator, another epoch
        cell = self.ledger.cell_of_caller()
        if cell is None:
            return
        count, persistent = internals.loader_settings(iterator)
        dataset = type(getattr(loader, "dataset", None)).__name__
        label = f"DataLoader iterator over {dataset}, {count} workers" + (" (persistent)" if persistent else "")
        entry = _Iterator(weakref.ref(iterator), cell, time.time(), self.ledger.issue("loader"), label, persistent)
        with self._lock:
            self._iterators[key] = entry
        self._own_thread(entry, iterator)

    def _own_thread(self, entry: _Iterator, iterator: Any) -> None:
        """The pin-memory thread and the queues' feeder threads get the iterator as their owner."""
        pin = internals.loader_pin_memory_thread(iterator)
        feeders = internals.loader_feeder_threads(iterator)
        for thread in ([pin] if pin is not None else []) + feeders:
            if id(thread) in entry.owned or thread.ident is None:
                continue
            entry.owned.add(id(thread))
            owner = Owner(
                kind="loader", label=f"{entry.label} ({entry.id})", ref=entry.ref, is_closed=internals.loader_shut_down
            )
            self.ledger.registry.add_owner(thread, owner)

    def _live(self) -> list[tuple[_Iterator, Any, dict[str, list[Any]]]]:
        """Iterators not shut down yet (their workers may have exited), and shut down ones whose workers still run."""
        live: list[tuple[_Iterator, Any, dict[str, list[Any]]]] = []
        with self._lock:
            entries = list(self._iterators.items())
        gone: list[int] = []
        for key, entry in entries:
            iterator = entry.ref()
            workers: dict[str, list[Any]] = {"running": [], "exited": [], "gone": []}
            for worker in internals.loader_workers(iterator) if iterator is not None else []:
                workers[worker_state(worker)].append(worker)
            if iterator is None or (internals.loader_shut_down(iterator) and not workers["running"]):
                gone.append(key)
                continue
            live.append((entry, iterator, workers))
        if gone:
            with self._lock:
                for key in gone:
                    self._iterators.pop(key, None)
        return live

    def cells_in_use(self) -> set[int]:
        with self._lock:
            return {entry.cell.execution_count for entry in self._iterators.values()}

    def tick(self) -> bool:
        live = self._live()
        for entry, iterator, _workers in live:
            self._own_thread(entry, iterator)  # feeder threads start with the first put
        return bool(live)

    def rows(self) -> list[LedgerRow]:
        rows: list[LedgerRow] = []
        for entry, iterator, workers in self._live():
            reasons = self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at)
            shut_down = internals.loader_shut_down(iterator)
            if entry.stop_requested_at is not None:
                state = "stopping"
            elif shut_down:
                state = "shut down"
            else:
                state = "running" if workers["running"] else "workers exited"
            detail = f"{len(workers['running'])} worker(s) running"
            if workers["exited"]:
                detail += f", {len(workers['exited'])} exited and not reaped"
            if internals.loader_pin_memory_thread(iterator) is not None:
                detail += "; a pin-memory thread"
            rows.append(
                LedgerRow(
                    id=entry.id,
                    kind="loader",
                    label=entry.label,
                    cell=entry.cell.execution_count,
                    state=state,
                    started_at=entry.created_at,
                    zombie=reasons[0]["reason"] if reasons else None,
                    zombie_reasons=reasons,
                    detail=detail,
                    pids=[pid for w in workers["running"] + workers["exited"] if (pid := worker_pid(w)) is not None],
                )
            )
        return rows

    def worker_roles(self) -> dict[int, tuple[str, str, CellInfo | None]]:
        roles: dict[int, tuple[str, str, CellInfo | None]] = {}
        for entry, iterator, _alive in self._live():
            workers = internals.loader_workers(iterator)
            for index, worker in enumerate(workers):
                pid = worker_pid(worker)
                if pid is not None:
                    roles[pid] = (
                        f"DataLoader worker {index} of {len(workers)} of cell [{entry.cell.execution_count}], "
                        f"{entry.id}",
                        entry.id,
                        entry.cell,
                    )
        return roles

    def begin_stop(self, scope: StopScope) -> list[Pending]:
        pending: list[Pending] = []
        now = time.time()
        for entry, iterator, _workers in self._live():
            zombie = bool(self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at))
            if not self.ledger.selects(scope, entry.cell, zombie):
                continue
            if entry.stop_requested_at is None:
                entry.stop_requested_at = now
            item = ItemOutcome(
                id=entry.id, kind="loader", label=entry.label, cell=entry.cell.execution_count, stopped=False,
                reason=None,
            )
            shutdown = internals.loader_shutdown_method(iterator)

            def forget(it: Any = iterator) -> None:
                internals.loader_forget_worker_pids(it)

            pending.append(
                WorkerStop(
                    item,
                    "PyTorch's worker shutdown",
                    shutdown,
                    internals.loader_workers(iterator),
                    before_signals=forget,
                )
            )
        return pending


def watch(ledger: Ledger) -> Callable[[], None]:
    """Watch PyTorch's DataLoader from when the user imports it; returns the undo."""
    kind = LoaderLedger(ledger)
    removers: list[Callable[[], None]] = []

    def install(module: ModuleType) -> None:
        if ledger.active and kind.install(module):
            removers.append(ledger.add_kind(kind))

    remove_hook = when_imported(MODULE, install)

    def undo() -> None:
        remove_hook()
        for remove in removers:
            remove()
        kind.uninstall()

    return undo
