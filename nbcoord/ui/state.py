"""The panel's state, shaped from one snapshot: pure functions, the same snapshot gives the same JSON.

Figures that move on their own are not sent: idle times, ages and how long a run has been blocked are computed by
the front end from the absolute times sent here (``last_active``, ``since``, ``started_at``), so that an idle
kernel sends nothing and a view's "5 s ago" keeps counting while nothing arrives. Memory is rounded to MiB and
moves only by visible steps (:func:`steady_resources`); history (sparklines) is kept as change points
(:func:`change_points`).

Every count is the true one. Thread rows are sent up to ``MAX_THREAD_ROWS`` (zombies first); ``groups`` gives
each group's true count (threads and other items per cell, and the zombies), so that a view that shows fewer rows
says so once, with the true number.

Every name from outside (a thread's, an owner's, a task's, a queue's, a session's, a process's command line) is cut
to ``NAME_CHARS`` (200) characters, the last an ellipsis, and every longer text (a blocked run's sentence, an
exception message) to ``TEXT_CHARS`` (500), so that a 100,000-character thread name costs the front end no more
than a short one (``nbcoord.snapshot()`` keeps it whole). The front end sets every string as text, escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from nbcoord.core.snapshot import LedgerRow, Snapshot, ThreadRow
from nbcoord.core.text import NAME_CHARS, TEXT_CHARS, bounded
from nbcoord.ui.commands import is_number

HISTORY_POINTS: Final = 120
HISTORY_WINDOW_S: Final = 600.0
#: A thread that moved within this many seconds shows as active (its idle time counts from then on).
ACTIVE_WINDOW_S: Final = 3.0
#: Thread rows sent; the rest are counted in ``groups`` (Stop all and Stop cell still reach them).
MAX_THREAD_ROWS: Final = 2000
#: Ledger rows (tasks, pools, loaders) sent; likewise counted in ``groups``.
MAX_LEDGER_ROWS: Final = 500
#: A stop report's outcome rows sent (the counts are always the true ones).
MAX_OUTCOMES: Final = 200
_MIB: Final = 1 << 20


def name_cut(value: Any, limit: int = NAME_CHARS) -> Any:
    """A string cut to ``limit`` characters, the last being "…" when it was longer; anything else as it is."""
    return bounded(value, limit) if isinstance(value, str) else value


def mib(n: object) -> int | None:
    """Bytes rounded to whole MiB (still in bytes), so that memory that did not move sends nothing."""
    if not is_number(n):
        return None
    return round(float(n) / _MIB) * _MIB  # type: ignore[arg-type]


def _t(value: object, digits: int = 2) -> float | None:
    return round(float(value), digits) if is_number(value) else None  # type: ignore[arg-type]


def _significant(value: float | None, digits: int = 2) -> float | None:
    """``value`` to ``digits`` significant digits: CPU seconds that grow all the time change rarely."""
    if value is None or not is_number(value) or value <= 0:
        return value
    return round(value, digits - 1 - math.floor(math.log10(value)))


def _reasons(rows: Iterable[Mapping[str, Any]]) -> list[list[Any]]:
    """Zombie reasons as ``[reason, since]`` pairs, first cause first."""
    return [[r["reason"], _t(r["since"], 1)] for r in rows]


# ------------------------------------------------------------------------------------------------- threads
def thread_row(row: ThreadRow, now: float) -> dict[str, Any]:
    """A snapshot row as the panel needs it: no stacks (sent on request), times that move only on a change.

    ``last_active`` is None while the thread is active (it moved in the last ``ACTIVE_WINDOW_S``), else the
    moment its idle period began: a thread that polls all the time, or sleeps all the time, sends nothing.
    """
    last_active = row["last_active"]
    return {
        "tid": row["tid"],
        "name": name_cut(row["name"]),
        "cell": row["cell"],
        "state": row["state"],
        "zombie": row["zombie"],
        "reasons": _reasons(row["zombie_reasons"]),
        "daemon": row["daemon"],
        "owners": [
            {"kind": name_cut(o["kind"]), "label": name_cut(o["label"]), "closed": o["closed"]} for o in row["owners"]
        ],
        "started_at": _t(row["started_at"]),
        "last_active": None if now - last_active < ACTIVE_WINDOW_S else _t(last_active, 1),
        "cpu_s": _significant(row["cpu_s"]),
        "stop_requested_at": _t(row["stop_requested_at"]),
        "last_exception": name_cut(row["last_exception"], TEXT_CHARS),
    }


def ledger_row(row: LedgerRow) -> dict[str, Any]:
    """Something a cell left running that is not a thread (a task, a pool, a data loader)."""
    return {
        "id": row["id"],
        "kind": row["kind"],
        "label": name_cut(row["label"]),
        "cell": row["cell"],
        "state": row["state"],
        "zombie": row["zombie"],
        "reasons": _reasons(row["zombie_reasons"]),
        "started_at": _t(row["started_at"]),
        "detail": name_cut(row["detail"], TEXT_CHARS),
        "pids": list(row["pids"])[:20],
    }


def _sort_key(row: Mapping[str, Any]) -> tuple[int, int, float]:
    cell = row["cell"]
    return (0 if row["zombie"] else 1, cell if cell is not None else 1 << 30, row["started_at"])


def group_key(row: Mapping[str, Any]) -> str:
    """The group a row is drawn in: the zombies, its cell, or "none" (not started by a cell)."""
    if row.get("zombie"):
        return "zombies"
    cell = row.get("cell")
    return "none" if cell is None else f"c{cell}"


def groups(threads: Sequence[Mapping[str, Any]], ledger: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each group's true counts (all rows, sent or not), zombies first, then by cell."""
    counts: dict[str, dict[str, Any]] = {}
    for kind, rows in (("threads", threads), ("items", ledger)):
        for row in rows:
            key = group_key(row)
            group = counts.get(key)
            if group is None:
                group = counts[key] = {
                    "key": key,
                    "cell": None if key in ("zombies", "none") else row["cell"],
                    "threads": 0,
                    "items": 0,
                }
            group[kind] += 1
    rank = {"zombies": -1.0, "none": math.inf}
    return sorted(counts.values(), key=lambda g: rank.get(g["key"], g["cell"] if g["cell"] is not None else 0))


