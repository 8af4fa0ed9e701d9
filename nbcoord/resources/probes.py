"""Resources the kernel holds: GPU and host memory, native threads, child processes.

Floor 1: this module knows no IPython and never imports TensorFlow. :class:`ResourceProbe` reads

* **GPU**, per device, through NVML (``nvidia-ml-py``, imported lazily at the first sample): the device's
  total and used memory, this process's own use (NVML's per-process list; ``process_visible`` is False
  where that list cannot show this process, as in containers without host PID visibility, rather than a
  false 0) and, when the user has imported TensorFlow and started its eager runtime, TensorFlow's
  allocator figures;
* **host** memory: the kernel's RSS and USS, its children's RSS, the machine's available memory;
* **native threads**: every OS thread of the process with its OS name and CPU time, marked with its Python
  name where it is a Python thread;
* **child processes**: every descendant with its command line, status (``zombie`` for a defunct child),
  memory, GPU memory where NVML shows it, and the cell that started it.

Costs. The expensive reads (one ``stat`` per thread, 10-30 us each; ``/proc/*/stat`` of every process on the
machine to find the children; smaps for USS; NVML) run at most once per ``min_native_interval`` seconds, and
no more often than keeps them under ``max_duty`` of one core; they are cached in between. A sample inside
that interval reads only the RSS (one small ``/proc`` read) and re-labels the cached rows. On Linux the
probe reads ``/proc`` itself where psutil would read the same files more times (psutil's ``threads()``
drops the thread's name, which would take a second read per thread); elsewhere it uses psutil. Nothing here
runs on a hot path: the probe is called by views (report, panel), never by thread or cell hooks.

Everything is plain JSON (``str``/``int``/``float``/``bool``/``None``/lists/dicts), described by the
TypedDicts below.
"""

from __future__ import annotations

import collections
import importlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple, TypedDict, TypeVar

import psutil

logger = logging.getLogger("nbcoord")
_T = TypeVar("_T")

#: Why the GPU section is empty.
NO_LIBRARY = "nvidia-ml-py not installed"
NO_DRIVER = "no NVIDIA driver"
DRIVER_NOT_LOADED = "NVIDIA driver not loaded"
NO_DEVICE = "no device"

#: Said when TensorFlow holds GPU memory: its allocator keeps what it reserved until the process exits.
TF_HOLDS_GPU = (
    "TensorFlow keeps the GPU memory it has reserved until the kernel process exits: deleting tensors, "
    "models or sessions does not return it to the device; restarting the kernel does."
)
#: Said when TensorFlow is loaded but its eager runtime has not started (graph-mode sessions do not start it).
TF_NOT_STARTED = (
    "TensorFlow is loaded but its eager runtime has not started, so its allocator figures are not read "
    "(reading them would start it and fix its GPU settings)."
)

_PROC = "/proc"
# Linux: read /proc directly where psutil would read the same files more times (see _threads_linux)
_HAS_PROC = os.path.isdir(f"{_PROC}/self/task") and hasattr(time, "CLOCK_BOOTTIME")
_CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
_CMDLINE_MAX = 500


class CellWindow(NamedTuple):
    """When a cell ran, in ``time.time()`` seconds; ``ended_at`` is None while it runs."""

    execution_count: int
    started_at: float
    ended_at: float | None


class GpuDevice(TypedDict):
    """One GPU as NVML sees it, with this process's share and TensorFlow's allocator."""

    index: int
    name: str
    total: int
    used: int
    process_used: int | None  # this process, from NVML's per-process list; None when not visible
    process_visible: bool  # False: NVML's list cannot show this process (see _own_gpu_use)
    tf_current: int | None  # TensorFlow's allocator; None when not read
    tf_peak: int | None


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


# --- cells -------------------------------------------------------------------------------------------------


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


# --- NVML --------------------------------------------------------------------------------------------------


def _own_gpu_use(
    procs: Sequence[Any] | None, own_pid: int, pid_exists: Callable[[int], bool]
) -> tuple[int | None, bool]:
    """This process's memory on one device from NVML's process list: ``(bytes or None, visible)``.

    NVML lists processes by the PIDs of the host's namespace. In a container without host PID visibility
    the list is empty, or holds PIDs that do not exist here; either way it cannot show this process, so
    the answer is "not visible" rather than 0. An empty list on a host where nothing uses the device is
    indistinguishable from that case, and is reported the same way.
    """
    if not procs:
        return None, False
    own = [p for p in procs if p.pid == own_pid]
    if own:
        used = [p.usedGpuMemory for p in own]
        # usedGpuMemory is None where the driver cannot tell (Windows WDDM)
        return (None if None in used else sum(used)), True
    if not any(pid_exists(p.pid) for p in procs):
        return None, False  # PIDs of another namespace: this process may be among them, unseen
    return 0, True


