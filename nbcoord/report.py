"""Snapshots and stop reports as text: what ``%nbcoord`` prints, and the panel's text form."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from itertools import groupby
from typing import Any

from nbcoord.core.snapshot import Snapshot, ThreadRow
from nbcoord.core.stop import StopReport
from nbcoord.core.text import TEXT_CHARS, shown
from nbcoord.resources.own_stacks import stuck_in_c
from nbcoord.resources.probes import format_bytes


def zombie_text(reasons: Iterable[Mapping[str, Any]], cell: int | None, now: float) -> str:
    """A zombie's reasons, first cause first: ``cell [3] interrupted; ignored a stop 4 s ago``."""
    words: list[str] = []
    for reason in reasons:
        kind = reason["reason"]
        if kind == "cell-interrupted":
            words.append(f"cell [{cell}] interrupted")
        elif kind == "cell-error":
            words.append(f"cell [{cell}] failed")
        elif kind == "owner-closed":
            words.append("its owner is closed")
        elif kind == "stop-ignored":
            words.append(f"ignored a stop {max(0.0, now - float(reason['since'])):.0f} s ago")
        else:
            words.append(str(kind))
    return "; ".join(words)


def _owners(row: ThreadRow) -> str:
    return ", ".join(o["label"] + (" (closed)" if o["closed"] else "") for o in row["owners"])


def thread_line(
    row: ThreadRow, now: float, *, stacks: bool = False, output: str | None = None, waits: str | None = None
) -> str:
    """One thread as one line (plus its stack when asked); ``output``: where its background output went; ``waits``:
    what it waits on (from the snapshot's waits section)."""
    state = "waiting" if waits and row["state"] == "running" else row["state"]  # blocked in C: a lock
    parts = [f"{row['tid']:>5}  {shown(row['name'])}", state]
    if waits:
        parts.append(f"waits on {shown(waits, TEXT_CHARS)}")
    if row["zombie"]:
        parts.append(f"ZOMBIE: {zombie_text(row['zombie_reasons'], row['cell'], now)}")
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
        parts.append(f"last exception: {shown(row['last_exception'], TEXT_CHARS)}")
    if output:
        parts.append(output)
    line = " | ".join(parts)
    if stacks and row["stack"]:
        line += "\n" + "\n".join(f"          {shown(frame, TEXT_CHARS)}" for frame in row["stack"])
    return line


def _cell_title(snapshot: Snapshot, cell: int | None) -> str:
    if cell is None:
        return "Not started by a cell (the kernel's own, or from before nbcoord was loaded: never stopped)"
    info = next((c for c in snapshot["cells"] if c["execution_count"] == cell), None)
    if info is None:
        return f"Cell [{cell}]"
    return f"Cell [{cell}] ({info['outcome']}): {shown(info['first_line'], TEXT_CHARS)}"


def _sort_key(row: ThreadRow) -> tuple[int, int, float]:
    # Zombies first, then by cell (threads not started by a cell last), then by start time.
    return (0 if row["zombie"] else 1, row["cell"] if row["cell"] is not None else 1 << 30, row["started_at"])


def threads_section(snapshot: Snapshot, rows: Iterable[ThreadRow], *, stacks: bool, limit: int) -> list[str]:
    """Threads grouped by the cell that started them, zombies first."""
    ordered = sorted(rows, key=_sort_key)
    lines: list[str] = []
    now = time.time()
    shown = 0
    outputs = output_by_thread(snapshot)
    report = snapshot.get("waits")  # .get: snapshots made before the section existed
    waits = {row["tid"]: row["waits"] for row in report["threads"]} if report else {}
    for (_, cell), group in groupby(ordered, key=lambda r: (r["zombie"] is not None, r["cell"])):
        members = list(group)
        lines.append(f"{_cell_title(snapshot, cell)}")
        for row in members:
            if shown >= limit:
                break
            waiting = waits.get(row["native_id"]) if row["native_id"] is not None else None
            lines.append("  " + thread_line(row, now, stacks=stacks, output=outputs.get(row["tid"]), waits=waiting))
            shown += 1
    if len(ordered) > limit:
        lines.append(f"  ... and {len(ordered) - limit} more (%nbcoord json has them all)")
    return lines


