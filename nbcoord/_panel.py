"""The live panel: an AnyWidget whose state is built from snapshots, and whose clicks reach the one stop.

Data flows one way. One sender thread per kernel (``nbcoord-panel``) builds a snapshot every
``NBCoord.panel_interval`` seconds, turns it into the panel's traits (:func:`panel_state`) and sets only the traits
whose value changed, in one message (``hold_sync``). Nothing is sent when nothing changed: figures that move on
their own (idle times, ages, how long a run has been blocked) are computed by the front end from timestamps;
memory moves only by visible steps (:func:`steady_resources`); history (sparklines) is kept as change points and
sent at most every ``HISTORY_EVERY`` intervals. While a cell runs, a small ``beat`` goes out every tick: when the
beats stop, the front end says that the main thread holds the GIL in native code. The sender keeps itself under
``MAX_DUTY`` of one core (with a thousand threads it ticks less often, and its beat says so).

Commands flow to one place. The front end sends only commands (stop all / a cell / a thread / the zombies, a
stack request, view presence), each with a ``click_id``. They arrive by two routes: the fast route of
:mod:`nbcoord._fastcomm` (handled off the main thread, so a Stop click acts while a cell is busy) and the
widget's ordinary message (handled when the main thread is free); the first to arrive acts, the other is
dropped by its ``click_id``. The front end is untrusted: every command is checked against the ids this kernel
issued (:func:`parse_command`); anything else is rejected and logged, never raised.

A panel nobody looks at costs nothing: each view announces itself and renews a lease every
``VIEW_RENEW_S`` (the module does it); when no lease is left the sender parks until one comes back.

Without a widget front end (nbconvert, a terminal) the panel shows as the ``%nbcoord`` text report.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import anywidget
import traitlets

from . import _fastcomm, _report
from ._panel_commands import (
    COMMAND_TYPES,
    ClickLedger,
    Command,
    Rejected,
    StopRunner,
    is_number,
    parse_command,
    reject,
)
from ._snapshot import Snapshot, ThreadRow, creation_lines, format_stack
from ._stop import StopReport
from ._threads import INTERNAL_PREFIX

__all__ = ["COMMAND_TYPES", "Command", "NBCoordPanel", "PanelController", "Rejected", "panel_for", "parse_command"]

from ._internals import current_frames

log = logging.getLogger("nbcoord")

SENDER_THREAD_NAME: Final = f"{INTERNAL_PREFIX}panel"
#: A view that has not renewed its lease for this long is taken as gone (the module renews every 20 s).
VIEW_LEASE_S: Final = 60.0
VIEW_RENEW_S: Final = 20.0
#: After the panel is created or displayed, it is taken as watched for this long, until a view says so itself.
PENDING_VIEW_S: Final = 30.0
#: History (sparklines) is sent at most every this many intervals.
HISTORY_EVERY: Final = 5
HISTORY_POINTS: Final = 120
HISTORY_WINDOW_S: Final = 600.0
#: The share of one core the sender may use: a tick that costs more (1000 threads: about 10 ms) waits longer.
MAX_DUTY: Final = 0.005
#: A thread that moved within this many seconds shows as active (its idle time counts from then on).
ACTIVE_WINDOW_S: Final = 3.0
#: Thread rows sent; the rest are counted in the header (Stop all and Stop cell still reach them).
MAX_THREAD_ROWS: Final = 500
#: A trait larger than this is sent at most every (size / this) intervals, so that 1000 busy threads cannot
#: turn the panel into a firehose.
BYTES_PER_INTERVAL: Final = 64 * 1024
_MAX_VIEWS: Final = 64
_MIB: Final = 1 << 20


def esm_path() -> Path:
    """The panel's ES module: inside the wheel at ``nbcoord/static``, in a checkout at ``js/``."""
    packaged = Path(__file__).parent / "static" / "panel.js"
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "js" / "panel.js"


# -------------------------------------------------------------------------------------------------- state
def _mib(n: object) -> int | None:
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


