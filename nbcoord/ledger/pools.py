"""Process pools in the ledger (S12): ``multiprocessing`` pools, ``concurrent.futures.ProcessPoolExecutor`` and
joblib's (loky's) executors, each with its cell, state and worker processes; the one stop ends them through their
own API first.

Each library is watched from the moment the user imports it (the post-import hook; nbcoord imports none of them):
the pool's ``__init__`` is wrapped on its class (restored exactly at unload), and a pool made while a cell runs,
or by a thread a cell started, is that cell's. Pools are held by weak reference. A pool's own threads (a
``multiprocessing`` pool's handlers, an executor's manager thread) get the pool as their owner in the registry.

How each is stopped, in a helper thread (see :class:`nbcoord.ledger.stopping.WorkerStop` for the signals that
follow when that leaves a worker alive):

- ``multiprocessing.Pool`` (and ``ThreadPool``): ``terminate()``;
- ``ProcessPoolExecutor``: ``shutdown(wait=False, cancel_futures=True)``: pending work is cancelled and idle
  workers leave; busy workers are then terminated through their ``Process`` objects;
- loky's executors (joblib's reusable executor, which keeps its workers on purpose): joblib's
  ``terminate(kill_workers=True)`` where it has one, else loky's ``shutdown(wait=True, kill_workers=True)``.
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

#: The modules watched, and the class in each whose instances are pools.
WATCHED = (
    ("multiprocessing.pool", "Pool", "multiprocessing"),
    ("concurrent.futures.process", "ProcessPoolExecutor", "futures"),
    ("joblib.externals.loky.process_executor", "ProcessPoolExecutor", "loky"),
    ("loky.process_executor", "ProcessPoolExecutor", "loky"),
)


@dataclass(eq=False)
class _Pool:
    """One pool a cell made."""

    ref: weakref.ref[Any]
    flavour: str  # "multiprocessing", "futures" or "loky"
    cell: CellInfo
    created_at: float
    id: str
    label: str
    stop_requested_at: float | None = None
    #: Threads of the pool already given it as their owner.
    owned: set[int] = field(default_factory=set)


class PoolLedger:
    """The pools kind: wrapped constructors, rows, roles of workers, stops."""

    name = "pool"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()  # guards _pools
        self._pools: dict[int, _Pool] = {}
        #: The wrapped constructors, restored exactly at unload.
        self._patches = ClassPatches()

    # ---------------------------------------------------------------------------------- install / undo
    def patch(self, module: ModuleType, class_name: str, flavour: str) -> None:
        """Wrap ``__init__`` of ``module.class_name`` (the post-import hook calls this)."""
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type) or "__init__" not in vars(cls):
            log.info("nbcoord: %s.%s not found: its pools are not in the ledger", module.__name__, class_name)
            return
        kind = self

        def wrap(original: Callable[..., None]) -> Callable[..., None]:
            def __init__(pool: Any, *args: Any, **kwargs: Any) -> None:
                original(pool, *args, **kwargs)
                if kind.ledger.active:
                    try:
                        kind.created(pool, flavour)
                    except Exception:
                        log.warning("nbcoord: could not register a pool", exc_info=True)

            return __init__

        self._patches.patch(cls, "__init__", wrap)

    def uninstall(self) -> None:
        self._patches.restore()
        with self._lock:
            self._pools.clear()

    # ------------------------------------------------------------------------------------------ pools
    def created(self, pool: Any, flavour: str) -> None:
        key = id(pool)
        with self._lock:
            known = self._pools.get(key)
            if known is not None and known.ref() is pool:
                return  # a subclass's __init__ calling its base's: one pool
        cell = self.ledger.cell_of_caller()
        if cell is None:
            return  # not made by a cell: the kernel's, or a library's at import
        entry = _Pool(weakref.ref(pool), flavour, cell, time.time(), self.ledger.issue("pool"), _label(pool, flavour))
        with self._lock:
            self._pools[key] = entry
        self._own_threads(entry, pool)

    def _own_threads(self, entry: _Pool, pool: Any) -> None:
        """Give the pool's threads the pool as their owner (once each)."""
        if entry.flavour == "multiprocessing":
            threads = internals.pool_threads(pool)
        else:
            threads = internals.executor_threads(pool) + internals.executor_feeder_threads(pool)
        for thread in threads:
            if id(thread) in entry.owned or thread.ident is None:
                continue
            entry.owned.add(id(thread))
            owner = Owner(
                kind="pool", label=f"{entry.label} ({entry.id})", ref=entry.ref, is_closed=_closed_check(entry.flavour)
            )
            self.ledger.registry.add_owner(thread, owner)

    def _live(self) -> list[tuple[_Pool, Any, dict[str, list[Any]]]]:
        """(entry, pool, its workers by state: running, exited) of pools still there; forgets the rest."""
        live: list[tuple[_Pool, Any, dict[str, list[Any]]]] = []
        with self._lock:
            entries = list(self._pools.items())
        gone: list[int] = []
        for key, entry in entries:
            pool = entry.ref()
            workers: dict[str, list[Any]] = {"running": [], "exited": [], "gone": []}
            for worker in _workers(pool, entry.flavour) if pool is not None else []:
                workers[worker_state(worker)].append(worker)
            if pool is None or (
                not workers["running"] and not workers["exited"] and _state(pool, entry.flavour) != "running"
            ):
                gone.append(key)  # collected, or closed or terminated with nothing left running
                continue
            live.append((entry, pool, workers))
        if gone:
            with self._lock:
                for key in gone:
                    self._pools.pop(key, None)
        return live

    def cells_in_use(self) -> set[int]:
        with self._lock:
            return {entry.cell.execution_count for entry in self._pools.values()}

    def tick(self) -> bool:
        live = self._live()
        for entry, pool, _alive in live:
            self._own_threads(entry, pool)  # an executor starts its manager thread at its first submit
        return bool(live)

    # ------------------------------------------------------------------------------------------- rows
    def rows(self) -> list[LedgerRow]:
        rows: list[LedgerRow] = []
        for entry, pool, workers in self._live():
            reasons = self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at)
            state = _state(pool, entry.flavour)
            pids = [pid for w in workers["running"] + workers["exited"] if (pid := worker_pid(w)) is not None]
            detail = f"{len(workers['running'])} worker(s) running"
            if workers["exited"]:
                detail += f", {len(workers['exited'])} exited and not reaped"
            if entry.flavour == "loky":
                detail += "; loky keeps idle workers for reuse"
            rows.append(
                LedgerRow(
                    id=entry.id,
                    kind="pool",
                    label=entry.label,
                    cell=entry.cell.execution_count,
                    state=state if entry.stop_requested_at is None else "stopping",
                    started_at=entry.created_at,
                    zombie=reasons[0]["reason"] if reasons else None,
                    zombie_reasons=reasons,
                    detail=detail,
                    pids=pids,
                )
            )
        return rows

    def worker_roles(self) -> dict[int, tuple[str, str, CellInfo | None]]:
        roles: dict[int, tuple[str, str, CellInfo | None]] = {}
        for entry, pool, _alive in self._live():
            workers = _workers(pool, entry.flavour)
            for index, worker in enumerate(workers, 1):
                pid = worker_pid(worker)
                if pid is not None:
                    role = f"{_short(entry.flavour)} worker {index} of {len(workers)}, {entry.id}"
                    roles[pid] = (role, entry.id, entry.cell)
        return roles

    # ------------------------------------------------------------------------------------------- stop
    def begin_stop(self, scope: StopScope) -> list[Pending]:
        pending: list[Pending] = []
        now = time.time()
        for entry, pool, _by_state in self._live():
            zombie = bool(self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at))
            if not self.ledger.selects(scope, entry.cell, zombie):
                continue
            if entry.stop_requested_at is None:
                entry.stop_requested_at = now
            item = ItemOutcome(
                id=entry.id, kind="pool", label=entry.label, cell=entry.cell.execution_count, stopped=False, reason=None
            )
            api_name, api = _stop_api(pool, entry.flavour)
            pending.append(WorkerStop(item, api_name, api, _workers(pool, entry.flavour)))
        return pending


