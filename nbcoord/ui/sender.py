"""The panel's sender: the ticks while a view watches, and the diffing of traits.

:class:`Sender` runs the panel's ticks on nbcoord's monitor thread (a job of it, no thread of its own): every interval
while someone watches, parked (no cost) while nobody does, and at the monitor's quiet pace while nothing is live.
:class:`TraitSender` sets only the traits whose value changed, in one message (``hold_sync``): values are compared as
Python values (cheaper than encoding 1000 rows every tick), and a big trait that changes all the time is sent at most
every ``size / BYTES_PER_INTERVAL`` intervals, so that 1000 busy threads cannot turn the panel into a firehose. A trait
held back is sent, as that tick built it, once its wait is over: not at the next tick, which may be many seconds away
while ticks are expensive (the header would count 1000 new threads that the list does not show meanwhile). The
sections paced ``rows`` (threads, ledger, groups, cells) are no traits: :class:`nbcoord.ui.rowsync.RowsSender` sends
them by difference, in one custom message per change, paced the same way. One lock serialises every send to the
widget: the sender's ticks, the held traits and rows, and the acknowledgements of clicks, which go out at once from
the command thread.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from nbcoord.core.monitor import QUIET_INTERVAL_S, Monitor
from nbcoord.ui import rowsync

log = logging.getLogger("nbcoord")

#: The panel's job on the monitor thread.
SENDER_JOB: Final = "panel"
#: A trait larger than this is sent at most every (size / this) intervals.
BYTES_PER_INTERVAL: Final = 64 * 1024


def to_json(value: Any) -> str:
    """The JSON a trait's value is sent as (for its size)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


class Sender:
    """The panel's ticks, run as a job of nbcoord's monitor thread: every interval while someone watches, parked
    (no cost) while nobody does, and no more than the monitor's own ticks while nothing is live."""

    def __init__(
        self,
        monitor: Monitor,
        tick: Callable[[], None],
        wait: Callable[[], float],
        active: Callable[[], bool],
        traits: TraitSender,
    ) -> None:
        self._monitor = monitor
        self._tick = tick
        self._wait = wait
        self._active = active
        self._traits = traits  # whose held traits go out between ticks, when their wait is over
        self._tick_now = True
        self._last_tick = -math.inf
        self._stopping = False
        self._remove: Callable[[], None] | None = None

    def start(self) -> None:
        self._remove = self._monitor.add_job(SENDER_JOB, self._due, self._run)

    def wake(self) -> None:
        """Tick now (after a command), or unpark."""
        self._tick_now = True
        self._monitor.poke()

    def stop(self) -> None:
        """No more ticks; the tick in progress, if any, finishes first (bounded)."""
        self._stopping = True
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    @property
    def native_id(self) -> int | None:
        """The OS id of the thread the ticks run on (the benchmark reads its CPU time)."""
        return self._monitor.native_id

    def _next_tick(self) -> float:
        """After the interval; while the monitor is quiet (nothing live) and this has ticked since it became so,
        when the monitor ticks next: nothing can change the view meanwhile but what wakes both."""
        if self._monitor.quiet_since <= self._last_tick:
            return self._last_tick + QUIET_INTERVAL_S
        return self._last_tick + self._wait()

    def _due(self) -> float | None:
        if self._stopping:
            return None
        if self._tick_now:
            return -math.inf
        if not self._active():
            return None  # parked: a view, a command or stop() wakes it
        held = self._traits.held_due()
        next_tick = self._next_tick()
        return next_tick if held is None else min(held, next_tick)

    def _run(self, now: float) -> None:
        if self._stopping:
            return
        if self._tick_now or now >= self._next_tick():
            self._tick_now = False
            if not self._active():
                return
            self._last_tick = now
            try:
                self._tick()
            except Exception:
                log.warning("nbcoord: panel update failed", exc_info=True)
            return
        try:
            self._traits.send_held(now)
        except Exception:
            log.warning("nbcoord: panel update failed", exc_info=True)


