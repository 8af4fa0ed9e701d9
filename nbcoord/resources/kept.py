"""What IPython keeps by accident, dropped by ``%nbcoord reclaim``: the last exception (with the local variables of
every frame its traceback passed through) and the output cache.

After a cell fails, IPython keeps the exception (``sys.last_exc``, ``sys.last_value``, ``sys.last_traceback`` and
its last ``ExecutionResult``) for ``%debug`` and ``%tb``. The output cache (``Out``, ``_``, ``__``, ``___``, ``_N``)
keeps every displayed value.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any


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
