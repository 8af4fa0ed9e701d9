"""The fast route's worker: one thread that handles the panel's commands off the kernel's threads, in order.

Kernel channel threads hand commands over with :meth:`Worker.submit`, which never blocks: a command waits in a
bounded queue (``QUEUE_SIZE``), and one that finds the queue full is refused (the ordinary route still delivers
it, later). A flood costs the channel thread little and fills no queue:

- the worker takes every command waiting at once, and a channel thread that appends while the worker is busy
  wakes nobody; in a flood (a command within ``_FLOOD_GAP_S`` of the last batch) the worker lets commands gather
  for ``_GATHER_S`` first, so that it wakes a few hundred times a second, not once per command;
- with a :data:`JoinedHandler`, a command equal to the one queued last but for its ``click_id`` (and
  ``clicked_at``), every other value a plain one of the same type, joins it: its click id is appended to that
  command's ``joined`` list (at most ``MAX_JOINED``), and the worker hands them over in one call. Only the last
  command queued is joined, so commands keep their order.

When no command is left the worker calls its ``idle`` callback, which says in how many seconds it wants to be
called again (the panel sends the acknowledgement it held back in a flood that way).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from nbcoord.core.log import RateLimited, short

__all__ = ["MAX_JOINED", "QUEUE_SIZE", "WORKER_THREAD_NAME", "Handler", "JoinedHandler", "Worker"]

logger = logging.getLogger("nbcoord")

Handler = Callable[[str, dict[str, Any]], None]
"""``handler(comm_id, content)``: ``content`` is the custom message's own content."""

JoinedHandler = Callable[[str, dict[str, Any], list[str]], None]
"""``joined(comm_id, content, click_ids)``: the click ids of the commands that came, one after another, right after
``content``, equal to it but for their ``click_id`` and ``clicked_at``; called right after ``handler(comm_id,
content)``."""

WORKER_THREAD_NAME: Final = "nbcoord-fastcomm"
#: Commands waiting for the worker; more than this means the handler is stuck, and dropping is better than
#: blocking a kernel channel thread.
QUEUE_SIZE: Final = 64
#: Click ids joined to one queued command, at most (each of at most ``_MAX_CLICK_ID`` characters).
MAX_JOINED: Final = 256
_MAX_CLICK_ID: Final = 64
_CLICK_KEYS: Final = frozenset({"click_id", "clicked_at"})
_PLAIN_VALUES: Final = frozenset({str, int, float, bool, type(None)})
_FLOOD_GAP_S: Final = 0.02
_GATHER_S: Final = 0.005
_JOIN_TIMEOUT_S: Final = 2.0

_log_dropped = RateLimited(logging.WARNING, burst=3, window=60.0)
#: A handler that raises (it should not: the panel's catches everything) is logged a few times a minute at most: the
#: commands come from an untrusted front end, and a traceback per message would flood the log.
_log_failed = RateLimited(logging.WARNING, burst=3, window=60.0)


class _Queued:
    """A command waiting for the worker, with the click ids of the equal commands that joined it."""

    __slots__ = ("comm_id", "content", "joined", "key")

    def __init__(self, comm_id: str, content: dict[str, Any], key: tuple[Any, ...] | None) -> None:
        self.comm_id = comm_id
        self.content = content
        self.key = key
        self.joined: list[str] = []

    def join(self, key: tuple[Any, ...] | None, click_id: str | None) -> bool:
        """Join the click of a command with ``key``; False when it is another command, or this one is full."""
        if key is None or click_id is None or key != self.key or len(self.joined) >= MAX_JOINED:
            return False
        self.joined.append(click_id)
        return True


def _join_key(comm_id: str, content: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What a command must equal to join another: its comm id, and every key but the click's own with its value's
    exact type (``True`` never joins ``1``); None when a value is not a plain one (nothing nested is compared)."""
    key: list[Any] = [comm_id]
    for name, value in content.items():
        if name in _CLICK_KEYS:
            continue
        if type(value) not in _PLAIN_VALUES:
            return None
        key.append((name, type(value), value))
    return tuple(key)


class Worker:
    """One thread that calls the handler for each accepted command, in order (see the module's docstring)."""

    def __init__(
        self,
        handler: Handler,
        idle: Callable[[], float | None] = lambda: None,
        joined: JoinedHandler | None = None,
    ) -> None:
        self._handler = handler
        self._joined = joined
        self._idle = idle
        self._lock = threading.Lock()  # guards _pending (the joined lists of its items too), _asleep and _stopping
        self._ready = threading.Condition(self._lock)
        self._pending: collections.deque[_Queued] = collections.deque()
        self._asleep = False  # the worker waits on _ready
        self._stopping = False
        self._last_batch = -math.inf  # when the worker last finished a batch (its own thread only)
        self._thread = threading.Thread(target=self._run, name=WORKER_THREAD_NAME, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, comm_id: str, content: dict[str, Any]) -> bool:
        """Queue a command, or join it to the last one; never blocks (called on kernel channel threads).

        False: dropped (queue full).
        """
        click = content.get("click_id") if self._joined is not None else None
        click_id = click if isinstance(click, str) and len(click) <= _MAX_CLICK_ID else None
        key = _join_key(comm_id, content) if click_id is not None else None
        with self._lock:
            if self._stopping:
                return False
            if self._pending and self._pending[-1].join(key, click_id):
                return True
            taken = len(self._pending) < QUEUE_SIZE
            if taken:
                self._pending.append(_Queued(comm_id, content, key))
                if self._asleep:
                    self._ready.notify()
        if not taken:  # the ordinary route still delivers it, later
            _log_dropped("nbcoord fast route: handler is behind; a command was left to the ordinary route")
        return taken

    def wake(self) -> None:
        """Run the idle callback soon, also with no command queued (something it sends is due a moment later)."""
        with self._lock:
            if self._asleep:
                self._ready.notify()

    def stop(self) -> None:
        """Stop after the command being handled; pending commands are dropped."""
        with self._lock:
            self._stopping = True
            self._pending.clear()
            self._ready.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("nbcoord fast route: worker still busy after %.1f s", _JOIN_TIMEOUT_S)

    def _take(self, timeout: float | None) -> list[_Queued] | None:
        """Every command waiting, after waiting up to ``timeout`` for one ([]: none came); None once stopping."""
        with self._lock:
            if not self._pending and not self._stopping:
                self._asleep = True
                self._ready.wait(timeout)
                self._asleep = False
            flood = bool(self._pending) and time.monotonic() - self._last_batch < _FLOOD_GAP_S
        if flood:
            time.sleep(_GATHER_S)  # without the lock: the channel threads queue and join meanwhile
        with self._lock:
            if self._stopping:
                return None
            batch = list(self._pending)
            self._pending.clear()
            return batch

    def _run(self) -> None:
        wait: float | None = None
        while (batch := self._take(wait)) is not None:
            for item in batch:
                if self._stopping:
                    return
                self._handle(item)
            if batch:
                self._last_batch = time.monotonic()
            wait = None
            if not self._pending:  # a racy read: at worst idle runs once more, or after the next command
                try:
                    wait = self._idle()
                except Exception:
                    logger.exception("nbcoord fast route: idle callback failed")

    def _handle(self, item: _Queued) -> None:
        try:
            self._handler(item.comm_id, item.content)
        except Exception as error:
            _log_failed("nbcoord fast route: handler failed: %s", short(error))
        if item.joined and self._joined is not None:
            try:
                self._joined(item.comm_id, item.content, item.joined)
            except Exception as error:
                _log_failed("nbcoord fast route: handler failed: %s", short(error))
