"""A kernel's stacks, read from outside the kernel: every thread's Python frames (and native frames on request),
without the kernel's help, while a C call holds its GIL or its threads deadlock.

The reader is `pystack <https://github.com/bloomberg/pystack>`_ (the ``native`` extra), called in the calling
process itself. That is the choice's reason: under Yama's ``ptrace_scope`` 1 (Ubuntu's default) only an ancestor of
a process may read it, and the Jupyter server is the ancestor of its kernels, while a helper program such as py-spy
would run as the server's child, the kernel's sibling, and be refused.

Two reads, by what they cost the kernel:

- **Python frames** (the default): read while the kernel runs (``stop_process=False``), so the kernel is not
  paused at all. A thread whose frames change during the read may come back torn; the read is retried.
- **Native frames** (``native=True``): the kernel's threads are stopped (ptrace) for the whole read, which takes
  0.1-0.7 s here (libdw unwinds and symbolises every thread). Only on an explicit request; the reply says how long
  the kernel was paused. Never from the kernel's parent: a parent that stops its child with ptrace receives the
  stop in its own ``waitpid`` too, and ``subprocess.Popen.poll`` (jupyter_client's ``is_alive``) then takes the
  stop for the child's death (returncode -19) while the reader waits for that stop for ever (seen: it hung, and
  the kernel was reported dead). A native read runs in a process of its own (``python -m
  nbcoord.resources.stacks PID --native``, :func:`main`), which Yama's ptrace_scope 1 refuses: native frames need
  ptrace_scope 0 or CAP_SYS_PTRACE.

Frames of a cell read ``cell [3], line 2``: the running cell's number, file and start time are locals of a frame
nbcoord keeps on the main thread's stack while a cell runs (:mod:`nbcoord.kernel.cellmark`), and locals of simple
types are what a reader from outside can see. In a kernel without nbcoord, cells are shown by file name.

What each thread waits on is named from its frames where the frames say it (:mod:`nbcoord.resources.stack_waits`).
Nothing here raises: an unreadable kernel gives a read with ``available`` false and one sentence.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Iterable
from typing import Any, TypedDict

from nbcoord.resources.stack_model import (
    Frame,
    MainThread,
    NativeFrame,
    StacksRead,
    ThreadStack,
)
from nbcoord.resources.stack_waits import name_waits

SCHEMA = "nbcoord.stacks/1"
#: Mark locals (see nbcoord.kernel.cellmark; repeated here so that the server imports nothing of the kernel side).
CELL_LOCAL = "nbcoord_cell"
FILE_LOCAL = "nbcoord_file"
SINCE_LOCAL = "nbcoord_since_ms"
MAX_THREADS = 300
MAX_FRAMES = 60
MAX_NATIVE = 40
MAX_TEXT = 200
#: A read while the kernel runs may see a stack change under it ("Invalid address in remote process"); it is tried
#: this many times, a few milliseconds apart.
ATTEMPTS = 5


def unavailable(pid: int | None, reason: str, *, native: bool = False) -> StacksRead:
    """A read that could not be made, with the one sentence that says why."""
    return StacksRead(
        schema=SCHEMA, pid=pid, available=False, reason=reason[:MAX_TEXT], read_at=time.time(), read_ms=0.0,
        paused_ms=0.0, native=native, main=None, threads=[], deadlocks=[],
    )


def read_stacks(pid: int, *, native: bool = False, module: str = "pystack") -> StacksRead:
    """Read process ``pid``'s threads from outside (see the module docstring); never raises."""
    if not sys.platform.startswith("linux"):
        return unavailable(pid, "Stacks are read from outside only on Linux.", native=native)
    try:
        engine = importlib.import_module(f"{module}.engine")
    except ImportError:
        return unavailable(
            pid, "Reading stacks from outside needs pystack: pip install 'nbcoord[native]' where the server runs.",
            native=native,
        )
    started = time.perf_counter()
    threads: list[Any] = []
    error: Exception | None = None
    for _attempt in range(1 if native else ATTEMPTS):
        try:
            threads = list(
                engine.get_process_threads(
                    pid,
                    stop_process=native,
                    native_mode=engine.NativeReportingMode.ALL if native else engine.NativeReportingMode.OFF,
                    locals=True,
                )
            )
            error = None
            break
        except Exception as failed:  # pystack's EngineError and friends, or a torn read of a running process
            error = failed
            if not _exists(pid) or not _may_read(pid):
                break
            time.sleep(0.005)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if error is not None:
        return unavailable(pid, refusal(pid, error), native=native)
    stacks = [_thread(pid, thread) for thread in threads[:MAX_THREADS]]
    mark = _find_mark(threads)
    if mark is not None:
        _name_cells(stacks, mark)
    waits = name_waits(threads, stacks)
    for stack in stacks:
        stack["waits"] = waits.get(stack["tid"])
    main = next((stack for stack in stacks if stack["main"]), None)
    return StacksRead(
        schema=SCHEMA,
        pid=pid,
        available=True,
        reason=None,
        read_at=time.time(),
        read_ms=round(elapsed_ms, 1),
        # A read that stops the process keeps it stopped for (at most) the whole call.
        paused_ms=round(elapsed_ms, 1) if native else 0.0,
        native=native,
        main=_main_thread(main, mark, native) if main is not None else None,
        threads=stacks,
        deadlocks=[],  # named by the kernel itself when it can answer (nbcoord.server._stacks.merge_waits)
    )


