"""Resources the kernel holds: GPU and host memory, native threads, child processes.

This module knows no IPython and imports no framework. :class:`ResourceProbe` reads

* **GPU**, per device, through NVML (``nvidia-ml-py``, imported lazily at the first sample): the device's
  total and used memory, this process's own use (NVML's per-process list; ``process_visible`` is False
  where that list cannot show this process, as in containers without host PID visibility, rather than a
  false 0) and, when the user has imported TensorFlow and started its eager runtime, TensorFlow's
  allocator figures (read by the hook TensorFlow's part registers: :mod:`nbcoord.resources.frameworks`);
* **host** memory: the kernel's RSS and USS, its children's RSS, the machine's available memory;
* **native threads**: every OS thread of the process with its OS name and CPU time, marked with its Python
  name where it is a Python thread;
* **child processes**: every descendant with its command line, status (``zombie`` for a defunct child),
  memory, GPU memory where NVML shows it, and the cell that started it.

Costs. The expensive reads (one ``stat`` per thread, 10-30 us each; ``/proc/*/stat`` of every process on the
machine to find the children; smaps for USS; NVML) run at most once per ``min_native_interval`` seconds, and
no more often than keeps them under ``max_duty`` of one core; they are cached in between. A sample inside
that interval reads only the RSS (one small ``/proc`` read) and re-labels the cached rows. Threads and children
come from :mod:`nbcoord.resources.native` (``/proc`` on Linux, psutil elsewhere), the GPU from the one NVML
reader (:mod:`nbcoord.resources.nvml`, through :mod:`nbcoord.resources.gpu`). Nothing here runs on a hot path:
the probe is called by views (report, panel), never by thread or cell hooks.

Everything is plain JSON (``str``/``int``/``float``/``bool``/``None``/lists/dicts), described by the
TypedDicts below.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TypedDict, TypeVar

import psutil

from nbcoord.resources import frameworks, native
from nbcoord.resources.frameworks import AllocatorRead
from nbcoord.resources.gpu import DRIVER_NOT_LOADED, NO_DEVICE, NO_DRIVER, NO_LIBRARY, GpuDevice, GpuRead, gpu_read
from nbcoord.resources.native import CellWindow, ChildRead, cell_for_time
from nbcoord.resources.nvml import Nvml
from nbcoord.resources.proc import thread_cpu_seconds

logger = logging.getLogger("nbcoord")
_T = TypeVar("_T")

__all__ = [
    "DRIVER_NOT_LOADED",
    "NO_DEVICE",
    "NO_DRIVER",
    "NO_LIBRARY",
    "CellWindow",
    "ChildProcess",
    "GpuDevice",
    "GpuInfo",
    "HistoryPoint",
    "HostMemory",
    "NativeThread",
    "ResourceProbe",
    "Resources",
    "cell_for_time",
    "format_bytes",
    "thread_cpu_seconds",
]


class GpuInfo(TypedDict):
    available: bool
    reason: str | None  # why there are no devices
    devices: list[GpuDevice]
    tf_note: str | None


class HostMemory(TypedDict):
    rss: int
    uss: int | None
    children_rss: int
    available: int
    total: int
    tf_cpu_current: int | None  # None where TensorFlow keeps no CPU allocator statistics
    tf_cpu_peak: int | None


class NativeThread(TypedDict):
    native_id: int
    name: str  # the OS name (Linux ``comm``); "" where the OS gives none
    cpu_s: float  # user + system
    python_name: str | None  # None: not a Python thread (TensorFlow pools, BLAS/OpenMP, zmq...)


class ChildProcess(TypedDict):
    pid: int
    cmdline: str
    status: str  # psutil's status: "running", "sleeping", "zombie", ...
    rss: int | None
    gpu_mem: int | None  # None where NVML cannot show processes
    cell: int | None  # execution count of the cell that started it
    started_at: float  # time.time() seconds


class Resources(TypedDict):
    gpu: GpuInfo
    host: HostMemory
    native_threads: list[NativeThread]
    children: list[ChildProcess]
    sampled_at: float


class HistoryPoint(TypedDict):
    """One point of the history ring (for sparklines)."""

    sampled_at: float
    rss: int
    uss: int | None
    children_rss: int
    host_available: int
    gpu_used: int | None  # all devices together
    gpu_process_used: int | None  # this process on all devices
    tf_gpu_current: int | None
    native_threads: int
    children: int


def format_bytes(n: int | None) -> str:
    """Bytes in a short binary unit: ``"512 B"``, ``"1.5 KiB"``, ``"200.0 MiB"``; ``"n/a"`` for None."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _host_memory() -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


# --- the probe ---------------------------------------------------------------------------------------------


@dataclass
class _Slow:
    """The figures read at most once per ``min_native_interval``."""

    rss: int
    uss: int | None
    available: int
    total: int
    threads: list[tuple[int, str, float]]  # native id, OS name, CPU seconds
    children: list[ChildRead]
    gpu: GpuRead
    tf: AllocatorRead | None  # None: TensorFlow not imported (or its part not registered)