def _header(
    snapshot: Snapshot, user: list[ThreadRow], *, shown: int, route: str, interval: float, native: int | None
) -> dict[str, Any]:
    running = next((c for c in reversed(snapshot["cells"]) if c["outcome"] == "running"), None)
    return {
        "pid": snapshot["pid"],
        "threads": len(user),
        "threads_shown": shown,
        "items": len(snapshot["ledger"]),
        "kernel_threads": sum(1 for r in snapshot["threads"] if r["alive"] and not r["user"]),
        "native_threads": native,
        "zombies": snapshot["zombie_count"],
        "queues": len(snapshot["queues"]),
        "running_cell": running["execution_count"] if running is not None else None,
        "running_since": _t(running["started_at"]) if running is not None else None,
        "route": route,
        "interval": interval,
    }


def _cells(snapshot: Snapshot, wanted: set[int]) -> list[dict[str, Any]]:
    return [
        {
            "n": c["execution_count"],
            "line": name_cut(c["first_line"]),
            "outcome": c["outcome"],
            "started_at": _t(c["started_at"]),
            "ended_at": _t(c["ended_at"]),
        }
        for c in snapshot["cells"]
        if c["execution_count"] in wanted or c["outcome"] == "running"
    ]


# -------------------------------------------------------------------------------------- queues and runs
def _queue_row(queue: Mapping[str, Any]) -> dict[str, Any]:
    row = {key: name_cut(value, NAME_CHARS if key == "name" else TEXT_CHARS) for key, value in queue.items()
           if key != "history"}
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
            out["since"] = _t(since, 1)
            del out["seconds"]
    for key in ("text", "thread", "name"):
        if key in out:
            out[key] = name_cut(out[key], TEXT_CHARS if key == "text" else NAME_CHARS)
    return out


#: The former name, kept for callers of the first panel.
_blocked_row = templated


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
        "runners": runners[:50],
    }