def refusal(pid: int, error: Exception) -> str:
    """One sentence for a read that failed."""
    text = str(error)
    if not _exists(pid):
        return "The kernel's process is gone."
    if not _may_read(pid) or "ermission" in text or "not permitted" in text:
        return (
            "No permission to read the kernel's memory (ptrace): the server must run as the kernel's user and be "
            "its ancestor (Yama ptrace_scope 1), or have CAP_SYS_PTRACE."
        )
    return f"The kernel's stacks could not be read: {text[:120]}"


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _may_read(pid: int) -> bool:
    """Whether this process may read ``pid``'s memory map (the kernel's own check for ptrace's read mode; pystack
    reports a refusal there as "no such process")."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            maps.read(1)
    except PermissionError:
        return False
    except OSError:
        return True
    return True


def _proc_state(pid: int, tid: int) -> tuple[str, str]:
    """A thread's scheduler state letter and OS name, from /proc (``?`` where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
            raw = stat.read().decode("utf-8", "replace")
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        return raw[raw.rindex(")") + 2 : raw.rindex(")") + 3], name
    except (OSError, ValueError):
        return "?", ""


def _thread(pid: int, thread: Any) -> ThreadStack:
    state, name = _proc_state(pid, int(thread.tid))
    frames: list[Frame] = []
    for frame in thread.frames:
        if getattr(frame, "is_shim", False):
            continue
        code = frame.code
        line = int(code.location.lineno)
        function, filename = str(code.scope)[:MAX_TEXT], str(code.filename)[:MAX_TEXT]
        frames.append(
            Frame(where=f"{filename}:{line} in {function}", function=function, file=filename, line=line, cell=None)
        )
    native = [
        NativeFrame(symbol=str(frame.symbol)[:MAX_TEXT], library=os.path.basename(str(frame.library))[:MAX_TEXT])
        for frame in thread.native_frames
    ]
    return ThreadStack(
        tid=int(thread.tid),
        name=name or str(getattr(thread, "name", "") or "")[:MAX_TEXT],
        main=int(thread.tid) == pid,
        holds_gil=bool(thread.holds_the_gil),
        state=state,
        frames=frames[-MAX_FRAMES:],
        native=native[-MAX_NATIVE:],
        waits=None,
    )


class _Mark(TypedDict):
    cell: int
    file: str
    since: float | None


