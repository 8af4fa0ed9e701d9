"""The panel's memory: the kernel's and its children's memory, per GPU, and what each cell did to it.

Memory is rounded to MiB and moves only by visible steps: a figure is replaced only when it moved by more than
2 MiB and 1 % (:func:`steady_resources`), so that memory sitting on a MiB boundary sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbcoord.ui.commands import is_number
from nbcoord.ui.fields import MIB, mib, name_cut, rounded
from nbcoord.ui.source import Shaping

#: Child processes sent.
MAX_CHILDREN = 50


def resources_state(resources: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Memory rounded to MiB and the child processes: what the memory section draws.

    Not the native-thread count: the probe lists the threads only at its full reads (seconds apart under its duty
    cap), and the header carries the count read at every update; a second, staler copy here would only change
    the trait (one more message) whenever a full read catches up, in a panel that is otherwise idle."""
    if not resources:
        return None
    host = dict(resources.get("host") or {})
    for key in ("rss", "uss", "children_rss", "tf_cpu_current", "tf_cpu_peak"):
        if key in host:
            host[key] = mib(host[key])
    # The machine's available memory moves with every other process: not the kernel's, and never quiet.
    host.pop("available", None)
    gpu = dict(resources.get("gpu") or {})
    gpu["devices"] = [
        {
            **{k: name_cut(v) for k, v in device.items()},
            **{k: mib(device.get(k)) for k in ("used", "process_used", "tf_current", "tf_peak") if k in device},
        }
        for device in gpu.get("devices") or []
    ]
    children = [
        {
            "pid": c.get("pid"),
            "cmdline": name_cut(str(c.get("cmdline", ""))),
            "status": c.get("status"),
            "rss": mib(c.get("rss")),
            "gpu_mem": mib(c.get("gpu_mem")),
            "cell": c.get("cell"),
            "started_at": rounded(c.get("started_at")),
        }
        for c in (resources.get("children") or [])[:MAX_CHILDREN]
    ]
    return {
        "host": host,
        "gpu": gpu,
        "children": children,
    }


def cell_memory_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a cell did to memory (MiB-rounded): the front end says "+2.1 GiB on the GPU, still held"."""
    out: dict[str, Any] = {"cell": row.get("cell"), "held": bool(row.get("held"))}
    for key in ("rss_before", "rss_after", "rss_peak", "gpu_before", "gpu_after", "gpu_peak"):
        out[key] = mib(row.get(key))
    return out


def _close_enough(new: object, old: object, tolerance: float) -> bool:
    return is_number(new) and is_number(old) and abs(float(new) - float(old)) < tolerance  # type: ignore[arg-type]


def memory_close(new: object, old: object) -> bool:
    """Memory figures within 2 MiB or 1 % of each other: below what the panel shows."""
    return is_number(old) and _close_enough(new, old, max(2 * MIB, abs(float(old)) / 100))  # type: ignore[arg-type]


def steady_resources(new: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any] | None:
    """``new``, keeping ``old``'s figures where they moved less than a step (hysteresis for rounding).

    Memory rounded to MiB still flips when it sits on a boundary: a figure is replaced only when it moved by
    more than 2 MiB and 1 %.
    """
    if not new or not old:
        return new
    result = {**new, "host": dict(new.get("host") or {})}
    host, old_host = result["host"], old.get("host") or {}
    for key in host:
        if key != "total" and memory_close(host[key], old_host.get(key)):
            host[key] = old_host[key]
    old_devices = {d.get("index"): d for d in (old.get("gpu") or {}).get("devices") or []}
    gpu = dict(new.get("gpu") or {})
    devices = []
    for device in gpu.get("devices") or []:
        previous = old_devices.get(device.get("index"), {})
        devices.append(
            {
                k: previous[k] if k not in ("total", "index") and memory_close(v, previous.get(k)) else v
                for k, v in device.items()
            }
        )
    gpu["devices"] = devices
    result["gpu"] = gpu
    return result


# ------------------------------------------------------------------------------------ the sections' shaping
def shape_resources(s: Shaping) -> dict[str, Any] | None:
    """Memory and the child processes (the controller keeps it steady between ticks)."""
    return resources_state(s.snapshot["resources"])


def shape_cell_memory(s: Shaping) -> list[dict[str, Any]]:
    """What the last cells did to memory."""
    return [cell_memory_row(r) for r in s.cell_memory]
