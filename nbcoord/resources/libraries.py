"""The frameworks whose memory hooks are built in (see :mod:`nbcoord.resources.frameworks`): PyTorch, CuPy and JAX
(what reclaim can give back or says they keep), and the sizes of NumPy, PyTorch, CuPy and JAX arrays and pandas
frames. Each reads the framework from ``sys.modules`` only: nothing here imports one.

PyTorch's CUDA allocator is asked only where PyTorch already uses CUDA in this process: asking anything more would
start a CUDA context (a few hundred MiB of GPU memory).
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

from nbcoord.resources.frameworks import Framework, FrameworkAction, Measure

log = logging.getLogger("nbcoord")

JAX_NOTE = (
    "JAX preallocates most of each GPU's memory at its first use there and keeps it until the kernel process exits "
    "(set XLA_PYTHON_CLIENT_PREALLOCATE=false before importing JAX to allocate on demand)."
)
TORCH_CONTEXT_NOTE = (
    "PyTorch's CUDA context (a few hundred MiB per device it used) stays until the kernel process exits."
)


def _module(value: Any, name: str) -> ModuleType | None:
    """The framework ``name`` if the user imported it and ``value``'s type comes from it (never imports it)."""
    root = type(value).__module__.partition(".")[0]
    return sys.modules.get(name) if root == name else None


def one_device(devices: set[str]) -> str:
    """The one device of a set, "mixed" for several, "cpu" for none."""
    return next(iter(devices)) if len(devices) == 1 else ("mixed" if devices else "cpu")


# ----------------------------------------------------------------------------------------------- PyTorch
def torch_cuda() -> Any:
    """``torch.cuda`` where the user imported PyTorch and it already uses CUDA here; None otherwise."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # a broken or partial install
        log.debug("nbcoord: torch.cuda.is_initialized() failed", exc_info=True)
        return None


def torch_figures() -> list[tuple[int, int, int]]:
    """(CUDA index, allocated, reserved) of each device PyTorch's allocator knows; empty where it uses no CUDA."""
    cuda = torch_cuda()
    if cuda is None:
        return []
    try:
        return [(i, int(cuda.memory_allocated(i)), int(cuda.memory_reserved(i))) for i in range(cuda.device_count())]
    except Exception:
        log.warning("nbcoord: reading PyTorch's CUDA allocator failed", exc_info=True)
        return []


def _release_torch(_gpu_note: str | None) -> FrameworkAction:
    cuda = torch_cuda()
    if cuda is None:
        action = "nothing cached on a GPU: it has not used CUDA in this process"
        return FrameworkAction(framework="PyTorch", action=action, note=None)
    try:
        cuda.empty_cache()
        cuda.ipc_collect()
        action = "torch.cuda.empty_cache(): cached blocks no tensor uses went back to the driver"
    except Exception as exc:
        log.warning("nbcoord: torch.cuda.empty_cache() failed", exc_info=True)
        action = f"torch.cuda.empty_cache() failed: {type(exc).__name__}: {exc}"
    return FrameworkAction(framework="PyTorch", action=action, note=TORCH_CONTEXT_NOTE)


def _measure_torch(value: Any) -> Measure | None:
    torch = _module(value, "torch")
    if torch is None:
        return None
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage()
            identity: dict[Any, int] = {("torch", str(value.device), storage.data_ptr()): int(storage.nbytes())}
        except Exception:  # sparse, meta or nested tensors have no plain storage
            identity = {("torch-object", id(value)): int(value.nelement() * value.element_size())}
        return Measure(
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
        return Measure(
            type=f"torch.nn.Module ({type(value).__name__})",
            device=one_device(devices),
            bytes=sum(keys.values()),
            shape=None,
            dtype=None,
            keys=keys,
        )
    return None


# ------------------------------------------------------------------------------------------ CuPy and JAX
def _release_cupy(_gpu_note: str | None) -> FrameworkAction:
    cupy = sys.modules["cupy"]
    try:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        action = "free_all_blocks() on CuPy's memory pools"
    except Exception as exc:
        log.warning("nbcoord: freeing CuPy's pools failed", exc_info=True)
        action = f"freeing CuPy's pools failed: {type(exc).__name__}: {exc}"
    return FrameworkAction(framework="CuPy", action=action, note=None)


def _measure_cupy(value: Any) -> Measure | None:
    if _module(value, "cupy") is None or not hasattr(value, "nbytes") or not hasattr(value, "device"):
        return None
    device = f"cuda:{getattr(value.device, 'id', '?')}"
    return Measure(
        type="cupy.ndarray",
        device=device,
        bytes=int(value.nbytes),
        shape=str(tuple(value.shape)),
        dtype=str(value.dtype),
        keys={("cupy", device, int(getattr(getattr(value, "data", None), "ptr", id(value)))): int(value.nbytes)},
    )


def _release_jax(_gpu_note: str | None) -> FrameworkAction:
    return FrameworkAction(framework="JAX", action="", note=JAX_NOTE)


def _measure_jax(value: Any) -> Measure | None:
    if (_module(value, "jax") or _module(value, "jaxlib")) is None or not hasattr(value, "nbytes"):
        return None
    devices = getattr(value, "devices", None)
    device = ", ".join(sorted(str(d) for d in devices())) if callable(devices) else "?"
    return Measure(
        type="jax.Array",
        device=device,
        bytes=int(value.nbytes),
        shape=str(tuple(getattr(value, "shape", ()))),
        dtype=str(getattr(value, "dtype", "")),
        keys={("jax", id(value)): int(value.nbytes)},
    )


# ---------------------------------------------------------------------------------------- NumPy and pandas
def _measure_numpy(value: Any) -> Measure | None:
    np = sys.modules.get("numpy")
    if np is None or not isinstance(value, np.ndarray):
        return None
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    key = ("numpy", id(root.base if root.base is not None else root))
    return Measure(
        type="numpy.ndarray",
        device="cpu",
        bytes=int(value.nbytes),
        shape=str(tuple(value.shape)),
        dtype=str(value.dtype),
        keys={key: int(root.nbytes)},
    )


def _measure_pandas(value: Any) -> Measure | None:
    if _module(value, "pandas") is None or not hasattr(value, "memory_usage"):
        return None
    usage = value.memory_usage(index=True, deep=False)
    size = int(usage.sum()) if hasattr(usage, "sum") else int(usage)
    return Measure(
        type=f"pandas.{type(value).__name__}",
        device="cpu",
        bytes=size,
        shape=str(tuple(getattr(value, "shape", ()))),
        dtype=None,
        keys={("pandas", id(value)): size},
    )


#: The built-in frameworks, in report order (TensorFlow, 30, registers itself: nbcoord.tensorflow.memory).
BUILTIN = (
    Framework("numpy", "NumPy", 0, measure=_measure_numpy),
    Framework("torch", "PyTorch", 10, release=_release_torch, measure=_measure_torch),
    Framework("cupy", "CuPy", 20, release=_release_cupy, measure=_measure_cupy),
    Framework("jax", "JAX", 40, release=_release_jax, measure=_measure_jax),
    Framework("pandas", "pandas", 50, measure=_measure_pandas),
)
