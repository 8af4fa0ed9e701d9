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
4. the frameworks the user imported give back their caches through their public APIs: PyTorch
   ``torch.cuda.empty_cache()`` and ``ipc_collect()`` (only where it already uses CUDA: nbcoord never starts a CUDA
   context), CuPy's memory pools ``free_all_blocks()``; and glibc's ``malloc_trim(0)`` returns freed heap pages to
   the system. Where a framework keeps memory until the process ends (TensorFlow's GPU allocator, JAX's
   preallocation, PyTorch's CUDA context), the report says so plainly;
5. before and after: this process's RSS and USS, its memory per GPU device (NVML, through the resource probe),
   PyTorch's and TensorFlow's allocator figures;
6. what the user's namespace (and the output cache) still holds: the largest arrays and tensors by variable name,
   with type, device, size, shape and dtype (NumPy, PyTorch tensors and modules, TensorFlow / Keras, CuPy, JAX,
   pandas, and lists, tuples, dicts and sets of them), so that the user knows what to ``del``. Memory shared by
   two names is counted once and said so.

It runs on the kernel's main thread (a magic, the API, or a panel command handled as an ordinary widget message,
between cells) and never imports a framework.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TypedDict

from nbcoord.core import fork as _fork
from nbcoord.resources.probes import TF_HOLDS_GPU, CellWindow, ResourceProbe, _nvml_index, format_bytes

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

#: Objects smaller than this are not listed as held.
LIST_MIN_BYTES = 2**20
#: How many held objects the report lists.
LARGEST = 10
#: How many items of a list, tuple, dict or set are looked at.
CONTAINER_ITEMS = 1000
_OUTPUT_NAME = re.compile(r"_\d+|_{1,3}")

JAX_NOTE = (
    "JAX preallocates most of each GPU's memory at its first use there and keeps it until the kernel process exits "
    "(set XLA_PYTHON_CLIENT_PREALLOCATE=false before importing JAX to allocate on demand)."
)
TORCH_CONTEXT_NOTE = (
    "PyTorch's CUDA context (a few hundred MiB per device it used) stays until the kernel process exits."
)


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


class HeldObject(TypedDict):
    """Something big that a name still holds."""

    name: str  # "x", "Out[5]", "batches"
    held_by: str  # "namespace" or "output cache"
    type: str  # "torch.Tensor", "numpy.ndarray", "list of 32 torch.Tensor"
    device: str  # "cpu", "cuda:0", "GPU:0", "mixed"
    bytes: int
    shape: str | None
    dtype: str | None
    shares_memory_with: str | None  # an earlier (larger) entry holding the same memory


class FrameworkAction(TypedDict):
    framework: str  # "PyTorch", "CuPy", "TensorFlow", "JAX", "glibc"
    action: str  # what was done, in words; "" when nothing could be done
    note: str | None  # where it keeps memory until the process ends


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
    for torch_index, allocated, reserved in _torch_figures():
        index = _nvml_index(torch_index)
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


