"""TensorFlow's memory, plugged into the resources (:mod:`nbcoord.resources.frameworks`): its allocator's figures
for the probe, what ``%nbcoord reclaim`` says of it, and the size of its tensors, variables and Keras models.

Never imports TensorFlow and never starts its eager runtime: :func:`nbcoord.tensorflow.watch.watch` registers these
hooks (:func:`register`) once the user has imported TensorFlow (a post-import hook, at once if it already is), and the
allocator is read only after the runtime has started (``nbcoord.tensorflow.internals.eager_runtime_started``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from nbcoord.resources.frameworks import AllocatorRead, Framework, FrameworkAction, Measure, add
from nbcoord.resources.gpu import GpuDevice
from nbcoord.resources.nvml import nvml_index
from nbcoord.tensorflow.internals import eager_runtime_started

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
#: Said by reclaim when TensorFlow is imported but holds no GPU memory.
NO_RELEASE = "TensorFlow has no public call that gives its allocator's memory back."


def register() -> Callable[[], None]:
    """Register TensorFlow's memory hooks now; returns the remover."""
    return add(Framework("tensorflow", "TensorFlow", 30, allocator=read_allocator, release=release, measure=measure))


# ---------------------------------------------------------------------------------------------- allocator
def read_allocator() -> AllocatorRead:
    """TensorFlow's allocator figures; none before its eager runtime started (reading them would start it)."""
    tf = sys.modules["tensorflow"]
    if not eager_runtime_started():
        return AllocatorRead(note=lambda devices: _note(False, 0, devices))
    get_memory_info = tf.config.experimental.get_memory_info
    gpus = tf.config.list_logical_devices("GPU")
    read = AllocatorRead()
    for tf_index in range(len(gpus)):
        try:
            info = get_memory_info(f"GPU:{tf_index}")
        except ValueError:  # a device without allocator statistics
            continue
        read.gpu[nvml_index(tf_index)] = (int(info["current"]), int(info["peak"]))
    try:
        info = get_memory_info("CPU:0")
    except ValueError:  # a build whose CPU allocator keeps no statistics
        pass
    else:
        read.cpu = (int(info["current"]), int(info["peak"]))
    gpu_devices = len(gpus)
    read.note = lambda devices: _note(True, gpu_devices, devices)
    return read


def _note(started: bool, gpu_devices: int, devices: Sequence[GpuDevice]) -> str | None:
    if started:
        # TensorFlow's GPU devices reserve their memory when created, before any tensor exists
        holds = gpu_devices > 0 or any(d["tf_peak"] for d in devices)
    else:
        # graph-mode sessions hold GPU memory without starting the eager runtime
        holds = any(d["process_used"] for d in devices)
    if holds:
        return TF_HOLDS_GPU
    if not started and devices:  # only where there is a GPU to speak of
        return TF_NOT_STARTED
    return None


# ------------------------------------------------------------------------------------------------ reclaim
def release(gpu_note: str | None) -> FrameworkAction:
    """Nothing to call: say where TensorFlow keeps memory (``gpu_note``: the probe's note on TensorFlow)."""
    note = gpu_note if gpu_note == TF_HOLDS_GPU else None
    return FrameworkAction(framework="TensorFlow", action="", note=note or NO_RELEASE)


def _module(value: Any, name: str) -> Any:
    root = type(value).__module__.partition(".")[0]
    return sys.modules.get(name) if root == name else None


def _device(device: str) -> str:
    # "/job:localhost/replica:0/task:0/device:GPU:0" -> "GPU:0"
    return device.rpartition("device:")[2] or device or "?"


def _one_device(devices: set[str]) -> str:
    return next(iter(devices)) if len(devices) == 1 else ("mixed" if devices else "cpu")


def measure(value: Any) -> Measure | None:
    """A TensorFlow tensor or variable, or a Keras model or layer (its weights); None for anything else."""
    module = _module(value, "tensorflow") or _module(value, "keras")
    if module is None:
        return None
    weights = getattr(value, "weights", None)
    if isinstance(weights, list):  # a Keras model or layer (variables and tensors have no weights)
        keys: dict[Any, int] = {}
        devices: set[str] = set()
        for weight in weights:
            measured = measure(weight)
            if measured is not None:
                keys.update(measured["keys"])
                devices.add(measured["device"])
        return Measure(
            type=f"Keras {type(value).__name__}",
            device=_one_device(devices),
            bytes=sum(keys.values()),
            shape=None,
            dtype=None,
            keys=keys,
        )
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    count = getattr(shape, "num_elements", lambda: None)()
    size = getattr(dtype, "size", None)
    if not isinstance(count, int) or not isinstance(size, int):
        return None
    device = _device(str(getattr(value, "device", "") or ""))
    return Measure(
        type=f"tensorflow {type(value).__name__}",
        device=device,
        bytes=count * size,
        shape=str(tuple(shape.as_list())) if shape is not None and hasattr(shape, "as_list") else None,
        dtype=str(getattr(dtype, "name", dtype)),
        keys={("tensorflow", id(value)): count * size},
    )
