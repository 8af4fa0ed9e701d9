"""What fell back, and to what: each module of private internals keeps one record of the internals it found
missing, for ``%nbcoord``'s "Degraded here" and the snapshot."""

from __future__ import annotations

import logging

log = logging.getLogger("nbcoord")


class Fallbacks:
    """The internals found missing so far, each with what nbcoord does instead (logged once each)."""

    def __init__(self, subject: str = "") -> None:
        #: Put before an internal's name in the log line ("TensorFlow's ").
        self._subject = subject
        self._found: dict[str, str] = {}

    def fall_back(self, name: str, fallback: str) -> None:
        if name not in self._found:
            self._found[name] = fallback
            log.info("nbcoord: %s%s is not available here; %s", self._subject, name, fallback)

    def found(self) -> dict[str, str]:
        return dict(self._found)