def _torch_cuda() -> Any:
    """``torch.cuda`` where the user imported PyTorch and it already uses CUDA here; None otherwise (asking
    anything more would start a CUDA context, a few hundred MiB of GPU memory)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # a broken or partial install
        log.debug("nbcoord: torch.cuda.is_initialized() failed", exc_info=True)
        return None


def _torch_figures() -> list[tuple[int, int, int]]:
    cuda = _torch_cuda()
    if cuda is None:
        return []
    try:
        return [(i, int(cuda.memory_allocated(i)), int(cuda.memory_reserved(i))) for i in range(cuda.device_count())]
    except Exception:
        log.warning("nbcoord: reading PyTorch's CUDA allocator failed", exc_info=True)
        return []


# -------------------------------------------------------------------------------------------- exceptions
def _exception_chain(exc: BaseException) -> Iterable[BaseException]:
    """The exception and every exception chained to it (cause, context, an ExceptionGroup's members), once each."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        todo.extend(e for e in getattr(current, "exceptions", ()) if isinstance(e, BaseException))


def _release(exc: BaseException) -> None:
    """Let go of what the exception's tracebacks hold: the frames' local variables, then the tracebacks."""
    for member in _exception_chain(exc):
        tb = member.__traceback__
        if tb is not None:
            traceback.clear_frames(tb)  # an executing frame is skipped (clear_frames catches that)
            member.__traceback__ = None


def _cell_of_traceback(tb: TracebackType | None, cell_of_file: Callable[[str], int | None]) -> int | None:
    """The innermost cell among the traceback's frames."""
    found = None
    while tb is not None:
        cell = cell_of_file(tb.tb_frame.f_code.co_filename)
        if cell is not None:
            found = cell
        tb = tb.tb_next
    return found


def drop_last_exception(shell: Any, cell_of_file: Callable[[str], int | None]) -> list[str]:
    """Release IPython's last exception (see the module docstring); returns what was dropped, in words."""
    found: list[BaseException] = []
    for value in (
        getattr(sys, "last_exc", None),
        getattr(sys, "last_value", None),
        getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None),
        getattr(getattr(shell, "last_execution_result", None), "error_before_exec", None),
    ):
        if isinstance(value, BaseException) and all(value is not other for other in found):
            found.append(value)
    last_tb = getattr(sys, "last_traceback", None)
    dropped: list[str] = []
    for exc in found:
        cell = _cell_of_traceback(exc.__traceback__ or last_tb, cell_of_file)
        where = f" from cell [{cell}]" if cell is not None else ""
        message = str(exc)
        message = message if len(message) <= 120 else message[:117] + "..."
        dropped.append(
            f"IPython's last exception, {type(exc).__name__}: {message}{where} (the local variables of its frames)"
        )
        _release(exc)
    if isinstance(last_tb, TracebackType):
        traceback.clear_frames(last_tb)
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
    # IPython's traceback formatter keeps the traceback it last handed to a debugger (%debug, %pdb).
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is not None and isinstance(getattr(formatter, "tb", None), TracebackType):
        formatter.tb = None
    return dropped


def drop_output_cache(shell: Any) -> str | None:
    """IPython's output cache, as ``%reset -f out`` drops it; returns what was dropped, in words."""
    user_ns = getattr(shell, "user_ns", {})
    cache = user_ns.get("_oh")
    count = len(cache) if isinstance(cache, dict) else 0
    displayhook = getattr(shell, "displayhook", None)
    if displayhook is not None and getattr(displayhook, "do_full_cache", False):
        displayhook.flush()  # deletes _N, clears Out, resets _, __ and ___ (and collects)
    else:
        for name in ("_", "__", "___"):
            if name in user_ns:
                user_ns[name] = ""
    # IPython also pushed _, __ and ___ into user_ns_hidden (which %who compares by identity), and flush() leaves
    # them there: the last values displayed would stay alive.
    hidden = getattr(shell, "user_ns_hidden", None)
    if isinstance(hidden, dict):
        for name in ("_", "__", "___"):
            if name in hidden:
                hidden[name] = user_ns.get(name, "")
    last = getattr(shell, "last_execution_result", None)
    if last is not None and getattr(last, "result", None) is not None:
        last.result = None  # the previous cell's value, which IPython keeps besides Out
        count = max(count, 1)
    return f"the output cache: {count:,} value(s) (Out, _, __, ___, _N)" if count else None


# -------------------------------------------------------------------------------------------- frameworks
def release_frameworks(gpu_note: str | None) -> list[FrameworkAction]:
    """Ask the frameworks the user imported to give back their caches; say where one keeps memory until exit.
    ``gpu_note``: the probe's note on TensorFlow (set when TensorFlow holds GPU memory)."""
    actions: list[FrameworkAction] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = _torch_cuda()
        if cuda is None:
            action = "nothing cached on a GPU: it has not used CUDA in this process"
            actions.append(FrameworkAction(framework="PyTorch", action=action, note=None))
        else:
            try:
                cuda.empty_cache()
                cuda.ipc_collect()
                action = "torch.cuda.empty_cache(): cached blocks no tensor uses went back to the driver"
            except Exception as exc:
                log.warning("nbcoord: torch.cuda.empty_cache() failed", exc_info=True)
                action = f"torch.cuda.empty_cache() failed: {type(exc).__name__}: {exc}"
            actions.append(FrameworkAction(framework="PyTorch", action=action, note=TORCH_CONTEXT_NOTE))
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
            action = "free_all_blocks() on CuPy's memory pools"
        except Exception as exc:
            log.warning("nbcoord: freeing CuPy's pools failed", exc_info=True)
            action = f"freeing CuPy's pools failed: {type(exc).__name__}: {exc}"
        actions.append(FrameworkAction(framework="CuPy", action=action, note=None))
    if "tensorflow" in sys.modules:
        note = gpu_note if gpu_note == TF_HOLDS_GPU else None
        actions.append(
            FrameworkAction(
                framework="TensorFlow",
                action="",
                note=note or "TensorFlow has no public call that gives its allocator's memory back.",
            )
        )
    if "jax" in sys.modules:
        actions.append(FrameworkAction(framework="JAX", action="", note=JAX_NOTE))
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


