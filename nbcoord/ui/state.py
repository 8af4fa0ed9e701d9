"""The panel's state, shaped from one snapshot: pure functions, the same snapshot gives the same JSON.

:func:`panel_state` is every section of the registry (:mod:`nbcoord.ui.sections`) that is shaped from a snapshot,
in its order. Figures that move on their own are not sent: idle times, ages and how long a run has been blocked
are computed by the front end from the absolute times sent (``last_active``, ``since``, ``started_at``), so that
an idle kernel sends nothing. Memory is rounded to MiB (:mod:`nbcoord.ui.memory`), history is kept as change points
(:mod:`nbcoord.ui.history`), every name is cut short (:mod:`nbcoord.ui.fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbcoord.core.snapshot import Snapshot
from nbcoord.ui.sections import SHAPED
from nbcoord.ui.source import Shaping


def panel_state(
    snapshot: Snapshot,
    *,
    route: str = "none",
    interval: float = 1.0,
    stop_extra: Mapping[str, Any] | None = None,
    native_threads: int | None = None,
) -> dict[str, Any]:
    """The panel's traits shaped from one snapshot (all but history and the controller's answers). Pure."""
    shaping = Shaping(snapshot, route=route, interval=interval, stop_extra=stop_extra, native_threads=native_threads)
    return {section.trait: section.shape(shaping) for section in SHAPED if section.shape is not None}
