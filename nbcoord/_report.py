"""Snapshots and stop reports as text: what ``%nbcoord`` prints, and the panel's text form."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from itertools import groupby
from typing import Any

from ._probes import format_bytes
from ._snapshot import Snapshot, ThreadRow
from ._stop import StopReport

ZOMBIE_WORDS = {
    "cell-interrupted": "its cell was interrupted",
    "cell-error": "its cell raised an error",
    "stop-ignored": "a stop was requested and the grace period passed",
    "owner-closed": "its owner is closed or shut down",
}


def _owners(row: ThreadRow) -> str:
    return ", ".join(o["label"] + (" (closed)" if o["closed"] else "") for o in row["owners"])


def thread_line(row: ThreadRow, now: float, *, stacks: bool = False) -> str:
    """One thread as one line (plus its stack when asked)."""
    parts = [f"{row['tid']:>5}  {row['name']!s}", row["state"]]
    if row["zombie"]:
        parts.append(f"ZOMBIE: {ZOMBIE_WORDS.get(row['zombie'], row['zombie'])}")
    parts.append("daemon" if row["daemon"] else "non-daemon")
    if not row["user"]:
        parts.append("not the user's: never stopped")
    if row["owners"]:
        parts.append(f"owner: {_owners(row)}")
    idle = now - row["last_active"]
    if idle >= 1:
        parts.append(f"idle {idle:.0f} s")
    if row["cpu_s"] is not None:
        parts.append(f"cpu {row['cpu_s']:.2f} s")
    if row["last_exception"]:
        parts.append(f"last exception: {row['last_exception']}")
    line = " | ".join(parts)
    if stacks and row["stack"]:
        line += "\n" + "\n".join(f"          {frame}" for frame in row["stack"])
    return line


def _cell_title(snapshot: Snapshot, cell: int | None) -> str:
    if cell is None:
        return "Not started by a cell (the kernel's own, or from before nbcoord was loaded: never stopped)"
    info = next((c for c in snapshot["cells"] if c["execution_count"] == cell), None)
    if info is None:
        return f"Cell [{cell}]"
    return f"Cell [{cell}] ({info['outcome']}): {info['first_line']}"


def _sort_key(row: ThreadRow) -> tuple[int, int, float]:
    # Zombies first, then by cell (threads not started by a cell last), then by start time.
    return (0 if row["zombie"] else 1, row["cell"] if row["cell"] is not None else 1 << 30, row["started_at"])


def threads_section(snapshot: Snapshot, rows: Iterable[ThreadRow], *, stacks: bool, limit: int) -> list[str]:
    """Threads grouped by the cell that started them, zombies first."""
    ordered = sorted(rows, key=_sort_key)
    lines: list[str] = []
    now = time.time()
    shown = 0
    for (_, cell), group in groupby(ordered, key=lambda r: (r["zombie"] is not None, r["cell"])):
        members = list(group)
        lines.append(f"{_cell_title(snapshot, cell)}")
        for row in members:
            if shown >= limit:
                break
            lines.append("  " + thread_line(row, now, stacks=stacks))
            shown += 1
    if len(ordered) > limit:
        lines.append(f"  ... and {len(ordered) - limit} more (%nbcoord json has them all)")
    return lines


def report(snapshot: Snapshot, *, show_all: bool = False, stacks: bool = False, limit: int = 200) -> str:
    """The full text report: summary, zombies and threads by cell, queues, blocked runs, failures, memory."""
    threads = [r for r in snapshot["threads"] if show_all or r["user"]]
    lines = [summary_line(snapshot)]
    if threads:
        lines += threads_section(snapshot, threads, stacks=stacks, limit=limit)
    else:
        lines.append("No threads started since nbcoord was loaded." if not show_all else "No threads.")
    lines += queues_section(snapshot)
    lines += blocked_section(snapshot)
    lines += failures_section(snapshot)
    lines += resources_section(snapshot)
    if snapshot["last_stop"]:
        lines.append("Last stop: " + stop_summary(snapshot["last_stop"]))
    return "\n".join(lines)


def summary_line(snapshot: Snapshot) -> str:
    """One line: pid, thread, zombie and queue counts."""
    alive = [r for r in snapshot["threads"] if r["alive"]]
    return (
        f"nbcoord: kernel pid {snapshot['pid']}: {len(alive)} threads, {snapshot['zombie_count']} zombies, "
        f"{len(snapshot['queues'])} queues"
    )


def zombies_report(snapshot: Snapshot, *, stacks: bool = False) -> str:
    """Only the zombies, with their reasons."""
    zombies = [r for r in snapshot["threads"] if r["zombie"]]
    if not zombies:
        return "nbcoord: no zombie threads."
    lines = [f"nbcoord: {len(zombies)} zombie thread(s)"]
    lines += threads_section(snapshot, zombies, stacks=stacks, limit=10_000)
    lines.append("Stop them with: %nbcoord stop --zombies")
    return "\n".join(lines)


def queues_section(snapshot: Snapshot) -> list[str]:
    """Queues with fill levels (filled by the TensorFlow integration)."""
    if not snapshot["queues"]:
        return []
    lines = ["Queues:"]
    for q in snapshot["queues"]:
        capacity = q.get("capacity")
        cap = "unbounded" if capacity in (None, -1) else str(capacity)
        size = q.get("size")
        state = "closed" if q.get("closed") else "open"
        rates = ""
        if q.get("enqueue_rate") is not None:
            rates = f", in {q['enqueue_rate']:.1f}/s, out {q.get('dequeue_rate') or 0:.1f}/s"
        session = f", session {q['session']}" if q.get("session") else ""
        runners = q.get("runners")
        feeders = f", {runners} runner{'s' if runners != 1 else ''}" if runners is not None else ""
        filled = f"{size if size is not None else '?'} of {cap}"
        lines.append(f"  {q.get('name')}: {filled} ({state}{rates}{feeders}{session})")
    return lines


def blocked_section(snapshot: Snapshot) -> list[str]:
    """Blocked session runs as sentences."""
    return [f"Blocked: {b['text']}" for b in snapshot["blocked_runs"] if b.get("text")]


def failures_section(snapshot: Snapshot) -> list[str]:
    """Recent thread failures, one line each."""
    if not snapshot["failures"]:
        return []
    lines = ["Thread failures:"]
    for f in snapshot["failures"][-10:]:
        where = f" (cell [{f['cell']}])" if f["cell"] is not None else ""
        lines.append(f"  {f['thread_name']}{where}: {f['exc_type']}: {f['message']}")
    return lines


def resources_section(snapshot: Snapshot) -> list[str]:
    """Memory in one or two lines (filled by the resource probe)."""
    res = snapshot["resources"]
    if not res:
        return []
    host = res.get("host") or {}
    lines = [
        f"Memory: kernel RSS {format_bytes(host.get('rss'))}, children {format_bytes(host.get('children_rss'))}, "
        f"host available {format_bytes(host.get('available'))}"
    ]
    gpu = res.get("gpu") or {}
    if gpu.get("available"):
        for dev in gpu.get("devices", []):
            lines.append(
                f"GPU {dev.get('index')} {dev.get('name')}: {format_bytes(dev.get('used'))} of "
                f"{format_bytes(dev.get('total'))} used"
            )
    elif gpu:
        lines.append(f"GPU: {gpu.get('reason') or 'not available'}")
    return lines


def stop_summary(stop: StopReport | dict[str, Any]) -> str:
    """One line about a stop."""
    alive = stop["alive"]
    text = f"{len(stop['stopped'])} stopped, {len(alive)} still alive, in {stop['took_s'] * 1000:.0f} ms"
    children = stop["children"]
    if children["terminated"] or children["killed"]:
        text += f"; child processes: {len(children['terminated'])} terminated, {len(children['killed'])} killed"
    return text


def stop_report(stop: StopReport) -> str:
    """A stop's report as text: what stopped, what is still alive and why."""
    lines = [f"nbcoord stop ({stop['scope']}): " + stop_summary(stop)]
    for row in stop["stopped"]:
        lines.append(f"  stopped: {row['name']} ({row['tid']})" + (" [forced]" if row["reason"] == "forced" else ""))
    for row in stop["alive"]:
        lines.append(f"  STILL ALIVE: {row['name']} ({row['tid']}): {row['reason']}")
    for err in stop["stopper_errors"]:
        lines.append(f"  stopper {err['stopper']} failed: {err['error']}")
    if stop["children"]["alive"]:
        lines.append(f"  child processes still alive: {stop['children']['alive']}")
    return "\n".join(lines)


def to_json(data: Any) -> str:
    """JSON for the ``json`` magic."""
    return json.dumps(data, indent=1, default=str)
