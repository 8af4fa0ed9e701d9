"""The running extension: wires the registry, the hooks, the stop and the views to one IPython shell.

``load_ipython_extension`` creates one :class:`Extension` and calls :meth:`Extension.install`;
``unload_ipython_extension`` calls :meth:`Extension.uninstall`, which removes exactly what install added.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from . import _fork, _log
from ._config import NBCoord
from ._internals import abandon_thread, exit_now, running_cell
from ._probes import CellWindow, ResourceProbe, Resources, thread_cpu_seconds
from ._registry import CellOutcome, Registry
from ._report import ZOMBIE_WORDS
from ._shutdown import ShutdownHooks
from ._snapshot import Snapshot, SnapshotBuilder
from ._stop import ScopeKind, StopMechanism, StopReport, StopScope, ThreadStopped
from ._threads import INTERNAL_PREFIX, Monitor, ThreadHooks
from .integrations.tensorflow import watch as watch_tensorflow

log = logging.getLogger("nbcoord")

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
        self.registry = Registry()
        self.monitor = Monitor(lambda: self.config.monitor_interval)
        self.hooks = ThreadHooks(self.registry, ignore_exception=lambda exc: isinstance(exc, ThreadStopped))
        self.snapshots = SnapshotBuilder(self.registry, lambda: self.config.grace_period)
        self.stopper = StopMechanism(self.registry, self._children_in_scope)
        self.stopper.on_report = self._remember_stop
        self.shutdown = ShutdownHooks(
            self._shutdown_stop,
            wait_limit=lambda: self.config.shutdown_budget + 0.5,
            at_exit=self._leave_unstoppable,
        )
        self.probe = ResourceProbe()
        #: Non-daemon threads that would not stop at shutdown and that the interpreter could not be told to leave.
        self._unjoinable: list[threading.Thread] = []
        self._user_stoppers: list[tuple[Callable[[], None], int | None]] = []
        self._own_stoppers: list[Callable[[], None]] = []
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
        self._undo.append(self.monitor.add_task("resources", self._sample_resources))
        self._undo.append(self.snapshots.add_source("resources", self._resources_section))
        self._undo.append(self.probe.close)
        self.monitor.start()
        self._undo.append(self.monitor.stop)
        self.shutdown.install(self.shell)
        self._undo.append(self.shutdown.uninstall)
        self._undo.append(watch_tensorflow(self))
        self.installed = True

    def _forget_in_child(self) -> None:
        """In a forked child (see :mod:`nbcoord._fork`): every hook passes through, no route stops anything."""
        self.installed = False
        self.hooks.forget_in_child()
        self.shutdown.forget_in_child()

    def add_own_stopper(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Register how to stop one of nbcoord's own threads (the panel's sender); the shutdown runs it first."""
        self._own_stoppers.append(stop)

        def remove() -> None:
            if stop in self._own_stoppers:
                self._own_stoppers.remove(stop)

        return remove

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
            self.registry.cell_started(count, getattr(info, "cell_id", None), getattr(info, "raw_cell", "") or "")
        except Exception:
            log.warning("nbcoord: pre_run_cell hook failed", exc_info=True)

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
            if outcome == "interrupted" and self.config.stop_on_interrupt:
                report = self.stop(kind="cell", cell=cell.execution_count)
                if report["stopped"] or report["alive"]:
                    print(f"nbcoord: stopped the threads of interrupted cell [{cell.execution_count}].")
            if outcome != "ok":
                self._announce_zombies(cell.execution_count)
        except Exception:
            log.warning("nbcoord: post_run_cell hook failed", exc_info=True)

    def _announce_zombies(self, execution_count: int) -> None:
        grace = self.config.grace_period
        cell = self.registry.cell(execution_count)
        zombies = [
            (record, reason)
            for record in (self.registry.records_of_cell(cell) if cell is not None else [])
            if (reason := self.registry.zombie_reason(record, grace)) is not None
        ]
        if not zombies:
            return
        names = ", ".join(record.name for record, _ in zombies[:5]) + (" ..." if len(zombies) > 5 else "")
        why = ZOMBIE_WORDS[zombies[0][1]]
        print(
            f"nbcoord: this cell left {len(zombies)} zombie thread(s) running ({why}): {names}. "
            "See %nbcoord zombies; stop them with %nbcoord stop --zombies.",
            file=sys.stderr,
        )

    def _announce_failures(self) -> None:
        failures = self.registry.take_unreported_failures()
        if not failures:
            return
        first = failures[0]
        where = f" started by cell [{first.cell}]" if first.cell is not None else ""
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        print(
            f"nbcoord: thread {first.thread_name!r}{where} failed: {first.exc_type}: {first.message}{more}. "
            "See %nbcoord for tracebacks.",
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
            ``tid`` names no live thread, or one that no cell started (the kernel's own, or nbcoord's).
        """
        if kind == "thread":
            self.check_stoppable(tid)
        grace = self.config.grace_period if grace is None else grace
        return self.stopper.stop(kind, grace=grace, force=force, cell=cell, tid=tid)

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
        """Register a user callback, run by stops of everything or of the cell that registered it."""
        current = self.registry.current_cell()
        entry = (callback, current.execution_count if current is not None else None)
        self._user_stoppers.append(entry)

        def remove() -> None:
            if entry in self._user_stoppers:
                self._user_stoppers.remove(entry)

        return remove

    def _run_user_stoppers(self, scope: StopScope) -> None:
        cells = {r.cell.execution_count for r in scope.records if r.cell is not None}
        failures: list[str] = []
        for callback, cell in list(self._user_stoppers):
            if scope.kind == "all" or cell is None or cell in cells:
                try:
                    callback()
                except Exception as exc:
                    log.warning("nbcoord: on_stop callback %r failed", callback, exc_info=True)
                    failures.append(f"{callback!r}: {type(exc).__name__}: {exc}")
        if failures:
            raise RuntimeError("; ".join(failures))

    def _remember_stop(self, report: StopReport) -> None:
        self.snapshots.last_stop = dict(report)

    def _cell_windows(self) -> list[CellWindow]:
        return [CellWindow(c.execution_count, c.started_at, c.ended_at) for c in self.registry.cells()]

    def _sample_resources(self) -> Resources:
        """One resource sample (cheap between the probe's rate-limited full reads); feeds per-thread CPU."""
        python_threads = {
            r.native_id: r.name for r in self.registry.records(include_internal=True) if r.native_id is not None
        }
        resources = self.probe.sample(self._cell_windows(), python_threads)
        self.registry.note_cpu({t["native_id"]: t["cpu_s"] for t in resources["native_threads"]})
        return resources

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
        chosen: list[psutil.Process] = []
        for child, owner, started_at in self.probe.children_in_cells(self._cell_windows()):
            if started_at + 0.02 < self.loaded_at:
                continue  # not ours to stop: it existed before nbcoord was loaded
            if (
                kind == "all"
                or (kind == "cell" and owner == cell)
                or (kind == "zombies" and owner is not None and self._cell_failed(owner))
            ):
                chosen.append(child)
        return chosen

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
        own: list[Callable[[], None]] = [*self._own_stoppers, self._stop_monitor]
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
        """Block until a stop is requested for the calling thread, or the timeout passes."""
        event = self.registry.stop_event_for_current()
        if event is None:
            threading.Event().wait(timeout)
            return False
        return event.wait(timeout)

    def panel(self) -> Any:
        """The live panel (one per kernel; displaying it again shows another view of the same widget)."""
        from ._panel import panel_for

        return panel_for(self)
