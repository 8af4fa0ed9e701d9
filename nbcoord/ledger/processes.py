"""Child processes in the ledger (S12): the kernel's whole process tree, each process with the cell that started
it, its parent, its role where a pool or a data loader names it ("DataLoader worker 2 of 4 of cell [5]"), its CPU
time and memory, and whether it exited without being reaped (a zombie process: ``<defunct>`` in ``ps``).

The tree is read cheaply: on Linux from ``/proc/<pid>/task/<tid>/children`` of the kernel and of each descendant
(about 0.1 ms for a small tree), or, when the kernel runs more than ``proc.TASK_SCAN_LIMIT`` threads (each has its own
list: 20 ms at 1000 threads), from one pass over ``/proc/*/stat`` (a few milliseconds on a busy machine). The stop
and the monitor (about once a second) read it fresh; the snapshot's rows reuse the last read while it is under
``TREE_MAX_AGE_S`` old and names every worker the pool and loader rows beside them name (else they read it fresh): a
process started by other means within the last second may show up one refresh later, as in the probe's resources
section. What the resource probe's last read (``Ledger.probe``, shared with the ``resources`` section) says of a
process is reused; a process it has not read yet is read here, its cell found as the probe finds it: a direct child
belongs to the cell whose run holds its start (read to the clock tick from ``/proc``), a deeper one to the cell of
its ancestor among the kernel's children. Elsewhere the probe's last read is the tree.

A process that a pool or loader row names is that row's: it carries no zombie reason of its own, so that one
leaked pool counts as one zombie, not five. The helpers ``multiprocessing`` and loky start once for the whole
kernel (resource trackers, a fork server) are the kernel's, never a cell's.

Stopping live processes is the stop mechanism's (SIGTERM to the children of the cells in scope, then SIGKILL).
What this kind adds: a zombie process in scope is reaped, through the object that started it where there is one
(``multiprocessing.active_children()`` reaps ``multiprocessing``'s children and keeps their exit codes; a
``subprocess.Popen`` is polled), and with ``os.waitpid`` only where no such object exists (``os.fork``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import psutil

from nbcoord.core.records import CellInfo
from nbcoord.core.snapshot import LedgerRow
from nbcoord.core.stop import ItemOutcome, StopScope
from nbcoord.ledger import internals
from nbcoord.ledger.base import Ledger
from nbcoord.ledger.stopping import Pending, WorkerStop
from nbcoord.resources import proc
from nbcoord.resources.probes import CellWindow, cell_for_time, format_bytes

log = logging.getLogger("nbcoord")

#: Process rows per snapshot at most.
MAX_ROWS = 200
#: How old a tree the snapshot's rows may reuse (the monitor reads one about every second).
TREE_MAX_AGE_S = 1.5


class ProcessLedger:
    """The processes kind."""

    name = "process"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()  # guards _ids
        #: (pid, start time) -> the row id issued for it: stable while the process lives, never reused.
        self._ids: dict[tuple[int, float], str] = {}
        #: The last tree read: (monotonic time, rows, their pids), for the snapshot's rows.
        self._tree: tuple[float, list[dict[str, Any]], frozenset[int]] | None = None

    def uninstall(self) -> None:
        with self._lock:
            self._ids.clear()
        self._tree = None

    # ----------------------------------------------------------------------------------------------- tree
    def recent_children(self, named: Collection[int]) -> list[dict[str, Any]]:
        """The last tree read if it is under ``TREE_MAX_AGE_S`` old and holds every pid in ``named`` (the workers
        other rows name), else a fresh one."""
        tree = self._tree
        if tree is not None and time.monotonic() - tree[0] < TREE_MAX_AGE_S and tree[2].issuperset(named):
            return tree[1]
        return self.children()

    def children(self) -> list[dict[str, Any]]:
        """Every descendant of the kernel, parents first, as the probe's rows plus ``ppid``; read now."""
        read_at = time.monotonic()
        rows = self._read_children()
        self._tree = (read_at, rows, frozenset(row["pid"] for row in rows))
        return rows

    def _read_children(self) -> list[dict[str, Any]]:
        sample = self.ledger.probe.last_sample
        known = {child["pid"]: child for child in sample["children"]} if sample is not None else {}
        me = os.getpid()
        tree = proc.descendants(me) if proc.HAS_CHILDREN_LISTS else None
        if tree is None:  # no /proc children lists here: the probe's last read is the tree
            return [dict(child, ppid=None) for child in known.values()]
        windows = [CellWindow(c.execution_count, c.started_at, c.ended_at) for c in self.ledger.registry.cells()]
        cell_of: dict[int, int | None] = {}
        rows: list[dict[str, Any]] = []
        for pid, ppid in tree:
            row: dict[str, Any] | None = dict(known[pid]) if pid in known else _child_row(pid)
            if row is None:
                continue  # ended meanwhile
            if pid not in known and ppid == me:
                row["cell"] = cell_for_time(row["started_at"], windows, 1 / proc.CLOCK_TICKS)
            elif pid not in known:
                row["cell"] = cell_of.get(ppid)  # a deeper descendant: the cell of what started it
            row["ppid"] = ppid
            cell_of[pid] = row["cell"]
            rows.append(row)
        return rows

    def _id(self, pid: int, started_at: float) -> str:
        key = (pid, round(started_at, 1))
        with self._lock:
            found = self._ids.get(key)
            if found is None:
                found = self._ids[key] = self.ledger.issue("process")
            return found

    def _cell(self, number: int | None) -> CellInfo | None:
        cell: CellInfo | None = self.ledger.registry.cell(number) if number is not None else None
        return cell

    def tick(self) -> bool:
        alive = {(c["pid"], round(c["started_at"], 1)) for c in self.children()}
        with self._lock:
            for key in [key for key in self._ids if key not in alive]:
                del self._ids[key]
        return bool(alive)

    # ----------------------------------------------------------------------------------------------- rows
    def rows(self) -> list[LedgerRow]:
        roles = self.ledger.roles()
        helpers = internals.helper_processes()
        rows: list[LedgerRow] = []
        for child in self.recent_children(roles)[:MAX_ROWS]:
            pid = child["pid"]
            status, ppid, cpu = _fresh(pid)
            if not status:
                continue  # ended since the tree was read
            role = roles.get(pid)
            if pid in helpers:
                role = (f"{helpers[pid]}: the kernel's, shared by every cell", "", None)
            cell = role[2] if role is not None else self._cell(child["cell"])
            reasons = [] if role is not None else self.ledger.zombie_reasons(cell)
            detail = [role[0] if role is not None else ""]
            if ppid is not None and ppid != os.getpid():
                detail.append(f"child of {ppid}")
            if cpu is not None:
                detail.append(f"cpu {cpu:.2f} s")
            if child["rss"] is not None:
                detail.append(format_bytes(child["rss"]))
            detail.append(child["cmdline"][:120])
            rows.append(
                LedgerRow(
                    id=self._id(pid, child["started_at"]),
                    kind="process",
                    label=f"process {pid}",
                    cell=cell.execution_count if cell is not None else None,
                    state="exited, not reaped" if status == psutil.STATUS_ZOMBIE else status,
                    started_at=child["started_at"],
                    zombie=reasons[0]["reason"] if reasons else None,
                    zombie_reasons=reasons,
                    detail="; ".join(part for part in detail if part),
                    pids=[pid],
                )
            )
        return rows

    # ----------------------------------------------------------------------------------------------- stop
    def begin_stop(self, scope: StopScope) -> list[Pending]:
        """Reap the exited children in scope (the mechanism signals the live ones)."""
        me = os.getpid()
        # Only the kernel's own children can be reaped here; a grandchild is its parent's to reap.
        exited = [
            c for c in self.children() if c["ppid"] in (me, None) and _fresh(c["pid"])[:2] == (psutil.STATUS_ZOMBIE, me)
        ]
        if not exited:
            return []
        roles = self.ledger.roles()
        helpers = internals.helper_processes()
        chosen: list[tuple[dict[str, Any], CellInfo | None]] = []
        for child in exited:
            if child["pid"] in helpers or child["pid"] in roles:
                continue  # the kernel's helpers; a pool's or loader's workers are their owner's to reap
            cell = self._cell(child["cell"])
            if self.ledger.selects(scope, cell, bool(self.ledger.zombie_reasons(cell))):
                chosen.append((child, cell))
        if not chosen:
            return []
        statuses = reap({child["pid"] for child, _cell in chosen})
        return [
            _Reaped(
                ItemOutcome(
                    id=self._id(child["pid"], child["started_at"]),
                    kind="process",
                    label=f"process {child['pid']} (exited, not reaped)",
                    cell=cell.execution_count if cell is not None else None,
                    stopped=child["pid"] in statuses,
                    reason=statuses.get(child["pid"], "could not be reaped"),
                )
            )
            for child, cell in chosen
        ]


    def after_stop(self, scope: StopScope) -> list[Pending]:
        """At the kernel's shutdown, after everything else stopped: the kernel-wide helpers, through their own stop
        (they clean up what leaked, and exit); ipykernel's own shutdown would otherwise wait seconds for them (they
        ignore its SIGTERM) until jupyter_client kills the kernel. Never at any other stop: a helper stopped while
        the kernel runs unlinks shared memory the kernel still uses."""
        if scope.kind != "all" or not self.ledger.at_shutdown():
            return []
        pending: list[Pending] = []
        for pid, what, stop in internals.helper_stops():
            try:
                started_at = _started_at(psutil.Process(pid))
            except psutil.Error:
                continue  # it ended by itself
            item = ItemOutcome(
                id=self._id(pid, started_at),
                kind="process",
                label=f"{what} (process {pid})",
                cell=None,
                stopped=False,
                reason=None,
            )
            pending.append(WorkerStop(item, "its own stop", stop, [_Child(pid)]))
        return pending


