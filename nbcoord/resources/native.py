"""What this process holds on the host, besides memory: its OS threads, and its child processes with the cell that
started each one.

On Linux (:data:`nbcoord.resources.proc.HAS_PROC`) both are read from ``/proc`` through
:mod:`nbcoord.resources.proc`, where psutil would read the same files more times (psutil's ``threads()`` drops the
thread's name, which would take a second read per thread); elsewhere through psutil. A direct child belongs to the
cell whose run window holds its start; a deeper descendant to the cell of its ancestor among the direct children.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import psutil

from nbcoord.resources import proc

_CMDLINE_MAX = 500


class CellWindow(NamedTuple):
    """When a cell ran, in ``time.time()`` seconds; ``ended_at`` is None while it runs."""

    execution_count: int
    started_at: float
    ended_at: float | None


def cell_for_time(started_at: float, cells: Sequence[CellWindow], resolution: float = 0.0) -> int | None:
    """The cell whose run window contains ``started_at``, or None.

    ``resolution`` is how coarse ``started_at`` is: Linux records a process's start in clock ticks (10 ms),
    rounded down, so the true moment lies in ``[started_at, started_at + resolution)``. The cell whose
    window covers most of that interval wins; a moment at a window's very edge counts as inside it.
    """
    best: int | None = None
    best_overlap = -1.0
    latest = started_at + resolution
    for cell in cells:
        end = math.inf if cell.ended_at is None else cell.ended_at
        low, high = max(started_at, cell.started_at), min(latest, end)
        if high < low or (resolution > 0 and cell.started_at == latest):
            continue  # no overlap; a window that opens at the interval's open end does not hold it
        if high - low > best_overlap:
            best, best_overlap = cell.execution_count, high - low
    return best


# --- threads -----------------------------------------------------------------------------------------------


def threads(process: psutil.Process) -> list[tuple[int, str, float]]:
    """Every OS thread of ``process``: (native id, OS name, CPU seconds), sorted; the name is "" off Linux."""
    rows = proc.threads(process.pid) if proc.HAS_PROC else _threads_psutil(process)
    return sorted(rows)


def _threads_psutil(process: psutil.Process) -> list[tuple[int, str, float]]:
    return [(t.id, "", t.user_time + t.system_time) for t in process.threads()]


# --- child processes ---------------------------------------------------------------------------------------


class ChildRead(NamedTuple):
    """One descendant as read, before its cell is known."""

    pid: int
    ppid: int
    cmdline: str
    status: str
    rss: int | None
    started_at: float


def children(process: psutil.Process) -> list[ChildRead]:
    """Every descendant of ``process``, oldest first."""
    rows = _children_linux(process.pid) if proc.HAS_PROC else _children_psutil(process)
    return sorted(rows, key=lambda r: (r.started_at, r.pid))


def _command_line(args: Sequence[str], name: str, status: str) -> str:
    cmdline = " ".join(args) if args else f"[{name}]"
    if status == psutil.STATUS_ZOMBIE:
        cmdline += " <defunct>"
    return cmdline if len(cmdline) <= _CMDLINE_MAX else cmdline[: _CMDLINE_MAX - 1] + "\u2026"


def _children_linux(root: int) -> list[ChildRead]:
    """Every descendant of ``root``: one pass over ``/proc/*/stat`` (as psutil's ``children()`` makes, but
    keeping what it reads), then ``statm`` and ``cmdline`` of the descendants alone."""
    by_parent = proc.stats_by_parent()
    stats = {pid: stat for rows in by_parent.values() for pid, stat in rows}
    offset = proc.boot_to_wall()
    rows = []
    for pid, ppid in proc.walk(root, lambda parent: [child for child, _stat in by_parent.get(parent, [])], None):
        stat = stats[pid]
        status = proc.STATUS.get(stat.state, stat.state)
        rows.append(
            ChildRead(
                pid=pid,
                ppid=ppid,
                cmdline=_command_line(proc.cmdline(pid), stat.comm, status),
                status=status,
                rss=proc.rss(pid),
                started_at=offset + stat.start_ticks / proc.CLOCK_TICKS,
            )
        )
    return rows


def _children_psutil(process: psutil.Process) -> list[ChildRead]:
    rows = []
    for child in process.children(recursive=True):
        try:
            with child.oneshot():
                ppid, status, name = child.ppid(), child.status(), child.name()
                started_at: float = child.create_time()
                rss: int | None = None
                args: list[str] = []
                try:
                    rss = child.memory_info().rss
                    args = child.cmdline()
                except (psutil.ZombieProcess, psutil.AccessDenied):
                    pass  # a zombie has no command line left (catch ZombieProcess before NoSuchProcess)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended meanwhile
        rows.append(ChildRead(child.pid, ppid, _command_line(args, name, status), str(status), rss, started_at))
    return rows


def attribute(children: Sequence[ChildRead], cells: Sequence[CellWindow], own_pid: int) -> dict[int, int | None]:
    """The cell of every descendant.

    A direct child belongs to the cell whose window holds its start; a deeper descendant (a shell's command, a
    pool's worker) to the cell of its ancestor among our direct children, which is what started it.
    """
    by_pid = {c.pid: c for c in children}
    tick = 1.0 / proc.CLOCK_TICKS if proc.HAS_PROC else 0.0  # Linux records starts in ticks, others precisely
    cell: dict[int, int | None] = {}

    def resolve(child: ChildRead, depth: int = 0) -> int | None:
        if child.pid not in cell:
            parent = by_pid.get(child.ppid)
            if child.ppid == own_pid or parent is None or depth > 64:
                cell[child.pid] = cell_for_time(child.started_at, cells, tick)
            else:
                cell[child.pid] = resolve(parent, depth + 1)
        return cell[child.pid]

    for child in children:
        resolve(child)
    return cell
