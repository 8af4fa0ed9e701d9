"""The panel's history (sparklines): memory from the resource probe's ring, each queue's fill level, kept as the
points where the values change, so that an idle panel's history stays the same and sends nothing."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from nbcoord.core.snapshot import Snapshot
from nbcoord.ui.commands import is_number
from nbcoord.ui.fields import mib, name_cut
from nbcoord.ui.memory import memory_close

log = logging.getLogger("nbcoord")

HISTORY_POINTS: Final = 120
HISTORY_WINDOW_S: Final = 600.0


def _same(a: Sequence[Any], b: Sequence[Any], close: Callable[[object, object], bool] | None) -> bool:
    return len(a) == len(b) and all(x == y or (close is not None and close(y, x)) for x, y in zip(a, b, strict=True))


def change_points(
    points: Iterable[Sequence[Any]],
    *,
    now: float,
    limit: int = HISTORY_POINTS,
    close: Callable[[object, object], bool] | None = None,
) -> list[list[Any]]:
    """``[t, v...]`` points reduced to where the values change, in the last ``HISTORY_WINDOW_S`` seconds.

    The front end draws steps, extended to now: a level that did not move (or that ``close(new, old)`` finds
    close enough) adds no point, so an idle panel's history stays the same, and sends nothing. Longer series
    keep every n-th point and the last one.
    """
    kept: list[list[Any]] = []
    for point in points:
        if not point or not is_number(point[0]) or point[0] < now - HISTORY_WINDOW_S:
            continue
        values = list(point[1:])
        if kept and _same(kept[-1][1:], values, close):
            continue
        kept.append([round(float(point[0]), 1), *values])
    if len(kept) > limit:
        step = math.ceil(len(kept) / limit)
        kept = kept[::-step][::-1]
    return kept


def panel_history(snapshot: Snapshot, resource_history: Sequence[Mapping[str, Any]], *, now: float) -> dict[str, Any]:
    """Sparkline data: memory (MiB) from the probe's ring, each queue's fill level from its row."""
    memory = change_points(
        (
            [
                p.get("sampled_at"),
                mib(p.get("rss")),
                mib(p.get("gpu_used")),
                mib(p.get("gpu_process_used")),
                mib(p.get("children_rss")),
            ]
            for p in resource_history
        ),
        now=now,
        close=memory_close,
    )
    queues = {
        str(q.get("id", name_cut(q.get("name")))): change_points(q.get("history") or [], now=now)
        for q in snapshot["queues"]
        if q.get("history")
    }
    return {"memory": memory, "queues": queues}


def resource_history(read: Callable[[], Sequence[Mapping[str, Any]]]) -> Sequence[Mapping[str, Any]]:
    """The resource probe's history ring (empty where it cannot be read: logged)."""
    try:
        points = read()
    except Exception:
        log.warning("nbcoord: panel could not read the resource history", exc_info=True)
        return []
    return points if isinstance(points, list) else []
