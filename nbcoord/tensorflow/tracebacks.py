"""A cancelled run's traceback ends at the user's call, not inside nbcoord.

nbcoord ends a blocked ``Session.run`` (or eager queue call) with a KeyboardInterrupt raised in its own wrapper,
TensorFlow's frames already dropped (``with_traceback(None)``). That leaves the wrapper's frame at the end of the
traceback, and IPython always shows a traceback's innermost frame, ``__tracebackhide__`` or not. IPython's public
``set_custom_exc`` lets a handler display KeyboardInterrupt: this one cuts a cancelled run's traceback before the
first frame of nbcoord's wrappers, and shows every other KeyboardInterrupt exactly as IPython does.

IPython has one such handler slot. nbcoord takes it only while it is free, and gives it back at unload only if it
is still its own; a user's later ``set_custom_exc`` replaces it (a cancelled run's traceback then ends in
nbcoord's wrapper again, as it would without this).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any

from nbcoord.core.fallbacks import RECORD

log = logging.getLogger("nbcoord")

#: Set on the KeyboardInterrupt of a run or queue call nbcoord cancelled.
CANCELLED_MARK = "_nbcoord_cancelled"


def mark_cancelled(interrupt: KeyboardInterrupt) -> KeyboardInterrupt:
    """Mark ``interrupt`` as the end of a call nbcoord cancelled (its traceback is cut where nbcoord's starts)."""
    setattr(interrupt, CANCELLED_MARK, True)
    return interrupt


def is_cancelled(exc: BaseException) -> bool:
    return bool(getattr(exc, CANCELLED_MARK, False))


def cut_at(tb: TracebackType | None, files: Collection[str]) -> TracebackType | None:
    """``tb`` without its entries from the first frame of one of ``files`` on (cut in place); the whole
    traceback where none is in them, or where the very first is."""
    previous: TracebackType | None = None
    entry = tb
    while entry is not None:
        if entry.tb_frame.f_code.co_filename in files:
            if previous is None:
                return tb
            previous.tb_next = None
            return tb
        previous, entry = entry, entry.tb_next
    return tb


def install(shell: Any, wrapper_files: Collection[str]) -> Callable[[], None] | None:
    """Take IPython's custom exception slot for KeyboardInterrupt, if free; returns the undo (None: not taken)."""
    if getattr(shell, "custom_exceptions", None) != () or not callable(getattr(shell, "set_custom_exc", None)):
        RECORD.fall_back(
            "InteractiveShell.set_custom_exc",
            "another handler holds IPython's custom exception slot: a cancelled run's traceback ends in "
            "nbcoord's wrapper",
            "IPython's ",
        )
        return None
    files = frozenset(wrapper_files)

    def show(shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None) -> None:
        if is_cancelled(value):
            tb = cut_at(tb, files)
        # What IPython's run_code does with an exception no custom handler takes.
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)

    shell.set_custom_exc((KeyboardInterrupt,), show)
    installed = shell.CustomTB

    def undo() -> None:
        if shell.CustomTB is installed:
            shell.set_custom_exc((), None)  # IPython's own initial state

    return undo