def deadlocks_section(snapshot: Snapshot) -> list[str]:
    """Each deadlock the snapshot's waits section names, with every thread in it: what it holds, what it waits on,
    and its stack (innermost last)."""
    waits = snapshot.get("waits")
    if not waits:
        return []
    rows = {row["tid"]: row for row in waits["threads"]}
    lines: list[str] = []
    for deadlock in waits["deadlocks"]:
        lines.append(f"Deadlock: {shown(deadlock['text'], TEXT_CHARS)}")
        for tid in deadlock["tids"]:
            row = rows.get(tid)
            if row is None:
                continue
            holds = f"holds {', '.join(shown(name) for name in row['holds'])}; " if row["holds"] else ""
            waits_on = shown(row["waits"], TEXT_CHARS)
            lines.append(f"  thread {shown(row['name'])!r} (tid {tid}): {holds}waits on {waits_on}")
            lines += [f"      {shown(frame, TEXT_CHARS)}" for frame in row["stack"]]
    return lines


def native_section(read: Any, snapshot: Snapshot) -> list[str]:
    """``%nbcoord threads --native``: each thread stuck in C, the C function its Python code called and its innermost
    native frames (a read from :mod:`nbcoord.resources.own_stacks`)."""
    if not read["available"]:
        return [f"Native frames: not read. {shown(read['reason'], TEXT_CHARS)}"]
    names = {row["native_id"]: row["name"] for row in snapshot["threads"] if row.get("native_id") is not None}
    stuck = stuck_in_c(read)
    lines = [f"Native frames (read by a child process; the kernel was paused {read['paused_ms']:.0f} ms): "
             f"{len(stuck)} of {len(read['threads'])} threads in C"]  # fmt: skip
    for row in stuck:
        name = names.get(row["tid"]) or f"{row['os_name']} (not a Python thread)"
        called = f"in {row['called']}" if row["called"] else "in C"
        where = f", called from {shown(row['python'], TEXT_CHARS)}" if row["python"] else ""
        lines.append(f"  thread {shown(name)!r} (tid {row['tid']}): {called}{where}")
        lines.append(f"      innermost: {' <- '.join(shown(symbol) for symbol in row['innermost'])}")
    return lines


def report(
    snapshot: Snapshot,
    *,
    show_all: bool = False,
    stacks: bool = False,
    limit: int = 200,
    degraded: Mapping[str, str] | None = None,
) -> str:
    """The full text report: summary, zombies and threads by cell, queues, blocked runs, failures, memory, and
    what works differently here (``degraded``: internal -> what nbcoord does instead)."""
    threads = [r for r in snapshot["threads"] if show_all or r["user"]]
    lines = [summary_line(snapshot)]
    if threads:
        lines += threads_section(snapshot, threads, stacks=stacks, limit=limit)
    else:
        lines.append("No thread started by a cell is running." if not show_all else "No threads.")
    lines += deadlocks_section(snapshot)
    lines += ledger_section(snapshot)
    lines += queues_section(snapshot)
    lines += blocked_section(snapshot)
    lines += failures_section(snapshot)
    lines += outputs_section(snapshot)
    lines += resources_section(snapshot)
    if snapshot["last_stop"]:
        lines.append("Last stop: " + stop_summary(snapshot["last_stop"]))
    lines += degraded_section(degraded or {})
    return "\n".join(lines)


def summary_line(snapshot: Snapshot) -> str:
    """One line: pid, thread, zombie and queue counts. The threads counted first are the cells' (what the panel
    counts); the kernel's own follow in brackets."""
    alive = [r for r in snapshot["threads"] if r["alive"]]
    users = sum(1 for r in alive if r["user"])
    return (
        f"nbcoord: kernel pid {snapshot['pid']}: {users} thread{'' if users == 1 else 's'} started by cells "
        f"({len(alive) - users} of the kernel's own), {snapshot['zombie_count']} zombies, "
        f"{len(snapshot['queues'])} queues"
    )


def zombies_report(snapshot: Snapshot, *, stacks: bool = False) -> str:
    """Only the zombies, with their reasons: threads, then the other things cells left (tasks, pools, loaders)."""
    zombies = [r for r in snapshot["threads"] if r["zombie"]]
    items = [r for r in snapshot["ledger"] if r["zombie"]]
    if not zombies and not items:
        return "nbcoord: no zombie threads."  # nor anything else: tasks, pools and loaders are checked too
    lines = [f"nbcoord: {len(zombies)} zombie thread(s)" + (f", {len(items)} other zombie(s)" if items else "")]
    if zombies:
        lines += threads_section(snapshot, zombies, stacks=stacks, limit=10_000)
    lines += ledger_section({**snapshot, "ledger": items})
    # A zombie that ignored a stop ignores the next one too: only --force (between Python statements) reaches it.
    ignored = any(reason["reason"] == "stop-ignored" for row in zombies for reason in row["zombie_reasons"])
    lines.append("Stop them with: %nbcoord stop --zombies" + (" --force" if ignored else ""))
    return "\n".join(lines)


