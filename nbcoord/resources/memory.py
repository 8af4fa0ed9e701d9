"""A memory ledger per cell: which cell took the memory, and whether it is still held.

For each cell: this process's resident memory (RSS) before and after it, and the peak while it ran; this process's
GPU memory per device (NVML, through :class:`~nbcoord.resources.probes.ResourceProbe`) before, after and at
its peak as sampled; and, at every snapshot, whether the growth is still there now. Views read it as the snapshot's
``cell_memory`` section (one :class:`CellMemory` row per cell, newest last): ``%nbcoord``, the JSON and the panel
("cell [7]: +2.1 GiB on GPU 0, still held").

What is exact and what is sampled:

- RSS before and after: read at the cell's start and end from ``/proc/self/statm`` (one ``pread`` on a file kept
  open, about 2 us; psutil elsewhere);
- RSS peak: exact when the cell raised the process's lifetime peak (``getrusage``'s ``ru_maxrss``, read at start and
  end, about 0.5 us with ``RUSAGE_THREAD`` on Linux, which reports the process's memory map's high-water mark: the
  cell that takes the most memory is always caught); otherwise the highest of the monitor's
  samples (about one a second), before and after: a lower bound, and ``rss_peak_exact`` says which;
- GPU: from the probe's reads (NVML's per-process list; at most one read a second, fewer at high thread counts):
  before is the last read before the cell started, after the first read after it ended, peak the highest read while
  it ran. A cell shorter than the reads' spacing may share its figures with its neighbours.

The per-cell hook (a cell listener, on the main thread) only reads those two counters and the probe's last sample:
a few microseconds whatever the number of threads. The sampling happens on nbcoord's monitor thread (a monitor task)
and in the snapshot source. In a forked child the ledger does nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import psutil

from nbcoord.core import fork as _fork
from nbcoord.core.records import CellInfo
from nbcoord.core.snapshot import CellGpuRow, CellMemory
from nbcoord.resources.probes import ResourceProbe, Resources, format_bytes

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

#: Cells kept in the ledger (the oldest is forgotten first).
KEEP_CELLS = 100
#: Growth smaller than this is not called growth ("held" needs at least this much, half of it still there).
NOTABLE_BYTES = 16 * 2**20
#: Changes smaller than this are left out of a row's summary.
SHOWN_BYTES = 2**20
#: Once judged, a cell's host growth changes between held and given back only when what remains of it moved this
#: far past the half-way mark (or a tenth of the growth, if more): the process's RSS moves by a few MiB on its own,
#: and a row should not flicker between "still held" and "given back" with it. (GPU memory, allocated in large
#: blocks by the frameworks' allocators, does not drift that way: its verdict has no margin.)
HELD_MARGIN_BYTES = 2 * 2**20

try:
    import resource as _resource
except ImportError:  # Windows
    _resource = None  # type: ignore[assignment]
#: ru_maxrss is in KiB on Linux and in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def growth_held(before: int | None, after: int | None, now: int | None, was_held: bool | None = None) -> bool:
    """Whether a notable growth from ``before`` to ``after`` is still (at least half) there ``now``; given the last
    verdict ``was_held``, it changes only past a margin (HELD_MARGIN_BYTES) around the half-way mark."""
    if before is None or after is None or now is None:
        return False
    grew = after - before
    if grew < NOTABLE_BYTES:
        return False
    half = grew / 2
    if was_held is not None:
        half += -max(HELD_MARGIN_BYTES, grew / 10) if was_held else max(HELD_MARGIN_BYTES, grew / 10)
    return now - before >= half


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def _gpu_of(sample: Resources | None) -> dict[int, int] | None:
    """This process's memory per GPU device in a probe sample; None when no device shows it."""
    if sample is None:
        return None
    found = {d["index"]: d["process_used"] for d in sample["gpu"]["devices"] if d["process_used"] is not None}
    return found or None


class _CellRecord:
    """One cell's figures (written by the hook on the main thread and by the monitor, under the ledger's lock)."""

    __slots__ = (
        "cell",
        "ended_at",
        "ended_mono",
        "gpu_after",
        "gpu_before",
        "gpu_peak",
        "maxrss_after",
        "maxrss_before",
        "row_cache",
        "rss_after",
        "rss_before",
        "rss_held",
        "rss_peak",
        "started_at",
        "started_mono",
    )

    def __init__(self, cell: CellInfo, rss: int | None, maxrss: int | None, gpu: dict[int, int] | None) -> None:
        self.cell = cell
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.ended_at: float | None = None
        self.ended_mono: float | None = None
        self.rss_before = rss
        self.rss_after: int | None = None
        self.rss_peak = rss
        self.maxrss_before = maxrss
        self.maxrss_after: int | None = None
        self.gpu_before = gpu
        self.gpu_after: dict[int, int] | None = None
        self.gpu_peak: dict[int, int] = dict(gpu) if gpu else {}
        #: The last verdict on whether the cell's host growth is still held (None: not judged yet).
        self.rss_held: bool | None = None
        #: A finished cell's last row and what it was judged against (see MemoryLedger.rows).
        self.row_cache: tuple[tuple[bool, dict[int, int] | None, bool], CellMemory] | None = None


