"""What the server sees of a kernel from outside, without the kernel's help: its process (alive, pid, RSS), its
descendants, and GPU memory by pid (the one NVML reader)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from nbcoord.resources import proc
from nbcoord.server._gpu import GpuRead, GpuStatus, Nvml
from nbcoord.server._model import GpuHeld


@dataclass
class Outside:
    rss: dict[int, int] = field(default_factory=dict)
    descendants: dict[int, list[int]] = field(default_factory=dict)
    gpu: GpuRead | None = None


async def is_alive(kernel_manager: Any) -> bool:
    """Whether the kernel process runs (jupyter_server's managers answer asynchronously, older ones directly)."""
    alive = kernel_manager.is_alive()
    if inspect.isawaitable(alive):
        alive = await alive
    return bool(alive)


def kernel_pid(kernel_manager: Any) -> int | None:
    """The kernel's pid as its provisioner knows it (jupyter_client's LocalProvisioner); None for remote kernels."""
    provisioner = getattr(kernel_manager, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    if pid is None:
        pid = getattr(getattr(provisioner, "process", None), "pid", None)
    return pid if isinstance(pid, int) and pid > 0 else None


def read_outside(pids: Iterable[int], nvml: Nvml) -> Outside:
    """RSS and descendants of each pid, and GPU memory by pid. Descendants come from the kernel's own children lists
    in /proc (:func:`nbcoord.resources.proc.descendants`: a few small reads per kernel); only where those lists are
    missing, from one pass of psutil over the process table (the server may run anywhere), walked by the same
    :func:`nbcoord.resources.proc.walk`. (The pass over the whole table was most of a view's cost: 6 ms of CPU
    with 70 processes, paid by every poll of every open page.)"""
    outside = Outside()
    table: dict[int, list[int]] | None = None
    for pid in set(pids):
        resident = proc.rss(pid)
        if resident is None:
            try:
                resident = int(psutil.Process(pid).memory_info().rss)
            except psutil.Error:
                continue
        outside.rss[pid] = resident
        tree = proc.descendants(pid)
        if tree is None:
            if table is None:
                table = _children_table()
            tree = proc.walk(pid, functools.partial(_listed, table))
        outside.descendants[pid] = [child for child, _parent in tree]
    outside.gpu = nvml.read()
    return outside


def _listed(table: dict[int, list[int]], parent: int) -> list[int]:
    return table.get(parent, [])


def _children_table() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["pid", "ppid"]):
        info = process.info
        if info.get("ppid") is not None:
            children.setdefault(info["ppid"], []).append(info["pid"])
    return children


def no_outside(reason: str) -> GpuRead:
    return GpuRead(GpuStatus(available=False, reason=reason, devices=[]))


def gpu_held(pid: int | None, outside: Outside) -> list[GpuHeld]:
    gpu = outside.gpu
    if pid is None or gpu is None or not gpu.by_pid:
        return []
    own = gpu.by_pid.get(pid, {})
    workers: dict[int, int] = {}
    for child in outside.descendants.get(pid, []):
        for index, used in gpu.by_pid.get(child, {}).items():
            workers[index] = workers.get(index, 0) + used
    return [
        GpuHeld(index=index, bytes=own.get(index, 0), workers_bytes=workers.get(index, 0))
        for index in sorted(set(own) | set(workers))
        if own.get(index, 0) or workers.get(index, 0)
    ]
