"""Where a framework plugs its memory into the resources: allocator figures, what reclaim can give back, what a
value holds.

The resources never import a framework, nor a framework package of nbcoord. A framework's part registers a
:class:`Framework` here (:func:`add`, which returns its remover): nbcoord's TensorFlow part does so from
``nbcoord.tensorflow.memory`` once the user imported TensorFlow; PyTorch's, CuPy's, JAX's, NumPy's and pandas'
parts are built in (:mod:`nbcoord.resources.libraries`). A framework's hooks run only while ``sys.modules`` holds
its module: nothing here imports it.

- ``allocator``: the framework allocator's figures per GPU (by NVML index) and on the host, and the note the probe
  shows about the GPU memory it keeps. The snapshot's allocator fields (``tf_current``, ``tf_peak``,
  ``tf_cpu_current``, ``tf_cpu_peak``, ``tf_note``) are TensorFlow's: the probe reads :data:`ALLOCATOR`'s.
- ``release``: what ``%nbcoord reclaim`` asks the framework to give back, in words, given the probe's GPU note.
- ``measure``: the memory a value of the framework holds, and where (for reclaim's "still held" list); it is asked
  about every value and answers None for what is not its own.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from nbcoord.resources.gpu import GpuDevice

#: The framework whose allocator figures the snapshot's ``tf_*`` fields carry.
ALLOCATOR = "tensorflow"


@dataclass
class AllocatorRead:
    """A framework allocator's figures, read now."""

    gpu: dict[int, tuple[int, int]] = field(default_factory=dict)  # NVML index -> (current, peak)
    cpu: tuple[int, int] | None = None  # (current, peak); None where it keeps no host statistics
    #: The note on the GPU memory it keeps, given the device rows with its figures on them.
    note: Callable[[Sequence[GpuDevice]], str | None] = lambda _devices: None


class FrameworkAction(TypedDict):
    framework: str  # "PyTorch", "CuPy", "TensorFlow", "JAX", "glibc"
    action: str  # what was done, in words; "" when nothing could be done
    note: str | None  # where it keeps memory until the process ends


class Measure(TypedDict):
    """What one value holds."""

    type: str
    device: str
    bytes: int
    shape: str | None
    dtype: str | None
    keys: dict[Any, int]  # memory identity -> bytes, for counting shared memory once


@dataclass(frozen=True)
class Framework:
    """One framework's memory hooks (see the module docstring)."""

    module: str  # the top-level module; its hooks run only while sys.modules holds it
    label: str  # its name in reports: "PyTorch"
    rank: int  # its place in reports (PyTorch 10, CuPy 20, TensorFlow 30, JAX 40)
    allocator: Callable[[], AllocatorRead] | None = None
    release: Callable[[str | None], FrameworkAction | None] | None = None
    measure: Callable[[Any], Measure | None] | None = None


_lock = threading.Lock()  # guards _registered
_registered: list[Framework] = []


def add(framework: Framework) -> Callable[[], None]:
    """Register ``framework``'s hooks; returns the remover (safe to call more than once)."""
    with _lock:
        _registered.append(framework)

    def remove() -> None:
        with _lock:
            if framework in _registered:
                _registered.remove(framework)

    return remove


def registered() -> list[Framework]:
    """The frameworks registered through :func:`add`, oldest first."""
    with _lock:
        return list(_registered)


def ordered(frameworks: Iterable[Framework]) -> list[Framework]:
    """``frameworks`` in report order, each module once (the first registered wins)."""
    chosen: dict[str, Framework] = {}
    for framework in frameworks:
        chosen.setdefault(framework.module, framework)
    return sorted(chosen.values(), key=lambda f: f.rank)


def imported(frameworks: Iterable[Framework]) -> list[Framework]:
    """Those of ``frameworks`` the user imported, in report order."""
    return [f for f in ordered(frameworks) if sys.modules.get(f.module) is not None]


def allocator() -> Callable[[], AllocatorRead] | None:
    """The allocator reader of :data:`ALLOCATOR`, if registered and imported."""
    found = imported(f for f in registered() if f.module == ALLOCATOR)
    return found[0].allocator if found else None