class _RssReader:
    """This process's RSS, cheaply: ``pread`` of ``/proc/self/statm`` on a descriptor kept open (Linux); psutil
    elsewhere."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._process = psutil.Process()
        self._fd: int | None = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None

    def __call__(self) -> int | None:
        fd = self._fd
        try:
            if fd is not None:
                return int(os.pread(fd, 128, 0).split()[1]) * self._page
            return int(self._process.memory_info().rss)
        except (OSError, ValueError, IndexError, psutil.Error):
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


#: Linux answers RUSAGE_THREAD with the process's own high-water mark too (its memory map's), in about 0.5 us;
#: RUSAGE_SELF sums every thread's usage first (23 us at 1000 threads).
_RUSAGE = getattr(_resource, "RUSAGE_THREAD", None) if sys.platform.startswith("linux") else None
if _RUSAGE is None and _resource is not None:
    _RUSAGE = _resource.RUSAGE_SELF


def _maxrss() -> int | None:
    """The process's peak RSS so far (one getrusage call)."""
    if _resource is None or _RUSAGE is None:
        return None
    return int(_resource.getrusage(_RUSAGE).ru_maxrss) * _MAXRSS_UNIT


class MemoryLedger:
    """The per-cell memory ledger of one loaded extension (see the module docstring).

    Parameters
    ----------
    probe
        The extension's resource probe: the ledger reads its last sample (GPU figures) and never samples itself.
    keep
        How many cells are kept.
    """

    def __init__(self, probe: ResourceProbe, *, keep: int = KEEP_CELLS) -> None:
        self._probe = probe
        self._rss = _RssReader()
        # Guards _running, _done and every record's fields.
        self._lock = threading.Lock()
        self._running: _CellRecord | None = None
        self._done: deque[_CellRecord] = deque(maxlen=keep)
        # The last sample the hook looked at, and its GPU figures (a sample is read once, however many cells).
        self._seen: tuple[Resources | None, dict[int, int] | None] = (None, None)
        self._active = True
        self._undo: list[Callable[[], None]] = []

    # --------------------------------------------------------------------------- the hook (main thread)
    def on_cell(self, event: str, cell: CellInfo) -> None:
        """The cell listener: figures at a cell's start and end."""
        if not self._active:
            return
        rss, maxrss = self._rss(), _maxrss()
        if event == "started":
            started = _CellRecord(cell, rss, maxrss, self._gpu_now())
            with self._lock:
                self._running = started
            return
        if event != "finished":
            return
        with self._lock:
            record: _CellRecord | None = self._running
            self._running = None
            if record is None or record.cell is not cell:
                return
            record.ended_at = time.time()
            record.ended_mono = time.monotonic()
            record.rss_after = rss
            record.maxrss_after = maxrss
            if rss is not None:
                record.rss_peak = max(record.rss_peak or 0, rss)
            self._done.append(record)

    def _gpu_now(self) -> dict[int, int] | None:
        sample = self._probe.last_sample
        seen, gpu = self._seen
        if sample is not seen:
            gpu = _gpu_of(sample)
            self._seen = (sample, gpu)
        return gpu

    # --------------------------------------------------------------------------- the monitor (its thread)
    def tick(self) -> bool:
        """The monitor's task: the running cell's peaks, and the GPU figures of cells that ended since. Whether a
        cell runs or one still waits for its figures (then the monitor keeps its base interval)."""
        if not self._active:
            return False
        sample = self._probe.last_sample
        if sample is None:
            return self._running is not None
        read_at = self._probe.read_at  # when the GPU figures in the sample were read (the probe's clock)
        rss = sample["host"]["rss"]
        gpu = _gpu_of(sample)
        with self._lock:
            running = self._running
            if running is not None:
                running.rss_peak = max(running.rss_peak or 0, rss)
                if gpu is not None and read_at >= running.started_mono:
                    for index, used in gpu.items():
                        running.gpu_peak[index] = max(running.gpu_peak.get(index, 0), used)
            waiting = False
            for record in reversed(self._done):
                if record.gpu_after is not None or record.ended_mono is None:
                    break  # older ones have theirs
                if read_at >= record.ended_mono:
                    record.gpu_after = gpu if gpu is not None else {}
                else:
                    waiting = True
            return running is not None or waiting

    def _forget_in_child(self) -> None:
        self._active = False

    def attach(self, host: Host) -> None:
        """Plug into ``host`` (see :func:`install`)."""
        self._undo.append(_fork.on_fork_child(self._forget_in_child))
        self._undo.append(host.add_cell_listener("memory", self.on_cell))
        self._undo.append(host.monitor.add_task("memory", self.tick))
        self._undo.append(host.snapshots.add_source("cell_memory", self.section))

    def uninstall(self) -> None:
        """Remove what :meth:`attach` added and close the RSS reader; never raises."""
        self._active = False
        while self._undo:
            step = self._undo.pop()
            try:
                step()
            except Exception:
                log.warning("nbcoord: removing part of the memory ledger failed", exc_info=True)
        self._rss.close()

    # --------------------------------------------------------------------------------------- the view
    def section(self) -> dict[str, Any]:
        """The snapshot source: ``{"cell_memory": [CellMemory, ...]}``, oldest cell first, the running one last."""
        return {"cell_memory": self.rows()}

    def rows(self) -> list[CellMemory]:
        """Every kept cell as a row, judged against the memory held now."""
        rss_now = self._rss() if self._active else None
        gpu_now = self._gpu_now()
        rows: list[CellMemory] = []
        with self._lock:
            for record in self._done:
                # A finished cell's row changes only with what it is judged against: whether its host growth is
                # still held, the GPU figures now and its own GPU figures arriving.
                held = False
                if rss_now is not None:
                    held = record.rss_held = growth_held(record.rss_before, record.rss_after, rss_now, record.rss_held)
                key = (held, gpu_now, record.gpu_after is None)
                cached = record.row_cache
                if cached is not None and cached[0] == key:
                    row = cached[1].copy()
                    row["rss_now"] = rss_now
                else:
                    row = _row(record, rss_now, gpu_now, held)
                    record.row_cache = (key, row.copy())
                rows.append(row)
            if self._running is not None:  # (held: said of finished cells only)
                rows.append(_row(self._running, rss_now, gpu_now, False))
        return rows


