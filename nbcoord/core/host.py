"""The narrow contract between the wiring and the parts: what a part of nbcoord may use of the loaded extension.

Every part (output routing, the memory ledger, the ledger's kinds, TensorFlow, the panel, the control route, the
magics) receives one :class:`Host` and nothing else of the extension: the registry, the config, the monitor, the
snapshot builder (to add a source), the stop mechanism (to add a stopper), the checked front door of the one stop,
and registration points for cell listeners, own threads' stoppers, spared child processes and cells still in use.
Each ``add_*`` returns its remover; :meth:`Host.add_undo` keeps what the extension's unload undoes.

The wiring (:mod:`nbcoord._wiring`) builds the Host, installs the parts and unloads them.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from nbcoord.core import checks
from nbcoord.core.callbacks import Callbacks
from nbcoord.core.config import NBCoord
from nbcoord.core.internals import calling_frame, current_frames
from nbcoord.core.monitor import Monitor
from nbcoord.core.records import CellInfo
from nbcoord.core.registry import Registry
from nbcoord.core.schema import WaitsReport
from nbcoord.core.snapshot import Snapshot, SnapshotBuilder
from nbcoord.core.stop import ChildFinder, ScopeKind, StopMechanism, StopReport, StopScope
from nbcoord.core.threads import kernel_thread_classes
from nbcoord.core.waits import analyse

log = logging.getLogger("nbcoord")

#: How IPython's compiler names a cell's code in tracebacks.
_CELL_NAME = re.compile(r"In\[(\d+)\]")

CellListener = Callable[[str, CellInfo], None]


class Host:
    """What one loaded nbcoord offers its parts (see the module docstring)."""

    def __init__(self, shell: Any, config: NBCoord) -> None:
        self.shell = shell
        self.config = config
        self.registry = Registry(keep_cells=self.cells_in_use, kernel_classes=kernel_thread_classes)
        self.monitor = Monitor(lambda: self.config.monitor_interval)
        self.snapshots = SnapshotBuilder(self.registry, lambda: self.config.grace_period, self.cell_of_file)
        self.stopper = StopMechanism(self.registry, self._children_in_scope, self.cell_of_file)
        self.stopper.on_report = self._remember_stop
        #: Routes that could not be installed here, with why (the panel's fast route, the server's control route).
        self.degraded_routes: dict[str, str] = {}
        #: Undo steps of what the parts installed, run newest first at unload.
        self.undo: list[Callable[[], None]] = []
        self._ids = itertools.count(1)
        self._cell_listeners: Callbacks[CellListener] = Callbacks()
        self._own_stoppers: Callbacks[Callable[[], None]] = Callbacks()
        # on_stop callbacks with the cell that registered them.
        self._user_stoppers: Callbacks[Callable[[], None]] = Callbacks()
        self._user_stopper_cells: dict[str, int | None] = {}
        # Child pids no stop signals (kernel-wide helpers), cells something outside the registry refers to, and
        # what else a cell left running (the ledger's items): sources the parts register.
        self._spared_children: Callbacks[Callable[[], set[int]]] = Callbacks()
        self._cell_users: Callbacks[Callable[[], set[int]]] = Callbacks()
        self._leftovers: Callbacks[Callable[[int], list[str]]] = Callbacks()
        #: Who finds a stop's child processes (the resources part sets it).
        self.find_children: ChildFinder | None = None
        #: Whether the kernel's shutdown has begun (the shutdown part sets it).
        self.shutdown_ran: Callable[[], bool] = lambda: False

    # ----------------------------------------------------------------------------------- registration
    def add_undo(self, undo: Callable[[], None]) -> None:
        """Remember something to undo at unload (newest first)."""
        self.undo.append(undo)

    def add_cell_listener(self, name: str, listener: CellListener) -> Callable[[], None]:
        """Call ``listener("started" | "finished", cell)`` around every cell (on the main thread: keep it cheap);
        returns the remover. A listener that fails is logged and never breaks the cell."""
        return self._cell_listeners.add(name, listener)

    def tell_cell_listeners(self, event: str, cell: CellInfo) -> None:
        """Run the cell listeners for ``event`` (and wake the monitor: a cell beginning or ending is an event)."""
        self.monitor.wake()
        for name, listener in self._cell_listeners.items():
            try:
                listener(event, cell)
            except Exception:
                log.warning("nbcoord: cell listener %r failed", name, exc_info=True)

    def add_own_stopper(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Register how to stop one of nbcoord's own threads (the panel's sender); the shutdown runs it first."""
        return self._own_stoppers.add(f"own-{next(self._ids)}", stop)

    def own_stoppers(self) -> list[Callable[[], None]]:
        """The registered stoppers of nbcoord's own threads."""
        return [stop for _, stop in self._own_stoppers.items()]

    def add_spared_children(self, name: str, pids: Callable[[], set[int]]) -> Callable[[], None]:
        """Register a source of child pids that no stop signals: the kernel's own helpers, which some cell happened
        to start (a resource tracker ignores SIGTERM, and leaves by itself when the kernel does)."""
        return self._spared_children.add(name, pids)

    def spared_pids(self) -> set[int]:
        """Every registered source's spared child pids."""
        return self._union(self._spared_children, "spared-children")

    def add_cells_in_use(self, name: str, cells: Callable[[], set[int]]) -> Callable[[], None]:
        """Register a source of cells that must stay known while it refers to them (the ledger's live items: their
        zombie rules read the cell's outcome)."""
        return self._cell_users.add(name, cells)

    def add_leftovers(self, name: str, labels: Callable[[int], list[str]]) -> Callable[[], None]:
        """Register a source of what else a cell left running (besides threads), named for the one-line notice
        after an interrupted or failed cell."""
        return self._leftovers.add(name, labels)

    def leftovers(self, execution_count: int) -> list[str]:
        """What the registered sources say cell ``execution_count`` left running."""
        labels: list[str] = []
        for name, source in self._leftovers.items():
            try:
                labels.extend(source(execution_count))
            except Exception:
                log.warning("nbcoord: leftovers source %r failed", name, exc_info=True)
        return labels

    def cells_in_use(self) -> set[int]:
        """Cells that something outside the registry refers to: kept when old cells are forgotten."""
        used = {cell for cell in self._user_stopper_cells.values() if cell is not None}
        last = self.snapshots.last_stop
        if last:
            used.update(row["cell"] for row in [*last["stopped"], *last["alive"]] if row.get("cell") is not None)
            if last.get("cell") is not None:
                used.add(last["cell"])
        return used | self._union(self._cell_users, "cells-in-use")

    @staticmethod
    def _union(sources: Callbacks[Callable[[], set[int]]], what: str) -> set[int]:
        found: set[int] = set()
        for name, source in sources.items():
            try:
                found |= source()
            except Exception:
                log.warning("nbcoord: %s source %r failed", what, name, exc_info=True)
        return found

    # ------------------------------------------------------------------------------------------ cells
    def cell_of_file(self, filename: str) -> int | None:
        """The execution count of the cell whose code ``filename`` holds (IPython compiles each cell from a file of
        its own), through the shell compiler's public ``format_code_name``; None for any other file."""
        format_code_name = getattr(getattr(self.shell, "compile", None), "format_code_name", None)
        if format_code_name is None:
            return None
        try:
            named = format_code_name(filename)
        except Exception:  # a compiler of another shell: locations stay file names
            return None
        if not named:
            return None
        match = _CELL_NAME.fullmatch(str(named[1]))
        return int(match.group(1)) if match else None

    def cell_of_caller(self) -> int | None:
        """The cell the calling code belongs to: the running cell on the main thread, the cell that started the
        calling thread elsewhere (for integrations attributing what they see created)."""
        me = threading.current_thread()
        if me is threading.main_thread():
            current = self.registry.current_cell()
            return current.execution_count if current is not None else None
        record = self.registry.for_thread(me)
        return record.cell.execution_count if record is not None and record.cell is not None else None

    def cell_failed(self, execution_count: int) -> bool:
        """Whether cell ``execution_count`` was interrupted or failed."""
        cell = self.registry.cell(execution_count)
        return cell is not None and cell.outcome in ("error", "interrupted")

    # ------------------------------------------------------------------------------ the one stop's door
    def stop(
        self,
        kind: ScopeKind = "all",
        *,
        grace: float | None = None,
        force: bool = False,
        cell: int | None = None,
        tid: str | None = None,
    ) -> StopReport:
        """The one stop for the magic, the API, the panel and the server (the shutdown calls the mechanism with its
        budget).

        Raises
        ------
        ValueError
            ``tid`` names no live thread, or one that no cell started (the kernel's own, or nbcoord's); ``cell``
            names no known cell; ``grace`` is negative, not finite or over a day.
        TypeError
            ``grace`` is not a number, ``force`` not a bool.
        """
        grace = self.config.grace_period if grace is None else checks.finite_number("grace", grace)
        checks.flag("force", force)
        if kind == "cell":
            self.check_cell(cell)
        if kind == "thread":
            self.check_stoppable(tid)
        return self.stopper.stop(kind, grace=grace, force=force, cell=cell, tid=tid)

    def check_cell(self, cell: int | None) -> None:
        """Raise ValueError unless nbcoord knows cell ``cell``."""
        if cell is None or self.registry.cell(cell) is None:
            raise ValueError(
                f"No cell [{cell}] is known: nbcoord keeps the cells run since it was loaded that still have "
                "something running, and the most recent ones."
            )

    def check_stoppable(self, tid: str | None) -> None:
        """Raise ValueError unless ``tid`` is a live thread of the user's (one a cell started)."""
        record = self.registry.get(tid) if tid else None
        if record is None or not record.is_alive():
            raise ValueError(f"No live thread has the id {tid!r}; %nbcoord threads lists them.")
        if not record.user:
            owner = "nbcoord's own" if record.internal else "the kernel's"
            raise ValueError(
                f"Thread {tid} ({record.name!r}) is {owner}, not started by a cell: nbcoord stops only the threads "
                "that cells started (and the threads those started)."
            )

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register a user callback, run by stops of everything and of the cell that registered it (and of the
        zombies, when that cell was interrupted or failed); never by a stop of one thread.

        Raises
        ------
        TypeError
            ``callback`` cannot be called.
        """
        checks.callback("on_stop", callback)
        current = self.registry.current_cell()
        name = f"on_stop-{next(self._ids)}"
        self._user_stopper_cells[name] = current.execution_count if current is not None else None
        remove = self._user_stoppers.add(name, callback)

        def remove_both() -> None:
            remove()
            self._user_stopper_cells.pop(name, None)

        return remove_both

    def run_user_stoppers(self, scope: StopScope) -> None:
        """The stopper that runs the ``on_stop`` callbacks a stop's scope selects (installed by the wiring)."""
        if scope.kind == "thread":
            return
        failures: list[str] = []
        for name, callback in self._user_stoppers.items():
            cell = self._user_stopper_cells.get(name)
            chosen = (
                scope.kind == "all"
                or (scope.kind == "cell" and cell is not None and cell == scope.cell)
                or (scope.kind == "zombies" and cell is not None and self.cell_failed(cell))
            )
            if not chosen:
                continue
            try:
                callback()
            except Exception as exc:
                log.warning("nbcoord: on_stop callback %r failed", callback, exc_info=True)
                failures.append(f"{callback!r}: {type(exc).__name__}: {exc}")
        if failures:
            raise RuntimeError("; ".join(failures))

    def should_stop(self) -> bool:
        """Whether a stop was requested for the calling thread."""
        return self.registry.stop_requested_for_current()

    def wait_for_stop(self, timeout: float | None) -> bool:
        """Block until a stop is requested for the calling thread, or the timeout passes.

        Raises
        ------
        RuntimeError
            No timeout, in a thread that no stop selects (the main thread, one no cell started): it would wait
            forever.
        TypeError, ValueError
            ``timeout`` is not a finite number of seconds >= 0.
        """
        timeout = checks.optional_seconds("timeout", timeout)
        me = threading.current_thread()
        record = self.registry.for_thread(me)
        if record is None or not record.user or me is threading.main_thread():
            if timeout is None:
                raise RuntimeError(
                    f"wait_for_stop() without a timeout would wait forever in thread {me.name!r}: no stop selects "
                    "it (only threads that cells started are stopped). Pass a timeout."
                )
            threading.Event().wait(timeout)
            return False
        event = self.registry.stop_event_for_current()
        return event is not None and event.wait(timeout)

    def snapshot(self, *, stacks: bool = False, waits: bool = False) -> Snapshot:
        """One snapshot of the kernel; ``waits``: with what each blocked thread waits on (:meth:`waits`)."""
        snapshot = self.snapshots.build(stacks=stacks)
        if waits:
            snapshot["waits"] = self.waits()
        return snapshot

    def waits(self) -> WaitsReport:
        """What each blocked thread of the process waits on, who holds it, and the deadlocks among them
        (:func:`nbcoord.core.waits.analyse`), with stacks whose cells read "cell [3], line 2 in f"."""
        frames = current_frames()
        own = calling_frame(0)  # the calling thread waits on nothing, but may hold what another waits for
        if own is not None:
            frames[threading.get_ident()] = own
        del own
        try:
            return analyse(frames, cell_of=self.cell_of_file)
        finally:
            frames.clear()  # this frame is in the dict this frame holds: a cycle until cleared

    def _remember_stop(self, report: StopReport) -> None:
        self.snapshots.last_stop = dict(report)

    def _children_in_scope(self, kind: ScopeKind, cell: int | None) -> Sequence[psutil.Process]:
        return self.find_children(kind, cell) if self.find_children is not None else []