def thread_row(row: ThreadRow, now: float) -> dict[str, Any]:
    """A snapshot row as the panel needs it: no stacks (sent on request), times that move only on a change.

    ``last_active`` is None while the thread is active (it moved in the last ``ACTIVE_WINDOW_S``), else the
    moment its idle period began: a thread that polls all the time, or sleeps all the time, sends nothing.
    """
    last_active = row["last_active"]
    return {
        "tid": row["tid"],
        "name": row["name"],
        "cell": row["cell"],
        "state": row["state"],
        "zombie": row["zombie"],
        "daemon": row["daemon"],
        "owners": [{"kind": o["kind"], "label": o["label"], "closed": o["closed"]} for o in row["owners"]],
        "started_at": _t(row["started_at"]),
        "last_active": None if now - last_active < ACTIVE_WINDOW_S else _t(last_active, 1),
        "cpu_s": _significant(row["cpu_s"]),
        "stop_requested_at": _t(row["stop_requested_at"]),
        "last_exception": row["last_exception"],
    }


def _sort_key(row: ThreadRow) -> tuple[int, int, float]:
    return (0 if row["zombie"] else 1, row["cell"] if row["cell"] is not None else 1 << 30, row["started_at"])


def _header(snapshot: Snapshot, user: list[ThreadRow], shown: int, route: str, interval: float) -> dict[str, Any]:
    running = next((c for c in reversed(snapshot["cells"]) if c["outcome"] == "running"), None)
    return {
        "pid": snapshot["pid"],
        "threads": len(user),
        "threads_shown": shown,
        "kernel_threads": sum(1 for r in snapshot["threads"] if r["alive"] and not r["user"]),
        "zombies": snapshot["zombie_count"],
        "queues": len(snapshot["queues"]),
        "running_cell": running["execution_count"] if running is not None else None,
        "running_since": _t(running["started_at"]) if running is not None else None,
        "route": route,
        "interval": interval,
    }


def _cells(snapshot: Snapshot, rows: Iterable[ThreadRow]) -> list[dict[str, Any]]:
    wanted = {r["cell"] for r in rows if r["cell"] is not None}
    return [
        {
            "n": c["execution_count"],
            "line": c["first_line"][:120],
            "outcome": c["outcome"],
            "started_at": _t(c["started_at"]),
            "ended_at": _t(c["ended_at"]),
        }
        for c in snapshot["cells"]
        if c["execution_count"] in wanted or c["outcome"] == "running"
    ]


def _queue_row(queue: Mapping[str, Any]) -> dict[str, Any]:
    row = {key: value for key, value in queue.items() if key != "history"}
    for key in ("enqueue_rate", "dequeue_rate"):
        if is_number(row.get(key)):
            row[key] = round(float(row[key]), 1)
    return row


def _blocked_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A blocked run without the figure that grows every second: the module draws it from ``since``.

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
    return out