# ------------------------------------------------------------------------------------------ what is held
class _Measure(TypedDict):
    type: str
    device: str
    bytes: int
    shape: str | None
    dtype: str | None
    keys: dict[Any, int]  # memory identity -> bytes, for counting shared memory once


def _module(value: Any, name: str) -> ModuleType | None:
    """The framework ``name`` if the user imported it and ``value``'s type comes from it (never imports it)."""
    root = type(value).__module__.partition(".")[0]
    return sys.modules.get(name) if root == name else None


def _measure_numpy(value: Any) -> _Measure | None:
    np = sys.modules.get("numpy")
    if np is None or not isinstance(value, np.ndarray):
        return None
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    key = ("numpy", id(root.base if root.base is not None else root))
    return _Measure(
        type="numpy.ndarray",
        device="cpu",
        bytes=int(value.nbytes),
        shape=str(tuple(value.shape)),
        dtype=str(value.dtype),
        keys={key: int(root.nbytes)},
    )


def _measure_torch(value: Any) -> _Measure | None:
    torch = _module(value, "torch")
    if torch is None:
        return None
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage()
            identity: dict[Any, int] = {("torch", str(value.device), storage.data_ptr()): int(storage.nbytes())}
        except Exception:  # sparse, meta or nested tensors have no plain storage
            identity = {("torch-object", id(value)): int(value.nelement() * value.element_size())}
        return _Measure(
            type="torch.Tensor",
            device=str(value.device),
            bytes=int(value.nelement() * value.element_size()),
            shape=str(tuple(value.shape)),
            dtype=str(value.dtype).replace("torch.", ""),
            keys=identity,
        )
    if isinstance(value, torch.nn.Module):
        keys: dict[Any, int] = {}
        devices: set[str] = set()
        for tensor in [*value.parameters(), *value.buffers()]:
            measured = _measure_torch(tensor)
            if measured is not None:
                keys.update(measured["keys"])
                devices.add(measured["device"])
        return _Measure(
            type=f"torch.nn.Module ({type(value).__name__})",
            device=_one_device(devices),
            bytes=sum(keys.values()),
            shape=None,
            dtype=None,
            keys=keys,
        )
    return None


def _tf_device(device: str) -> str:
    # "/job:localhost/replica:0/task:0/device:GPU:0" -> "GPU:0"
    return device.rpartition("device:")[2] or device or "?"


