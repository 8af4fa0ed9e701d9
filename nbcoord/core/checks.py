"""Checks of what callers pass in, shared by the Python API, the magic and the settings: one sentence per mistake.

The API raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, wrong value); the magic turns
either into IPython's ``UsageError`` with the same words. Numbers must be finite: a NaN grace period or an infinite
panel interval would otherwise turn into a stop that never ends or a thread that spins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nbcoord.core.log import short
from nbcoord.core.stop import ScopeKind

#: Longest grace period or timeout accepted, in seconds (a day): beyond that a number is a mistake.
MAX_SECONDS = 86_400.0


def finite_number(name: str, value: object, *, low: float = 0.0, high: float = MAX_SECONDS) -> float:
    """``value`` as a float in ``[low, high]``; TypeError for a non-number, ValueError for NaN, infinities and
    values out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {short(value)}.")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float (10**400): out of range, said with the name
        raise ValueError(f"{name} must be between {low:g} and {high:g} seconds, not {short(value)}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number of seconds, not {short(value)}.")
    if not low <= number <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g} seconds, not {short(value)}.")
    return number


def flag(name: str, value: object) -> bool:
    """``value`` if it is a bool; TypeError otherwise (``force='no'`` must not count as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {short(value)}.")
    return value


def stop_scope(*, cell: object, thread: object, zombies: object) -> tuple[ScopeKind, int | None, str | None]:
    """The scope a stop names: everything, one cell, one thread or the zombies (at most one of them)."""
    flag("zombies", zombies)
    chosen = [name for name, given in (("cell", cell is not None), ("thread", thread is not None), ("zombies", zombies))
              if given]
    if len(chosen) > 1:
        raise ValueError(f"Choose one scope: cell, thread or zombies (got {' and '.join(chosen)}).")
    if cell is not None:
        if isinstance(cell, bool) or not isinstance(cell, int):
            raise TypeError(f"cell must be a cell's execution count (an int), not {short(cell)}.")
        return "cell", cell, None
    if thread is not None:
        if not isinstance(thread, str):
            raise TypeError(f"thread must be a thread id such as 't12', not {short(thread)}.")
        return "thread", None, thread
    return ("zombies" if zombies else "all"), None, None


def callback(name: str, value: object) -> Callable[[], None]:
    """``value`` if it can be called; TypeError now rather than at stop time."""
    if not callable(value):
        raise TypeError(f"{name} takes a callable, not {short(value)}.")
    checked: Callable[[], None] = value
    return checked


def optional_seconds(name: str, value: Any) -> float | None:
    """None, or a finite number of seconds."""
    return None if value is None else finite_number(name, value)
