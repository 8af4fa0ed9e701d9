"""The panel's fields: every name cut to ``NAME_CHARS``, times rounded, memory rounded to MiB.

Every name from outside (a thread's, an owner's, a task's, a queue's, a session's, a process's command line) is cut
to ``NAME_CHARS`` (200) characters, the last an ellipsis, and every longer text (a blocked run's sentence, an
exception message) to ``TEXT_CHARS`` (500), so that a 100,000-character thread name costs the front end no more
than a short one (``nbcoord.snapshot()`` keeps it whole). The front end sets every string as text, escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from nbcoord.core.text import NAME_CHARS, bounded
from nbcoord.ui.commands import is_number

MIB: Final = 1 << 20


def name_cut(value: Any, limit: int = NAME_CHARS) -> Any:
    """A string cut to ``limit`` characters, the last being "…" when it was longer; anything else as it is."""
    return bounded(value, limit) if isinstance(value, str) else value


def mib(n: object) -> int | None:
    """Bytes rounded to whole MiB (still in bytes), so that memory that did not move sends nothing."""
    if not is_number(n):
        return None
    return round(float(n) / MIB) * MIB  # type: ignore[arg-type]


def rounded(value: object, digits: int = 2) -> float | None:
    """A time (or a figure) rounded to ``digits`` decimals; None where it is not a number."""
    return round(float(value), digits) if is_number(value) else None  # type: ignore[arg-type]


def significant(value: float | None, digits: int = 2) -> float | None:
    """``value`` to ``digits`` significant digits: CPU seconds that grow all the time change rarely."""
    if value is None or not is_number(value) or value <= 0:
        return value
    return round(value, digits - 1 - math.floor(math.log10(value)))


def reasons(rows: Iterable[Mapping[str, Any]]) -> list[list[Any]]:
    """Zombie reasons as ``[reason, since]`` pairs, first cause first."""
    return [[r["reason"], rounded(r["since"], 1)] for r in rows]
