"""``%nbcoord reclaim``: give back the memory a kernel keeps by accident, and say what was done.

After a cell fails, IPython keeps the exception (``sys.last_exc``, ``sys.last_value``, ``sys.last_traceback`` and
its last ``ExecutionResult``) for ``%debug`` and ``%tb``; its traceback holds every frame the error passed through,
and their local variables: the batch, the activations, the model's copy. The output cache (``Out``, ``_``, ``__``,
``___``, ``_N``) keeps every displayed value. Frameworks keep freed memory in their own caches. Until a restart,
that memory stays taken: on the GPU it stops the next run. :func:`reclaim`, in order:

1. IPython's last exception: the local variables of the frames in its traceback (and in the tracebacks chained to
   it) are released (``traceback.clear_frames``), the exception loses its traceback, and ``sys.last_exc`` /
   ``last_type`` / ``last_value`` / ``last_traceback`` are deleted (``%debug`` and ``%tb`` then have nothing to
   show). nbcoord itself keeps no exception and no frame: its failure records are text;
2. with ``outputs=True`` only, the output cache: IPython's own ``displayhook.flush()`` (what ``%reset -f out``
   does), and the last result IPython keeps;
3. the garbage collector (``gc.collect()``);
4. the frameworks the user imported give back their caches through their public APIs (each framework's part in
   :mod:`nbcoord.resources.frameworks`): PyTorch ``torch.cuda.empty_cache()`` and ``ipc_collect()`` (only where it
   already uses CUDA: nbcoord never starts a CUDA context), CuPy's memory pools ``free_all_blocks()``; and glibc's
   ``malloc_trim(0)`` returns freed heap pages to the system. Where a framework keeps memory until the process ends
   (TensorFlow's GPU allocator, JAX's preallocation, PyTorch's CUDA context), the report says so plainly;
5. before and after: this process's RSS and USS, its memory per GPU device (NVML, through the resource probe),
   PyTorch's and TensorFlow's allocator figures;
6. what the user's namespace (and the output cache) still holds: the largest arrays and tensors by variable name,
   with type, device, size, shape and dtype (NumPy, PyTorch tensors and modules, TensorFlow / Keras, CuPy, JAX,
   pandas, and lists, tuples, dicts and sets of them), so that the user knows what to ``del``. Memory shared by
   two names is counted once and said so (:mod:`nbcoord.resources.held`).

Steps 1 and 2 are :mod:`nbcoord.resources.kept`'s.

It runs on the kernel's main thread (a magic, the API, or a panel command handled as an ordinary widget message,
between cells) and never imports a framework.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, TypedDict

from nbcoord.core import fork as _fork
from nbcoord.resources import frameworks
from nbcoord.resources.frameworks import FrameworkAction
from nbcoord.resources.held import HeldObject, largest_held
from nbcoord.resources.kept import drop_last_exception, drop_output_cache
from nbcoord.resources.libraries import BUILTIN, JAX_NOTE, TORCH_CONTEXT_NOTE, torch_figures
from nbcoord.resources.nvml import nvml_index
from nbcoord.resources.probes import CellWindow, ResourceProbe, format_bytes

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

__all__ = [
    "JAX_NOTE",
    "TORCH_CONTEXT_NOTE",
    "DeviceFigures",
    "FrameworkAction",
    "GpuFreed",
    "HeldObject",
    "MemoryFigures",
    "ReclaimReport",
    "drop_last_exception",
    "drop_output_cache",
    "largest_held",
    "reclaim",
    "release_frameworks",
    "report_text",
]


class DeviceFigures(TypedDict):
    """One GPU device: this process's memory on it (NVML) and the frameworks' allocator figures."""

    index: int  # NVML's index
    name: str
    process_used: int | None  # None: NVML cannot show this process here (see process_visible)
    process_visible: bool
    torch_allocated: int | None  # None: PyTorch not imported, or not using CUDA
    torch_reserved: int | None
    tf_current: int | None


class MemoryFigures(TypedDict):
    rss: int | None
    uss: int | None
    gpu: list[DeviceFigures]
    gpu_reason: str | None  # why there are no GPU figures


class GpuFreed(TypedDict):
    index: int
    bytes: int | None  # this process's memory on the device, before minus after (None: not visible)


class ReclaimReport(TypedDict):
    outputs: bool
    before: MemoryFigures
    after: MemoryFigures
    rss_freed: int | None
    gpu_freed: list[GpuFreed]
    dropped: list[str]  # what was let go, in words
    collected: int  # objects the garbage collector found unreachable
    frameworks: list[FrameworkAction]
    notes: list[str]
    largest: list[HeldObject]
    took_s: float
    text: str  # the whole report in words (what the magic prints)


# ------------------------------------------------------------------------------------------------- figures
def _figures(host: Host, probe: ResourceProbe) -> MemoryFigures:
    """Fresh figures: a full read of the probe (NVML included), and PyTorch's allocator where it uses CUDA."""
    registry = host.registry
    windows = [CellWindow(c.execution_count, c.started_at, c.ended_at) for c in registry.cells()]
    probe.invalidate()
    sample = probe.sample(windows, registry.native_names())
    devices = [
        DeviceFigures(
            index=d["index"],
            name=d["name"],
            process_used=d["process_used"],
            process_visible=d["process_visible"],
            torch_allocated=None,
            torch_reserved=None,
            tf_current=d["tf_current"],
        )
        for d in sample["gpu"]["devices"]
    ]
    for torch_index, allocated, reserved in torch_figures():
        index = nvml_index(torch_index)
        device = next((d for d in devices if d["index"] == index), None)
        if device is None:  # NVML not usable here: PyTorch's figures alone
            device = DeviceFigures(
                index=index,
                name=f"cuda:{torch_index}",
                process_used=None,
                process_visible=False,
                torch_allocated=None,
                torch_reserved=None,
                tf_current=None,
            )
            devices.append(device)
        device["torch_allocated"], device["torch_reserved"] = allocated, reserved
    return MemoryFigures(
        rss=sample["host"]["rss"],
        uss=sample["host"]["uss"],
        gpu=devices,
        gpu_reason=sample["gpu"]["reason"] if not devices else None,
    )


