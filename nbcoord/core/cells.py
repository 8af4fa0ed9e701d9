"""Cell events: the shell's ``pre_run_cell`` / ``post_run_cell`` tell the registry and the cell listeners, and an
interrupted or failed cell gets its one-line notice (what it left running; with ``stop_on_interrupt``, what the
stop of its threads did)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from nbcoord.core.host import Host
from nbcoord.core.records import CellOutcome
from nbcoord.core.text import shown

log = logging.getLogger("nbcoord")


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


class CellEvents:
    """The shell's cell events, for one :class:`Host`. ``routes_home`` says whether a thread's traceback is shown
    under its cell (output routing is on)."""

    def __init__(self, host: Host, routes_home: Callable[[], bool]) -> None:
        self._host = host
        self._routes_home = routes_home
        self._first_count = _ipython_major() >= 9

    def install(self) -> Callable[[], None]:
        """Register on the shell's events; returns the remover."""
        events = self._host.shell.events
        events.register("pre_run_cell", self.pre_run_cell)
        events.register("post_run_cell", self.post_run_cell)
        # A running cell is live: the monitor keeps its base interval until the cell ends.
        registry = self._host.registry
        remove_task = self._host.monitor.add_task("cells", lambda: registry.current_cell() is not None)

        def remove() -> None:
            remove_task()
            events.unregister("pre_run_cell", self.pre_run_cell)
            events.unregister("post_run_cell", self.post_run_cell)

        return remove

    def pre_run_cell(self, info: Any) -> None:
        try:
            self._announce_failures()
            count = self._host.shell.execution_count
            if self._first_count and getattr(info, "store_history", False):
                count -= 1  # IPython 9 counts the cell before pre_run_cell; 8 after it
            source = getattr(info, "raw_cell", "") or ""
            cell = self._host.registry.cell_started(count, getattr(info, "cell_id", None), source)
            self._host.tell_cell_listeners("started", cell)
        except Exception:
            log.warning("nbcoord: pre_run_cell hook failed", exc_info=True)

    def post_run_cell(self, result: Any) -> None:
        try:
            registry = self._host.registry
            outcome, error = cell_outcome(result)
            count = getattr(result, "execution_count", None)
            current = registry.current_cell()
            if count is None:
                count = current.execution_count if current is not None else 0
            cell = registry.cell_finished(count, outcome, error)
            if cell is None:
                return
            self._host.tell_cell_listeners("finished", cell)
            if outcome == "interrupted" and self._host.config.stop_on_interrupt:
                self._stop_interrupted(cell.execution_count)
            elif outcome != "ok":
                self._announce_zombies(cell.execution_count)
        except Exception:
            log.warning("nbcoord: post_run_cell hook failed", exc_info=True)

    def _stop_interrupted(self, execution_count: int) -> None:
        """``stop_on_interrupt``: stop what the interrupted cell started, and say so in one line."""
        report = self._host.stop(kind="cell", cell=execution_count)
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
        registry = self._host.registry
        grace = self._host.config.grace_period
        cell = registry.cell(execution_count)
        zombies = [
            record
            for record in (registry.records_of_cell(cell) if cell is not None else [])
            if registry.zombie_reasons(record, grace)
        ]
        # What else it left (tasks, pools, data loaders: the ledger's items), read only after a cell that failed.
        items = self._host.leftovers(execution_count)
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
        failures = self._host.registry.take_unreported_failures()
        if not failures:
            return
        first = failures[0]
        where = f" started by cell [{first.cell}]" if first.cell is not None else ""
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        note = f" {first.notes[0]}" if first.notes else ""
        home = self._routes_home() and first.cell is not None
        see = f"Its traceback is under cell [{first.cell}]; %nbcoord keeps it too." if home else (
            "See %nbcoord for tracebacks."
        )
        print(
            f"nbcoord: thread {first.thread_name!r}{where} failed: {first.exc_type}: {first.message}{more}.{note} "
            + see,
            file=sys.stderr,
        )
