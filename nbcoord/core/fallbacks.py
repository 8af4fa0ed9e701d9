"""What fell back, and to what: one record for every internals module (CPython's, IPython's and ipykernel's in
:mod:`nbcoord.core.internals`, the ledger's libraries', TensorFlow's), for ``%nbcoord``'s "Degraded here" and the
snapshot."""

from __future__ import annotations

import logging

log = logging.getLogger("nbcoord")


class Fallbacks:
    """The internals found missing so far, each with what nbcoord does instead (logged once each)."""

    def __init__(self) -> None:
        self._found: dict[str, str] = {}

    def fall_back(self, name: str, fallback: str, subject: str = "") -> None:
        """Record that ``name`` is missing and ``fallback`` is done instead; ``subject`` goes before the name in the
        log line ("TensorFlow's ")."""
        if name not in self._found:
            self._found[name] = fallback
            log.info("nbcoord: %s%s is not available here; %s", subject, name, fallback)

    def found(self) -> dict[str, str]:
        return dict(self._found)


#: The one record.
RECORD = Fallbacks()


def degraded() -> dict[str, str]:
    """Every internal found missing so far, with what nbcoord does instead."""
    return RECORD.found()
