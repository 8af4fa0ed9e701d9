"""The panel's commands: validated against what the kernel issued, acted on once, never in floods.

The front end is untrusted. A command is a small JSON object: a stop (all / a cell / a thread / the zombies; a
stop of all may also interrupt the running cell), a restart of a TensorFlow session's queue runners, a reclaim of
memory, a stack request, a view's presence. Each carries a ``click_id`` of the form ``<view id>-<n>``, where the
panel's module numbers each view's clicks. Every command is checked by :func:`parse_command` against the ids this
kernel issued: a thread id must name a live thread that a cell started (never the kernel's own threads, never
nbcoord's: the one check of a stop's thread, ``Host.check_stoppable``, through :func:`thread_check`), a cell number
a cell that ran, a session id a session of the last snapshot that can be restarted.
Every field is checked by type and range before it is used (a list where a string belongs, ``10**400``, NaN, a
value nested 400 deep or 100,000 characters long are all rejected the same way, never raised). Anything else
raises :class:`Rejected`, which the caller logs through a rate limit, with values cut short (the reason and the
content to ``REJECTED_CHARS`` characters each): a flood of bad messages writes a few lines to the kernel's log,
and nothing into the running cell.

A click reaches the kernel by up to two routes (the fast route, and the widget's ordinary message when the main
thread is free), any time apart: :class:`ClickLedger` remembers which clicks were acted on, per view, as a
watermark plus the few seen above it, so a click is acted on once however many messages come between its copies.

Stops and restarts are run by :class:`StopRunner`, on a thread of its own, never on a kernel channel thread or
the main thread: taking a click costs a few microseconds whatever the action costs, and a click that arrives while
an equal action waits or runs joins it (a burst of clicks is one stop, one report). A click for yet another action
when ``MAX_WAITING_STOPS`` different ones already wait is refused, and its outcome says so: every click that was
acknowledged gets an outcome. Reclaims run on the main thread (see :mod:`.actions`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from nbcoord.core.log import RateLimited, short
from nbcoord.core.stop import ScopeKind
from nbcoord.core.text import shown
from nbcoord.core.threads import INTERNAL_PREFIX

log = logging.getLogger("nbcoord")

#: Command types the front end may send; the fast route takes exactly these.
COMMAND_TYPES: Final = frozenset({"stop", "stack", "view", "restart", "reclaim"})
#: Types that are actions: run one after another on the runner's thread, and answered with an outcome.
ACTION_TYPES: Final = frozenset({"stop", "restart", "reclaim"})
STOP_THREAD_NAME: Final = f"{INTERNAL_PREFIX}panel-stop"
#: The stop thread ends after this long without a stop.
STOP_THREAD_IDLE_S: Final = 30.0
#: Different stops that may wait at once; a click for yet another is refused (its outcome says why).
MAX_WAITING_STOPS: Final = 8
#: Characters of a rejection's reason, and of the rejected content's representation, in the log.
REJECTED_CHARS: Final = 200
#: The largest cell number a command may name (a cell's execution count).
MAX_CELL: Final = 2**31 - 1
#: ``clicked_at`` and ``client_time`` are times since the epoch, in milliseconds (the module's ``Date.now()``) or
#: seconds: 0 to this (1e15 ms is the year 33658).
MAX_TIME: Final = 1e15
#: Ints beyond this do not convert to a float (``float(10**400)`` raises OverflowError).
_FLOAT_INT: Final = 2**1023
#: Click ids kept per view above its watermark, and views remembered.
_MAX_ABOVE: Final = 1024
_MAX_VIEWS: Final = 64
_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_SESSION_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_CLICK_ID: Final = re.compile(r"([A-Za-z0-9_.:]{1,48})-([0-9]{1,15})")
_STOP_SCOPES: Final = frozenset({"all", "cell", "thread", "zombies"})
#: A view's presence (open, alive, close), and its request for every row (rows: it missed a difference).
_VIEW_ACTIONS: Final = frozenset({"open", "alive", "close", "rows"})
_KEYS: Final = {
    "stop": frozenset({"type", "click_id", "scope", "cell", "tid", "force", "interrupt", "clicked_at"}),
    "stack": frozenset({"type", "click_id", "tid", "clicked_at"}),
    "view": frozenset({"type", "click_id", "view_id", "action", "client_time"}),
    "restart": frozenset({"type", "click_id", "session", "clicked_at"}),
    "reclaim": frozenset({"type", "click_id", "clicked_at"}),
}

#: Rejections the front end can cause: a few lines a minute at most.
log_rejection = RateLimited(logging.WARNING, burst=5, window=60.0)


class Rejected(ValueError):
    """A command from the front end that is not one this kernel accepts."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A validated command from the front end."""

    type: Literal["stop", "stack", "view", "restart", "reclaim"]
    click_id: str
    scope: ScopeKind = "all"
    cell: int | None = None
    tid: str | None = None
    force: bool = False
    #: A stop of all that also interrupts the running cell (the panel's "Stop all"; "Stop background work" does not).
    interrupt: bool = False
    session: str | None = None
    view_id: str | None = None
    action: str | None = None
    client_time: float | None = None
    clicked_at: float | None = None
    #: Set by the kernel, not the front end: which route brought the command, and when (``time.time()``).
    route: str = ""
    received_at: float | None = None

    @property
    def stop_key(self) -> tuple[Any, ...]:
        """Two commands with the same key are the same action (a stop, a restart of one session, a reclaim)."""
        if self.type == "stop":
            return ("stop", self.scope, self.cell, self.tid, self.force, self.interrupt)
        return (self.type, self.session)


