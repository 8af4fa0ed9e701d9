"""How the panel shows what ended: thread failures, the last stop's report, the last restart of a session's runners.

Every count is the true one; long lists are trimmed (``MAX_OUTCOMES`` rows of a stop report).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from nbcoord.core.text import TEXT_CHARS
from nbcoord.ui.fields import name_cut, rounded
from nbcoord.ui.source import Shaping

#: A stop report's outcome rows sent (the counts are always the true ones).
MAX_OUTCOMES: Final = 200
#: Thread failures sent (the last ones).
MAX_FAILURES: Final = 10


def _outcomes(rows: Sequence[Mapping[str, Any]], limit: int) -> list[dict[str, Any]]:
    return [
        {"tid": r["tid"], "name": name_cut(r["name"]), "cell": r["cell"], "reason": name_cut(r["reason"], TEXT_CHARS)}
        for r in rows[:limit]
    ]


def stop_state(report: Mapping[str, Any] | None, extra: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A stop report as the panel shows it: true counts, long lists trimmed, the click data when it was ours."""
    if not report:
        return None
    items = list(report.get("items") or [])
    state: dict[str, Any] = {
        "scope": report["scope"],
        "cell": report["cell"],
        "force": report["force"],
        "started_at": rounded(report["started_at"], 3),
        "took_s": rounded(report["took_s"], 3),
        "stopped_count": len(report["stopped"]),
        "alive_count": len(report["alive"]),
        "stopped": _outcomes(report["stopped"], 50),
        "alive": _outcomes(report["alive"], MAX_OUTCOMES),
        "items_stopped": sum(1 for i in items if i.get("stopped")),
        "items_alive": [
            {
                "id": i.get("id"),
                "label": name_cut(i.get("label")),
                "cell": i.get("cell"),
                "reason": name_cut(i.get("reason"), TEXT_CHARS),
            }
            for i in items
            if not i.get("stopped")
        ][:MAX_OUTCOMES],
        "stopper_errors": [name_cut(e, TEXT_CHARS) for e in list(report["stopper_errors"])[:20]],
        "children": report["children"],
    }
    if extra is not None and extra.get("started_at") == report["started_at"]:
        state.update({k: v for k, v in extra.items() if k != "started_at"})
    return state


def restart_state(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The last restart of a session's runners, as the panel shows it."""
    if not report:
        return None
    return {
        "session": name_cut(report.get("session")),
        "started_at": rounded(report.get("started_at"), 3),
        "took_s": rounded(report.get("took_s"), 3),
        "text": str(report.get("text") or "")[:4000],
        "errors": [name_cut(str(e), TEXT_CHARS) for e in (report.get("errors") or [])[:10]],
    }


# ------------------------------------------------------------------------------------ the sections' shaping
def shape_failures(s: Shaping) -> list[dict[str, Any]]:
    """The last thread failures, with the end of their tracebacks."""
    return [
        {
            "thread_name": name_cut(f["thread_name"]),
            "cell": f["cell"],
            "exc_type": name_cut(f["exc_type"]),
            "message": name_cut(f["message"], TEXT_CHARS),
            "traceback": f["traceback"][-4000:],
            "at": rounded(f["at"]),
        }
        for f in s.snapshot["failures"][-MAX_FAILURES:]
    ]


def shape_last_stop(s: Shaping) -> dict[str, Any] | None:
    """The last stop's report, with its click data when the panel made it."""
    return stop_state(s.snapshot["last_stop"], s.stop_extra)