@dataclass
class _GpuRead:
    reason: str | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    by_pid: dict[int, int] | None = None  # memory per PID over devices whose process list is visible


class _Nvml:
    """NVML, initialised at first use. An initialisation that failed is not retried: it does not heal."""

    def __init__(self, module: ModuleType | None) -> None:
        self._module = module
        self._initialised = False
        self._reason: str | None = None

    def _ensure(self) -> ModuleType | None:
        if self._initialised or self._reason is not None:
            return self._module if self._initialised else None
        module = self._module
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError:
                self._reason = NO_LIBRARY
                return None
            self._module = module
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            self._reason = _init_failure(module, exc)
            logger.debug("nbcoord: NVML not usable: %s", self._reason, exc_info=True)
            return None
        self._initialised = True
        return module

    def read(self, own_pid: int, pid_exists: Callable[[int], bool]) -> _GpuRead:
        nvml = self._ensure()
        if nvml is None:
            return _GpuRead(reason=self._reason)
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            return _GpuRead(reason=f"NVML error: {exc}")
        if count == 0:
            return _GpuRead(reason=NO_DEVICE)
        read = _GpuRead()
        for index in range(count):
            try:
                read.devices.append(self._device(nvml, index, own_pid, pid_exists, read))
            except nvml.NVMLError as exc:
                logger.debug("nbcoord: NVML device %d unreadable: %s", index, exc, exc_info=True)
        if not read.devices:
            read.reason = "NVML error: no device readable"
        return read

    @staticmethod
    def _device(
        nvml: ModuleType, index: int, own_pid: int, pid_exists: Callable[[int], bool], read: _GpuRead
    ) -> GpuDevice:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        try:
            procs: list[Any] | None = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:
            # NOT_SUPPORTED or NO_PERMISSION (an NVMLError), or pynvml's NVMLLibraryMismatchError where the
            # driver is older than the binding: the list is not visible here, the device's figures still are
            logger.debug("nbcoord: NVML process list of device %d unreadable", index, exc_info=True)
            procs = None
        process_used, visible = _own_gpu_use(procs, own_pid, pid_exists)
        if visible and procs:
            by_pid = read.by_pid if read.by_pid is not None else {}
            for p in procs:
                by_pid[p.pid] = by_pid.get(p.pid, 0) + (p.usedGpuMemory or 0)
            read.by_pid = by_pid
        return GpuDevice(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            total=int(memory.total),
            used=int(memory.used),
            process_used=process_used,
            process_visible=visible,
            tf_current=None,
            tf_peak=None,
        )

    def close(self) -> None:
        if self._initialised and self._module is not None:
            self._initialised = False
            try:
                self._module.nvmlShutdown()
            except self._module.NVMLError:
                logger.debug("nbcoord: nvmlShutdown failed", exc_info=True)


