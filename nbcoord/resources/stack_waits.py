"""What each thread of a kernel read from outside waits on, named from its frames (see
:mod:`nbcoord.resources.stacks`).

A reader from outside sees each frame's function and file, and the type and address of each argument
(``<Event at 0x7f..>``): enough to name the waits of the standard library's primitives, which wait in Python
frames (an Event, a Condition, a Queue, a Semaphore, a Barrier, the end of another thread), and to tell which
thread another one joins (the joined Thread's address is the ``self`` of that thread's own bootstrap frame). A
thread blocked in a C-level ``Lock.acquire`` (``with lock:``) shows no frame of its own for it: its native frames
say so when they were read. Which lock, and who holds it, is known only inside the kernel
(:mod:`nbcoord.core.waits`, asked over the control channel when the kernel can answer).
"""

from __future__ import annotations

import os
import re
from typing import Any

from nbcoord.resources.stack_model import ThreadStack

_OBJECT = re.compile(r"<([\w.]+) at (0x[0-9a-f]+)>")
_STDLIB_WAITS = {
    ("threading.py", "Event"): "an Event",
    ("threading.py", "Semaphore"): "a Semaphore",
    ("threading.py", "BoundedSemaphore"): "a Semaphore",
    ("threading.py", "Barrier"): "a Barrier",
    ("threading.py", "Condition"): "a Condition",
}
_LOCK_SYMBOLS = ("lock_PyThread_acquire_lock", "rlock_acquire", "acquire_timed")


def _object(value: str | None) -> tuple[str, str] | None:
    """``("Event", "0x7f..")`` from a reader's ``<Event at 0x7f..>``."""
    match = _OBJECT.fullmatch(value or "")
    return (match.group(1), match.group(2)) if match else None


def _self_of(frame: Any) -> tuple[str, str] | None:
    arguments = getattr(frame, "arguments", None) or {}
    return _object(arguments.get("self"))


def name_waits(threads: list[Any], stacks: list[ThreadStack]) -> dict[int, str]:
    """Each thread's wait, by tid (threads that wait on nothing nameable are left out). Deadlocks cannot be seen
    from outside: a cycle needs the owners of locks, which only the kernel knows."""
    thread_by_address: dict[str, int] = {}
    for thread in threads:
        frames = list(thread.frames)
        if frames and frames[0].code.scope == "_bootstrap":
            found = _self_of(frames[0])
            if found is not None:
                thread_by_address[found[1]] = int(thread.tid)
    waits: dict[int, str] = {}
    native_by_tid = {stack["tid"]: stack["native"] for stack in stacks}
    for thread in threads:
        text = _wait_of(list(thread.frames), thread_by_address)
        if text is None:
            native = native_by_tid.get(int(thread.tid), [])
            if any(frame["symbol"].startswith(_LOCK_SYMBOLS) for frame in native[-8:]):
                text = "a lock"
        if text is not None:
            waits[int(thread.tid)] = text
    return waits


def _wait_of(frames: list[Any], thread_by_address: dict[str, int]) -> str | None:
    """The outermost standard-library wait among a thread's innermost frames (innermost last): a Queue's ``get``
    waits in a Condition's ``wait``, and it is the Queue that the thread waits on."""
    for frame in frames[-6:]:
        filename = os.path.basename(str(frame.code.filename))
        scope = str(frame.code.scope)
        found = _self_of(frame)
        if filename == "threading.py" and scope in ("join", "_wait_for_tstate_lock") and found is not None:
            tid = thread_by_address.get(found[1])
            return f"thread {tid} to end" if tid is not None else "a thread to end"
        if filename == "queue.py" and scope in ("get", "put"):
            return "a Queue (empty)" if scope == "get" else "a Queue (full)"
        if found is not None and (filename, found[0]) in _STDLIB_WAITS and scope in ("wait", "acquire", "wait_for"):
            return _STDLIB_WAITS[(filename, found[0])]
    return None