def ledger_section(snapshot: Snapshot) -> list[str]:
    """What cells left running besides threads (tasks, pools, data loaders), by cell, zombies first."""
    rows = sorted(
        snapshot["ledger"],
        key=lambda r: (r["zombie"] is None, r["cell"] if r["cell"] is not None else 1 << 30, r["started_at"]),
    )
    if not rows:
        return []
    now = time.time()
    lines = ["Also running:"]
    for row in rows:
        where = f"cell [{row['cell']}]" if row["cell"] is not None else "not started by a cell"
        parts = [f"{row['id']:>8}  {shown(row['label'])}", row["state"], where]
        if row["zombie"]:
            parts.append(f"ZOMBIE: {zombie_text(row['zombie_reasons'], row['cell'], now)}")
        if row["pids"]:
            parts.append(f"processes {', '.join(map(str, row['pids'][:8]))}" + (" ..." if len(row["pids"]) > 8 else ""))
        if row["detail"]:
            parts.append(row["detail"])
        lines.append("  " + " | ".join(parts))
    return lines


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
        if q.get("mode") == "eager":
            state += ", eager"
        rates = ""
        if q.get("enqueue_rate") is not None:
            rates = f", in {q['enqueue_rate']:.1f}/s, out {q.get('dequeue_rate') or 0:.1f}/s"
        session = f", session {q['session']}" if q.get("session") else ""
        runners = q.get("runners")
        feeders = f", {runners} runner{'s' if runners != 1 else ''}" if runners is not None else ""
        if q.get("stuck_runners"):
            feeders += f", {q['stuck_runners']} stuck"
        filled = f"{size if size is not None else '?'} of {cap}"
        lines.append(f"  {shown(q.get('name'))}: {filled} ({state}{rates}{feeders}{session})")
    return lines


def blocked_section(snapshot: Snapshot) -> list[str]:
    """Blocked session runs as sentences, then stuck queue-runner threads (with how to restart them)."""
    lines = [f"Blocked: {b['text']}" for b in snapshot["blocked_runs"] if b.get("text")]
    for session in snapshot["sessions"]:
        stuck = [row for row in session.get("runners") or [] if row.get("stuck") and row.get("text")]
        lines += [f"Stuck: {row['text']}" for row in stuck]
        if stuck and session.get("restartable"):
            sid = session.get("id")
            lines.append(f"  restart the runners of session {sid} with: %nbcoord restart {sid}")
    return lines


def degraded_section(degraded: Mapping[str, str]) -> list[str]:
    """What nbcoord does differently here because an internal it relies on is missing (one line each)."""
    if not degraded:
        return []
    return ["Degraded here:"] + [f"  {name}: {fallback}" for name, fallback in sorted(degraded.items())]


def failures_section(snapshot: Snapshot) -> list[str]:
    """Recent thread failures, one line each."""
    if not snapshot["failures"]:
        return []
    lines = ["Thread failures:"]
    for f in snapshot["failures"][-10:]:
        where = f" (cell [{f['cell']}])" if f["cell"] is not None else ""
        message = shown(f["message"], TEXT_CHARS)
        lines.append(f"  {shown(f['thread_name'])}{where}: {shown(f['exc_type'])}: {message}")
        lines += [f"    {shown(note, TEXT_CHARS)}" for note in f.get("notes", [])[:1]]
    return lines


def output_by_thread(snapshot: Snapshot) -> dict[str, str]:
    """Thread id -> where its background output went, in words (``output: 12 line(s) under cell [3]``)."""
    found: dict[str, str] = {}
    for area in snapshot.get("outputs") or []:  # .get: snapshots made before the section existed
        for thread in area["threads"]:
            found[thread["tid"]] = f"output: {thread['lines']:,} line(s) under cell [{area['cell']}]"
    return found


def outputs_section(snapshot: Snapshot) -> list[str]:
    """Background output routed home: one line per cell whose output area holds some."""
    areas = snapshot.get("outputs") or []
    if not areas:
        return []
    lines = ["Background output (under the cell that started each thread):"]
    for area in areas:
        threads = ", ".join(
            f"{shown(t['name'])} ({t['tid']}{', failed' if t['failed'] else ''})" for t in area["threads"][:5]
        ) + (" ..." if len(area["threads"]) > 5 else "")
        kept = f", the last {area['shown']:,} shown" if area["hidden"] else ""
        last = f"; last: {shown(area['last_lines'][-1], 120)}" if area["last_lines"] else ""
        lines.append(f"  cell [{area['cell']}]: {area['lines']:,} line(s) from {threads}{kept}{last}")
    return lines


