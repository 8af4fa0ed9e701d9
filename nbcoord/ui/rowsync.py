"""The panel's rows sent by difference: one custom message per change for every section paced ``rows``.

Whole traits cost the whole list for any change: with 1000 threads, one thread renamed re-sent about 245 KB. The
sections paced ``rows`` in the registry (:mod:`nbcoord.ui.sections`: threads, ledger, groups, cells) are no synced
traits; each change goes in one message, so that a view never shows a group's count with another moment's rows::

    {"type": "rows", "seq": n, "base": n - 1, "full": false,
     "threads": {"upsert": [rows added or changed], "remove": [tids]},
     "ledger": {"upsert": [...], "remove": [ids]},
     "groups": [every group] (only when they changed), "cells": [...] (likewise)}

Keyed sections (a ``key`` in the registry: threads by ``tid``, ledger rows by ``id``) send the rows that changed;
the others, a few dozen entries at most, are sent whole when they changed. The order of rows is not sent: the front
end sorts them by :func:`nbcoord.ui.rows.drawn_order`, as the kernel does. A view applies a difference only onto
the message it is based on (``base`` equal to the view's ``seq``); a view that opens, or that missed a message (a
page that loaded meanwhile, a lost message), asks for everything (the ``view`` command, action ``open`` or
``rows``), and the next message is a full copy (``"full": true``, ``base`` null, every row in ``upsert``): every
view takes it, whatever its ``seq``.

Pacing stays meaningful: a message of ``size`` bytes waits ``interval * size / BYTES_PER_INTERVAL`` seconds after
the last rows message (a difference of one row waits nothing; 1000 rows that all change are sent every few
intervals, the newest state each time), and a full copy that many seconds after the last full copy (a flood of
requests costs one full copy per few intervals). A held message goes out when its wait is over, as the tick that
built it built it (the sender thread asks :meth:`RowsSender.held_due`). Not thread-safe: its owner
(:class:`nbcoord.ui.sender.TraitSender`) calls it under its one lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from nbcoord.ui.sections import ROWS

#: The type of the rows message (the front end ignores custom messages of other types).
MESSAGE_TYPE: Final = "rows"
#: The keyed sections: trait -> the field that keys each row.
KEYS: Final = {section.trait: section.key for section in ROWS if section.key is not None}
#: Every rows section's trait, in the registry's order.
TRAITS: Final = tuple(section.trait for section in ROWS)


def _keyed(rows: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {row[key]: row for row in rows}


def difference(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What turns the rows ``before`` into ``after`` (trait -> value, as :func:`panel_state` shapes them): keyed
    sections as ``{"upsert": [...], "remove": [...]}`` where something changed, the others whole where they
    changed. Empty: nothing changed. Rows are compared as Python values (cheaper than encoding them)."""
    changes: dict[str, Any] = {}
    for trait in TRAITS:
        old, new = before.get(trait), after.get(trait)
        if old == new:
            continue
        key = KEYS.get(trait)
        if key is None or old is None:
            changes[trait] = new if key is None else {"upsert": list(new or []), "remove": []}
            continue
        old_rows, new_rows = _keyed(old, key), _keyed(new or [], key)
        upsert = [row for k, row in new_rows.items() if old_rows.get(k) != row]
        remove = [k for k in old_rows if k not in new_rows]
        if upsert or remove:
            changes[trait] = {"upsert": upsert, "remove": remove}
    return changes


def full_copy(rows: Mapping[str, Any]) -> dict[str, Any]:
    """Every rows section in the message's form: keyed sections as all rows to upsert, the others whole."""
    return {
        trait: {"upsert": list(rows.get(trait) or []), "remove": []} if trait in KEYS else rows.get(trait) or []
        for trait in TRAITS
    }


class RowsSender:
    """Sends the rows sections by difference through ``send`` (the widget's custom message); see the module.

    ``send(message)`` sends one message; ``measure(message)`` gives its size in bytes; ``sent(rows)`` is told the
    rows each message brought the views to (the widget's kernel-side copy).
    """

    def __init__(
        self,
        send: Callable[[dict[str, Any]], None],
        measure: Callable[[Any], int],
        sent: Callable[[Mapping[str, Any]], None],
        bytes_per_interval: int,
    ) -> None:
        self._send = send
        self._measure = measure
        self._on_sent = sent
        self._bytes_per_interval = bytes_per_interval
        self.seq = 0  # the last message sent; 0: none yet
        #: The rows as the last message left every view that is in step (None: nothing sent yet).
        self.rows: dict[str, Any] | None = None
        self.full_wanted = True  # the first message is a full copy: no view has a base yet
        self.full_copies = 0  # sent so far (tests and the benchmark read them)
        self.last_size = 0  # bytes of the last message, and of the last full copy
        self.full_size = 0
        self._sent_at = -math.inf
        self._full_at = -math.inf
        #: The newest rows a tick built that wait for their turn: (rows, the message, its size, when it may go).
        self._held: tuple[dict[str, Any], dict[str, Any], int, float] | None = None

    def want_full(self) -> None:
        """A view asked for everything: the next message is a full copy (paced against the last full copy)."""
        self.full_wanted = True

    def offer(self, rows: Mapping[str, Any], now: float, interval: float) -> None:
        """The rows a tick built: sent now if they changed (or a view wants a full copy) and their wait is over,
        else held until it is (newer rows replace held ones)."""
        self._held = None  # these rows are newer than what was held
        current = {trait: rows[trait] for trait in TRAITS if trait in rows}
        if self.rows is not None:
            current = {**self.rows, **current}
        message = self._message(current)
        if message is None:
            return
        size = self._measure(message)
        due = self._due(message, size, interval)
        if now < due:
            self._held = (current, message, size, due)
            return
        self._go(current, message, size, now)

    def held_due(self) -> float | None:
        """When the held message may go out (``now``'s clock), or None if none is held."""
        return None if self._held is None else self._held[3]

    def send_held(self, now: float) -> None:
        """Send the held message if its wait is over, as the tick that held it built it."""
        if self._held is not None and self._held[3] <= now:
            current, message, size, _ = self._held
            self._held = None
            self._go(current, message, size, now)

    def _message(self, current: dict[str, Any]) -> dict[str, Any] | None:
        if self.full_wanted or self.rows is None:
            return {"type": MESSAGE_TYPE, "seq": self.seq + 1, "base": None, "full": True, **full_copy(current)}
        changes = difference(self.rows, current)
        if not changes:
            return None
        return {"type": MESSAGE_TYPE, "seq": self.seq + 1, "base": self.seq, "full": False, **changes}

    def _due(self, message: Mapping[str, Any], size: int, interval: float) -> float:
        gap = interval * size / self._bytes_per_interval  # one row: no wait; 640 KB: 10 intervals
        due = self._sent_at + gap
        if message["full"] and self.rows is not None:
            # A full copy answers a view: it waits for the last full copy only (a view that opens while many rows
            # change is not kept waiting by the differences), so that a flood of requests is one per few intervals.
            due = self._full_at + gap
        return due

    def _go(self, current: dict[str, Any], message: dict[str, Any], size: int, now: float) -> None:
        self._send(message)
        self.seq = message["seq"]
        self.rows = current
        self.last_size = size
        self._sent_at = now
        if message["full"]:
            self.full_wanted = False
            self.full_copies += 1
            self.full_size = size
            self._full_at = now
        self._on_sent(current)
