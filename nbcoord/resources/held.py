"""What the user's names still hold: the largest arrays, tensors, models and frames by variable name, for
``%nbcoord reclaim``.

Each framework measures its own values (:mod:`nbcoord.resources.frameworks`: the built-in ones in
:mod:`nbcoord.resources.libraries`, TensorFlow's once it registered); lists, tuples, dicts and sets of them are
summed here. Memory shared by two names is counted once and said so. Nothing here imports a framework.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypedDict

from nbcoord.resources import frameworks
from nbcoord.resources.frameworks import Measure
from nbcoord.resources.libraries import BUILTIN, one_device

log = logging.getLogger("nbcoord")

#: Objects smaller than this are not listed as held.
LIST_MIN_BYTES = 2**20
#: How many held objects the report lists.
LARGEST = 10
#: How many items of a list, tuple, dict or set are looked at.
CONTAINER_ITEMS = 1000
_OUTPUT_NAME = re.compile(r"_\d+|_{1,3}")


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


def _measures() -> list[Callable[[Any], Measure | None]]:
    """Every framework's measure, in report order (each answers None for what is not its own)."""
    return [f.measure for f in frameworks.ordered([*BUILTIN, *frameworks.registered()]) if f.measure is not None]


def measure(value: Any, *, depth: int = 1) -> Measure | None:
    """The memory an array, tensor, model or frame holds, and where; lists, tuples, dicts and sets of them are
    summed (``depth`` levels down). None for anything else."""
    for measure_one in _measures():
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
    return Measure(
        type=f"{type(value).__name__} of {what}",
        device=one_device(devices),
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
    measured: list[tuple[str, str, Measure]] = []
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
