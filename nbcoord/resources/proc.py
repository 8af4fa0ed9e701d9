"""The one reader of Linux's ``/proc``: a thread's or process's ``stat``, the threads of a process, the process tree.

Used by the resource probe (native threads, child processes) and by the ledger's process kind (the kernel's tree).
Every read is one ``open``/``read`` of a small file; a file that is gone (the thread or process ended meanwhile)
reads as None or is skipped, never raises. Nothing here is Linux-only at import: :data:`HAS_PROC` and
:data:`HAS_CHILDREN_LISTS` say whether the files exist, and callers fall back to psutil where they do not.

Two ways to find a process's descendants:

* each thread's own children list, ``/proc/<pid>/task/<tid>/children`` (Linux with ``CONFIG_PROC_CHILDREN``):
  about 0.1 ms for a small tree, but one read per thread of each process (20 ms at 1000 threads);
* one pass over every process's ``/proc/<pid>/stat`` (its parent is there): a few milliseconds on a busy machine,
  whatever the thread count.

:func:`descendants` takes the first unless the root runs more than :data:`TASK_SCAN_LIMIT` threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

import psutil

PROC = "/proc"
#: Linux: ``/proc`` is read directly where psutil would read the same files more times (see :func:`threads`).
HAS_PROC = os.path.isdir(f"{PROC}/self/task") and hasattr(time, "CLOCK_BOOTTIME")
#: Whether this system lists a thread's children in /proc (Linux with CONFIG_PROC_CHILDREN).
HAS_CHILDREN_LISTS = os.path.exists(f"{PROC}/{os.getpid()}/task/{os.getpid()}/children")
CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
#: Above this many threads in a process, its children are found by one pass over /proc/*/stat instead of reading
#: each thread's own children list.
TASK_SCAN_LIMIT = 64
#: How deep :func:`descendants` follows the tree.
MAX_DEPTH = 16

#: ``/proc/<pid>/stat``'s state letter, in psutil's words.
STATUS = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD,
    "I": psutil.STATUS_IDLE,
    "P": psutil.STATUS_PARKED,
}


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` (or ``/proc/<pid>/task/<tid>/stat``) that nbcoord uses."""

    comm: str
    state: str
    ppid: int
    cpu_s: float  # user + system
    start_ticks: int  # clock ticks since boot


def read_small(path: str) -> bytes | None:
    """A small /proc file in one read; None if it is gone (the thread or process ended)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_stat(path: str) -> Stat | None:
    """A ``stat`` file's fields; None if it is gone or unreadable."""
    data = read_small(path)
    if not data:
        return None
    close = data.rfind(b")")  # the name may itself hold spaces and parentheses
    fields = data[close + 2 :].split()
    try:
        return Stat(
            comm=data[data.find(b"(") + 1 : close].decode("utf-8", "replace"),
            state=fields[0].decode(),
            ppid=int(fields[1]),
            cpu_s=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,  # fields 14 and 15, utime and stime
            start_ticks=int(fields[19]),  # field 22, starttime
        )
    except (ValueError, IndexError):
        return None


