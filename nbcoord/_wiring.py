"""The running extension: wires the registry, the hooks, the stop and the views to one IPython shell.

``load_ipython_extension`` creates one :class:`Extension` and calls :meth:`Extension.install`;
``unload_ipython_extension`` calls :meth:`Extension.uninstall`, which removes exactly what install added.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from nbcoord.core import checks as _checks
from nbcoord.core import fork as _fork
from nbcoord.core import log as _log
from nbcoord.core.callbacks import Callbacks
from nbcoord.core.config import NBCoord
from nbcoord.core.internals import abandon_thread, exit_now, running_cell
from nbcoord.core.registry import CellInfo, CellOutcome, Registry
from nbcoord.core.snapshot import Snapshot, SnapshotBuilder
from nbcoord.core.stop import ScopeKind, StopMechanism, StopReport, StopScope, ThreadStopped
from nbcoord.core.text import shown
from nbcoord.core.threads import INTERNAL_PREFIX, Monitor, ThreadHooks, kernel_thread_classes
from nbcoord.kernel import control as _control
from nbcoord.kernel import output as _output
from nbcoord.kernel.shutdown import ShutdownHooks
from nbcoord.ledger.ledger import current as current_ledger
from nbcoord.ledger.ledger import watch as watch_ledger
from nbcoord.resources import memory as _memory
from nbcoord.resources.probes import CellWindow, ResourceProbe, Resources, thread_cpu_seconds
from nbcoord.resources.reclaim import ReclaimReport, reclaim
from nbcoord.tensorflow.integration import watch as watch_tensorflow

log = logging.getLogger("nbcoord")

#: How IPython's compiler names a cell's code in tracebacks.
_CELL_NAME = re.compile(r"In\[(\d+)\]")
#: Threads whose CPU time is read per monitor tick (about 18 us each): bounds the monitor's cost.
CPU_SAMPLES_PER_TICK = 64
#: At shutdown, how long daemon threads are waited for: the interpreter itself would not wait for them at all,
#: so only those about to finish (a record being written) get this long.
SHUTDOWN_DAEMON_GRACE_S = 0.1


def _ipython_major() -> int:
    import IPython

    return int(IPython.version_info[0])


def cell_outcome(result: Any) -> tuple[CellOutcome, str | None]:
    """ok, error or interrupted, from IPython's ExecutionResult."""
    error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    if error is None:
        return "ok", None
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt"
    return "error", f"{type(error).__name__}: {error}"[:300]


