"""The kernel's GPU figures, from the one NVML reader (:mod:`nbcoord.resources.nvml`): each device with this
process's share, and the memory of each process NVML lists (for the child-process rows).

NVML lists processes by the pids of the host's namespace. ``process_visible`` is False where that list cannot show
this process (in containers without host PID visibility, or where the list cannot be read), rather than a false 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from nbcoord.resources.nvml import Device, Process, Reading, Unavailable

#: Why the GPU section is empty.
NO_LIBRARY = "nvidia-ml-py not installed"
NO_DRIVER = "no NVIDIA driver"
DRIVER_NOT_LOADED = "NVIDIA driver not loaded"
NO_DEVICE = "no device"


class GpuDevice(TypedDict):
    """One GPU in the kernel's snapshot: NVML's figures, this process's share and TensorFlow's allocator."""

    index: int
    name: str
    total: int
    used: int
    process_used: int | None  # this process, from NVML's per-process list; None when not visible
    process_visible: bool  # False: NVML's list cannot show this process (see own_gpu_use)
    tf_current: int | None  # TensorFlow's allocator; None when not read
    tf_peak: int | None


@dataclass
class GpuRead:
    """The devices as this process sees them, or why there are none."""

    reason: str | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    by_pid: dict[int, int] | None = None  # memory per PID over devices whose process list is visible


def reason(unavailable: Unavailable) -> str:
    """Why there are no devices, in the kernel's words."""
    kind, detail = unavailable.kind, unavailable.detail
    if kind == "library":
        return NO_LIBRARY
    if kind == "driver":
        return NO_DRIVER  # libnvidia-ml.so ships with the driver
    if kind == "driver-not-loaded":
        return DRIVER_NOT_LOADED
    if kind == "no-device":
        return NO_DEVICE
    if kind == "unreadable":
        return "NVML error: no device readable"
    return f"NVML error: {detail}"


def own_gpu_use(
    procs: Sequence[Process] | None, own_pid: int, pid_exists: Callable[[int], bool]
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
        used = [p.used for p in own]
        # None where the driver cannot tell (Windows WDDM)
        return (None if None in used else sum(u for u in used if u is not None)), True
    if not any(pid_exists(p.pid) for p in procs):
        return None, False  # PIDs of another namespace: this process may be among them, unseen
    return 0, True


def gpu_read(reading: Reading, own_pid: int, pid_exists: Callable[[int], bool]) -> GpuRead:
    """The kernel's view of one NVML reading."""
    if reading.unavailable is not None:
        return GpuRead(reason=reason(reading.unavailable))
    read = GpuRead()
    for device in reading.devices:
        read.devices.append(_row(device, own_pid, pid_exists, read))
    return read


def _row(device: Device, own_pid: int, pid_exists: Callable[[int], bool], read: GpuRead) -> GpuDevice:
    process_used, visible = own_gpu_use(device.processes, own_pid, pid_exists)
    if visible and device.processes:
        by_pid = read.by_pid if read.by_pid is not None else {}
        for p in device.processes:
            by_pid[p.pid] = by_pid.get(p.pid, 0) + (p.used or 0)
        read.by_pid = by_pid
    return GpuDevice(
        index=device.index,
        name=device.name,
        total=device.total,
        used=device.used,
        process_used=process_used,
        process_visible=visible,
        tf_current=None,
        tf_peak=None,
    )