def is_click_id(value: object) -> bool:
    """Whether ``value`` has the form of a click id, ``<view id>-<n>`` (what :func:`parse_command` checks)."""
    return isinstance(value, str) and _CLICK_ID.fullmatch(value) is not None


def is_number(value: object) -> bool:
    """A finite int or float (not a bool) that converts to a float: ``10**400`` is not one (and raises nothing)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -_FLOAT_INT < value < _FLOAT_INT
    return isinstance(value, float) and math.isfinite(value)


def _checked_id(content: Mapping[str, Any], key: str) -> str:
    value = content.get(key)
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise Rejected(f"{key} must be 1-64 characters of [A-Za-z0-9_.:-]")
    return value


def _optional_time(content: Mapping[str, Any], key: str) -> float | None:
    """A time since the epoch (ms or s), or None where the key is absent or null."""
    value = content.get(key)
    if value is None:
        return None
    if not is_number(value) or not 0 <= value <= MAX_TIME:
        raise Rejected(f"{key} must be a finite number from 0 to {MAX_TIME:g}")
    return float(value)


def _one_of(content: Mapping[str, Any], key: str, allowed: frozenset[str], why: str) -> str:
    """A string field with one of a few values (checked for its type first: a list is not hashable)."""
    value = content.get(key)
    if not isinstance(value, str) or value not in allowed:
        raise Rejected(why)
    return value


def parse_command(
    content: object,
    *,
    thread_exists: Callable[[str], bool],
    cell_exists: Callable[[int], bool],
    session_exists: Callable[[str], bool] | None = None,
) -> Command:
    """Validate a command from the front end against the ids this kernel issued; raise :class:`Rejected`.

    ``thread_exists(tid)`` must be true only for live threads a cell started; ``session_exists(sid)`` only for
    sessions whose runners can be restarted (None: no session can).
    """
    if not isinstance(content, Mapping):
        raise Rejected("not an object")
    kind = content.get("type")
    if not isinstance(kind, str) or kind not in COMMAND_TYPES:
        raise Rejected(f"unknown command type {short(kind)}")
    unknown = set(content) - _KEYS[kind]
    if unknown:
        raise Rejected(f"unexpected keys {', '.join(short(key) for key in sorted(map(str, unknown))[:5])}")
    click_id = _checked_id(content, "click_id")
    if not _CLICK_ID.fullmatch(click_id):
        raise Rejected("click_id must be <view id>-<number>")
    clicked_at = _optional_time(content, "clicked_at")
    if kind == "view":
        action = _one_of(content, "action", _VIEW_ACTIONS, "view action must be open, alive, close or rows")
        return Command(
            "view",
            click_id,
            view_id=_checked_id(content, "view_id"),
            action=action,
            client_time=_optional_time(content, "client_time"),
        )
    if kind == "stack":
        return Command("stack", click_id, tid=_known_thread(content, thread_exists), clicked_at=clicked_at)
    if kind == "restart":
        session = content.get("session")
        if not isinstance(session, str) or not _SESSION_ID.fullmatch(session):
            raise Rejected("session must be 1-128 characters of [A-Za-z0-9_.:-]")
        if session_exists is None or not session_exists(session):
            raise Rejected(f"no session whose runners can be restarted has the id {session!r}")
        return Command("restart", click_id, session=session, clicked_at=clicked_at)
    if kind == "reclaim":
        return Command("reclaim", click_id, clicked_at=clicked_at)
    return _parse_stop(content, click_id, clicked_at, thread_exists, cell_exists)


def thread_check(check_stoppable: Callable[[str], None]) -> Callable[[str], bool]:
    """``thread_exists`` for :func:`parse_command` from the one check of a stop's thread (``Host.check_stoppable``,
    which raises ValueError): a command naming a thread the stop would refuse is rejected before it is taken."""

    def thread_exists(tid: str) -> bool:
        try:
            check_stoppable(tid)
        except ValueError:
            return False
        return True

    return thread_exists


def _known_thread(content: Mapping[str, Any], thread_exists: Callable[[str], bool]) -> str:
    tid = _checked_id(content, "tid")
    if not thread_exists(tid):
        raise Rejected(f"no live thread started by a cell has the id {tid!r}")
    return tid


def _parse_stop(
    content: Mapping[str, Any],
    click_id: str,
    clicked_at: float | None,
    thread_exists: Callable[[str], bool],
    cell_exists: Callable[[int], bool],
) -> Command:
    scope = _one_of(content, "scope", _STOP_SCOPES, "stop scope must be all, cell, thread or zombies")
    force = content.get("force", False)
    if not isinstance(force, bool):
        raise Rejected("force must be true or false")
    interrupt = content.get("interrupt", False)
    if not isinstance(interrupt, bool):
        raise Rejected("interrupt must be true or false")
    if interrupt and scope != "all":
        raise Rejected("interrupt goes only with scope all")
    cell: int | None = None
    tid: str | None = None
    if scope == "cell":
        value = content.get("cell")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_CELL:
            raise Rejected("no cell has that number")
        if not cell_exists(value):
            raise Rejected("no cell has that number")
        cell = value
    elif "cell" in content:
        raise Rejected("cell goes only with scope cell")
    if scope == "thread":
        tid = _known_thread(content, thread_exists)
    elif "tid" in content:
        raise Rejected("tid goes only with scope thread")
    return Command(
        "stop",
        click_id,
        scope=scope,  # type: ignore[arg-type]  # one of _STOP_SCOPES, the values of ScopeKind
        cell=cell,
        tid=tid,
        force=force,
        interrupt=interrupt,
        clicked_at=clicked_at,
    )


def joined_commands(command: Command, click_ids: Sequence[str]) -> list[Command]:
    """``command`` once per click id that joined it on the fast route; ids of another form are rejected."""
    commands = []
    for click_id in click_ids:
        if is_click_id(click_id):
            commands.append(dataclasses.replace(command, click_id=click_id, clicked_at=None))
        else:
            reject(Rejected("click_id must be <view id>-<number>"), {"type": command.type, "click_id": click_id})
    return commands


def reject(why: Rejected, content: object) -> None:
    """Log a rejected command (rate-limited; its reason and the content cut to ``REJECTED_CHARS`` characters, and
    escaped)."""
    log_rejection(
        "nbcoord: panel rejected a command (%s): %s", shown(why, REJECTED_CHARS), shown(short(content), REJECTED_CHARS)
    )


# ------------------------------------------------------------------------------------------------- clicks
class _ViewClicks:
    """One view's clicks: every n <= ``low`` was seen, and the ones in ``above``."""

    __slots__ = ("above", "low")

    def __init__(self) -> None:
        self.low = -1  # the module numbers from 1; a peer that starts at 0 is served too
        self.above: set[int] = set()

    def first_time(self, n: int) -> bool:
        if n <= self.low or n in self.above:
            return False
        self.above.add(n)
        while self.low + 1 in self.above:
            self.low += 1
            self.above.discard(self.low)
        if len(self.above) > _MAX_ABOVE:
            # Clicks missing below this many later ones will not come any more (or come from a peer that
            # numbers wildly): move the watermark up to the oldest kept.
            self.low = min(self.above)
            self.above.discard(self.low)
        return True