class _Child:
    """A child process known by its pid, with the few methods of a ``multiprocessing`` process a stop uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self) -> bool:
        """Running (an exited one is its owner's to reap: its stop waits for it)."""
        status = _fresh(self.pid)[0]
        return bool(status) and status != psutil.STATUS_ZOMBIE

    def terminate(self) -> None:
        os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)


class _Reaped:
    def __init__(self, item: ItemOutcome) -> None:
        self.item = item

    def poll(self, now: float, started: float, deadline: float) -> bool:
        return True

    def outcome(self) -> ItemOutcome:
        return self.item


def spared_pids() -> set[int]:
    """Child processes no stop may signal: the kernel-wide helpers (see ``helper_processes``)."""
    return set(internals.helper_processes())


def _started_at(process: psutil.Process) -> float:
    """When a process started, in ``time.time()`` seconds, to the clock tick (see :func:`proc.started_at`; psutil's
    ``create_time()`` adds a boot time known only to the second, too coarse to tell cells apart)."""
    started = proc.started_at(process.pid)
    return started if started is not None else float(process.create_time())


def _child_row(pid: int) -> dict[str, Any] | None:
    """A process the probe has not read yet, in the probe's row format (without its cell)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = str(process.status())
            try:
                rss: int | None = process.memory_info().rss
                cmdline = " ".join(process.cmdline())
            except psutil.ZombieProcess:
                rss, cmdline = None, f"[{process.name()}] <defunct>"
            started_at = _started_at(process)
    except psutil.Error:
        return None
    return {"pid": pid, "cmdline": cmdline, "status": status, "rss": rss, "cell": None, "started_at": started_at}


def _fresh(pid: int) -> tuple[str, int | None, float | None]:
    """(status, parent pid, CPU seconds) of a process read now; status "" once it is gone."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = str(process.status())
            ppid = process.ppid()
            try:
                times = process.cpu_times()
                cpu: float | None = times.user + times.system
            except psutil.ZombieProcess:
                cpu = None
            return status, ppid, cpu
    except (psutil.Error, OSError):
        return "", None, None