def _find_mark(threads: Iterable[Any]) -> _Mark | None:
    """The running cell's mark (nbcoord.kernel.cellmark), from the main thread's frames' locals."""
    for thread in threads:
        for frame in thread.frames:
            found = getattr(frame, "locals", None) or {}
            if CELL_LOCAL in found and FILE_LOCAL in found:
                try:
                    cell = int(found[CELL_LOCAL])
                    since = int(found[SINCE_LOCAL]) / 1000 if SINCE_LOCAL in found else None
                except ValueError:
                    continue
                if cell < 0:  # code run outside a cell nbcoord saw begin (a silent execution)
                    continue
                return _Mark(cell=cell, file=str(found[FILE_LOCAL]).strip("\"'"), since=since)
    return None


def _name_cells(stacks: list[ThreadStack], mark: _Mark) -> None:
    for stack in stacks:
        for frame in stack["frames"]:
            if frame["file"] == mark["file"]:
                frame["cell"] = mark["cell"]
                frame["where"] = f"cell [{mark['cell']}], line {frame['line']} in {frame['function']}"


def called_c_function(native: list[NativeFrame]) -> str | None:
    """The C function the innermost Python frame called (``builtin_sum``): the first frame after the last
    evaluation-loop frame that is not the interpreter's call machinery; None without native frames."""
    last_eval = max((i for i, frame in enumerate(native) if "_PyEval_EvalFrame" in frame["symbol"]), default=-1)
    if last_eval < 0:  # a thread without Python code (a library's own thread)
        return None
    for frame in native[last_eval + 1 :]:
        symbol = frame["symbol"].replace(" (inlined)", "")
        if symbol.startswith(("_Py", "PyEval", "PyObject_Call", "PyObject_Vectorcall")) or "vectorcall" in symbol:
            continue
        if symbol.startswith(("cfunction_call", "method_vectorcall", "do_call_core")):
            continue
        return symbol
    return None


def _main_thread(stack: ThreadStack, mark: _Mark | None, native: bool) -> MainThread:
    frames = stack["frames"]
    in_cell = [frame for frame in frames if frame["cell"] is not None]
    innermost_cell = in_cell[-1] if in_cell else None
    c_function = called_c_function(stack["native"]) if native else None
    running = mark is not None
    since = mark["since"] if mark is not None else None
    place = innermost_cell["where"] if innermost_cell else (frames[-1]["where"] if frames else "no Python frame")
    for_how_long = f", for {time.time() - since:.1f} s" if since is not None else ""
    if not running:
        doing = "not running a cell"
    elif stack["holds_gil"]:
        what = f"busy in {c_function}" if c_function else "busy"
        doing = f"{what}, holding the GIL, {place}{for_how_long}"
    else:
        doing = f"running {place}{for_how_long}" + (f" (waits: {stack['waits']})" if stack["waits"] else "")
    return MainThread(
        tid=stack["tid"],
        holds_gil=stack["holds_gil"],
        in_c=(c_function is not None) if native else None,
        doing=doing[:MAX_TEXT],
        cell=innermost_cell["cell"] if innermost_cell else (mark["cell"] if mark else None),
        line=innermost_cell["line"] if innermost_cell else None,
        function=c_function or (frames[-1]["function"] if frames else None),
        since=since,
        since_exact=since is not None,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m nbcoord.resources.stacks PID [--native]``: one read, as JSON on stdout (for a process that must
    not read its own child; see the module docstring)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Read a Python process's stacks from outside (pystack).")
    parser.add_argument("pid", type=int)
    parser.add_argument("--native", action="store_true", help="native frames too (stops the process for the read)")
    parser.add_argument("--module", default="pystack")
    parser.add_argument("--after-go", action="store_true", help="read after a line on stdin (the target allows us)")
    options = parser.parse_args(argv)
    if options.after_go:
        sys.stdin.readline()
    print(json.dumps(read_stacks(options.pid, native=options.native, module=options.module)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