class ClickLedger:
    """Which clicks were acted on; a click id is ``<view id>-<n>``. Bounded: 64 views of 1024 ids at most."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _views
        self._views: OrderedDict[str, _ViewClicks] = OrderedDict()

    def first_time(self, click_id: str) -> bool:
        """True the first time ``click_id`` is seen (the caller acts on it), False for every later copy."""
        match = _CLICK_ID.fullmatch(click_id)
        if match is None:
            return False
        view, n = match.group(1), int(match.group(2))
        with self._lock:
            clicks = self._views.get(view)
            if clicks is None:
                clicks = self._views[view] = _ViewClicks()
                while len(self._views) > _MAX_VIEWS:
                    self._views.popitem(last=False)
            self._views.move_to_end(view)
            return clicks.first_time(n)


# -------------------------------------------------------------------------------------------------- stops
RunStop = Callable[[Command], Any]
StopDone = Callable[[list[Command], Any], None]


class StopRunner:
    """Runs the panel's actions (stops, restarts, reclaims) one after another on its own thread; equal clicks join
    the action that waits or runs.

    ``run(command)`` performs one action and returns its report; ``done(commands, report)`` is told every click
    that the action answered. An action that raises is logged, and answered with ``error(commands, exc)``
    when given.
    """

    def __init__(
        self, run: RunStop, done: StopDone, error: Callable[[list[Command], Exception], None] | None = None
    ) -> None:
        self._run = run
        self._done = done
        self._error = error
        self._lock = threading.Lock()  # guards _waiting, _current, _current_key, _answering, _thread, _stopping
        self._wake = threading.Condition(self._lock)
        self._waiting: OrderedDict[tuple[Any, ...], list[Command]] = OrderedDict()
        self._current: list[Command] | None = None
        self._current_key: tuple[Any, ...] | None = None
        #: An action has ended and its clicks are being answered (no click can join it any more).
        self._answering = False
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dropped = RateLimited(logging.WARNING, burst=3, window=60.0)
        self.stops_run = 0

    def submit(self, command: Command) -> str | None:
        """Queue a stop (or join an equal one); never blocks, whatever runs. Returns why it was refused (None:
        taken, and ``done`` or ``error`` will answer it)."""
        return self.submit_all([command])

    def submit_all(self, commands: list[Command]) -> str | None:
        """Queue equal actions (the same ``stop_key``, clicks joined on the fast route) as :meth:`submit` would,
        under one lock: the first queues a stop or joins one, the others join it. Returns why they were refused
        (the caller answers them), or None."""
        if not commands:
            return None
        command = commands[0]
        key = command.stop_key
        with self._lock:
            if self._stopping:
                return "the panel is closing"
            if self._current is not None and self._current_key == key:
                self._current.extend(commands)
                return None
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.extend(commands)
                return None
            if len(self._waiting) >= MAX_WAITING_STOPS:
                waiting_now = len(self._waiting)
                self._dropped(
                    "nbcoord: %d different stops are already waiting; a %s click was refused",
                    waiting_now,
                    command.type,
                )
                return (
                    f"{waiting_now} different stops are already waiting (at most {MAX_WAITING_STOPS}); "
                    "click again once they have run"
                )
            self._waiting[key] = list(commands)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=STOP_THREAD_NAME, daemon=True)
                self._thread.start()
            self._wake.notify()
        return None

    @property
    def busy(self) -> bool:
        """Whether a stop runs or waits, or the clicks of one that ended are not answered yet."""
        with self._lock:
            return self._current is not None or bool(self._waiting) or self._answering

    @property
    def in_flight(self) -> bool:
        """Whether an action runs or its clicks are not answered yet: its report may be stored while the click
        data that goes with it is not (the panel holds the report back meanwhile)."""
        with self._lock:
            return self._current is not None or self._answering

    def close(self, timeout: float = 2.0) -> None:
        """Drop waiting stops, let the running one finish (bounded by its grace), end the thread."""
        with self._lock:
            self._stopping = True
            self._waiting.clear()
            thread = self._thread
            self._wake.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    if not self._wake.wait(STOP_THREAD_IDLE_S):
                        # Idle: end (a click starts another, under this lock), so that an idle kernel keeps no
                        # thread of the panel's but the fast route's.
                        self._thread = None
                        return
                if self._stopping:
                    return
                key, commands = self._waiting.popitem(last=False)
                self._current, self._current_key = commands, key
            failure: Exception | None = None
            try:
                report = self._run(commands[0])
                self.stops_run += 1
            except Exception as error:
                log.warning("nbcoord: a panel %s failed", commands[0].type, exc_info=True)
                report, failure = None, error
            with self._lock:
                answered, self._current, self._current_key = commands, None, None
                self._answering = True
            try:
                if report is not None:
                    self._done(answered, report)
                elif failure is not None and self._error is not None:
                    self._error(answered, failure)
            except Exception:
                log.warning("nbcoord: reporting a panel %s failed", commands[0].type, exc_info=True)
            finally:
                with self._lock:
                    self._answering = False