def reap(pids: set[int]) -> dict[int, str]:
    """Reap these exited children, each through the object that started it where one exists; returns how each
    ended (pids that could not be reaped are missing)."""
    done = {pid: "already reaped by its owner" for pid in pids if not _exists(pid)}
    left = pids - set(done)
    mp = sys.modules.get("multiprocessing")
    if left and mp is not None:
        mp.active_children()  # reaps every finished child of multiprocessing's, keeping its exit code
        done.update({pid: "reaped by multiprocessing" for pid in left if not _exists(pid)})
        left -= set(done)
    subprocess = sys.modules.get("subprocess")
    if left and subprocess is not None:
        popen_class = subprocess.Popen
        # type(), not isinstance(): isinstance reads __class__, which some libraries' objects compute (and warn)
        for popen in [o for o in gc.get_objects() if issubclass(type(o), popen_class)]:
            if popen.pid in left and popen.poll() is not None:
                done[popen.pid] = f"reaped through its subprocess.Popen (exit status {popen.returncode})"
                left.discard(popen.pid)
    for pid in left:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped meanwhile by someone else (a pool's own management thread waits for its workers), or not
            # ours: gone either way is reaped, not alive.
            if not _exists(pid):
                done[pid] = "already reaped by its owner"
            continue
        if reaped == pid:
            done[pid] = f"reaped (exit status {os.waitstatus_to_exitcode(status)})"
    return done


def _exists(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def watch(ledger: Ledger) -> Callable[[], None]:
    """The process tree is always there (psutil is nbcoord's own dependency). The kernel-wide helper processes are
    no cell's: the stop's signals leave them."""
    kind = ProcessLedger(ledger)
    remove_spared = ledger.host.add_spared_children("ledger", spared_pids)
    remove = ledger.add_kind(kind)

    def undo() -> None:
        remove()
        remove_spared()
        kind.uninstall()

    return undo
