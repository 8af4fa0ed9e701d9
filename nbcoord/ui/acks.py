"""The acknowledgement of panel clicks: at once, before their action runs, and in a flood a few messages for many.

A click the front end sees no acknowledgement for within a second was not handled (the main thread holds the GIL
in a C call), and the view says so; see :mod:`.panel`.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from nbcoord.ui.commands import Command

__all__ = ["ACKED_KEPT", "ACK_SPACING_S", "Acknowledger"]

#: In a flood of clicks on the fast route, at most one acknowledgement per this many seconds (each names the last
#: ``ACKED_KEPT`` clicks), and the last one when the burst is handled: 10,000 clicks no longer make 10,000 messages.
ACK_SPACING_S: Final = 0.05
ACKED_KEPT: Final = 64


class Acknowledger:
    """Acknowledges clicks at once, before their action runs (a stop may take its whole grace period).

    Each acknowledgement names the last ``ACKED_KEPT`` clicks acknowledged (``click_ids``), so that in a flood one
    message answers many: a click that comes within ``ACK_SPACING_S`` of the last message sent is held, and sent
    with the next one, or by the fast route's worker once it has no command left and the spacing has passed
    (:meth:`send_due`; a click that came by the ordinary route wakes it for that): a flood sends 20 messages a
    second, not one per click, also when the fast route's queue overflows and leaves clicks to the ordinary route
    (where there is no worker, without pacing).
    """

    def __init__(self, send: Callable[[dict[str, Any], float], None]) -> None:
        self._send = send
        #: Wakes the fast route's worker, which sends a held acknowledgement once it is due (:meth:`send_due`);
        #: returns False where there is none. Set by the panel once its route is installed.
        self.wake: Callable[[], bool] = lambda: False
        self._lock = threading.Lock()  # guards the three below
        self._acked: collections.deque[str] = collections.deque(maxlen=ACKED_KEPT)
        self._held: dict[str, Any] | None = None
        self._sent_at = -math.inf
        #: Clicks acknowledged so far (each gets an outcome later: see ``PanelController.clicks_answered``).
        self.acknowledged = 0

    def acknowledge(self, command: Command, received: float, route: str, more: Sequence[str] = ()) -> None:
        """Acknowledge ``command``'s click and the clicks in ``more`` (equal commands that joined it), in one."""
        now = time.monotonic()
        with self._lock:
            self.acknowledged += 1 + len(more)
            self._acked.append(command.click_id)
            self._acked.extend(more[-ACKED_KEPT:])
            ack = {
                "click_id": more[-1] if more else command.click_id,
                "click_ids": list(self._acked),
                "type": command.type,
                "at": round(received, 3),
                "route": route,
            }
            hold = now - self._sent_at < ACK_SPACING_S
            self._held = ack if hold else None
            if not hold:
                self._sent_at = now
        if not hold:
            self._send(ack, now)
        elif route == "ordinary" and not self.wake():
            # Clicks the fast route left to the ordinary one (its queue full in a flood) are paced too, when its
            # worker can send the last held one later (woken here); with no worker, nothing would: send it now.
            self.send_held()

    def send_held(self) -> None:
        """Send the acknowledgement held back, if any (the fast route's worker calls it when it has no command)."""
        now = time.monotonic()
        with self._lock:
            ack, self._held = self._held, None
            if ack is not None:
                self._sent_at = now
        if ack is not None:
            self._send(ack, now)

    def send_due(self) -> float | None:
        """Send the acknowledgement held back once ``ACK_SPACING_S`` has passed since the last one; return the
        seconds until then (the fast route's worker calls it again after that long), None when none is held."""
        with self._lock:
            if self._held is None:
                return None
            wait = self._sent_at + ACK_SPACING_S - time.monotonic()
        if wait > 0:
            return wait
        self.send_held()
        return None
