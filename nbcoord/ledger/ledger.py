"""The ledger: what cells leave running besides threads, one kind per module, behind one source and one stopper.

Kinds (S11, S12):

- :mod:`.tasks`: asyncio tasks, on the kernel's event loop and on loops that cells' threads run (installed at
  load: the kernel has imported asyncio already);
- :mod:`.pools`: ``multiprocessing`` pools, ``concurrent.futures.ProcessPoolExecutor`` and joblib's (loky's)
  executors, each installed when the user imports that library;
- :mod:`.dataloader`: PyTorch ``DataLoader`` iterators with worker processes, installed when the user imports
  ``torch``;
- :mod:`.processes`: every child process, the whole tree, with the role a pool or loader gives it.

:func:`watch` makes one :class:`Ledger` for the extension. It registers one snapshot source (the ``ledger``
section), one stopper, one monitor task, one cell listener and one fork-child action, and asks each kind for its
rows and its stops: a kind plugs into the ledger, the ledger into the extension's extension points, and the stop
and the snapshot never import a library. Nothing of a library is imported here: each kind installs from the
post-import hook (:func:`nbcoord.core.imports.when_imported`).

The stopper works in two phases, so that kinds stop in parallel within the one deadline: every kind first starts
its stops (tasks are cancelled on their loops, a pool's own ``terminate()`` runs in a helper thread), then the
ledger waits for all of them together, and escalates to signals where a library's own API has not ended a
worker by its share of the time. What is still alive at the deadline is in the report, with why.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import psutil

from nbcoord.core.fork import on_fork_child
from nbcoord.core.host import Host
from nbcoord.core.registry import CellInfo
from nbcoord.core.snapshot import LedgerRow, ZombieReasonRow
from nbcoord.core.stop import ItemOutcome, StopScope
from nbcoord.resources.probes import ResourceProbe

log = logging.getLogger("nbcoord")

#: How often the stopper looks at what it waits for.
POLL_S = 0.002
#: Row ids a kind issues are "<prefix>-<n>", n counting from 1 for each prefix.
_PREFIXES = ("task", "pool", "loader", "process")


class Pending(Protocol):
    """One item being stopped: the ledger polls it until it is finished or the deadline passes."""

    def poll(self, now: float, started: float, deadline: float) -> bool:
        """Advance (escalate when its time comes); True once there is nothing more to wait for."""

    def outcome(self) -> ItemOutcome:
        """What happened to it, for the stop's report."""


class Kind(Protocol):
    """One kind of item in the ledger."""

    name: str

    def rows(self) -> list[LedgerRow]:
        """The items alive now, as rows."""

    def begin_stop(self, scope: StopScope) -> list[Pending]:
        """Start stopping the items in scope (quickly: the waiting is the ledger's); returns what to wait for."""

    def tick(self) -> None:
        """The monitor's periodic work (forget what ended)."""

    def uninstall(self) -> None:
        """Undo exactly what the kind installed."""


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
    def install(self) -> None:
        from nbcoord.ledger import dataloader, pools, processes, tasks

        ext = self.host
        self.active = True
        self._undo.append(on_fork_child(self._forget_in_child))
        self._undo.append(ext.add_cell_listener("ledger", self._cell_event))
        self._undo.append(ext.snapshots.add_source("ledger", self._source))
        self._undo.append(ext.stopper.add_stopper("ledger", self._stop))
        self._undo.append(ext.monitor.add_task("ledger", self._tick))
        # The cells of live items stay known (their zombie rules need them); the kernel-wide helper processes are
        # no cell's (the stop's signals leave them); the notice after a failed cell names the items it left.
        self._undo.append(ext.add_cells_in_use("ledger", self.cells_in_use))
        self._undo.append(ext.add_spared_children("ledger", processes.spared_pids))
        self._undo.append(ext.add_leftovers("ledger", self.leftovers))
        # Order matters for rows only: processes last, so that the roles pools and loaders give are known.
        for watch in (tasks.watch, pools.watch, dataloader.watch, processes.watch):
            self._undo.append(watch(self))

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

    def _tick(self) -> None:
        if not self.active:
            return
        for kind in list(self.kinds):
            try:
                kind.tick()
            except Exception:
                log.warning("nbcoord: the %s ledger's monitor task failed", kind.name, exc_info=True)

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