def _resources(resources: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Memory rounded to MiB, native threads as a count: what the header and the memory section draw."""
    if not resources:
        return None
    host = dict(resources.get("host") or {})
    for key in ("rss", "uss", "children_rss", "tf_cpu_current", "tf_cpu_peak"):
        if key in host:
            host[key] = _mib(host[key])
    # The machine's available memory moves with every other process: not the kernel's, and never quiet.
    host.pop("available", None)
    gpu = dict(resources.get("gpu") or {})
    gpu["devices"] = [
        {
            **device,
            **{k: _mib(device.get(k)) for k in ("used", "process_used", "tf_current", "tf_peak") if k in device},
        }
        for device in gpu.get("devices") or []
    ]
    native = resources.get("native_threads")
    children = [
        {
            "pid": c.get("pid"),
            "cmdline": str(c.get("cmdline", ""))[:200],
            "status": c.get("status"),
            "rss": _mib(c.get("rss")),
            "gpu_mem": _mib(c.get("gpu_mem")),
            "cell": c.get("cell"),
            "started_at": _t(c.get("started_at")),
        }
        for c in (resources.get("children") or [])[:50]
    ]
    return {
        "host": host,
        "gpu": gpu,
        "native_threads": len(native) if isinstance(native, list) else None,
        "children": children,
    }


def _close_enough(new: object, old: object, tolerance: float) -> bool:
    return is_number(new) and is_number(old) and abs(float(new) - float(old)) < tolerance  # type: ignore[arg-type]


def _memory_close(new: object, old: object) -> bool:
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
        if key != "total" and _memory_close(host[key], old_host.get(key)):
            host[key] = old_host[key]
    old_devices = {d.get("index"): d for d in (old.get("gpu") or {}).get("devices") or []}
    gpu = dict(new.get("gpu") or {})
    devices = []
    for device in gpu.get("devices") or []:
        previous = old_devices.get(device.get("index"), {})
        devices.append(
            {
                k: previous[k] if k not in ("total", "index") and _memory_close(v, previous.get(k)) else v
                for k, v in device.items()
            }
        )
    gpu["devices"] = devices
    result["gpu"] = gpu
    return result


def _failures(snapshot: Snapshot) -> list[dict[str, Any]]:
    return [
        {
            "thread_name": f["thread_name"],
            "cell": f["cell"],
            "exc_type": f["exc_type"],
            "message": f["message"][:300],
            "traceback": f["traceback"][-4000:],
            "at": _t(f["at"]),
        }
        for f in snapshot["failures"][-10:]
    ]


def _outcomes(rows: Sequence[Mapping[str, Any]], limit: int) -> list[dict[str, Any]]:
    return [{"tid": r["tid"], "name": r["name"], "cell": r["cell"], "reason": r["reason"]} for r in rows[:limit]]


def stop_state(report: Mapping[str, Any] | None, extra: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A stop report as the panel shows it (long lists trimmed), with the panel's click data when it was ours."""
    if not report:
        return None
    state: dict[str, Any] = {
        "scope": report["scope"],
        "cell": report["cell"],
        "force": report["force"],
        "started_at": _t(report["started_at"], 3),
        "took_s": _t(report["took_s"], 3),
        "stopped_count": len(report["stopped"]),
        "stopped": _outcomes(report["stopped"], 50),
        "alive": _outcomes(report["alive"], 100),
        "stopper_errors": list(report["stopper_errors"])[:20],
        "children": report["children"],
    }
    if extra is not None and extra.get("started_at") == report["started_at"]:
        state.update({k: v for k, v in extra.items() if k != "started_at"})
    return state


def panel_state(
    snapshot: Snapshot,
    *,
    route: str = "none",
    interval: float = 1.0,
    stop_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The panel's traits (all but history) from one snapshot. Pure: the same snapshot gives the same JSON."""
    user = sorted((r for r in snapshot["threads"] if r["alive"] and r["user"]), key=_sort_key)
    shown = user[:MAX_THREAD_ROWS]
    return {
        "header": _header(snapshot, user, len(shown), route, interval),
        "threads": [thread_row(r, snapshot["taken_at"]) for r in shown],
        "cells": _cells(snapshot, shown),
        "queues": [_queue_row(q) for q in snapshot["queues"]],
        "blocked": [_blocked_row(b) for b in snapshot["blocked_runs"]],
        "resources": _resources(snapshot["resources"]),
        "failures": _failures(snapshot),
        "last_stop": stop_state(snapshot["last_stop"], stop_extra),
    }


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
                _mib(p.get("rss")),
                _mib(p.get("gpu_used")),
                _mib(p.get("gpu_process_used")),
                _mib(p.get("children_rss")),
            ]
            for p in resource_history
        ),
        now=now,
        close=_memory_close,
    )
    queues = {
        str(q.get("id", q.get("name"))): change_points(q.get("history") or [], now=now)
        for q in snapshot["queues"]
        if q.get("history")
    }
    return {"memory": memory, "queues": queues}


