"""GPU memory by process, read by the server through the one NVML reader (:mod:`nbcoord.resources.nvml`): works for
every kernel, with nbcoord or without.

NVML (``nvidia-ml-py``, the ``gpu`` extra) lists the compute processes of each device with their memory. The server
reads that list once per view and attributes each entry to a kernel by pid: the kernel's own process, and its
descendants (data-loader workers, pool processes) apart.

NVML lists processes by the pids of the host's namespace. Where the server runs in a container that cannot see the
host's pids, no listed pid exists here: the device is marked ``processes_visible: false`` and its memory is
attributed to no kernel, rather than reported as 0.

Initialisation is tried once; a failure (no library, no driver) is kept as the reason and not retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import psutil

from nbcoord.resources import nvml
from nbcoord.resources.nvml import Unavailable

NO_LIBRARY = "nvidia-ml-py is not installed in the server's environment"


class GpuRow(TypedDict):
    """One device in the server's view (the kernel's snapshot has its own row, ``nbcoord.resources.gpu``)."""

    index: int
    name: str
    total: int
    used: int
    processes_visible: bool  # False: NVML's process list cannot be matched to pids here (or is not readable)


class GpuStatus(TypedDict):
    """The devices, or why there are none."""

    available: bool
    reason: str | None
    devices: list[GpuRow]


@dataclass
class GpuRead:
    """One read: the devices, and memory per pid per device index."""

    status: GpuStatus
    by_pid: dict[int, dict[int, int]] = field(default_factory=dict)


def _no_gpu(reason: str) -> GpuRead:
    return GpuRead(GpuStatus(available=False, reason=reason, devices=[]))


def _reason(unavailable: Unavailable) -> str:
    """Why there are no devices, in the server's words."""
    kind, detail = unavailable.kind, unavailable.detail
    if kind == "library":
        return NO_LIBRARY
    if kind in ("driver", "driver-not-loaded", "start"):
        return f"NVML could not start: {detail}"
    if kind == "no-device":
        return "no GPU device"
    if kind == "unreadable":
        return "NVML error: no device readable"
    return f"NVML error: {detail}"


class Nvml:
    """The server's GPU reader: the one NVML reader, attributed by pid; thread-safe (reads run on the server's
    worker thread).

    Parameters
    ----------
    module_name
        The binding to import, ``pynvml`` (package ``nvidia-ml-py``); tests name a fake.
    pid_exists
        Whether a pid exists here (to tell a foreign pid namespace); tests pass their own.
    """

    def __init__(self, module_name: str = "pynvml", pid_exists: Callable[[int], bool] = psutil.pid_exists) -> None:
        self._reader = nvml.Nvml(module_name)
        self._pid_exists = pid_exists

    def read(self) -> GpuRead:
        """Every device, and each listed process's memory on it."""
        reading = self._reader.read()
        if reading.unavailable is not None:
            return _no_gpu(_reason(reading.unavailable))
        read = GpuRead(GpuStatus(available=True, reason=None, devices=[]))
        for device in reading.devices:
            read.status["devices"].append(self._row(device, read.by_pid))
        return read

    def _row(self, device: nvml.Device, by_pid: dict[int, dict[int, int]]) -> GpuRow:
        processes = device.processes
        visible = bool(processes) and any(self._pid_exists(p.pid) for p in processes or [])
        if processes is not None and (visible or not processes):
            visible = True  # an empty list is a device nobody uses, as far as anyone here can tell
            for process in processes:
                per_device = by_pid.setdefault(process.pid, {})
                per_device[device.index] = per_device.get(device.index, 0) + (process.used or 0)
        return GpuRow(
            index=device.index,
            name=device.name,
            total=device.total,
            used=device.used,
            processes_visible=visible,
        )

    def close(self) -> None:
        """Shut NVML down if it was started here."""
        self._reader.close()