def _closed_check(flavour: str) -> Callable[[object], bool]:
    def closed(pool: object) -> bool:
        return _terminated(pool, flavour)

    return closed


def _workers(pool: Any, flavour: str) -> list[Any]:
    if flavour == "multiprocessing":
        return internals.pool_workers(pool)
    return internals.executor_processes(pool)


def _terminated(pool: Any, flavour: str) -> bool:
    if flavour == "multiprocessing":
        return internals.pool_state(pool) == "TERMINATE"
    return bool(internals.executor_shut_down(pool))


def _state(pool: Any, flavour: str) -> str:
    if flavour == "multiprocessing":
        state = internals.pool_state(pool)
        return {"RUN": "running", "CLOSE": "closed", "TERMINATE": "terminated"}.get(state or "RUN", "running")
    return "shut down" if internals.executor_shut_down(pool) else "running"


def _short(flavour: str) -> str:
    return {"multiprocessing": "Pool", "futures": "ProcessPoolExecutor", "loky": "loky"}[flavour]


def _label(pool: Any, flavour: str) -> str:
    cls = type(pool)
    if flavour == "multiprocessing":
        what = "ThreadPool" if cls.__name__ == "ThreadPool" else "Pool"
        unit = "threads" if what == "ThreadPool" else "workers"
        return f"multiprocessing.{what}, {len(internals.pool_workers(pool))} {unit}"
    workers = internals.executor_max_workers(pool)
    if flavour == "futures":
        name = f"concurrent.futures.{cls.__name__}"
    elif internals.loky_reusable(cls):
        name = "joblib's reusable loky executor" if cls.__module__.startswith("joblib") else "loky reusable executor"
    else:
        name = f"loky {cls.__name__}"
    return f"{name}, {workers} workers" if workers is not None else name


def _stop_api(pool: Any, flavour: str) -> tuple[str, Callable[[], None]]:
    if flavour == "multiprocessing":
        return "terminate()", pool.terminate
    if flavour == "futures":
        return "shutdown(cancel_futures=True)", lambda: pool.shutdown(wait=False, cancel_futures=True)
    terminate = getattr(pool, "terminate", None)  # joblib's executor: also cleans its temporary folder
    if callable(terminate):
        return "terminate(kill_workers=True)", lambda: terminate(kill_workers=True)
    return "shutdown(kill_workers=True)", lambda: pool.shutdown(wait=True, kill_workers=True)


def watch(ledger: Ledger) -> Callable[[], None]:
    """Watch each pool library from when the user imports it; returns the undo."""
    kind = PoolLedger(ledger)
    state = {"added": False}
    removers: list[Callable[[], None]] = []

    def imported(module_name: str, class_name: str, flavour: str) -> Callable[[ModuleType], None]:
        def install(module: ModuleType) -> None:
            if not ledger.active:
                return
            kind.patch(module, class_name, flavour)
            if not state["added"]:
                state["added"] = True
                removers.append(ledger.add_kind(kind))

        return install

    hooks = [when_imported(name, imported(name, cls, flavour)) for name, cls, flavour in WATCHED]

    def undo() -> None:
        for remove in hooks:
            remove()
        for remove in removers:
            remove()
        kind.uninstall()

    return undo