class TraitSender:
    """Sets a widget's traits that changed since they were last sent; thread-safe (one lock for every send)."""

    def __init__(self, widget: Any, initial: Mapping[str, Any]) -> None:
        self.widget = widget
        self._lock = threading.Lock()  # guards the widget's sends and the three dicts below
        self.sent: dict[str, Any] = dict(initial)
        # The rows sections' sizes are the rows messages' (``rows.last_size``, ``rows.full_size``).
        self.sizes: dict[str, int] = {
            key: len(to_json(value)) for key, value in initial.items() if key not in rowsync.TRAITS
        }
        self._sent_at: dict[str, float] = {}
        #: Traits a tick held back (too big to send again so soon): key -> (value, its size, when it may go out).
        self._held: dict[str, tuple[Any, int, float]] = {}
        #: The rows sections, by difference (under ``_lock`` too).
        self.rows = rowsync.RowsSender(
            self._send_rows, lambda message: len(to_json(message)), self._rows_sent, BYTES_PER_INTERVAL
        )

    def want_rows(self) -> None:
        """A view asked for every row (it opened, or missed a difference): the next rows message is a full copy."""
        with self._lock:
            self.rows.want_full()

    @property
    def sent_at(self) -> dict[str, float]:
        """When each trait was last sent (a copy)."""
        with self._lock:
            return dict(self._sent_at)

    def send(self, state: Mapping[str, Any], now: float, interval: float, force: set[str] | frozenset[str]) -> None:
        """Send the traits of ``state`` that changed (those in ``force`` whatever they are), in one message.

        A trait of ``size`` bytes is sent at most every ``interval * size / BYTES_PER_INTERVAL`` seconds.
        """
        with self._lock:
            changed: dict[str, tuple[Any, int]] = {}
            held: dict[str, float] = {}  # key -> when it may go out
            sizes: dict[str, int] = {}
            rows = {key: state[key] for key in rowsync.TRAITS if key in state}
            if rows and getattr(self.widget, "comm", None) is not None:
                self.rows.offer(rows, now, interval)
            for key, value in state.items():
                if key in rows:
                    continue
                self._held.pop(key, None)  # this state is newer than what was held
                if key not in force and key in self.sent and value == self.sent[key]:
                    continue
                size = sizes[key] = len(to_json(value))
                gap = interval * size / BYTES_PER_INTERVAL  # small traits: no wait; 640 KB: 10 intervals
                due = self._sent_at.get(key, -math.inf) + gap
                if key not in force and now < due:
                    held[key] = due  # a big trait that changes all the time: sent less often
                    continue
                changed[key] = (value, size)
            self._held.update((key, (state[key], sizes[key], due)) for key, due in held.items())
            self._set(changed, now)

    def held_due(self) -> float | None:
        """When the next held trait may go out (``now``'s clock), or None if none is held."""
        with self._lock:
            dues = [due for _, _, due in self._held.values()]
            rows = self.rows.held_due()
            return min(dues if rows is None else [*dues, rows], default=None)

    def send_held(self, now: float) -> None:
        """Send the held traits that are due, as the tick that held them built them, in one message."""
        with self._lock:
            due = {key: (value, size) for key, (value, size, at) in self._held.items() if at <= now}
            for key in due:
                del self._held[key]
            self._set(due, now)
            if getattr(self.widget, "comm", None) is not None:
                self.rows.send_held(now)

    def _set(self, changed: Mapping[str, tuple[Any, int]], now: float) -> None:
        """Set ``changed`` (key -> value and its size) on the widget in one message (under ``_lock``)."""
        if not changed or getattr(self.widget, "comm", None) is None:
            return
        with self.widget.hold_sync():
            for key, (value, size) in changed.items():
                setattr(self.widget, key, value)
                self.sent[key] = value
                self.sizes[key] = size
                self._sent_at[key] = now

    def send_now(self, key: str, value: Any, now: float) -> None:
        """Send one small trait at once (a click's acknowledgement), whatever the sender thread is doing."""
        self.send({key: value}, now, 0.0, frozenset({key}))

    def _send_rows(self, message: dict[str, Any]) -> None:
        """One rows message to every view (under ``_lock``)."""
        self.widget.send(message)

    def _rows_sent(self, rows: Mapping[str, Any]) -> None:
        """The rows every view in step now has: the widget's kernel-side copy (no synced trait: nothing is sent)."""
        for key, value in rows.items():
            setattr(self.widget, key, value)
            self.sent[key] = value
