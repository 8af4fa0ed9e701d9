"""The panel's TensorFlow rows: sessions with their queue runners, queues, and runs blocked in a C++ call.

How long a run has been blocked (or a runner stuck) is not sent: the front end counts it from ``since``, so that a
sentence that did not change sends nothing (:func:`templated`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nbcoord.core.text import NAME_CHARS, TEXT_CHARS
from nbcoord.ui.commands import is_number
from nbcoord.ui.fields import name_cut, rounded
from nbcoord.ui.source import Shaping

#: TensorFlow sessions sent, and runners per session.
MAX_SESSIONS = 20
MAX_RUNNERS = 50


def queue_row(queue: Mapping[str, Any]) -> dict[str, Any]:
    """A queue's row without its history (sent apart, as sparklines), its rates to one decimal."""
    row = {
        key: name_cut(value, NAME_CHARS if key == "name" else TEXT_CHARS)
        for key, value in queue.items()
        if key != "history"
    }
    for key in ("enqueue_rate", "dequeue_rate"):
        if is_number(row.get(key)):
            row[key] = round(float(row[key]), 1)
    return row


def templated(row: Mapping[str, Any]) -> dict[str, Any]:
    """A sentence without the figure that grows every second: the module draws it from ``since``.

    Where the sentence contains the duration as the integration wrote it (``f"{seconds:.1f} s"``), that part
    becomes ``{duration}``; otherwise the row is kept as it is (and sent whenever it changes).
    """
    out = dict(row)
    seconds, text, since = out.get("seconds"), out.get("text"), out.get("since")
    if isinstance(seconds, (int, float)) and is_number(since) and isinstance(text, str):
        written = f"{float(seconds):.1f} s"
        if written in text:
            out["text"] = text.replace(written, "{duration}", 1)
            out["since"] = rounded(since, 1)
            del out["seconds"]
    for key in ("text", "thread", "name"):
        if key in out:
            out[key] = name_cut(out[key], TEXT_CHARS if key == "text" else NAME_CHARS)
    return out


def blocked_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Blocked runs as sentences; identical sentences are merged into one, with a count and the earliest start."""
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        out = templated(row)
        text = out.get("text")
        if not isinstance(text, str):
            continue
        seen = merged.get(text)
        if seen is None:
            out["count"] = 1
            merged[text] = out
            continue
        seen["count"] += 1
        if is_number(out.get("since")) and (not is_number(seen.get("since")) or out["since"] < seen["since"]):
            seen["since"] = out["since"]
    return list(merged.values())


def session_row(session: Mapping[str, Any]) -> dict[str, Any]:
    """A TensorFlow session with its queue runners: figures that move all the time (runs done, last progress of
    a runner that works) are left out; a stuck runner's sentence counts its duration in the front end."""
    runners = []
    for runner in session.get("runners") or []:
        row = {
            "tid": runner.get("tid"),
            "name": name_cut(runner.get("name")),
            "role": name_cut(runner.get("role")),
            "queue_name": name_cut(runner.get("queue_name")),
            "stuck": bool(runner.get("stuck")),
        }
        if row["stuck"] and isinstance(runner.get("text"), str):
            stuck = templated(runner)
            row["text"], row["since"] = stuck.get("text"), stuck.get("since")
        runners.append(row)
    return {
        "id": session.get("id"),
        "target": name_cut(session.get("target")),
        "closed": bool(session.get("closed")),
        "cell": session.get("cell"),
        "runner_threads": session.get("runner_threads"),
        "stuck_runners": session.get("stuck_runners", 0),
        "restartable": bool(session.get("restartable")),
        "runners": runners[:MAX_RUNNERS],
    }


# ------------------------------------------------------------------------------------ the sections' shaping
def shape_sessions(s: Shaping) -> list[dict[str, Any]]:
    """The first sessions, with their runners."""
    return [session_row(session) for session in s.snapshot["sessions"][:MAX_SESSIONS]]


def shape_queues(s: Shaping) -> list[dict[str, Any]]:
    """Every queue, without its history."""
    return [queue_row(q) for q in s.snapshot["queues"]]


def shape_blocked(s: Shaping) -> list[dict[str, Any]]:
    """The blocked runs, equal sentences merged."""
    return blocked_rows(s.snapshot["blocked_runs"])
