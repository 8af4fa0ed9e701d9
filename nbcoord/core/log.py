"""Where nbcoord's own messages go: the kernel's log, never the running cell, and never in floods.

A logger without handlers makes Python write its warnings through the last-resort handler to ``sys.stderr``,
which in a kernel is the output of whichever cell runs. While loaded, nbcoord's logger (``"nbcoord"``) has a
handler on the process's standard error as the kernel's parent gave it (the terminal or log of the Jupyter
server that started the kernel; ipykernel 7 forwards file descriptor 2 into the running cell, so not that one).
Messages an untrusted peer can cause (a rejected panel command) go through :class:`RateLimited`, with values cut
to a short prefix by :func:`short`.
"""

from __future__ import annotations

import contextlib
import logging
import reprlib
import threading
import time
from collections.abc import Callable
from typing import Any

from nbcoord.core.text import printable

log = logging.getLogger("nbcoord")

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxdict = 8
_short.maxlist = 8
_short.maxlevel = 3


def short(value: object) -> str:
    """A short, bounded representation of ``value`` (a 10 MB string costs no more than a small one)."""
    return _short.repr(value)


class _ServerLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on nbcoord's own stream onto the server's log: a write that fails (the log closed at the
    kernel's end) is dropped, never reported through Python's logging error print into a cell."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class _EscapingFormatter(logging.Formatter):
    """One record, one line: a name or value in a message cannot forge log lines (a newline), recolour a terminal
    (ESC) or reorder what a reader sees (bidi overrides); a traceback keeps its own newlines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep="\n")


def install_handler() -> Callable[[], None]:
    """Send nbcoord's log to the process's standard error as the kernel's parent gave it (never the file
    descriptor ipykernel 7 forwards into the running cell: see :func:`nbcoord.core.internals.log_stream`); returns the
    function that removes the handler and closes its stream."""
    from nbcoord.core.internals import log_stream

    stream = log_stream()
    handler: logging.Handler = _ServerLogHandler(stream) if stream is not None else logging.NullHandler()
    handler.setFormatter(_EscapingFormatter("[nbcoord %(levelname)s %(asctime)s] %(message)s"))
    log.addHandler(handler)

    def remove() -> None:
        log.removeHandler(handler)
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.close()

    return remove


class RateLimited:
    """Logs at most ``burst`` messages per ``window`` seconds; the rest are counted, and the next message that is
    let through says how many were left out."""

    def __init__(
        self,
        level: int = logging.WARNING,
        *,
        burst: int = 5,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._level = level
        self.burst = burst
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()  # guards _window_start, _count, _suppressed
        self._window_start = -window
        self._count = 0
        self._suppressed = 0
        #: Every message asked for, logged or not.
        self.calls = 0

    def __call__(self, message: str, *args: object) -> bool:
        """Log ``message % args`` unless over the rate; returns whether it was logged."""
        with self._lock:
            self.calls += 1
            now = self._clock()
            if now - self._window_start >= self._window:
                self._window_start, self._count = now, 0
            if self._count >= self.burst:
                self._suppressed += 1
                return False
            self._count += 1
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            message += f" ({suppressed} similar message(s) left out)"
        log.log(self._level, message, *args)
        return True

    @property
    def suppressed(self) -> int:
        """Messages left out since the last one logged."""
        return self._suppressed