class Extension:
    """Everything one loaded nbcoord holds, and the wiring between the parts."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.config = NBCoord(parent=shell)
        self.registry = Registry(keep_cells=self._cells_in_use, kernel_classes=kernel_thread_classes)
        self.monitor = Monitor(lambda: self.config.monitor_interval)
        self.hooks = ThreadHooks(self.registry, ignore_exception=lambda exc: isinstance(exc, ThreadStopped))
        self.snapshots = SnapshotBuilder(self.registry, lambda: self.config.grace_period, self.cell_of_file)
        self.stopper = StopMechanism(self.registry, self._children_in_scope, self.cell_of_file)
        self.stopper.on_report = self._remember_stop
        self.shutdown = ShutdownHooks(
            self._shutdown_stop,
            wait_limit=lambda: self.config.shutdown_budget + 0.5,
            at_exit=self._leave_unstoppable,
        )
        self.probe = ResourceProbe()
        #: Routes that could not be installed here, with why (the panel's fast route, the server's control route).
        self.degraded_routes: dict[str, str] = {}
        #: Non-daemon threads that would not stop at shutdown and that the interpreter could not be told to leave.
        self._unjoinable: list[threading.Thread] = []
        # on_stop callbacks with the cell that registered them, and nbcoord's own threads' stoppers.
        self._user_stoppers: Callbacks[Callable[[], None]] = Callbacks()
        self._user_stopper_cells: dict[str, int | None] = {}
        self._own_stoppers: Callbacks[Callable[[], None]] = Callbacks()
        self._callback_ids = itertools.count(1)
        # Parts that follow cells (the memory ledger, output routing): called with the CellInfo at start and end.
        self._cell_listeners: Callbacks[Callable[[str, CellInfo], None]] = Callbacks()
        # Child pids no stop signals (kernel-wide helpers such as multiprocessing's resource tracker), and cells that
        # something outside the registry still refers to (the ledger's items): both from the integrations.
        self._spared_children: Callbacks[Callable[[], set[int]]] = Callbacks()
        self._cell_users: Callbacks[Callable[[], set[int]]] = Callbacks()
        #: Background output routed home, and the per-cell memory ledger (installed by install()).
        self.output: _output.OutputRouter | None = None
        self.memory: _memory.MemoryLedger | None = None
        self._cpu_cursor = 0
        self._undo: list[Callable[[], None]] = []
        self._first_count = _ipython_major() >= 9
        self.loaded_at = time.time()
        self.installed = False

    # ---------------------------------------------------------------------------------------- install
    def install(self) -> None:
        """Install hooks, events, the monitor and the shutdown routes; if one step fails, undo the others and
        re-raise (a half-loaded extension could not be unloaded)."""
        try:
            self._install()
        except BaseException:
            self.uninstall()
            raise

    def _install(self) -> None:
        _fork.claim()
        self._undo.append(_fork.on_fork_child(self._forget_in_child))
        self._undo.append(_log.install_handler())
        self.registry.adopt_existing(internal=lambda t: t.name.startswith(INTERNAL_PREFIX))
        loading_cell = running_cell(self.shell)
        if loading_cell is not None:
            # Loaded by %load_ext in a cell: what the rest of that cell starts is that cell's, like any other.
            self.registry.cell_started(*loading_cell)
        self.hooks.install()
        self._undo.append(self.hooks.uninstall)
        events = self.shell.events
        events.register("pre_run_cell", self._pre_run_cell)
        events.register("post_run_cell", self._post_run_cell)
        self._undo.append(lambda: events.unregister("pre_run_cell", self._pre_run_cell))
        self._undo.append(lambda: events.unregister("post_run_cell", self._post_run_cell))
        self._undo.append(self.stopper.add_stopper("user", self._run_user_stoppers))
        self._undo.append(self.monitor.add_task("activity", self.registry.sample_activity))
        self._undo.append(self.monitor.add_task("thread-cpu", self._sample_thread_cpu))
        self._undo.append(self.monitor.add_task("resources", self._monitor_resources))
        self._undo.append(self.snapshots.add_source("resources", self._resources_section))
        self._undo.append(self.probe.close)
        # After the thread hooks (the output route chains threading.excepthook above theirs) and after the
        # resources task (the ledger reads the sample that task takes on the same monitor tick).
        self.memory = _memory.install(self)
        self._undo.append(self.memory.uninstall)
        self.output = _output.install(self)
        self._undo.append(self.output.uninstall)
        self.monitor.start()
        self._undo.append(self.monitor.stop)
        self.shutdown.install(self.shell)
        self._undo.append(self.shutdown.uninstall)
        self._undo.append(watch_tensorflow(self))
        self._undo.append(watch_ledger(self))
        # Last: the Jupyter server's requests are answered only once everything else is in place (and unload
        # removes this first).
        self._undo.append(_control.install(self))
        self.installed = True

    def _forget_in_child(self) -> None:
        """In a forked child (see :mod:`nbcoord.core.fork`): every hook passes through, no route stops anything."""
        self.installed = False
        self.hooks.forget_in_child()
        self.shutdown.forget_in_child()

    def add_own_stopper(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Register how to stop one of nbcoord's own threads (the panel's sender); the shutdown runs it first."""
        return self._own_stoppers.add(f"own-{next(self._callback_ids)}", stop)

    def add_spared_children(self, name: str, pids: Callable[[], set[int]]) -> Callable[[], None]:
        """Register a source of child pids that no stop signals: the kernel's own helpers, which some cell happened
        to start (a resource tracker ignores SIGTERM, and leaves by itself when the kernel does); returns the
        remover."""
        return self._spared_children.add(name, pids)

    def add_cells_in_use(self, name: str, cells: Callable[[], set[int]]) -> Callable[[], None]:
        """Register a source of cells that must stay known while it refers to them (the ledger's live items: their
        zombie rules read the cell's outcome); returns the remover."""
        return self._cell_users.add(name, cells)

    def add_undo(self, undo: Callable[[], None]) -> None:
        """Remember something to undo at uninstall (integrations and the panel add theirs)."""
        self._undo.append(undo)

    def uninstall(self) -> None:
        """Undo everything, newest first; one failing step does not keep the others from running."""
        self.installed = False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: an unload step failed", exc_info=True)

    # ------------------------------------------------------------------------------------------- cells
    def _pre_run_cell(self, info: Any) -> None:
        try:
            self._announce_failures()
            count = self.shell.execution_count
            if self._first_count and getattr(info, "store_history", False):
                count -= 1  # IPython 9 counts the cell before pre_run_cell; 8 after it
            source = getattr(info, "raw_cell", "") or ""
            cell = self.registry.cell_started(count, getattr(info, "cell_id", None), source)
            self._tell_cell_listeners("started", cell)
        except Exception:
            log.warning("nbcoord: pre_run_cell hook failed", exc_info=True)

    def add_cell_listener(self, name: str, listener: Callable[[str, CellInfo], None]) -> Callable[[], None]:
        """Call ``listener("started" | "finished", cell)`` around every cell (on the main thread: keep it cheap);
        returns the remover. A listener that fails is logged and never breaks the cell."""
        return self._cell_listeners.add(name, listener)

    def _tell_cell_listeners(self, event: str, cell: CellInfo) -> None:
        for name, listener in self._cell_listeners.items():
            try:
                listener(event, cell)
            except Exception:
                log.warning("nbcoord: cell listener %r failed", name, exc_info=True)

    def cell_of_caller(self) -> int | None:
        """The cell the calling code belongs to: the running cell on the main thread, the cell that started the
        calling thread elsewhere (for integrations attributing what they see created)."""
        me = threading.current_thread()
        if me is threading.main_thread():
            current = self.registry.current_cell()
            return current.execution_count if current is not None else None
        record = self.registry.for_thread(me)
        return record.cell.execution_count if record is not None and record.cell is not None else None

    def _post_run_cell(self, result: Any) -> None:
        try:
            outcome, error = cell_outcome(result)
            count = getattr(result, "execution_count", None)
            current = self.registry.current_cell()
            if count is None:
                count = current.execution_count if current is not None else 0
            cell = self.registry.cell_finished(count, outcome, error)
            if cell is None:
                return
            self._tell_cell_listeners("finished", cell)
            if outcome == "interrupted" and self.config.stop_on_interrupt:
                self._stop_interrupted(cell.execution_count)
            elif outcome != "ok":
                self._announce_zombies(cell.execution_count)
        except Exception:
            log.warning("nbcoord: post_run_cell hook failed", exc_info=True)

    def degraded(self) -> dict[str, str]:
        """What works differently here, and how: internals found missing, routes that could not be installed."""
        from nbcoord.core import internals as _internals
        from nbcoord.ledger import internals as _ledger_internals
        from nbcoord.tensorflow import internals as _tf_internals

        return {
            **_internals.degraded(),
            **_tf_internals.degraded(),
            **_ledger_internals.degraded(),
            **self.degraded_routes,
        }

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

    def _stop_interrupted(self, execution_count: int) -> None:
        """``stop_on_interrupt``: stop what the interrupted cell started, and say so in one line."""
        report = self.stop(kind="cell", cell=execution_count)
        stopped, alive = report["stopped"], report["alive"]
        if not stopped and not alive:
            return
        line = f"nbcoord: cell [{execution_count}] was interrupted: stopped {len(stopped)} thread(s)"
        if alive:
            names = ", ".join(shown(row["name"]) for row in alive[:5]) + (" ..." if len(alive) > 5 else "")
            # They ignored this very stop: only --force (between Python statements) reaches them now.
            line += f"; {len(alive)} still running ({names}): see %nbcoord zombies; %nbcoord stop --zombies --force"
        print(line + ".", file=sys.stderr)

    def _announce_zombies(self, execution_count: int) -> None:
        """After an interrupted or failed cell: one line naming what it left running."""
        grace = self.config.grace_period
        cell = self.registry.cell(execution_count)
        zombies = [
            record
            for record in (self.registry.records_of_cell(cell) if cell is not None else [])
            if self.registry.zombie_reasons(record, grace)
        ]
        # What else it left (tasks, pools, data loaders; not the process tree), read only after a cell that failed.
        ledger = current_ledger()
        items = [
            row["label"]
            for row in (ledger.rows(skip=("process",)) if ledger is not None and ledger.active else [])
            if row["cell"] == execution_count and row["zombie"] is not None
        ]
        if (not zombies and not items) or cell is None:
            return
        left = [record.name for record in zombies] + items
        names = ", ".join(shown(name) for name in left[:5]) + (" ..." if len(left) > 5 else "")
        counts = [f"{len(zombies)} thread(s)"] if zombies else []
        counts += [f"{len(items)} other item(s)"] if items else []
        what = "was interrupted" if cell.outcome == "interrupted" else "failed"
        # A thread that already ignored a stop (stop_on_interrupt asked it) will ignore the next one too.
        ignored = any(record.stop_requested_at is not None for record in zombies)
        command = "%nbcoord stop --zombies --force" if ignored else "%nbcoord stop --zombies"
        print(
            f"nbcoord: cell [{execution_count}] {what} and left {' and '.join(counts)} running: {names}. "
            f"See %nbcoord zombies; stop them with {command}.",
            file=sys.stderr,
        )

    def _announce_failures(self) -> None:
        failures = self.registry.take_unreported_failures()
        if not failures:
            return
        first = failures[0]
        where = f" started by cell [{first.cell}]" if first.cell is not None else ""
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        note = f" {first.notes[0]}" if first.notes else ""
        home = self.output is not None and self.output.routing and first.cell is not None
        see = f"Its traceback is under cell [{first.cell}]; %nbcoord keeps it too." if home else (
            "See %nbcoord for tracebacks."
        )
        print(
            f"nbcoord: thread {first.thread_name!r}{where} failed: {first.exc_type}: {first.message}{more}.{note} "
            + see,
            file=sys.stderr,
        )

    # -------------------------------------------------------------------------------------------- stop
    def stop(
        self,
        kind: ScopeKind = "all",
        *,
        grace: float | None = None,
        force: bool = False,
        cell: int | None = None,
        tid: str | None = None,
    ) -> StopReport:
        """The one stop for the magic, the API and the panel (the shutdown calls the mechanism with its budget).

        Raises
        ------
        ValueError
            ``tid`` names no live thread, or one that no cell started (the kernel's own, or nbcoord's); ``cell``
            names no known cell; ``grace`` is negative, not finite or over a day.
        TypeError
            ``grace`` is not a number, ``force`` not a bool.
        """
        grace = self.config.grace_period if grace is None else _checks.finite_number("grace", grace)
        _checks.flag("force", force)
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
        _checks.callback("on_stop", callback)
        current = self.registry.current_cell()
        name = f"on_stop-{next(self._callback_ids)}"
        self._user_stopper_cells[name] = current.execution_count if current is not None else None
        remove = self._user_stoppers.add(name, callback)

        def remove_both() -> None:
            remove()
            self._user_stopper_cells.pop(name, None)

        return remove_both

    def _run_user_stoppers(self, scope: StopScope) -> None:
        if scope.kind == "thread":
            return
        failures: list[str] = []
        for name, callback in self._user_stoppers.items():
            cell = self._user_stopper_cells.get(name)
            chosen = (
                scope.kind == "all"
                or (scope.kind == "cell" and cell is not None and cell == scope.cell)
                or (scope.kind == "zombies" and cell is not None and self._cell_failed(cell))
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

    def _remember_stop(self, report: StopReport) -> None:
        self.snapshots.last_stop = dict(report)

    def _cells_in_use(self) -> set[int]:
        """Cells that something outside the registry refers to: kept when old cells are forgotten."""
        used = {cell for cell in self._user_stopper_cells.values() if cell is not None}
        last = self.snapshots.last_stop
        if last:
            used.update(row["cell"] for row in [*last["stopped"], *last["alive"]] if row.get("cell") is not None)
            if last.get("cell") is not None:
                used.add(last["cell"])
        sample = self.probe.last_sample
        if sample is not None:
            used.update(child["cell"] for child in sample["children"] if child["cell"] is not None)
        for name, cells in self._cell_users.items():
            try:
                used.update(cells())
            except Exception:
                log.warning("nbcoord: cells-in-use source %r failed", name, exc_info=True)
        return used

    def _cell_windows(self) -> list[CellWindow]:
        return [CellWindow(c.execution_count, c.started_at, c.ended_at) for c in self.registry.cells()]

    def _sample_resources(self) -> Resources:
        """One resource sample (cheap between the probe's rate-limited full reads)."""
        return self.probe.sample(self._cell_windows(), self.registry.native_names())

    def _monitor_resources(self) -> None:
        """The monitor's sample: keeps the probe's history going, and feeds per-thread CPU from each new read."""
        noted = self.probe.read_at
        resources = self._sample_resources()
        if self.probe.read_at != noted:
            self.registry.note_cpu({t["native_id"]: t["cpu_s"] for t in resources["native_threads"]})

    def _sample_thread_cpu(self) -> None:
        """CPU time of the user's threads, a bounded number per tick, so that a busy thread never looks idle
        (its innermost frame can look the same at every sample while it works)."""
        records = [r for r in self.registry.records() if r.user and r.native_id is not None]
        if not records:
            return
        start = self._cpu_cursor % len(records)
        batch = (records[start:] + records[:start])[:CPU_SAMPLES_PER_TICK]
        self._cpu_cursor = start + len(batch)
        cpu: dict[int, float] = {}
        for record in batch:
            seconds = thread_cpu_seconds(record.native_id) if record.native_id is not None else None
            if record.native_id is not None and seconds is not None:
                cpu[record.native_id] = seconds
        self.registry.note_cpu(cpu)

    def _resources_section(self) -> dict[str, Any]:
        return {"resources": self._sample_resources()}

    def _children_in_scope(self, kind: ScopeKind, cell: int | None) -> Sequence[psutil.Process]:
        """Child processes started since load by the cells in scope (exact start times against their runs)."""
        if kind == "thread":
            return []
        spared = self._spared_pids()
        chosen: list[psutil.Process] = []
        for child, owner, started_at in self.probe.children_in_cells(self._cell_windows()):
            if started_at + 0.02 < self.loaded_at:
                continue  # not ours to stop: it existed before nbcoord was loaded
            if child.pid in spared:
                continue  # the kernel's helper (a resource tracker): it leaves with the kernel
            if (
                kind == "all"
                or (kind == "cell" and owner == cell)
                or (kind == "zombies" and owner is not None and self._cell_failed(owner))
            ):
                chosen.append(child)
        return chosen

    def _spared_pids(self) -> set[int]:
        spared: set[int] = set()
        for name, pids in self._spared_children.items():
            try:
                spared |= pids()
            except Exception:
                log.warning("nbcoord: spared-children source %r failed", name, exc_info=True)
        return spared

    def _cell_failed(self, execution_count: int) -> bool:
        cell = self.registry.cell(execution_count)
        return cell is not None and cell.outcome in ("error", "interrupted")

    # ---------------------------------------------------------------------------------------- shutdown
    def _stop_monitor(self) -> None:
        self.monitor.stop(timeout=0.2)

    def _shutdown_stop(self, route: str) -> None:
        """Stop nbcoord's own threads, then the user's, within the budget; non-daemon threads that would not stop
        are left out of the interpreter's exit join (or, where it cannot be told, the exit ends the process)."""
        started = time.monotonic()
        budget = self.config.shutdown_budget
        own: list[Callable[[], None]] = [stop for _, stop in self._own_stoppers.items()] + [self._stop_monitor]
        for stop_own in own:
            try:
                stop_own()
            except Exception:
                log.warning("nbcoord: stopping an nbcoord thread failed", exc_info=True)
        report = self.stopper.stop(
            "all",
            grace=max(0.0, budget - (time.monotonic() - started)),
            force=self.config.force_on_shutdown,
            force_after=self.config.shutdown_force_after,
            daemon_grace=SHUTDOWN_DAEMON_GRACE_S,
        )
        abandoned: list[str] = []
        for row in report["alive"]:
            record = self.registry.get(row["tid"])
            thread = record.thread if record is not None else None
            if thread is None or thread.daemon or not thread.is_alive():
                continue  # the interpreter does not wait for daemon threads
            if abandon_thread(thread):
                abandoned.append(thread.name)
            else:
                self._unjoinable.append(thread)
        if abandoned:
            log.warning("nbcoord: %s: the exit will not wait for %d thread(s) that would not stop: %s",
                        route, len(abandoned), abandoned)
        log.info(
            "nbcoord: %s: stopped %d thread(s) in %.3f s; %d still running",
            route,
            len(report["stopped"]),
            time.monotonic() - started,
            len(report["alive"]),
        )

    def _leave_unstoppable(self) -> None:
        """At interpreter exit, after the stop: if a non-daemon thread that would not stop is still running and
        the interpreter would wait for it, run the exit's remaining work and end the process."""
        left = [thread for thread in self._unjoinable if thread.is_alive()]
        if not left:
            return
        log.warning(
            "nbcoord: ending the process without waiting for %d thread(s) that would not stop: %s",
            len(left),
            [thread.name for thread in left],
        )
        exit_now(0)

    # ------------------------------------------------------------------------------------------- views
    def snapshot(self, *, stacks: bool = False) -> Snapshot:
        """One snapshot of the kernel."""
        return self.snapshots.build(stacks=stacks)

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
        timeout = _checks.optional_seconds("timeout", timeout)
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

    def reclaim(self, *, outputs: bool = False) -> ReclaimReport:
        """Give back what the kernel keeps by accident, and report it (see :mod:`nbcoord.resources.reclaim`).

        Raises
        ------
        TypeError
            ``outputs`` is not a bool.
        RuntimeError
            Not on the kernel's main thread.
        """
        return reclaim(self, outputs=outputs)

    def panel(self) -> Any:
        """The live panel (one per kernel; displaying it again shows another view of the same widget)."""
        from nbcoord.panel.panel import panel_for

        return panel_for(self)
