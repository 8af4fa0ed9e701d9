"""The one NVML reader: every device with its memory and its compute processes, for the kernel and for the server.

NVML (``nvidia-ml-py``, imported by name at the first read, never at import) is started once; a start that failed
(no library, no driver) is kept as the reason and not retried: it does not heal. :meth:`Nvml.close` shuts it down,
and a later read starts it again. Reads are serialised by one lock (the server reads on a worker thread, the kernel
from its monitor and its views).

What a read gives is what NVML says, nothing interpreted: the devices' figures, and each device's process list with
the pids of the host's namespace (``None`` where the list cannot be read: NOT_SUPPORTED, NO_PERMISSION, a binding
newer than the driver). Whose process is whose, and whether this namespace can see those pids at all, is the
caller's question: the kernel's probe asks it for its own pid (:mod:`nbcoord.resources.gpu`), the server for every
kernel (``nbcoord.server._gpu``). When there are no devices, :class:`Unavailable` says why, in kinds each caller
words its own way.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal, NamedTuple

log = logging.getLogger("nbcoord")

#: Why there are no devices: the binding is not installed, the driver's library is missing, the driver is not
#: loaded, another start failure, the device count failed, no device, or no device could be read.
Failure = Literal["library", "driver", "driver-not-loaded", "start", "count", "no-device", "unreadable"]


@dataclass(frozen=True)
class Unavailable:
    """Why a read has no devices; ``detail`` is NVML's own message where there is one."""

    kind: Failure
    detail: str = ""


class Process(NamedTuple):
    """One entry of a device's compute process list."""

    pid: int  # in the host's pid namespace
    used: int | None  # bytes; None where the driver cannot tell (Windows WDDM)


@dataclass(frozen=True)
class Device:
    """One GPU as NVML sees it."""

    index: int  # NVML's index
    name: str
    total: int
    used: int
    processes: tuple[Process, ...] | None  # None: the list cannot be read here


@dataclass
class Reading:
    """One read: the devices, or why there are none."""

    devices: list[Device] = field(default_factory=list)
    unavailable: Unavailable | None = None


class Nvml:
    """NVML, started at the first read (see the module docstring).

    Parameters
    ----------
    module
        The binding, or the name to import it by: ``pynvml`` (package ``nvidia-ml-py``). Tests pass a fake.
    """

    def __init__(self, module: ModuleType | str = "pynvml") -> None:
        self._lock = threading.Lock()  # guards _module, _started and _unavailable
        self._module: ModuleType | None = module if isinstance(module, ModuleType) else None
        self._name = module if isinstance(module, str) else module.__name__
        self._started = False
        self._unavailable: Unavailable | None = None

    def read(self) -> Reading:
        """Every device NVML can read, with its process list."""
        with self._lock:
            nvml = self._start()
            if nvml is None:
                return Reading(unavailable=self._unavailable)
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as error:
                return Reading(unavailable=Unavailable("count", str(error)))
            if count == 0:
                return Reading(unavailable=Unavailable("no-device"))
            devices: list[Device] = []
            for index in range(count):
                try:
                    devices.append(_device(nvml, index))
                except Exception:
                    log.debug("nbcoord: NVML device %d unreadable", index, exc_info=True)
            if not devices:
                return Reading(unavailable=Unavailable("unreadable"))
            return Reading(devices=devices)

    def close(self) -> None:
        """Shut NVML down if it was started here; a later read starts it again."""
        with self._lock:
            if not self._started or self._module is None:
                return
            self._started = False
            try:
                self._module.nvmlShutdown()
            except Exception:
                log.debug("nbcoord: nvmlShutdown failed", exc_info=True)

    def _start(self) -> ModuleType | None:
        if self._started or self._unavailable is not None:
            return self._module if self._started else None
        module = self._module
        if module is None:
            try:
                module = importlib.import_module(self._name)
            except ImportError:
                self._unavailable = Unavailable("library")
                return None
            self._module = module
        try:
            module.nvmlInit()
        except Exception as error:  # NVMLError: no driver, driver not loaded, no permission...
            self._unavailable = _start_failure(module, error)
            log.debug("nbcoord: NVML not usable: %s", error, exc_info=True)
            return None
        self._started = True
        return module


def _device(nvml: ModuleType, index: int) -> Device:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    name = nvml.nvmlDeviceGetName(handle)
    processes: tuple[Process, ...] | None
    try:
        listed: list[Any] = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:
        # NOT_SUPPORTED or NO_PERMISSION (an NVMLError), or pynvml's NVMLLibraryMismatchError where the driver is
        # older than the binding: the list is not visible here, the device's figures still are
        log.debug("nbcoord: NVML process list of device %d unreadable", index, exc_info=True)
        processes = None
    else:
        processes = tuple(Process(int(p.pid), _bytes(getattr(p, "usedGpuMemory", None))) for p in listed)
    return Device(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        total=int(memory.total),
        used=int(memory.used),
        processes=processes,
    )


def _bytes(value: Any) -> int | None:
    return None if value is None else int(value)


def _start_failure(nvml: ModuleType, error: BaseException) -> Unavailable:
    code = getattr(error, "value", None)
    if code is not None and code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return Unavailable("driver", str(error))  # libnvidia-ml.so ships with the driver
    if code is not None and code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return Unavailable("driver-not-loaded", str(error))
    return Unavailable("start", str(error))


def nvml_index(cuda_index: int) -> int:
    """NVML's index of a framework's CUDA device ``cuda_index`` (TensorFlow's ``GPU:i``, PyTorch's ``cuda:i``),
    through ``CUDA_VISIBLE_DEVICES`` when it lists indices.

    Assumes CUDA orders devices as NVML does (always true with one GPU; set CUDA_DEVICE_ORDER=PCI_BUS_ID
    otherwise).
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index