def boot_to_wall() -> float:
    """Add to seconds since boot to get ``time.time()`` seconds.

    Not psutil's ``create_time()``: it adds the boot time from ``/proc/stat``, which Linux gives in whole
    seconds, so it can be up to a second off ``time.time()``, too coarse to tell which cell started a process.
    ``CLOCK_BOOTTIME`` makes a process's start exact to the clock tick (10 ms).
    """
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in ``time.time()`` seconds, to the clock tick; None where it cannot be read
    (gone, or no /proc)."""
    stat = read_stat(f"{PROC}/{pid}/stat") if HAS_PROC else None
    return None if stat is None else boot_to_wall() + stat.start_ticks / CLOCK_TICKS


def threads(pid: int) -> list[tuple[int, str, float]]:
    """Every thread of ``pid`` with its OS name and CPU time: one read of its ``stat`` each (psutil's
    ``threads()`` reads the same file but drops the name, which would take a second read of ``comm``)."""
    rows = []
    for entry in os.listdir(f"{PROC}/{pid}/task"):
        stat = read_stat(f"{PROC}/{pid}/task/{entry}/stat")
        if stat is not None:  # None: the thread ended meanwhile
            rows.append((int(entry), stat.comm, stat.cpu_s))
    return rows


def thread_cpu_seconds(native_id: int) -> float | None:
    """CPU time (user + system) of one thread of this process; None where unavailable.

    About 18 us a call. Safe for any id: a thread that ended just gives None (unlike ``pthread_getcpuclockid``,
    which is undefined behaviour on a thread that is gone).
    """
    if not HAS_PROC:
        return None
    stat = read_stat(f"{PROC}/self/task/{native_id}/stat")
    return None if stat is None else stat.cpu_s


def rss(pid: int) -> int | None:
    """Resident memory of ``pid`` in bytes, from ``statm``; None if it is gone."""
    statm = read_small(f"{PROC}/{pid}/statm")
    return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE") if statm else None


def cmdline(pid: int) -> list[str]:
    """The arguments of ``pid``; empty for a zombie, a kernel thread, or a process that is gone."""
    raw = read_small(f"{PROC}/{pid}/cmdline") or b""
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


# ------------------------------------------------------------------------------------------------ the tree
def stats_by_parent() -> dict[int, list[tuple[int, Stat]]]:
    """Every process on the machine with its ``stat``, by parent pid: one pass over ``/proc/*/stat``."""
    by_parent: dict[int, list[tuple[int, Stat]]] = {}
    for entry in os.listdir(PROC):
        if entry.isdigit():
            stat = read_stat(f"{PROC}/{entry}/stat")
            if stat is not None:  # None: ended meanwhile, or unreadable
                by_parent.setdefault(stat.ppid, []).append((int(entry), stat))
    return by_parent


def children_by_stat() -> Callable[[int], list[int]]:
    """Every process's children, from one pass over ``/proc/*/stat``."""
    by_parent = stats_by_parent()
    return lambda parent: [pid for pid, _stat in by_parent.get(parent, [])]


def children_of_threads(parent: int) -> list[int]:
    """The children of every thread of ``parent``, from their own lists (empty once it ended)."""
    try:
        tasks = os.listdir(f"{PROC}/{parent}/task")
    except OSError:
        return []  # ended meanwhile
    pids: list[int] = []
    for task in tasks:
        try:
            with open(f"{PROC}/{parent}/task/{task}/children", "rb") as listing:  # may exceed one small read
                pids += [int(pid) for pid in listing.read().split()]
        except OSError:
            continue
    return pids


def walk(
    root: int, children_of: Callable[[int], list[int]], max_depth: int | None = MAX_DEPTH
) -> list[tuple[int, int]]:
    """Breadth first from ``root``: (pid, parent pid), parents first, each pid once (pids reused while the tree is
    read can make a cycle), at most ``max_depth`` levels (None: all)."""
    found: list[tuple[int, int]] = []
    seen = {root}
    level = [root]
    depth = 0
    while level and (max_depth is None or depth < max_depth):
        following: list[int] = []
        for parent in level:
            for pid in children_of(parent):
                if pid not in seen:
                    seen.add(pid)
                    found.append((pid, parent))
                    following.append(pid)
        level = following
        depth += 1
    return found


def descendants(root: int) -> list[tuple[int, int]] | None:
    """(pid, parent pid) of every descendant of ``root``, parents first, from ``/proc/<pid>/task/*/children``
    (or one pass over ``/proc/*/stat`` when ``root`` runs many threads); None where those lists cannot be read."""
    try:
        many = len(os.listdir(f"{PROC}/{root}/task")) > TASK_SCAN_LIMIT
    except OSError:
        return None
    return walk(root, children_by_stat() if many else children_of_threads)


def descendants_from_stat(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every descendant of ``root``, parents first, from one pass over ``/proc/*/stat``."""
    return walk(root, children_by_stat())
