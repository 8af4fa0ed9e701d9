"""A mark on the main thread's stack while a cell runs, readable from outside the kernel.

When a C call holds the GIL, nothing in the kernel can answer, and the Jupyter server reads the kernel's stacks
from outside (:mod:`nbcoord.resources.stacks`). Such a reader sees each frame's code file and line, and the local
variables of simple types, but not the kernel's objects: the file of a cell's code (``ipykernel_<pid>/<hash>.py``)
does not say which cell it is, and nothing says since when the cell runs.

This module wraps the shell's ``run_code`` (IPython's public method that executes each of a cell's code objects)
in a coroutine whose frame stays on the stack, above the cell's code, while it runs. Its locals are the mark: the
cell's execution count, the code's file name, and the time the cell began (epoch milliseconds; an int, which a
reader prints in full). Reading them costs the kernel nothing; writing them costs one frame per code object run.

The frame is above ``run_code``, which IPython marks as the bottom of what a traceback shows
(``__tracebackhide__``): tracebacks are unchanged. The wrapper is an attribute of the shell instance, so removing
it restores the class's method; if someone wrapped ``run_code`` after us, we leave theirs in place (and say so).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

#: The mark's local variable names, which :mod:`nbcoord.resources.stacks` looks for.
CELL_LOCAL = "nbcoord_cell"
FILE_LOCAL = "nbcoord_file"
SINCE_LOCAL = "nbcoord_since_ms"


def install(host: Host) -> Callable[[], None]:
    """Wrap ``host.shell.run_code``; returns the undo. Where the shell has no coroutine ``run_code`` (another shell,
    an IPython that changed it), nothing is wrapped and outside readers show cells by file name."""
    shell = host.shell
    original = getattr(shell, "run_code", None)
    if original is None or not inspect.iscoroutinefunction(original) or "run_code" in vars(shell):
        host.degraded_routes["cell-mark"] = (
            "the shell's run_code is not IPython's coroutine method: a kernel read from outside shows cells by "
            "file name"
        )
        return lambda: None

    wrapper = _marked(original, host)
    shell.run_code = wrapper

    def uninstall() -> None:
        if vars(shell).get("run_code") is wrapper:
            del shell.run_code
        else:
            log.warning("nbcoord: the shell's run_code was wrapped again after nbcoord; nbcoord leaves it in place")

    return uninstall


def _marked(original: Callable[..., Any], host: Host) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_code(code_obj: Any, result: Any = None, *, async_: bool = False) -> Any:
        # The registry's running cell, as the rest of nbcoord numbers it (IPython 9 has already moved its own
        # execution_count on when the code runs; 8 has not).
        cell = host.registry.current_cell()
        nbcoord_cell = cell.execution_count if cell is not None else -1
        nbcoord_since_ms = int(cell.started_at * 1000) if cell is not None else int(time.time() * 1000)
        nbcoord_file = str(getattr(code_obj, "co_filename", ""))
        outcome = await original(code_obj, result, async_=async_)
        # Referenced after the await, so that every compiler keeps them as locals of this frame while the cell runs.
        _ = (nbcoord_cell, nbcoord_file, nbcoord_since_ms)
        return outcome

    return run_code
