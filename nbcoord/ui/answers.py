"""The panel's answers to clicks: every click acknowledged gets exactly one outcome, which the next tick sends.

A stop's answer is its click data (which clicks it answered, by which route, when), joined to its report in
``last_stop``; a restart's or a reclaim's is ``outcome``, and so is a click that was refused or whose action
raised. A restart made from a cell (``nbcoord.restart_runners``) shows there too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from nbcoord.ui.commands import Command
from nbcoord.ui.outcomes import restart_state

log = logging.getLogger("nbcoord")

#: Click ids an answer names (the first click, and up to this many that joined it).
CLICKS_NAMED = 64


class Answers:
    """The last stop's click data and the last outcome, for the next tick; ``wake`` asks for that tick now.

    ``last_restart()`` reads the last restart of a session's runners, wherever it was made.
    """

    def __init__(self, wake: Callable[[], None], last_restart: Callable[[], object]) -> None:
        self._wake = wake
        self._last_restart = last_restart
        self._lock = threading.Lock()  # guards the four below
        self._stop_extra: dict[str, Any] | None = None
        self._outcome: dict[str, Any] | None = None  # the last restart or reclaim
        self._restart_seen: float | None = None  # started_at of the last restart shown
        #: Clicks answered with an outcome (done, failed or refused).
        self.answered = 0

    def stop_extra(self) -> dict[str, Any] | None:
        """The click data of the last stop the panel made (joined to its report when the report is the same)."""
        with self._lock:
            return self._stop_extra

    def outcome(self) -> dict[str, Any] | None:
        """The last restart or reclaim: the panel's own, or a restart made from a cell (``restart_runners``)."""
        restart = self._last_restart()
        with self._lock:
            if isinstance(restart, Mapping) and restart.get("started_at") != self._restart_seen:
                self._restart_seen = restart.get("started_at")
                own = self._outcome is not None and self._outcome.get("started_at") == restart.get("started_at")
                if not own:
                    self._outcome = {"kind": "restart", "click_ids": [], "ok": True, **(restart_state(restart) or {})}
            return self._outcome

    def done(self, commands: list[Command], result: dict[str, Any]) -> None:
        """Tell the views which clicks an action answered (the first, and up to 64 that joined it)."""
        with self._lock:
            self.answered += len(commands)
        first = commands[0]
        clicks = {
            "click_id": first.click_id,
            "click_ids": [command.click_id for command in commands[-CLICKS_NAMED:]],
            "clicks": len(commands),
            "route": first.route,
            "received_at": round(first.received_at or time.time(), 4),
            "clicked_at": first.clicked_at,
        }
        report = result["report"]
        if result["kind"] != "stop":
            text = str(report.get("text") or "") if isinstance(report, Mapping) else str(report)
            outcome = {"kind": result["kind"], "ok": True, "text": text[:4000], **clicks}
            if result["kind"] == "restart" and isinstance(report, Mapping):
                outcome.update(restart_state(report) or {})
                outcome["started_at"] = report.get("started_at")
            else:
                outcome["started_at"] = round(time.time(), 3)
            with self._lock:
                self._outcome = outcome
            self._wake()
            return
        extra = {"started_at": report["started_at"], "interrupt": result.get("interrupt"), **clicks}
        with self._lock:
            self._stop_extra = extra
        log.info(
            "nbcoord: panel stop %s (%s%s, %d click(s)) by the %s route: %d stopped, %d still alive",
            first.click_id,
            first.scope,
            ", interrupt" if first.interrupt else "",
            len(commands),
            first.route,
            len(report["stopped"]),
            len(report["alive"]),
        )
        self._wake()

    def failed(self, commands: list[Command], error: Exception, *, refused: bool = False) -> None:
        """An action that raised (a restart of a session that closed meanwhile), or clicks that were refused (too
        many different stops wait): the views say why."""
        with self._lock:
            self.answered += len(commands)
        first = commands[0]
        text = f"Refused: {error}" if refused else f"{type(error).__name__}: {error}"
        outcome = {
            "kind": first.type,
            "ok": False,
            "refused": refused,
            "text": text[:1000],
            "click_id": first.click_id,
            "click_ids": [command.click_id for command in commands[-CLICKS_NAMED:]],
            "started_at": round(time.time(), 3),
        }
        with self._lock:
            self._outcome = outcome
        self._wake()
