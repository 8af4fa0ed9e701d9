"""A FAKE of NVIDIA's NVML Python binding (``pynvml``, package nvidia-ml-py), for tests only.

This is not the real library and talks to no driver. It keeps a list of fake devices in module state
(:func:`reset`) and mimics the parts of ``pynvml`` that nbcoord calls, as nvidia-ml-py 12-13 has them:

* ``nvmlInit``, ``nvmlShutdown`` (reference counted; calls before ``nvmlInit`` raise
  ``NVMLError_Uninitialized``, as the real binding does once its library is loaded),
* ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName`` (a ``str``),
  ``nvmlDeviceGetMemoryInfo`` (an object with ``total``, ``free``, ``used``),
  ``nvmlDeviceGetComputeRunningProcesses`` (objects with ``pid``, ``usedGpuMemory``, ``gpuInstanceId``,
  ``computeInstanceId``; ``usedGpuMemory`` is None where the driver cannot tell),
* ``NVMLError`` with the same ``NVML_ERROR_*`` constants, and one subclass per code built the same way
  (``NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)`` is an ``NVMLError_DriverNotLoaded``), with ``.value``.

Configure it with :func:`reset` and pass the module itself as ``ResourceProbe(nvml=fake_nvml)``. ``calls``
records every function called, by name.
"""

from __future__ import annotations

import string
import sys
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """As in pynvml: ``NVMLError(code)`` builds the subclass for that code; ``.value`` is the code."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 (pynvml's own name and shape)
    value: int

    def __new__(cls, value: int) -> NVMLError:
        chosen = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(chosen)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _make_error_classes() -> None:
    """One subclass per NVML_ERROR_* constant, named as pynvml names them (NVMLError_DriverNotLoaded...)."""
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        code = getattr(module, name)

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(class_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()


def __getattr__(name: str) -> Any:  # for type checkers: the NVMLError_* classes are made at import
    raise AttributeError(name)


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeDevice:
    name: str = "NVIDIA Fake GPU"
    total: int = 80 * 2**30
    used: int = 2**30
    processes: list[FakeProcess] = field(default_factory=list)
    processes_error: int | None = None  # e.g. NVML_ERROR_NOT_SUPPORTED: the process list raises


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int


@dataclass
class _Handle:
    index: int


@dataclass
class _State:
    init_error: int | None = None
    refcount: int = 0


devices: list[FakeDevice] = []
calls: list[str] = []
_state = _State()


def reset(fake_devices: list[FakeDevice] | None = None, *, fail_init: int | None = None) -> None:
    """Start over: these devices, and ``nvmlInit`` failing with ``fail_init`` (an NVML_ERROR_* code)."""
    devices[:] = fake_devices or []
    calls.clear()
    _state.init_error = fail_init
    _state.refcount = 0


def initialised() -> bool:
    return _state.refcount > 0


def _enter(name: str) -> None:
    calls.append(name)
    if _state.refcount == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    calls.append("nvmlInit")
    if _state.init_error is not None:
        raise NVMLError(_state.init_error)
    _state.refcount += 1


def nvmlShutdown() -> None:
    _enter("nvmlShutdown")
    _state.refcount -= 1


def nvmlDeviceGetCount() -> int:
    _enter("nvmlDeviceGetCount")
    return len(devices)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _enter("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetName(handle: _Handle) -> str:
    _enter("nvmlDeviceGetName")
    return devices[handle.index].name


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> FakeMemory:
    _enter("nvmlDeviceGetMemoryInfo")
    device = devices[handle.index]
    return FakeMemory(total=device.total, free=device.total - device.used, used=device.used)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[FakeProcess]:
    _enter("nvmlDeviceGetComputeRunningProcesses")
    device = devices[handle.index]
    if device.processes_error is not None:
        raise NVMLError(device.processes_error)
    return list(device.processes)