# -------------------------------------------------------------------------------------------- frameworks
def release_frameworks(gpu_note: str | None) -> list[FrameworkAction]:
    """Ask the frameworks the user imported to give back their caches; say where one keeps memory until exit.
    ``gpu_note``: the probe's note on TensorFlow (set when TensorFlow holds GPU memory)."""
    actions: list[FrameworkAction] = []
    for framework in frameworks.imported([*BUILTIN, *frameworks.registered()]):
        if framework.release is None:
            continue
        action = framework.release(gpu_note)
        if action is not None:
            actions.append(action)
    trimmed = _malloc_trim()
    if trimmed is not None:
        actions.append(FrameworkAction(framework="glibc", action=trimmed, note=None))
    return actions


def _malloc_trim() -> str | None:
    """glibc's ``malloc_trim(0)``: free heap pages back to the system (Linux with glibc only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None  # another C library (musl)
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    released = trim(0)
    return "malloc_trim(0): free heap pages went back to the system" if released else "malloc_trim(0): nothing to trim"


# ------------------------------------------------------------------------------------------------ reclaim
def reclaim(host: Host, probe: ResourceProbe, *, outputs: bool = False) -> ReclaimReport:
    """Give back what the kernel keeps by accident (see the module docstring) and report it.

    Parameters
    ----------
    outputs
        Also drop IPython's output cache (``Out``, ``_``, ``__``, ``___``, ``_N``).

    Raises
    ------
    TypeError
        ``outputs`` is not a bool.
    RuntimeError
        Not on the kernel's main thread (the user's namespace and IPython's caches belong to it), or in a forked
        child of the process that loaded nbcoord.
    """
    if not isinstance(outputs, bool):
        raise TypeError(f"outputs must be True or False, not {outputs!r}.")
    _fork.ensure_owner()
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "reclaim runs on the kernel's main thread (the namespace and IPython's caches are its own); call it from "
            "a cell, or from a panel command handled as an ordinary widget message."
        )
    started = time.monotonic()
    shell = host.shell
    before = _figures(host, probe)
    dropped = drop_last_exception(shell, host.cell_of_file)
    notes: list[str] = []
    if outputs:
        cache = drop_output_cache(shell)
        if cache is not None:
            dropped.append(cache)
    host.registry.records()  # drains queued thread starts and forgets finished threads
    collected = gc.collect()
    gpu_note = probe.last_sample["gpu"]["tf_note"] if probe.last_sample is not None else None
    frameworks = release_frameworks(gpu_note)
    after = _figures(host, probe)
    largest = largest_held(shell)
    cached = [row for row in largest if row["held_by"] == "output cache"]
    if cached and not outputs:
        notes.append(
            f"The output cache still holds {len(cached)} of the values below; %nbcoord reclaim --outputs drops it."
        )
    notes.append("nbcoord itself keeps no exception and no frame: its thread-failure records are text.")
    rss_freed = before["rss"] - after["rss"] if before["rss"] is not None and after["rss"] is not None else None
    gpu_freed = [
        GpuFreed(
            index=device["index"],
            bytes=_difference(device["process_used"], _device(after, device["index"])),
        )
        for device in before["gpu"]
    ]
    report = ReclaimReport(
        outputs=outputs,
        before=before,
        after=after,
        rss_freed=rss_freed,
        gpu_freed=gpu_freed,
        dropped=dropped,
        collected=collected,
        frameworks=frameworks,
        notes=notes,
        largest=largest,
        took_s=time.monotonic() - started,
        text="",
    )
    report["text"] = report_text(report)
    return report


def _device(figures: MemoryFigures, index: int) -> int | None:
    return next((d["process_used"] for d in figures["gpu"] if d["index"] == index), None)


def _difference(before: int | None, after: int | None) -> int | None:
    return before - after if before is not None and after is not None else None


def _signed_freed(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"gave back {format_bytes(n)}" if n >= 0 else f"grew by {format_bytes(-n)}"


def report_text(report: ReclaimReport) -> str:
    """The report in words: what ``%nbcoord reclaim`` prints."""
    before, after = report["before"], report["after"]
    lines = [
        f"nbcoord reclaim: host memory (RSS) {format_bytes(before['rss'])} -> {format_bytes(after['rss'])}: "
        f"{_signed_freed(report['rss_freed'])} ({report['took_s']:.2f} s)."
    ]
    lines += _gpu_lines(before, after)
    if report["dropped"]:
        lines.append("Dropped:")
        lines += [f"  - {what}" for what in report["dropped"]]
    else:
        left = "" if report["outputs"] else "; the output cache was left (--outputs drops it)"
        lines.append(f"Dropped: nothing (no last exception was kept{left}).")
    lines.append("Released:")
    lines.append(f"  - the garbage collector: {report['collected']:,} unreachable object(s)")
    lines += [f"  - {a['framework']}: {a['action']}" for a in report["frameworks"] if a["action"]]
    kept = [action for action in report["frameworks"] if action["note"]]
    if kept:
        lines.append("Kept until the kernel process exits:")
        lines += [f"  - {action['framework']}: {action['note']}" for action in kept]
    lines += report["notes"]
    lines += _held_lines(report["largest"])
    return "\n".join(lines)


def _gpu_lines(before: MemoryFigures, after: MemoryFigures) -> list[str]:
    if not before["gpu"]:
        return [f"  GPU: no figures ({before['gpu_reason'] or 'no device'})."]
    lines = []
    for device in before["gpu"]:
        now = next((d for d in after["gpu"] if d["index"] == device["index"]), device)
        if device["process_visible"]:
            text = (
                f"this process {format_bytes(device['process_used'])} -> {format_bytes(now['process_used'])}: "
                f"{_signed_freed(_difference(device['process_used'], now['process_used']))}"
            )
        else:
            text = "this process's share is not visible to NVML here"
        if device["torch_reserved"] is not None:
            text += (
                f"; PyTorch allocated {format_bytes(device['torch_allocated'])} -> "
                f"{format_bytes(now['torch_allocated'])}, reserved {format_bytes(device['torch_reserved'])} -> "
                f"{format_bytes(now['torch_reserved'])}"
            )
        if device["tf_current"] is not None:
            text += f"; TensorFlow's allocator {format_bytes(now['tf_current'])} in use"
        lines.append(f"  GPU {device['index']} ({device['name']}): {text}.")
    return lines


def _held_lines(largest: list[HeldObject]) -> list[str]:
    if not largest:
        return ["Nothing over 1 MiB is held by a name in the namespace or the output cache."]
    lines = ["Still held (largest first; `del` a name to give its memory back):"]
    for row in largest:
        extra = " ".join(filter(None, [row["shape"], row["dtype"]]))
        shared = f", same memory as {row['shares_memory_with']}" if row["shares_memory_with"] else ""
        where = " [output cache]" if row["held_by"] == "output cache" else ""
        lines.append(
            f"  {row['name']:<16} {row['type']:<28} {row['device']:<8} {format_bytes(row['bytes']):>10}  "
            f"{extra}{shared}{where}".rstrip()
        )
    return lines
