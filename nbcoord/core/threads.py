"""Thread-level hooks: a patched ``Thread.start`` and a chained ``threading.excepthook``.

Installed by the extension's load and removed exactly by its unload. ``Thread.start`` is patched as a class
attribute, so ``threading.Thread`` stays the same class and subclasses that call ``super().start()`` are seen.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import CodeType, FrameType
from typing import Any

from nbcoord.core.internals import executor_name, executor_shut_down, executor_spawn_code, frame_getter
from nbcoord.core.records import INTERNAL_PREFIX, Owner
from nbcoord.core.registry import Registry

__all__ = [
    "INTERNAL_PREFIX", "ThreadHooks", "executor_owner", "kernel_thread_classes", "owner_from_caller",
]

log = logging.getLogger("nbcoord")

#: The code of the executor method that starts worker threads (looked up at install; None: not recognised).
_executor_spawn: CodeType | None = None


#: The kernel's own kinds of thread, by module and class: one of them is the kernel's even when a cell's code starts
#: it (IPython restarts its history-saving thread after every fork, in the forking thread).
KERNEL_THREAD_CLASSES = (
    ("IPython.core.history", "HistorySavingThread"),
    ("ipykernel.thread", "BaseThread"),  # ipykernel 7's control, shell-channel and subshell threads
    ("ipykernel.control", "ControlThread"),  # ipykernel 6's
    ("ipykernel.heartbeat", "Heartbeat"),
    ("ipykernel.parentpoller", "ParentPollerUnix"),
)


def kernel_thread_classes() -> tuple[type, ...]:
    """The classes of :data:`KERNEL_THREAD_CLASSES` whose modules are imported (never imported here)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in KERNEL_THREAD_CLASSES)
    return tuple(cls for cls in found if isinstance(cls, type))


def executor_owner(executor: ThreadPoolExecutor) -> Owner:
    """The owner entry of a ThreadPoolExecutor: closed once shut down; stopping cancels its pending work."""
    prefix = executor_name(executor)

    def is_shut_down(target: object) -> bool:
        return executor_shut_down(target)

    def shut_down(target: object) -> None:
        if isinstance(target, ThreadPoolExecutor):
            target.shutdown(wait=False, cancel_futures=True)

    return Owner(
        kind="executor",
        label=f"ThreadPoolExecutor {prefix!r}",
        ref=weakref.ref(executor),
        is_closed=is_shut_down,
        stop=shut_down,
    )


def owner_from_caller(frame: FrameType | None) -> Owner | None:
    """Recognise who is starting a thread from the caller's frame (cheap: one code-object comparison)."""
    if frame is not None and _executor_spawn is not None and frame.f_code is _executor_spawn:
        executor = frame.f_locals.get("self")
        if isinstance(executor, ThreadPoolExecutor):
            return executor_owner(executor)
    return None


class ThreadHooks:
    """Owns the ``Thread.start`` patch and the ``threading.excepthook`` chain for one registry."""

    def __init__(
        self,
        registry: Registry,
        ignore_exception: Callable[[BaseException], bool],
        started: Callable[[], None] = lambda: None,
    ) -> None:
        self._registry = registry
        self._ignore_exception = ignore_exception
        self._started = started  # told after a thread is registered (the monitor wakes from its quiet)
        self._original_start: Callable[[threading.Thread], None] | None = None
        self._previous_excepthook: Callable[[Any], object] | None = None
        self._patched_start: Callable[[threading.Thread], None] | None = None
        self._patched_excepthook: Callable[[Any], object] | None = None
        self._active = False

    def install(self) -> None:
        """Patch ``Thread.start`` and chain ``threading.excepthook``."""
        global _executor_spawn
        if self._active:
            return
        if _executor_spawn is None:
            _executor_spawn = executor_spawn_code()
        getframe = frame_getter()
        registry = self._registry
        original_start = threading.Thread.start
        hooks = self

        def start(thread: threading.Thread) -> None:
            # Queued before the thread runs, so that a thread failing (or starting another) at its first
            # instruction already has its cell.
            entry = None
            if hooks._active:
                try:
                    caller = getframe(1) if getframe is not None else None
                    executor = _executor_spawn is not None and caller is not None and caller.f_code is _executor_spawn
                    entry = registry.note_started(
                        thread, threading.current_thread(), caller, owner_from_caller(caller) if executor else None
                    )
                    hooks._started()
                except Exception:  # registration must never break the user's thread start
                    log.warning("nbcoord: could not register thread %r", thread.name, exc_info=True)
            try:
                original_start(thread)
            except BaseException:
                if entry is not None:
                    registry.forget_pending(entry)
                raise

        start.__wrapped__ = original_start  # type: ignore[attr-defined]
        start.__doc__ = original_start.__doc__
        previous_hook = threading.excepthook

        def excepthook(args: Any) -> object:
            if hooks._active:
                try:
                    if hooks._ignore_exception(args.exc_value):
                        return None
                    failure = registry.thread_failed(args.thread, args.exc_value)
                    record = registry.get(failure.tid) if failure.tid is not None else None
                    if record is not None and record.user and previous_hook is threading.__excepthook__:
                        # The user's thread: nbcoord keeps the traceback and reports it once, in the next cell.
                        # Python's default hook would print it into whichever cell runs now.
                        return None
                except Exception:
                    log.warning("nbcoord: could not record a thread failure", exc_info=True)
            return previous_hook(args)

        self._original_start, self._patched_start = original_start, start
        self._previous_excepthook, self._patched_excepthook = previous_hook, excepthook
        threading.Thread.start = start  # type: ignore[method-assign,assignment]
        threading.excepthook = excepthook
        self._active = True

    def forget_in_child(self) -> None:
        """In a forked child: both hooks pass straight through (the patches stay: undoing takes no lock, but a
        child has nothing to gain from it)."""
        self._active = False

    def uninstall(self) -> None:
        """Undo :meth:`install`. If someone patched on top of us, leave theirs and make ours pass through."""
        if not self._active:
            return
        self._active = False
        if threading.Thread.start is self._patched_start:
            threading.Thread.start = self._original_start  # type: ignore[assignment,method-assign]
        else:
            log.warning("nbcoord: Thread.start was patched again after nbcoord; leaving it, nbcoord's part is off")
        if threading.excepthook is self._patched_excepthook and self._previous_excepthook is not None:
            threading.excepthook = self._previous_excepthook
        else:
            log.warning("nbcoord: threading.excepthook was replaced after nbcoord; nbcoord's part is off")