def _measure_tensorflow(value: Any) -> _Measure | None:
    module = _module(value, "tensorflow") or _module(value, "keras")
    if module is None:
        return None
    weights = getattr(value, "weights", None)
    if isinstance(weights, list):  # a Keras model or layer (variables and tensors have no weights)
        keys: dict[Any, int] = {}
        devices: set[str] = set()
        for weight in weights:
            measured = _measure_tensorflow(weight)
            if measured is not None:
                keys.update(measured["keys"])
                devices.add(measured["device"])
        return _Measure(
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
    device = _tf_device(str(getattr(value, "device", "") or ""))
    return _Measure(
        type=f"tensorflow {type(value).__name__}",
        device=device,
        bytes=count * size,
        shape=str(tuple(shape.as_list())) if shape is not None and hasattr(shape, "as_list") else None,
        dtype=str(getattr(dtype, "name", dtype)),
        keys={("tensorflow", id(value)): count * size},
    )


def _measure_other(value: Any) -> _Measure | None:
    """CuPy and JAX arrays, pandas frames and series."""
    if _module(value, "cupy") is not None and hasattr(value, "nbytes") and hasattr(value, "device"):
        device = f"cuda:{getattr(value.device, 'id', '?')}"
        return _Measure(
            type="cupy.ndarray",
            device=device,
            bytes=int(value.nbytes),
            shape=str(tuple(value.shape)),
            dtype=str(value.dtype),
            keys={("cupy", device, int(getattr(getattr(value, "data", None), "ptr", id(value)))): int(value.nbytes)},
        )
    if (_module(value, "jax") or _module(value, "jaxlib")) is not None and hasattr(value, "nbytes"):
        devices = getattr(value, "devices", None)
        device = ", ".join(sorted(str(d) for d in devices())) if callable(devices) else "?"
        return _Measure(
            type="jax.Array",
            device=device,
            bytes=int(value.nbytes),
            shape=str(tuple(getattr(value, "shape", ()))),
            dtype=str(getattr(value, "dtype", "")),
            keys={("jax", id(value)): int(value.nbytes)},
        )
    if _module(value, "pandas") is not None and hasattr(value, "memory_usage"):
        usage = value.memory_usage(index=True, deep=False)
        size = int(usage.sum()) if hasattr(usage, "sum") else int(usage)
        return _Measure(
            type=f"pandas.{type(value).__name__}",
            device="cpu",
            bytes=size,
            shape=str(tuple(getattr(value, "shape", ()))),
            dtype=None,
            keys={("pandas", id(value)): size},
        )
    return None


def _one_device(devices: set[str]) -> str:
    return next(iter(devices)) if len(devices) == 1 else ("mixed" if devices else "cpu")


_MEASURES = (_measure_numpy, _measure_torch, _measure_tensorflow, _measure_other)


def measure(value: Any, *, depth: int = 1) -> _Measure | None:
    """The memory an array, tensor, model or frame holds, and where; lists, tuples, dicts and sets of them are
    summed (``depth`` levels down). None for anything else."""
    for measure_one in _MEASURES:
        try:
            measured = measure_one(value)
        except Exception:  # a half-built object, a framework's own error: not something to list
            log.debug("nbcoord: could not measure a %s", type(value).__name__, exc_info=True)
            measured = None
        if measured is not None:
            return measured
    if depth <= 0 or not isinstance(value, (list, tuple, dict, set, frozenset)):
        return None
    items = value.values() if isinstance(value, dict) else value
    keys: dict[Any, int] = {}
    kinds: dict[str, int] = {}
    devices: set[str] = set()
    for index, item in enumerate(items):
        if index >= CONTAINER_ITEMS:
            break
        inner = measure(item, depth=depth - 1)
        if inner is not None:
            keys.update(inner["keys"])
            kinds[inner["type"]] = kinds.get(inner["type"], 0) + 1
            devices.add(inner["device"])
    if not keys:
        return None
    what = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    return _Measure(
        type=f"{type(value).__name__} of {what}",
        device=_one_device(devices),
        bytes=sum(keys.values()),
        shape=f"{len(value):,} items",
        dtype=None,
        keys=keys,
    )


def largest_held(shell: Any, limit: int = LARGEST) -> list[HeldObject]:
    """The largest arrays and tensors still held by the user's namespace and the output cache, largest first."""
    user_ns: dict[str, Any] = getattr(shell, "user_ns", {})
    hidden = getattr(shell, "user_ns_hidden", {})
    candidates: list[tuple[str, str, Any]] = []
    cache = user_ns.get("_oh")
    cached_ids: set[int] = set()
    if isinstance(cache, dict):
        for count, value in list(cache.items()):
            candidates.append((f"Out[{count}]", "output cache", value))
            cached_ids.add(id(value))
    for name, value in list(user_ns.items()):
        if _OUTPUT_NAME.fullmatch(name):
            if id(value) not in cached_ids:
                candidates.append((name, "output cache", value))
                cached_ids.add(id(value))
        elif name not in hidden and not name.startswith("__"):
            candidates.append((name, "namespace", value))
    measured: list[tuple[str, str, _Measure]] = []
    for name, held_by, value in candidates:
        found = measure(value)
        if found is not None and found["bytes"] >= LIST_MIN_BYTES:
            measured.append((name, held_by, found))
    measured.sort(key=lambda entry: entry[2]["bytes"], reverse=True)
    owner_of: dict[Any, str] = {}
    rows: list[HeldObject] = []
    for name, held_by, found in measured:
        shared = next((owner_of[key] for key in found["keys"] if key in owner_of), None)
        for key in found["keys"]:
            owner_of.setdefault(key, name)
        if len(rows) < limit:
            rows.append(
                HeldObject(
                    name=name,
                    held_by=held_by,
                    type=found["type"],
                    device=found["device"],
                    bytes=found["bytes"],
                    shape=found["shape"],
                    dtype=found["dtype"],
                    shares_memory_with=shared,
                )
            )
    return rows


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