def restart_state(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The last restart of a session's runners, as the panel shows it."""
    if not report:
        return None
    return {
        "session": name_cut(report.get("session")),
        "started_at": _t(report.get("started_at"), 3),
        "took_s": _t(report.get("took_s"), 3),
        "text": str(report.get("text") or "")[:4000],
        "errors": [name_cut(str(e), TEXT_CHARS) for e in (report.get("errors") or [])[:10]],
    }


# ------------------------------------------------------------------------------------------------- memory
def _resources(resources: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Memory rounded to MiB and the child processes: what the memory section draws.

    Not the native-thread count: the probe lists the threads only at its full reads (seconds apart under its duty
    cap), and the header carries the count read at every update; a second, staler copy here would only change
    the trait (one more message) whenever a full read catches up, in a panel that is otherwise idle."""
    if not resources:
        return None
    host = dict(resources.get("host") or {})
    for key in ("rss", "uss", "children_rss", "tf_cpu_current", "tf_cpu_peak"):
        if key in host:
            host[key] = mib(host[key])
    # The machine's available memory moves with every other process: not the kernel's, and never quiet.
    host.pop("available", None)
    gpu = dict(resources.get("gpu") or {})
    gpu["devices"] = [
        {
            **{k: name_cut(v) for k, v in device.items()},
            **{k: mib(device.get(k)) for k in ("used", "process_used", "tf_current", "tf_peak") if k in device},
        }
        for device in gpu.get("devices") or []
    ]
    children = [
        {
            "pid": c.get("pid"),
            "cmdline": name_cut(str(c.get("cmdline", ""))),
            "status": c.get("status"),
            "rss": mib(c.get("rss")),
            "gpu_mem": mib(c.get("gpu_mem")),
            "cell": c.get("cell"),
            "started_at": _t(c.get("started_at")),
        }
        for c in (resources.get("children") or [])[:50]
    ]
    return {
        "host": host,
        "gpu": gpu,
        "children": children,
    }


def cell_memory_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a cell did to memory (MiB-rounded): the front end says "+2.1 GiB on the GPU, still held"."""
    out: dict[str, Any] = {"cell": row.get("cell"), "held": bool(row.get("held"))}
    for key in ("rss_before", "rss_after", "rss_peak", "gpu_before", "gpu_after", "gpu_peak"):
        out[key] = mib(row.get(key))
    return out


def _close_enough(new: object, old: object, tolerance: float) -> bool:
    return is_number(new) and is_number(old) and abs(float(new) - float(old)) < tolerance  # type: ignore[arg-type]


def memory_close(new: object, old: object) -> bool:
    """Memory figures within 2 MiB or 1 % of each other: below what the panel shows."""
    return is_number(old) and _close_enough(new, old, max(2 * _MIB, abs(float(old)) / 100))  # type: ignore[arg-type]


def steady_resources(new: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any] | None:
    """``new``, keeping ``old``'s figures where they moved less than a step (hysteresis for rounding).

    Memory rounded to MiB still flips when it sits on a boundary: a figure is replaced only when it moved by
    more than 2 MiB and 1 %.
    """
    if not new or not old:
        return new
    result = {**new, "host": dict(new.get("host") or {})}
    host, old_host = result["host"], old.get("host") or {}
    for key in host:
        if key != "total" and memory_close(host[key], old_host.get(key)):
            host[key] = old_host[key]
    old_devices = {d.get("index"): d for d in (old.get("gpu") or {}).get("devices") or []}
    gpu = dict(new.get("gpu") or {})
    devices = []
    for device in gpu.get("devices") or []:
        previous = old_devices.get(device.get("index"), {})
        devices.append(
            {
                k: previous[k] if k not in ("total", "index") and memory_close(v, previous.get(k)) else v
                for k, v in device.items()
            }
        )
    gpu["devices"] = devices
    result["gpu"] = gpu
    return result


# --------------------------------------------------------------------------------------- failures, stops
def _failures(snapshot: Snapshot) -> list[dict[str, Any]]:
    return [
        {
            "thread_name": name_cut(f["thread_name"]),
            "cell": f["cell"],
            "exc_type": name_cut(f["exc_type"]),
            "message": name_cut(f["message"], TEXT_CHARS),
            "traceback": f["traceback"][-4000:],
            "at": _t(f["at"]),
        }
        for f in snapshot["failures"][-10:]
    ]


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
        "started_at": _t(report["started_at"], 3),
        "took_s": _t(report["took_s"], 3),
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


# ----------------------------------------------------------------------------------------------- the whole
def panel_state(
    snapshot: Snapshot,
    *,
    route: str = "none",
    interval: float = 1.0,
    stop_extra: Mapping[str, Any] | None = None,
    native_threads: int | None = None,
) -> dict[str, Any]:
    """The panel's traits (all but history and the one-off answers) from one snapshot. Pure."""
    user = sorted((r for r in snapshot["threads"] if r["alive"] and r["user"]), key=_sort_key)
    shown = user[:MAX_THREAD_ROWS]
    ledger = sorted(snapshot["ledger"], key=_sort_key)
    ledger_shown = ledger[:MAX_LEDGER_ROWS]
    resources = _resources(snapshot["resources"])
    if native_threads is None and snapshot["resources"]:
        listed = snapshot["resources"].get("native_threads")
        native_threads = len(listed) if isinstance(listed, list) else None
    memory = [cell_memory_row(r) for r in snapshot["cell_memory"][-50:]]
    wanted = {r["cell"] for r in shown if r["cell"] is not None}
    wanted |= {r["cell"] for r in ledger_shown if r["cell"] is not None}
    wanted |= {r["cell"] for r in memory if isinstance(r["cell"], int)}
    return {
        "header": _header(snapshot, user, shown=len(shown), route=route, interval=interval, native=native_threads),
        "threads": [thread_row(r, snapshot["taken_at"]) for r in shown],
        "ledger": [ledger_row(r) for r in ledger_shown],
        "groups": groups(user, ledger),
        "cells": _cells(snapshot, wanted),
        "cell_memory": memory,
        "sessions": [session_row(s) for s in snapshot["sessions"][:20]],
        "queues": [_queue_row(q) for q in snapshot["queues"]],
        "blocked": blocked_rows(snapshot["blocked_runs"]),
        "resources": resources,
        "failures": _failures(snapshot),
        "last_stop": stop_state(snapshot["last_stop"], stop_extra),
    }


# ------------------------------------------------------------------------------------------------ history
def _same(a: Sequence[Any], b: Sequence[Any], close: Callable[[object, object], bool] | None) -> bool:
    return len(a) == len(b) and all(x == y or (close is not None and close(y, x)) for x, y in zip(a, b, strict=True))


def change_points(
    points: Iterable[Sequence[Any]],
    *,
    now: float,
    limit: int = HISTORY_POINTS,
    close: Callable[[object, object], bool] | None = None,
) -> list[list[Any]]:
    """``[t, v...]`` points reduced to where the values change, in the last ``HISTORY_WINDOW_S`` seconds.

    The front end draws steps, extended to now: a level that did not move (or that ``close(new, old)`` finds
    close enough) adds no point, so an idle panel's history stays the same, and sends nothing. Longer series
    keep every n-th point and the last one.
    """
    kept: list[list[Any]] = []
    for point in points:
        if not point or not is_number(point[0]) or point[0] < now - HISTORY_WINDOW_S:
            continue
        values = list(point[1:])
        if kept and _same(kept[-1][1:], values, close):
            continue
        kept.append([round(float(point[0]), 1), *values])
    if len(kept) > limit:
        step = math.ceil(len(kept) / limit)
        kept = kept[::-step][::-1]
    return kept


def panel_history(snapshot: Snapshot, resource_history: Sequence[Mapping[str, Any]], *, now: float) -> dict[str, Any]:
    """Sparkline data: memory (MiB) from the probe's ring, each queue's fill level from its row."""
    memory = change_points(
        (
            [
                p.get("sampled_at"),
                mib(p.get("rss")),
                mib(p.get("gpu_used")),
                mib(p.get("gpu_process_used")),
                mib(p.get("children_rss")),
            ]
            for p in resource_history
        ),
        now=now,
        close=memory_close,
    )
    queues = {
        str(q.get("id", name_cut(q.get("name")))): change_points(q.get("history") or [], now=now)
        for q in snapshot["queues"]
        if q.get("history")
    }
    return {"memory": memory, "queues": queues}