def _row(record: _CellRecord, rss_now: int | None, gpu_now: Mapping[int, int] | None, rss_held: bool) -> CellMemory:
    """One cell as a row (under the ledger's lock); ``rss_held``: the verdict on its host growth."""
    rss_peak = record.rss_peak
    exact = False
    if (
        record.maxrss_after is not None
        and record.maxrss_before is not None
        and record.maxrss_after > record.maxrss_before
    ):
        rss_peak, exact = record.maxrss_after, True  # the process's own high-water mark, reached in this cell
    before, after = record.gpu_before or {}, record.gpu_after
    indices = sorted(set(before) | set(after or {}) | set(record.gpu_peak) | set(gpu_now or {}))
    devices = [
        CellGpuRow(
            index=i,
            before=before.get(i),
            after=after.get(i) if after is not None else None,
            peak=record.gpu_peak.get(i),
            now=gpu_now.get(i) if gpu_now is not None else None,
        )
        for i in indices
    ]
    gpu_held = any(growth_held(d["before"], d["after"], d["now"]) for d in devices)
    row = CellMemory(
        cell=record.cell.execution_count,
        rss_before=record.rss_before,
        rss_after=record.rss_after,
        rss_peak=rss_peak,
        gpu_before=_total(d["before"] for d in devices),
        gpu_after=_total(d["after"] for d in devices),
        gpu_peak=_total(d["peak"] for d in devices),
        held=rss_held or gpu_held,
        started_at=record.started_at,
        ended_at=record.ended_at,
        rss_now=rss_now,
        rss_peak_exact=exact,
        rss_held=rss_held,
        gpu_held=gpu_held,
        gpu_devices=devices,
        summary="",
    )
    row["summary"] = summary(row)
    return row


def _total(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def summary(row: CellMemory) -> str:
    """One row in words: ``cell [7]: +2.1 GiB on GPU 0, still held``."""
    head = f"cell [{row['cell']}]"
    if row["ended_at"] is None:
        if row["rss_before"] is not None and row["rss_now"] is not None:
            return f"{head}: running, {_signed(row['rss_now'] - row['rss_before'])} host so far"
        return f"{head}: running"
    parts: list[str] = []
    before, after, peak = row["rss_before"], row["rss_after"], row["rss_peak"]
    if before is not None and after is not None:
        grew = after - before
        part = f"{_signed(grew)} host" if abs(grew) >= SHOWN_BYTES else ""
        if peak is not None and peak - max(before, after) >= NOTABLE_BYTES:
            part = (part + " " if part else "") + f"(peak {_signed(peak - before)})"
        if part:
            parts.append(part)
    for device in row["gpu_devices"]:
        if device["before"] is not None and device["after"] is not None:
            grew = device["after"] - device["before"]
            if abs(grew) >= SHOWN_BYTES:
                parts.append(f"{_signed(grew)} on GPU {device['index']}")
    if not parts:
        return f"{head}: no notable change"
    notable = (before is not None and after is not None and after - before >= NOTABLE_BYTES) or any(
        d["before"] is not None and d["after"] is not None and d["after"] - d["before"] >= NOTABLE_BYTES
        for d in row["gpu_devices"]
    )
    state = ", still held" if row["held"] else (", given back" if notable else "")
    return f"{head}: {', '.join(parts)}{state}"


def install(host: Host, probe: ResourceProbe) -> MemoryLedger:
    """Install the ledger for ``host``, reading ``probe``'s samples: a cell listener, a monitor task, the
    ``cell_memory`` snapshot source and a fork-child action. ``uninstall()`` on the result removes exactly those."""
    ledger = MemoryLedger(probe)
    try:
        ledger.attach(host)
    except BaseException:
        ledger.uninstall()
        raise
    return ledger