def _init_failure(nvml: ModuleType, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return NO_DRIVER  # libnvidia-ml.so ships with the driver
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return DRIVER_NOT_LOADED
    return f"NVML error: {exc}"


# --- TensorFlow (only if the user imported it) -------------------------------------------------------------


@dataclass
class _TfRead:
    started: bool = False  # the eager runtime exists, so figures could be read
    gpu_devices: int = 0  # TensorFlow's GPU devices: each holds its allocator's reservation
    gpu: dict[int, tuple[int, int]] = field(default_factory=dict)  # NVML index -> (current, peak)
    cpu: tuple[int, int] | None = None


def _tf_runtime_started() -> bool:
    """Whether TensorFlow's eager context is initialised, asked without initialising it (its private names sit
    with the integration's, in nbcoord/tensorflow/internals.py; that module imports nothing of TensorFlow)."""
    from nbcoord.tensorflow.internals import eager_runtime_started

    return eager_runtime_started()


def _nvml_index(tf_index: int) -> int:
    """NVML's index of TensorFlow's ``GPU:i``, through CUDA_VISIBLE_DEVICES when it lists indices.

    Assumes CUDA orders devices as NVML does (always true with one GPU; set CUDA_DEVICE_ORDER=PCI_BUS_ID
    otherwise).
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if tf_index < len(visible) and visible[tf_index].isdigit():
        return int(visible[tf_index])
    return tf_index


def _tf_memory() -> _TfRead | None:
    """TensorFlow's allocator figures; None if the user has not imported TensorFlow. Never imports it, and
    never starts its runtime."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    read = _TfRead(started=_tf_runtime_started())
    if not read.started:
        return read
    get_memory_info = tf.config.experimental.get_memory_info
    gpus = tf.config.list_logical_devices("GPU")
    read.gpu_devices = len(gpus)
    for tf_index in range(len(gpus)):
        try:
            info = get_memory_info(f"GPU:{tf_index}")
        except ValueError:  # a device without allocator statistics
            continue
        read.gpu[_nvml_index(tf_index)] = (int(info["current"]), int(info["peak"]))
    try:
        info = get_memory_info("CPU:0")
    except ValueError:  # a build whose CPU allocator keeps no statistics
        pass
    else:
        read.cpu = (int(info["current"]), int(info["peak"]))
    return read


def _tf_note(tf: _TfRead, devices: Sequence[GpuDevice]) -> str | None:
    if tf.started:
        # TensorFlow's GPU devices reserve their memory when created, before any tensor exists
        holds = tf.gpu_devices > 0 or any(d["tf_peak"] for d in devices)
    else:
        # graph-mode sessions hold GPU memory without starting the eager runtime
        holds = any(d["process_used"] for d in devices)
    if holds:
        return TF_HOLDS_GPU
    if not tf.started and devices:  # only where there is a GPU to speak of
        return TF_NOT_STARTED
    return None


# --- threads and processes ---------------------------------------------------------------------------------


def _host_memory() -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _read_small(path: str) -> bytes | None:
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


_STATUS = {  # /proc/<pid>/stat's state letter, in psutil's words
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


class _Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` (or ``/proc/<pid>/task/<tid>/stat``) that the probe uses."""

    comm: str
    state: str
    ppid: int
    cpu_s: float  # user + system
    start_ticks: int  # clock ticks since boot


def _read_stat(path: str) -> _Stat | None:
    data = _read_small(path)
    if not data:
        return None
    close = data.rfind(b")")  # the name may itself hold spaces and parentheses
    fields = data[close + 2 :].split()
    return _Stat(
        comm=data[data.find(b"(") + 1 : close].decode("utf-8", "replace"),
        state=fields[0].decode(),
        ppid=int(fields[1]),
        cpu_s=(int(fields[11]) + int(fields[12])) / _CLOCK_TICKS,  # fields 14 and 15, utime and stime
        start_ticks=int(fields[19]),  # field 22, starttime
    )


def _boot_to_wall() -> float:
    """Add to seconds since boot to get ``time.time()`` seconds.

    Not psutil's ``create_time()``: it adds the boot time from ``/proc/stat``, which Linux gives in whole
    seconds, so it can be up to a second off ``time.time()``, too coarse to tell which cell started a process.
    ``CLOCK_BOOTTIME`` makes a process's start exact to the clock tick (10 ms).
    """
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _threads_linux(pid: int) -> list[tuple[int, str, float]]:
    """Every thread of ``pid`` with its OS name and CPU time: one read of its ``stat`` each (psutil's
    ``threads()`` reads the same file but drops the name, which would take a second read of ``comm``)."""
    rows = []
    for entry in os.listdir(f"{_PROC}/{pid}/task"):
        stat = _read_stat(f"{_PROC}/{pid}/task/{entry}/stat")
        if stat is not None:  # None: the thread ended meanwhile
            rows.append((int(entry), stat.comm, stat.cpu_s))
    return rows


def thread_cpu_seconds(native_id: int) -> float | None:
    """CPU time (user + system) of one thread of this process, from ``/proc``; None where unavailable.

    About 18 us a call here. Safe for any id: a thread that ended just gives None (unlike
    ``pthread_getcpuclockid``, which is undefined behaviour on a thread that is gone).
    """
    if not _HAS_PROC:
        return None
    stat = _read_stat(f"{_PROC}/self/task/{native_id}/stat")
    return None if stat is None else stat.cpu_s


def _threads_psutil(process: psutil.Process) -> list[tuple[int, str, float]]:
    return [(t.id, "", t.user_time + t.system_time) for t in process.threads()]


class _ChildRead(NamedTuple):
    pid: int
    ppid: int
    cmdline: str
    status: str
    rss: int | None
    started_at: float


def _command_line(args: Sequence[str], name: str, status: str) -> str:
    cmdline = " ".join(args) if args else f"[{name}]"
    if status == psutil.STATUS_ZOMBIE:
        cmdline += " <defunct>"
    return cmdline if len(cmdline) <= _CMDLINE_MAX else cmdline[: _CMDLINE_MAX - 1] + "\u2026"


def _children_linux(root: int) -> list[_ChildRead]:
    """Every descendant of ``root``: one pass over ``/proc/*/stat`` (as psutil's ``children()`` makes, but
    keeping what it reads), then ``statm`` and ``cmdline`` of the descendants alone."""
    by_parent: dict[int, list[tuple[int, _Stat]]] = collections.defaultdict(list)
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            stat = _read_stat(f"{_PROC}/{entry}/stat")
            if stat is not None:
                by_parent[stat.ppid].append((int(entry), stat))
    offset, page = _boot_to_wall(), os.sysconf("SC_PAGE_SIZE")
    rows, todo, seen = [], [root], {root}
    while todo:
        for pid, stat in by_parent.get(todo.pop(), []):
            if pid in seen:
                continue  # PIDs reused during the pass can make a cycle
            seen.add(pid)
            todo.append(pid)
            statm = _read_small(f"{_PROC}/{pid}/statm")
            raw_args = _read_small(f"{_PROC}/{pid}/cmdline") or b""
            args = [a.decode("utf-8", "replace") for a in raw_args.split(b"\0") if a]
            status = _STATUS.get(stat.state, stat.state)
            rows.append(
                _ChildRead(
                    pid=pid,
                    ppid=stat.ppid,
                    cmdline=_command_line(args, stat.comm, status),
                    status=status,
                    rss=int(statm.split()[1]) * page if statm else None,
                    started_at=offset + stat.start_ticks / _CLOCK_TICKS,
                )
            )
    return rows


def _children_psutil(process: psutil.Process) -> list[_ChildRead]:
    rows = []
    for proc in process.children(recursive=True):
        try:
            with proc.oneshot():
                ppid, status, name = proc.ppid(), proc.status(), proc.name()
                started_at: float = proc.create_time()
                rss: int | None = None
                args: list[str] = []
                try:
                    rss = proc.memory_info().rss
                    args = proc.cmdline()
                except (psutil.ZombieProcess, psutil.AccessDenied):
                    pass  # a zombie has no command line left (catch ZombieProcess before NoSuchProcess)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended meanwhile
        rows.append(_ChildRead(proc.pid, ppid, _command_line(args, name, status), str(status), rss, started_at))
    return rows


def _attribute(children: Sequence[_ChildRead], cells: Sequence[CellWindow], own_pid: int) -> dict[int, int | None]:
    """The cell of every descendant.

    A direct child belongs to the cell whose window holds its start; a deeper descendant (a shell's command, a
    pool's worker) to the cell of its ancestor among our direct children, which is what started it.
    """
    by_pid = {c.pid: c for c in children}
    tick = 1.0 / _CLOCK_TICKS if _HAS_PROC else 0.0  # Linux records starts in ticks, others precisely
    cell: dict[int, int | None] = {}

    def resolve(child: _ChildRead, depth: int = 0) -> int | None:
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


# --- the probe ---------------------------------------------------------------------------------------------


@dataclass
class _Slow:
    """The figures read at most once per ``min_native_interval``."""

    rss: int
    uss: int | None
    available: int
    total: int
    threads: list[tuple[int, str, float]]  # native id, OS name, CPU seconds
    children: list[_ChildRead]
    gpu: _GpuRead
    tf: _TfRead | None  # None: TensorFlow not imported


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
        self._nvml = _Nvml(nvml)
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
        none: list[_ChildRead] = []
        rows = self._guard("children", self._read_children, none)
        cell_of = _attribute(rows, cells, self._process.pid)
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
            gpu=self._guard("gpu", self._read_gpu, _GpuRead(reason="NVML error")),
            tf=self._guard("tensorflow", _tf_memory, None),
        )

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _rss_uss(self) -> tuple[int, int | None]:
        full = self._process.memory_full_info()
        return int(full.rss), int(full.uss)

    def _read_gpu(self) -> _GpuRead:
        return self._nvml.read(self._process.pid, psutil.pid_exists)

    def _read_threads(self) -> list[tuple[int, str, float]]:
        rows = _threads_linux(self._process.pid) if _HAS_PROC else _threads_psutil(self._process)
        return sorted(rows)

    def _read_children(self) -> list[_ChildRead]:
        rows = _children_linux(self._process.pid) if _HAS_PROC else _children_psutil(self._process)
        return sorted(rows, key=lambda r: (r.started_at, r.pid))

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
        tf_note = _tf_note(slow.tf, devices)  # also without NVML: TensorFlow may still hold a GPU
    by_pid = slow.gpu.by_pid
    cell_of = _attribute(slow.children, cells, own_pid)
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