def _resource_history(extension: Any) -> Sequence[Mapping[str, Any]]:
    """The resource probe's history ring, where the extension has a probe."""
    probe = getattr(extension, "probe", None)
    history = getattr(probe, "history", None)
    if not callable(history):
        return []
    try:
        points = history()
    except Exception:
        log.warning("nbcoord: panel could not read the resource history", exc_info=True)
        return []
    return points if isinstance(points, list) else []


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


# ------------------------------------------------------------------------------------------------- widget
def _read_esm() -> str:
    # The text, not the Path: given a Path, anywidget may start a file-watching thread in a checkout.
    try:
        return esm_path().read_text(encoding="utf-8")
    except OSError:
        log.warning("nbcoord: the panel's module is missing at %s", esm_path(), exc_info=True)
        return "export default { render({ el }) { el.textContent = 'nbcoord: panel module missing'; } };"


class NBCoordPanel(anywidget.AnyWidget):
    """The panel widget. Its state is set by the panel's sender thread only; the front end cannot write it."""

    _esm = _read_esm()

    header = traitlets.Dict().tag(sync=True)
    threads: traitlets.List[Any] = traitlets.List().tag(sync=True)
    cells: traitlets.List[Any] = traitlets.List().tag(sync=True)
    queues: traitlets.List[Any] = traitlets.List().tag(sync=True)
    blocked: traitlets.List[Any] = traitlets.List().tag(sync=True)
    resources = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    failures: traitlets.List[Any] = traitlets.List().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)
    last_stop = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    stack = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    clock = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    beat = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    _fast_route = traitlets.Dict().tag(sync=True)

    def __init__(self, text_form: Callable[[], str], on_display: Callable[[], None], **state: Any) -> None:
        self._text_form = text_form
        self._on_display = on_display
        super().__init__(**state)

    def set_state(self, sync_data: Any) -> None:
        """Refuse state from the front end: the panel's state is the kernel's to set."""
        keys = sorted(map(str, sync_data))[:5] if isinstance(sync_data, Mapping) else []
        log.warning("nbcoord: panel rejected a state update from the front end (keys %s)", keys)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            text = self._text_form()
        except Exception:
            log.warning("nbcoord: the panel's text form failed", exc_info=True)
            text = "nbcoord panel (the text report failed; see the kernel log)"
        try:
            self._on_display()
        except Exception:
            log.warning("nbcoord: panel display hook failed", exc_info=True)
        return {**data, "text/plain": text}, metadata