class ResourceProbe:
    """Samples the resources this process holds; see the module docstring.

    Parameters
    ----------
    nvml
        The NVML module; None imports ``pynvml`` (package ``nvidia-ml-py``) lazily at the first sample.
        Tests pass a fake.
    min_native_interval
        The expensive reads run at most once per this many seconds (of ``clock``); samples in between reuse
        them. The history ring gets one point per expensive read.
    history_len
        How many history points are kept.
    max_duty
        The share of one core the expensive reads may take: after a read that took ``c`` seconds the next
        waits at least ``c / max_duty`` (at 1000 threads a read takes about 20 ms: 4 s apart at the default
        0.5 %). None: ``min_native_interval`` alone (benchmarks, tests that want every sample full).
    process
        The process to probe; defaults to this one. Tests pass a wrapper to count calls.
    clock
        Monotonic seconds for the rate limit; tests pass a fake clock.

    The probe is thread-safe: one lock serialises samples (the panel's sender and a magic may sample at once).
    """

    def __init__(
        self,
        *,
        nvml: ModuleType | None = None,
        min_native_interval: float = 1.0,
        history_len: int = 300,
        max_duty: float | None = 0.005,
        process: psutil.Process | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = Nvml(nvml if nvml is not None else "pynvml")
        self._interval = self._next_interval = min_native_interval
        self._max_duty = max_duty
        self._process = process if process is not None else psutil.Process()
        self._clock = clock
        # _lock guards _slow, _slow_at, _history, _native and the NVML state; _logged_lock guards _logged
        self._lock = threading.Lock()
        self._logged_lock = threading.Lock()
        self._slow: _Slow | None = None
        self._slow_at = 0.0
        self._history: collections.deque[HistoryPoint] = collections.deque(maxlen=max(1, history_len))
        self._logged: set[str] = set()
        #: The native-thread rows of the last sample, with the read and the names they came from: a sample
        #: between full reads with the same names reuses them (1000 threads: 0.5 ms a snapshot otherwise).
        self._native: tuple[_Slow | None, Mapping[int, str] | None, list[NativeThread]] = (None, None, [])
        #: When the last full read was made (``clock``): callers that only want new figures compare it.
        self.read_at = 0.0
        #: The last sample, read-only (the extension keeps the cells its child processes came from).
        self.last_sample: Resources | None = None

    def sample(self, cells: Sequence[CellWindow], python_threads: Mapping[int, str]) -> Resources:
        """One picture of the resources; the expensive part is at most ``min_native_interval`` old.

        ``cells`` are the run windows of the cells (for attributing child processes); ``python_threads``
        maps native thread ids to Python thread names.
        """
        with self._lock:
            now = self._clock()
            slow = self._slow
            fresh = slow is None or now - self._slow_at >= self._next_interval
            if slow is None or fresh:
                slow = self._slow = self._read_slow()
                self._slow_at = self.read_at = now
                if self._max_duty:
                    # an expensive read that took 20 ms waits 4 s at a duty of 0.5 %, whatever the interval
                    cost = self._clock() - now
                    self._next_interval = max(self._interval, cost / self._max_duty)
                rss = slow.rss
            else:
                rss = self._guard("rss", self._rss, slow.rss)
            resources = _assemble(slow, rss, cells, self._native_rows(slow, python_threads), self._process.pid)
            self.last_sample = resources
            if fresh:
                self._history.append(_history_point(resources))
            return resources

    def invalidate(self) -> None:
        """Make the next sample a full read (``%nbcoord mem`` shows a child started a moment ago)."""
        with self._lock:
            self._slow = None

    def history(self) -> list[HistoryPoint]:
        """The history ring, oldest first: one point per expensive read, at most ``history_len``."""
        with self._lock:
            return [p.copy() for p in self._history]

    def _foreign(self) -> bool:
        """Whether this probe runs in another process than the one it watches (a forked child of it): there it
        must never report, let alone offer to signal, that process's children."""
        return os.getpid() != int(self._process.pid)

    def children(self) -> list[psutil.Process]:
        """Every live descendant of the process, read now (for the stop mechanism to terminate)."""
        if self._foreign():
            return []
        try:
            kids: list[psutil.Process] = self._process.children(recursive=True)
        except psutil.Error:
            logger.warning("nbcoord: could not list child processes", exc_info=True)
            return []
        return kids

    def children_in_cells(self, cells: Sequence[CellWindow]) -> list[tuple[psutil.Process, int | None, float]]:
        """Every live descendant read now, with the cell that started it and its exact start (for the stop)."""
        if self._foreign():
            return []
        none: list[ChildRead] = []
        rows = self._guard("children", self._read_children, none)
        cell_of = native.attribute(rows, cells, self._process.pid)
        found: list[tuple[psutil.Process, int | None, float]] = []
        for row in rows:
            try:
                found.append((psutil.Process(row.pid), cell_of.get(row.pid), row.started_at))
            except psutil.Error:
                continue  # it ended between the read and now
        return found

    def close(self) -> None:
        """Shut NVML down if this probe initialised it. A later sample initialises it again."""
        with self._lock:
            self._nvml.close()

    # -- the expensive read

    def _read_slow(self) -> _Slow:
        unknown: tuple[int, int | None] = (0, None)
        rss, uss = self._guard("memory", self._rss_uss, unknown)
        if rss == 0:
            rss = self._guard("rss", self._rss, 0)
        available, total = self._guard("host memory", _host_memory, (0, 0))
        return _Slow(
            rss=rss,
            uss=uss,
            available=available,
            total=total,
            threads=self._guard("threads", self._read_threads, []),
            children=self._guard("children", self._read_children, []),
            gpu=self._guard("gpu", self._read_gpu, GpuRead(reason="NVML error")),
            tf=self._guard(frameworks.ALLOCATOR, _read_allocator, None),
        )

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _rss_uss(self) -> tuple[int, int | None]:
        full = self._process.memory_full_info()
        return int(full.rss), int(full.uss)

    def _read_gpu(self) -> GpuRead:
        return gpu_read(self._nvml.read(), self._process.pid, psutil.pid_exists)

    def _read_threads(self) -> list[tuple[int, str, float]]:
        return native.threads(self._process)

    def _read_children(self) -> list[ChildRead]:
        return native.children(self._process)

    def _native_rows(self, slow: _Slow, names: Mapping[int, str]) -> list[NativeThread]:
        """Rows of the OS's threads, labelled with Python's names; the last ones when neither changed."""
        cached_slow, cached_names, rows = self._native
        if cached_slow is not slow or (cached_names is not names and cached_names != names):
            rows = [
                NativeThread(native_id=tid, name=name, cpu_s=cpu, python_name=names.get(tid))
                for tid, name, cpu in slow.threads
            ]
            self._native = (slow, names, rows)
        return list(rows)  # a list of its own; the rows, read-only, are shared

    def _guard(self, what: str, read: Callable[[], _T], default: _T) -> _T:
        """``read()``, or ``default`` if it fails; each kind of failure is logged once, with its traceback."""
        try:
            return read()
        except Exception:
            with self._logged_lock:  # _guard also runs outside _lock (children_in_cells, for the stop)
                first = what not in self._logged
                self._logged.add(what)
            if first:
                logger.warning("nbcoord: reading %s failed", what, exc_info=True)
            return default


def _assemble(
    slow: _Slow, rss: int, cells: Sequence[CellWindow], native_threads: list[NativeThread], own_pid: int
) -> Resources:
    """Fresh rows (callers may keep or change them) from the cached read and the current labels."""
    devices = [d.copy() for d in slow.gpu.devices]
    tf_note: str | None = None
    tf_cpu = None
    if slow.tf is not None:
        for device in devices:
            current_peak = slow.tf.gpu.get(device["index"])
            if current_peak is not None:
                device["tf_current"], device["tf_peak"] = current_peak
        tf_cpu = slow.tf.cpu
        tf_note = slow.tf.note(devices)  # also without NVML: TensorFlow may still hold a GPU
    by_pid = slow.gpu.by_pid
    cell_of = native.attribute(slow.children, cells, own_pid)
    children = [
        ChildProcess(
            pid=c.pid,
            cmdline=c.cmdline,
            status=c.status,
            rss=c.rss,
            gpu_mem=None if by_pid is None else by_pid.get(c.pid, 0),
            cell=cell_of.get(c.pid),
            started_at=c.started_at,
        )
        for c in slow.children
    ]
    return Resources(
        gpu=GpuInfo(available=bool(devices), reason=slow.gpu.reason, devices=devices, tf_note=tf_note),
        host=HostMemory(
            rss=rss,
            uss=slow.uss,
            children_rss=sum(c.rss for c in slow.children if c.rss is not None),
            available=slow.available,
            total=slow.total,
            tf_cpu_current=None if tf_cpu is None else tf_cpu[0],
            tf_cpu_peak=None if tf_cpu is None else tf_cpu[1],
        ),
        native_threads=native_threads,
        children=children,
        sampled_at=time.time(),
    )


def _read_allocator() -> AllocatorRead | None:
    """TensorFlow's allocator figures (the snapshot's ``tf_*`` fields); None if it is not imported."""
    read = frameworks.allocator()
    return read() if read is not None else None


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _history_point(res: Resources) -> HistoryPoint:
    devices = res["gpu"]["devices"]
    return HistoryPoint(
        sampled_at=res["sampled_at"],
        rss=res["host"]["rss"],
        uss=res["host"]["uss"],
        children_rss=res["host"]["children_rss"],
        host_available=res["host"]["available"],
        gpu_used=_sum_or_none(d["used"] for d in devices),
        gpu_process_used=_sum_or_none(d["process_used"] for d in devices),
        tf_gpu_current=_sum_or_none(d["tf_current"] for d in devices),
        native_threads=len(res["native_threads"]),
        children=len(res["children"]),
    )
