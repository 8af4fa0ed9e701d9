"""GPU memory by process, read by the server through NVML: works for every kernel, with nbcoord or without.

NVML (``nvidia-ml-py``, the ``gpu`` extra) lists the compute processes of each device with their memory. The server
reads that list once per view and attributes each entry to a kernel by pid: the kernel's own process, and its
descendants (data-loader workers, pool processes) apart.

NVML lists processes by the pids of the host's namespace. Where the server runs in a container that cannot see the
host's pids, no listed pid exists here: the device is marked ``processes_visible: false`` and its memory is
attributed to no kernel, rather than reported as 0.

Initialisation is tried once; a failure (no library, no driver) is kept as the reason and not retried.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypedDict

import psutil

log = logging.getLogger("nbcoord.server")

NO_LIBRARY = "nvidia-ml-py is not installed in the server's environment"


class GpuDevice(TypedDict):
    """One device as NVML sees it."""

    index: int
    name: str
    total: int
    used: int
    processes_visible: bool  # False: NVML's process list cannot be matched to pids here (or is not readable)


class GpuStatus(TypedDict):
    """The devices, or why there are none."""

    available: bool
    reason: str | None
    devices: list[GpuDevice]


@dataclass
class GpuRead:
    """One read: the devices, and memory per pid per device index."""

    status: GpuStatus
    by_pid: dict[int, dict[int, int]] = field(default_factory=dict)


def _no_gpu(reason: str) -> GpuRead:
    return GpuRead(GpuStatus(available=False, reason=reason, devices=[]))


class Nvml:
    """NVML, initialised at first read; thread-safe (reads run on the server's worker thread).

    Parameters
    ----------
    module_name
        The binding to import, ``pynvml`` (package ``nvidia-ml-py``); tests name a fake.
    pid_exists
        Whether a pid exists here (to tell a foreign pid namespace); tests pass their own.
    """

    def __init__(self, module_name: str = "pynvml", pid_exists: Callable[[int], bool] = psutil.pid_exists) -> None:
        self._module_name = module_name
        self._pid_exists = pid_exists
        self._lock = threading.Lock()  # guards _module and _reason
        self._module: ModuleType | None = None
        self._reason: str | None = None

    def _ensure(self) -> ModuleType | None:
        if self._module is not None or self._reason is not None:
            return self._module
        try:
            module = importlib.import_module(self._module_name)
        except ImportError:
            self._reason = NO_LIBRARY
            return None
        try:
            module.nvmlInit()
        except Exception as error:  # NVMLError: no driver, driver not loaded, ...
            self._reason = f"NVML could not start: {error}"
            log.info("nbcoord: no GPU figures: %s", self._reason)
            return None
        self._module = module
        return module

    def read(self) -> GpuRead:
        """Every device, and each listed process's memory on it."""
        with self._lock:
            nvml = self._ensure()
            if nvml is None:
                return _no_gpu(self._reason or NO_LIBRARY)
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as error:
                return _no_gpu(f"NVML error: {error}")
            if count == 0:
                return _no_gpu("no GPU device")
            read = GpuRead(GpuStatus(available=True, reason=None, devices=[]))
            for index in range(count):
                try:
                    read.status["devices"].append(self._device(nvml, index, read.by_pid))
                except Exception:
                    log.debug("nbcoord: NVML device %d unreadable", index, exc_info=True)
            if not read.status["devices"]:
                return _no_gpu("NVML error: no device readable")
            return read

    def _device(self, nvml: ModuleType, index: int, by_pid: dict[int, dict[int, int]]) -> GpuDevice:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        try:
            processes: list[Any] | None = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:  # NOT_SUPPORTED, NO_PERMISSION: the device's figures are still there
            log.debug("nbcoord: NVML process list of device %d unreadable", index, exc_info=True)
            processes = None
        visible = bool(processes) and any(self._pid_exists(p.pid) for p in processes or [])
        if processes is not None and (visible or not processes):
            visible = True  # an empty list is a device nobody uses, as far as anyone here can tell
            for process in processes:
                used = getattr(process, "usedGpuMemory", None) or 0  # None where the driver cannot tell
                per_device = by_pid.setdefault(int(process.pid), {})
                per_device[index] = per_device.get(index, 0) + int(used)
        return GpuDevice(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            total=int(memory.total),
            used=int(memory.used),
            processes_visible=visible,
        )

    def close(self) -> None:
        """Shut NVML down if it was started here."""
        with self._lock:
            module, self._module = self._module, None
            if module is not None:
                try:
                    module.nvmlShutdown()
                except Exception:
                    log.debug("nbcoord: nvmlShutdown failed", exc_info=True)
