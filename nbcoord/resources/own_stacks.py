"""The kernel's own native frames (``%nbcoord threads --native``): which C function each thread is in, for threads
stuck in C while the main thread can still answer.

A process cannot ptrace its own threads, so a child process reads them (``python -m nbcoord.resources.stacks PID
--native --after-go``, the reader the server uses, :mod:`nbcoord.resources.stacks`). Under Yama's ``ptrace_scope``
1 (Ubuntu's default) a child may not trace its parent unless the parent names it: the kernel calls
``prctl(PR_SET_PTRACER, child)`` for that one child before the child reads (it waits for a line on its stdin), and
``prctl(PR_SET_PTRACER, 0)`` after. Where even that is refused (``ptrace_scope`` 2 or 3, a seccomp profile without
ptrace), the read says why in one sentence. The child stops every thread of the kernel for its read (0.1-0.7 s here),
so this runs only when asked.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from nbcoord.resources.stack_model import StacksRead
from nbcoord.resources.stacks import called_c_function, unavailable

PR_SET_PTRACER = 0x59616D61
TIMEOUT_S = 20.0


def _set_ptracer(pid: int) -> None:
    """Let ``pid`` trace this process under Yama (a no-op, EINVAL, where Yama is not there)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def read_own_native(
    pid: int, module: str = "pystack", cell_of: Callable[[str], int | None] | None = None
) -> StacksRead:
    """This process's threads with native frames, read by a child; never raises. ``cell_of`` names the frames of
    every cell (the kernel knows them all; a reader from outside knows only the running cell's)."""
    if not sys.platform.startswith("linux"):
        return unavailable(pid, "Native frames are read only on Linux.", native=True)
    command = [sys.executable, "-m", "nbcoord.resources.stacks", str(pid), "--native", "--after-go",
               "--module", module]  # fmt: skip
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as error:
        return unavailable(pid, f"The native stack reader could not start: {error}.", native=True)
    _set_ptracer(child.pid)
    try:
        out, err = child.communicate(b"go\n", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()  # a tracer that ends lets this process go on
        child.communicate()
        return unavailable(pid, f"Reading native frames took over {TIMEOUT_S:.0f} s.", native=True)
    finally:
        _set_ptracer(0)
    try:
        found: StacksRead = json.loads(out)
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return unavailable(pid, f"The native stack reader failed: {tail[0][:160]}", native=True)
    if cell_of is not None:
        for thread in found["threads"]:
            for frame in thread["frames"]:
                cell = cell_of(frame["file"])
                if cell is not None:
                    frame["cell"] = cell
                    frame["where"] = f"cell [{cell}], line {frame['line']} in {frame['function']}"
    return found


def stuck_in_c(read: StacksRead) -> list[dict[str, Any]]:
    """Threads whose innermost frames are C code (not Python's evaluation loop), innermost native frame first."""
    rows = []
    for thread in read["threads"]:
        native = thread["native"]
        if not native:
            continue
        innermost = native[-1]["symbol"]
        if "_PyEval_EvalFrame" in innermost:
            continue
        rows.append(
            {
                "tid": thread["tid"],
                "os_name": thread["name"],
                "called": called_c_function(native),
                "innermost": [frame["symbol"] for frame in reversed(native[-6:])],
                "python": thread["frames"][-1]["where"] if thread["frames"] else None,
            }
        )
    return rows