# ------------------------------------------------------------------------------------------------- sender
class _Sender:
    """The one long-lived thread that sends the panel's state; parked (no cost) while nobody watches."""

    def __init__(self, tick: Callable[[], None], wait: Callable[[], float], active: Callable[[], bool]) -> None:
        self._tick = tick
        self._wait = wait
        self._active = active
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=SENDER_THREAD_NAME, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Tick now (after a command), or unpark."""
        self._wake.set()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop and join; the tick in progress, if any, finishes first."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping:
            if not self._active():
                self._wake.wait()  # parked: a view, a command or stop() wakes it
                self._wake.clear()
                continue
            try:
                self._tick()
            except Exception:
                log.warning("nbcoord: panel update failed", exc_info=True)
            self._wake.wait(self._wait())
            self._wake.clear()


# ------------------------------------------------------------------------------------------------ control
class PanelController:
    """Owns one kernel's panel: the widget, its sender thread, its fast route, its views and its commands."""

    def __init__(self, extension: Any) -> None:
        self.extension = extension
        self.closed = False
        self._lock = threading.Lock()  # guards _views, _had_view, _pending, _pending_until, _stop_extra
        self._views: dict[str, float] = {}  # view id -> lease end (monotonic)
        self._clicks = ClickLedger()
        self._stops = StopRunner(self._run_stop, self._stop_done)
        self._pending: dict[str, Any] = {}  # one-off traits (stack, clock) for the next tick
        self._pending_until = time.monotonic() + PENDING_VIEW_S
        self._stop_extra: dict[str, Any] | None = None
        # What was last sent, per trait (its value, JSON size and when); touched by the sender thread only.
        self._sent: dict[str, Any] = {}
        self._sent_size: dict[str, int] = {}
        self._sent_at: dict[str, float] = {}
        self._cost = 0.0  # CPU seconds per tick, averaged
        self._multiplier = 1  # of panel_interval, while ticks are expensive
        self._history_at = 0.0
        self.ticks = 0  # state builds so far (tests and the benchmark read it)
        self.duplicates: collections.deque[str] = collections.deque(maxlen=64)  # click ids dropped as seen
        self._had_view = False
        kernel = getattr(extension.shell, "kernel", None)
        self.route = _fastcomm.install(kernel, self._from_fast_route, types=COMMAND_TYPES)
        try:
            if self.route.reason is not None:
                why = f"{self.route.reason}; Stop acts when the cell ends"
                extension.degraded_routes["the panel's fast route"] = why
            initial = self._state()
            self._resources: dict[str, Any] | None = initial["resources"]
            self._sent = dict(initial)
            self._sent_size = {key: len(_json(value)) for key, value in initial.items()}
            self.widget = NBCoordPanel(self._text_form, self._displayed, **initial)
            self.widget.on_msg(self._from_widget)
            comm_id = getattr(getattr(self.widget, "comm", None), "comm_id", None)
            if isinstance(comm_id, str):
                self.route.add_comm(comm_id)
            self.widget._fast_route = {"kind": self.route.kind, "comm_id": comm_id}
        except BaseException:
            self.route.uninstall()  # a panel that could not be made leaves the kernel's shell stream as it was
            raise
        self._sender = _Sender(self._tick, self._wait, self._watched)
        self._sender.start()
        self._remove_own_stopper = extension.add_own_stopper(self.stop_threads)
        extension.add_undo(self.close)
        # A cell starting or ending changes the header at once (and the front end's expectation of beats).
        self._events = getattr(extension.shell, "events", None)
        if self._events is not None:
            self._events.register("pre_run_cell", self._cell_event)
            self._events.register("post_run_cell", self._cell_event)

    # ----------------------------------------------------------------------------------------- lifecycle
    def stop_sender(self) -> None:
        """Stop the sender thread (tests drive ticks themselves then)."""
        self._sender.stop()

    def stop_threads(self) -> None:
        """Stop the panel's threads: the sender, and the stop runner after its running stop (the shutdown runs
        this before it stops anything else)."""
        self._sender.stop()
        self._stops.close(timeout=0.2)

    def close(self) -> None:
        """Stop the sender, remove the fast route, close the widget (its views disappear). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._events is not None:
            for event in ("pre_run_cell", "post_run_cell"):
                try:
                    self._events.unregister(event, self._cell_event)
                except ValueError:
                    log.debug("nbcoord: panel's %s callback was already gone", event)
        self._sender.stop()
        self._stops.close()
        self._remove_own_stopper()
        self.route.uninstall()
        try:
            self.widget.close()
        except Exception:
            log.warning("nbcoord: closing the panel widget failed", exc_info=True)

    def _cell_event(self, *args: Any) -> None:
        self._sender.wake()

    def _displayed(self) -> None:
        with self._lock:
            self._pending_until = time.monotonic() + PENDING_VIEW_S
        self._sender.wake()

    def _text_form(self) -> str:
        snapshot = self.extension.snapshot()
        return _report.report(snapshot, limit=self.extension.config.max_report_threads)

    # ------------------------------------------------------------------------------------------- views
    def _watched(self) -> bool:
        """Whether any view is there to see an update."""
        if self.closed or getattr(self.widget, "comm", None) is None:
            return False
        now = time.monotonic()
        with self._lock:
            for view, until in list(self._views.items()):
                if until < now:
                    del self._views[view]
            if self._views or self._pending_until > now:
                return True
            had_view = self._had_view
        # Without a fast route a view's renewals wait for the running cell to end: keep sending meanwhile.
        return self.route.kind == "none" and had_view and self.extension.registry.current_cell() is not None

    def watched(self) -> bool:
        """Public for tests and the benchmark: whether the sender is sending (True) or parked."""
        return self._watched()

    # ------------------------------------------------------------------------------------------- state
    def _wait(self) -> float:
        """Seconds to the next tick: the configured interval, or a multiple of it (see :meth:`_adapt`)."""
        return float(self.extension.config.panel_interval) * self._multiplier

    def _adapt(self, cost: float) -> None:
        """Keep the sender under MAX_DUTY of one core: double the interval while a tick costs more, halve it
        once the cost is well below (a third), so that the interval the front end is told rarely changes."""
        # A moving average: one slow tick (a garbage collection) does not double the interval.
        self._cost = 0.8 * self._cost + 0.2 * cost if self._cost else cost
        needed = self._cost / MAX_DUTY
        interval = float(self.extension.config.panel_interval)
        while needed > interval * self._multiplier and self._multiplier < 64:
            self._multiplier *= 2
        while self._multiplier > 1 and needed < interval * self._multiplier / 3:
            self._multiplier //= 2

    def _state(self) -> dict[str, Any]:
        with self._lock:
            extra = self._stop_extra
        return panel_state(
            self.extension.snapshot(),
            route=self.route.kind,
            interval=float(self.extension.config.panel_interval),
            stop_extra=extra,
        )

    def _tick(self) -> None:
        """Build the state, and send the traits that changed, in one message (sender thread)."""
        started = time.thread_time()
        self.ticks += 1
        now = time.monotonic()
        interval = self._wait()
        with self._lock:
            # Before the snapshot: a stop's click data is set after its report, so a snapshot taken after
            # reading it holds that report and the threads as the stop left them.
            extra = self._stop_extra
            pending, self._pending = self._pending, {}
        snapshot = self.extension.snapshot()
        configured = float(self.extension.config.panel_interval)
        state = panel_state(snapshot, route=self.route.kind, interval=configured, stop_extra=extra)
        state["resources"] = self._resources = steady_resources(state["resources"], self._resources)
        if now - self._history_at >= HISTORY_EVERY * interval:
            self._history_at = now
            state["history"] = panel_history(snapshot, _resource_history(self.extension), now=time.time())
        state.update(pending)
        if state["header"]["running_cell"] is not None:
            # While a cell runs the front end expects a beat every interval; its absence means the main
            # thread holds the GIL in native code (and a stop will act when it returns).
            # The beat says how often to expect it: more than panel_interval while ticks are expensive.
            state["beat"] = {"at": round(snapshot["taken_at"], 2), "every": interval}
        self._send(state, now, interval, force=set(pending))
        self._adapt(time.thread_time() - started)

    def _send(self, state: Mapping[str, Any], now: float, interval: float, force: set[str]) -> None:
        changed: dict[str, tuple[Any, int]] = {}
        for key, value in state.items():
            if key not in force and key in self._sent and value == self._sent[key]:
                continue  # compared as Python values: cheaper than encoding 1000 rows every tick
            size = len(_json(value))
            gap = interval * size / BYTES_PER_INTERVAL  # small traits: no wait; 640 KB: 10 intervals
            if key not in force and now - self._sent_at.get(key, -math.inf) < gap:
                continue  # a big trait that changes all the time: sent less often
            changed[key] = (value, size)
        if not changed or getattr(self.widget, "comm", None) is None:
            return
        with self.widget.hold_sync():
            for key, (value, size) in changed.items():
                setattr(self.widget, key, value)
                self._sent[key] = value
                self._sent_size[key] = size
                self._sent_at[key] = now

    # ---------------------------------------------------------------------------------------- commands
    def _from_fast_route(self, comm_id: str, content: dict[str, Any]) -> None:
        self.handle(content, route=self.route.kind)

    def _from_widget(self, widget: Any, content: Any, buffers: Any) -> None:
        self.handle(content, route="ordinary")

    def handle(self, content: object, *, route: str) -> None:
        """Validate and run one command from the front end; never raises."""
        try:
            self._handle(content, route)
        except Exception:
            log.warning("nbcoord: panel command failed", exc_info=True)

    def _handle(self, content: object, route: str) -> None:
        received = time.time()
        registry = self.extension.registry
        try:
            command = parse_command(
                content,
                thread_exists=lambda tid: (r := registry.get(tid)) is not None and r.user and r.is_alive(),
                cell_exists=lambda n: registry.cell(n) is not None,
            )
        except Rejected as why:
            reject(why, content)
            return
        if not self._clicks.first_time(command.click_id):
            self.duplicates.append(command.click_id)  # the other route's copy: already handled
            return
        if command.type == "view":
            self._view(command)
        elif command.type == "stack":
            self._stack(command)
        else:
            self._stops.submit(dataclasses.replace(command, route=route, received_at=received))

    def _view(self, command: Command) -> None:
        assert command.view_id is not None
        with self._lock:
            if command.action == "close":
                self._views.pop(command.view_id, None)
            else:
                self._had_view = True
                self._views[command.view_id] = time.monotonic() + VIEW_LEASE_S
                while len(self._views) > _MAX_VIEWS:
                    self._views.pop(next(iter(self._views)))
            if command.action == "open" and command.client_time is not None:
                self._pending["clock"] = {
                    "view_id": command.view_id,
                    "client_time": command.client_time,
                    "kernel_time": time.time(),
                }
        self._sender.wake()

    def _stack(self, command: Command) -> None:
        record = self.extension.registry.get(command.tid)
        if record is None:
            return
        frame = current_frames().get(record.ident) if record.ident is not None else None
        stack = {
            "tid": record.tid,
            "name": record.name,
            "click_id": command.click_id,
            "stack": format_stack(frame, cell_of=self.extension.cell_of_file) if frame is not None else [],
            "creation": creation_lines(record, self.extension.cell_of_file),
            "at": round(time.time(), 3),
        }
        with self._lock:
            self._pending["stack"] = stack
        self._sender.wake()

    def _run_stop(self, command: Command) -> StopReport:
        """The stop runner's action: the extension's one stop (on the runner's thread)."""
        report: StopReport = self.extension.stop(command.scope, force=command.force, cell=command.cell, tid=command.tid)
        return report

    def _stop_done(self, commands: list[Command], report: StopReport) -> None:
        """Tell the views which clicks a stop answered (the first, and up to 64 that joined it)."""
        first = commands[0]
        extra = {
            "started_at": report["started_at"],
            "click_id": first.click_id,
            "click_ids": [command.click_id for command in commands[-64:]],
            "clicks": len(commands),
            "route": first.route,
            "received_at": round(first.received_at or report["started_at"], 4),
            "clicked_at": first.clicked_at,
        }
        with self._lock:
            self._stop_extra = extra
        log.info(
            "nbcoord: panel stop %s (%s, %d click(s)) by the %s route: %d stopped, %d still alive",
            first.click_id,
            first.scope,
            len(commands),
            first.route,
            len(report["stopped"]),
            len(report["alive"]),
        )
        self._sender.wake()


_controllers: weakref.WeakKeyDictionary[Any, PanelController] = weakref.WeakKeyDictionary()
_controllers_lock = threading.Lock()  # guards _controllers


def controller_for(extension: Any) -> PanelController:
    """The extension's panel controller, created on first use (or again after the panel was closed)."""
    with _controllers_lock:
        controller = _controllers.get(extension)
        if controller is None or controller.closed or getattr(controller.widget, "comm", None) is None:
            if controller is not None:
                controller.close()
            controller = PanelController(extension)
            _controllers[extension] = controller
        return controller


def panel_for(extension: Any) -> NBCoordPanel:
    """The kernel's one panel widget: displaying it again shows another view of the same state."""
    return controller_for(extension).widget