def cell_memory_section(snapshot: Snapshot, limit: int = 8) -> list[str]:
    """The memory ledger's notable cells, those still holding their growth first: ``cell [7]: +2.1 GiB on GPU 0,
    still held``."""
    rows = [r for r in snapshot["cell_memory"] if r["ended_at"] is not None and "no notable change" not in r["summary"]]
    if not rows:
        return []
    rows.sort(key=lambda r: (not r["held"], -r["cell"]))
    lines = ["Memory by cell:"] + [f"  {row['summary']}" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"  ... and {len(rows) - limit} more (%nbcoord json has them all)")
    return lines


def resources_section(snapshot: Snapshot, *, details: bool = False) -> list[str]:
    """Memory in one or two lines (filled by the resource probe); with ``details`` (``%nbcoord mem``), native
    threads with their CPU time and child processes with the cell that started them."""
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
    lines += cell_memory_section(snapshot)
    if details:
        lines += _native_threads_lines(res.get("native_threads") or [])
        lines += _children_lines(res.get("children") or [])
    return lines


def _native_threads_lines(threads: list[dict[str, Any]], top: int = 20) -> list[str]:
    python = sum(1 for t in threads if t.get("python_name") is not None)
    lines = [f"Native threads: {len(threads)} ({python} Python, {len(threads) - python} others); by CPU time:"]
    for thread in sorted(threads, key=lambda t: -float(t.get("cpu_s") or 0.0))[:top]:
        name = thread.get("python_name") or thread.get("name") or "?"
        kind = "" if thread.get("python_name") is not None else " (native)"
        cpu = float(thread.get("cpu_s") or 0)
        lines.append(f"  {thread.get('native_id')}  {shown(name)}{kind}: cpu {cpu:.2f} s")
    if len(threads) > top:
        lines.append(f"  ... and {len(threads) - top} more (%nbcoord json has them all)")
    return lines


def _children_lines(children: list[dict[str, Any]]) -> list[str]:
    if not children:
        return ["Child processes: none"]
    lines = [f"Child processes: {len(children)}"]
    for child in children:
        cell = f"cell [{child['cell']}]" if child.get("cell") is not None else "not started by a cell"
        lines.append(
            f"  {child.get('pid')}  {child.get('status')}  {format_bytes(child.get('rss'))}  {cell}: "
            f"{shown(child.get('cmdline'), TEXT_CHARS)}"
        )
    return lines


def stop_summary(stop: StopReport | dict[str, Any]) -> str:
    """One line about a stop."""
    alive = stop["alive"]
    text = f"{len(stop['stopped'])} stopped, {len(alive)} still alive, in {stop['took_s'] * 1000:.0f} ms"
    items = stop.get("items") or []
    if items:
        ended = sum(1 for item in items if item["stopped"])
        text += f"; {ended} other item(s) stopped, {len(items) - ended} alive"
    children = stop["children"]
    if children["terminated"] or children["killed"]:
        text += f"; child processes: {len(children['terminated'])} terminated, {len(children['killed'])} killed"
    return text


def stop_report(stop: StopReport) -> str:
    """A stop's report as text: what stopped, what is still alive and why."""
    lines = [f"nbcoord stop ({stop['scope']}): " + stop_summary(stop)]
    for row in stop["stopped"]:
        forced = " [forced]" if row["reason"] == "forced" else ""
        lines.append(f"  stopped: {shown(row['name'])} ({row['tid']}){forced}")
    for row in stop["alive"]:
        lines.append(f"  STILL ALIVE: {shown(row['name'])} ({row['tid']}): {shown(row['reason'], TEXT_CHARS)}")
    for item in stop.get("items", []):
        state = "stopped" if item["stopped"] else "STILL ALIVE"
        reason = f": {shown(item['reason'], TEXT_CHARS)}" if item["reason"] else ""
        lines.append(f"  {state}: {shown(item['label'])} ({item['id']}){reason}")
    for err in stop["stopper_errors"]:
        lines.append(f"  stopper {shown(err['stopper'])} failed: {shown(err['error'], TEXT_CHARS)}")
    if stop["children"]["alive"]:
        lines.append(f"  child processes still alive: {stop['children']['alive']}")
    return "\n".join(lines)


def to_json(data: Any) -> str:
    """JSON for the ``json`` magic."""
    return json.dumps(data, indent=1, default=str)
