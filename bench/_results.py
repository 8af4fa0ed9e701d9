"""One machine-readable line per headline figure, printed beside a bench script's own table.

Each bench script calls :func:`result` once per headline figure; the line it prints is ``RESULT<TAB>{json}``.
``bench/run_all.py`` runs every script, collects these lines and prints one table. The fields:

name      what was measured (stable across runs, so that two tables can be compared)
value     the figure with nbcoord
baseline  the same figure without nbcoord, or its anchor, measured in the same run (null: none exists)
vs        what the baseline is, in words
unit      of value and baseline
ratio     value / baseline, unless the script gives a better estimate (a median of paired ratios)
target    the target in words (null: none was set)
met       whether the target was met (null: no target)
note      anything a reader needs to read the figure (exit statuses, which route)
"""

from __future__ import annotations

import json
import math
from typing import Any

PREFIX = "RESULT\t"


def _number(value: float | None) -> float | None:
    """JSON has no NaN or infinity: a figure that could not be measured is null."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def result(
    name: str,
    value: float | None,
    baseline: float | None,
    unit: str,
    target: str | None = None,
    met: bool | None = None,
    *,
    vs: str = "",
    ratio: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """Print one ``RESULT`` line (flushed, so that it interleaves rightly with the table) and return its record."""
    value, baseline = _number(value), _number(baseline)
    if ratio is None and value is not None and baseline:
        ratio = value / baseline
    record: dict[str, Any] = {
        "name": name,
        "value": value,
        "baseline": baseline,
        "vs": vs,
        "unit": unit,
        "ratio": _number(ratio),
        "target": target,
        "met": None if target is None else met,
        "note": note,
    }
    print(PREFIX + json.dumps(record), flush=True)
    return record


def parse(line: str) -> dict[str, Any] | None:
    """The record of a ``RESULT`` line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        record = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) and "name" in record else None