class WorkerStop:
    """Stopping something with worker processes: its library's own API first, in a helper thread (it may block or
    join), then signals to the workers still alive, each through its ``multiprocessing`` object (so that its
    library still learns its exit status: nbcoord never reaps another library's child behind its back).

    SIGTERM goes to the workers still alive once the library's call returned and they had ``SETTLE_S`` to exit,
    or at ``TERM_AT`` of the stop's time, whichever is first; SIGKILL at ``KILL_AT``. ``before_signals`` runs once,
    just before the first signal (PyTorch must forget its workers first, or its SIGCHLD handler raises in the
    main thread).
    """

    SETTLE_S = 0.1
    TERM_AT = 0.4
    KILL_AT = 0.7

    def __init__(
        self,
        item: ItemOutcome,
        api_name: str,
        api: Callable[[], None] | None,
        workers: Sequence[Any],
        before_signals: Callable[[], None] | None = None,
    ) -> None:
        self.item = item
        self.api_name = api_name
        self.workers = list(workers)
        self.before_signals = before_signals
        self.began = time.monotonic()
        self.api_took: float | None = None
        self.api_error: str | None = None
        self.signalled: dict[str, list[int]] = {"SIGTERM": [], "SIGKILL": []}
        self._done = threading.Event()
        self._has_api = api is not None
        if api is None:
            self.api_took = 0.0  # nothing to wait for: signals once the workers had SETTLE_S
            self._done.set()
        else:
            thread = threading.Thread(target=self._call, args=(api,), name=f"nbcoord-stop-{item['id']}", daemon=True)
            thread.start()

    def _call(self, api: Callable[[], None]) -> None:
        try:
            api()
        except Exception as exc:
            log.warning("nbcoord: %s of %s failed", self.api_name, self.item["label"], exc_info=True)
            self.api_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.api_took = time.monotonic() - self.began
            self._done.set()

    def alive(self) -> list[Any]:
        """Workers still running (asked through their objects: an exited one is reaped, its status kept)."""
        return [w for w in self.workers if worker_alive(w)]

    def poll(self, now: float, started: float, deadline: float) -> bool:
        alive = self.alive()
        done = self._done.is_set()
        if done and not alive:
            return True
        window = max(0.0, deadline - started)
        settled = done and self.api_took is not None and now - self.began >= self.api_took + self.SETTLE_S
        if alive and not self.signalled["SIGTERM"] and (settled or now >= started + window * self.TERM_AT):
            self._signal(alive, "SIGTERM")
        elif alive and not self.signalled["SIGKILL"] and now >= started + window * self.KILL_AT:
            self._signal(alive, "SIGKILL")
        return False

    def _signal(self, workers: list[Any], name: str) -> None:
        if self.before_signals is not None:
            before, self.before_signals = self.before_signals, None
            try:
                before()
            except Exception:
                log.warning("nbcoord: preparing to signal the workers of %s failed", self.item["label"], exc_info=True)
        for worker in workers:
            try:
                worker.terminate() if name == "SIGTERM" else worker.kill()
                self.signalled[name].append(int(worker.pid))
            except Exception:  # ended meanwhile, or not ours to signal
                log.debug("nbcoord: could not signal a worker of %s", self.item["label"], exc_info=True)
        for worker in workers:
            join = getattr(worker, "join", None)
            if join is not None:
                try:
                    join(0)  # reaps it through its own object when it has exited
                except Exception:
                    log.debug("nbcoord: could not reap a worker of %s", self.item["label"], exc_info=True)

    def outcome(self) -> ItemOutcome:
        alive = self.alive()
        words: list[str] = []
        if not self._has_api:
            pass
        elif self.api_error is not None:
            words.append(f"{self.api_name} failed: {self.api_error}")
        elif self.api_took is not None:
            words.append(f"{self.api_name} took {self.api_took * 1000:.0f} ms")
        else:
            words.append(f"{self.api_name} had not returned")
        for name, pids in self.signalled.items():
            if pids:
                words.append(f"{len(pids)} worker(s) got {name}")
        if alive:
            listed = ", ".join(str(getattr(w, "pid", "?")) for w in alive)
            words.append(f"still alive: worker(s) {listed}")
        return ItemOutcome(
            id=self.item["id"],
            kind=self.item["kind"],
            label=self.item["label"],
            cell=self.item["cell"],
            stopped=not alive and self._done.is_set(),
            reason="; ".join(words),
        )


def worker_alive(worker: Any) -> bool:
    """Whether a worker (a ``multiprocessing`` process, or a ThreadPool's thread) still runs, asked through its
    own object (which reaps an exited child and keeps its exit status)."""
    try:
        return bool(worker.is_alive())
    except Exception:  # not started, or not a child of this process
        return False


def worker_state(worker: Any) -> str:
    """``"running"``, ``"exited"`` (a process that exited and was not reaped yet) or ``"gone"``, read without reaping
    (a view must not change what the library will find)."""
    if isinstance(worker, threading.Thread):  # a ThreadPool's worker
        return "running" if worker.is_alive() else "gone"
    pid = worker_pid(worker)
    if pid is None:
        return "gone"
    try:
        status = psutil.Process(pid).status()
    except psutil.ZombieProcess:
        return "exited"
    except psutil.Error:
        return "gone"
    return "exited" if status == psutil.STATUS_ZOMBIE else "running"


def worker_pid(worker: Any) -> int | None:
    pid = getattr(worker, "pid", None)
    return pid if isinstance(pid, int) else None


def wait_all(pending: Sequence[Pending], started: float, deadline: float) -> None:
    """Poll every item until each is finished or the deadline passes (one last poll at the deadline)."""
    waiting = list(pending)
    while waiting:
        now = time.monotonic()
        waiting = [item for item in waiting if not _poll(item, now, started, deadline)]
        if not waiting or now >= deadline:
            return
        time.sleep(min(POLL_S, max(0.0, deadline - now)))


def _poll(item: Pending, now: float, started: float, deadline: float) -> bool:
    try:
        return item.poll(now, started, deadline)
    except Exception:
        log.warning("nbcoord: waiting for %r failed", item, exc_info=True)
        return True


#: The ledger of the loaded extension (one per process), for tests, the bench and debugging.
_current: Ledger | None = None


def current() -> Ledger | None:
    """The ledger of the loaded extension, if any."""
    return _current


def watch(host: Host, probe: ResourceProbe) -> Callable[[], None]:
    """Install the ledger for ``host``; returns the undo."""
    global _current
    ledger = Ledger(host, probe)
    try:
        ledger.install()
    except BaseException:
        ledger.uninstall()
        raise
    _current = ledger

    def undo() -> None:
        global _current
        ledger.uninstall()
        if _current is ledger:
            _current = None

    return undo
