"""How a kernel with nbcoord answers the Jupyter server: a request/reply on the kernel's control channel.

The server extension (:mod:`nbcoord.server`) lists every kernel and stops threads from outside. It asks each kernel
with an ``nbcoord_request`` on the control channel (schema: :mod:`nbcoord.core.schema`). ipykernel reads that channel
on its "Control" thread, not on the main thread, so a kernel answers while a cell runs, sleeps, waits in C or loops
in Python. Nothing can answer while the main thread holds the GIL inside a C call; the server then shows the kernel
as not answering, and goes on with the others.

- A **summary** request is answered on the control thread at once: :func:`build_summary` of one snapshot (counts,
  a few rows, no stacks; a few milliseconds).
- A **waits** request is answered on the control thread at once: :meth:`nbcoord.core.host.Host.waits` (what each
  blocked thread waits on, and deadlocks, with stacks). A main thread blocked on a lock lets this thread run, so
  a kernel whose cell is deadlocked still answers it.
- A **stop** request is checked on the control thread (an error reply at once if it is not valid), then run by one
  stop thread of this module's, ``nbcoord-control-stop`` (started by the first stop request), through the
  extension's one bounded stop; its report is sent back from the control thread's event loop when the stop ends.
  The control channel is never held by a stop: the kernel's own requests there (shutdown, interrupt, debug) go on
  while it runs. At most :data:`MAX_WAITING_STOPS` stops wait; more are refused with an error reply.

Everything in a request is validated (:func:`nbcoord.core.schema.parse_request`); nothing in it is evaluated. A
request that is not valid gets an error reply and a log line, rate-limited. In a forked child of the kernel (see
:mod:`nbcoord.core.fork`) the handler does nothing: the child has no control thread, and a copy of nbcoord there must
not act.

ipykernel internals used, each feature-detected when :func:`install` runs; where one is missing, the route is not
installed, the reason is logged once, and the server shows the kernel as one without nbcoord (pid, memory, GPU
from outside):

=====================================  ==========================================  ===================================
Name                                   Used for                                    When missing
=====================================  ==========================================  ===================================
``shell.kernel``                       the running kernel                          no route (not a kernel: a terminal)
``kernel.control_handlers`` (dict)     registering ``nbcoord_request``             no route
                                       (ipykernel 6 and 7 dispatch control
                                       messages through it by ``msg_type``)
``kernel.control_thread.io_loop``      sending a stop's reply from the control     no route (control handled on the
(tornado IOLoop, ``add_callback``)     thread's loop (a zmq stream is not          main thread: in-process kernels)
                                       thread-safe)
``kernel.session.send``                the reply (jupyter_client's public API)     no route
handler signature                      ``handler(stream, idents, msg)``, as        the handler is never called; no
                                       ipykernel 6 and 7 call control handlers     harm
=====================================  ==========================================  ===================================
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from nbcoord.core import fork as _fork
from nbcoord.core.host import Host
from nbcoord.core.log import RateLimited, short
from nbcoord.core.schema import (
    MAX_BLOCKED,
    MAX_CELLS,
    MAX_NAMES,
    MAX_QUEUES,
    MAX_TEXT,
    REPLY,
    REQUEST,
    THREAD_STATES,
    BlockedRun,
    CellThreads,
    GpuUse,
    KernelSummary,
    LastStop,
    QueueFill,
    SchemaError,
    StopRequest,
    error_reply,
    ok_reply,
    parse_request,
)
from nbcoord.core.snapshot import Snapshot
from nbcoord.core.stop import ScopeKind
from nbcoord.core.text import bounded
from nbcoord.core.threads import INTERNAL_PREFIX
from nbcoord.core.version import __version__

__all__ = ["STOP_THREAD_NAME", "ControlRoute", "build_summary", "install"]

log = logging.getLogger("nbcoord")

STOP_THREAD_NAME: Final = f"{INTERNAL_PREFIX}control-stop"
#: Stops from the server that may wait while one runs; one more is refused (the server says so).
MAX_WAITING_STOPS: Final = 4
_JOIN_TIMEOUT_S: Final = 2.0
#: The stop thread ends after this long without a stop (an idle kernel keeps no thread of nbcoord's but the monitor).
STOP_THREAD_IDLE_S: Final = 30.0

#: Requests that are not valid: the server is authenticated, but a bug or a version skew must not flood the log.
_log_rejected = RateLimited(logging.WARNING, burst=3, window=60.0)

_Job = tuple[StopRequest, Any, Any, Any]  # request, stream, idents, parent message


def _unavailable(kernel: Any) -> str | None:
    """Why the route cannot be installed on ``kernel``, or None."""
    if kernel is None:
        return "the shell has no kernel (not an IPython kernel)"
    if not isinstance(getattr(kernel, "control_handlers", None), dict):
        return "the kernel has no control handlers"
    loop = getattr(getattr(kernel, "control_thread", None), "io_loop", None)
    if not callable(getattr(loop, "add_callback", None)):
        return "the control channel is not served by a thread of its own"
    if not callable(getattr(getattr(kernel, "session", None), "send", None)):
        return "the kernel has no session to reply with"
    return None


def install(host: Host) -> Callable[[], None]:
    """Register the ``nbcoord_request`` control handler for ``host``.

    Returns the undo: it removes the handler (only if it is still ours) and ends the stop thread. Where the kernel
    offers no route (see the module docstring), nothing is installed and the undo does nothing.
    """
    kernel = getattr(host.shell, "kernel", None)
    why = _unavailable(kernel)
    if why is not None:
        log.info("nbcoord: the Jupyter server cannot ask this kernel over its control channel: %s", why)
        host.degraded_routes["server requests (control channel)"] = why
        return lambda: None
    route = ControlRoute(host, kernel)
    route.install()
    return route.uninstall


class ControlRoute:
    """The installed handler, its stop thread and its undo; see the module docstring."""

    def __init__(self, host: Host, kernel: Any) -> None:
        self._host = host
        self._handlers: dict[str, Any] = kernel.control_handlers
        self._loop: Any = kernel.control_thread.io_loop
        self._session: Any = kernel.session
        self._stops: queue.Queue[_Job | None] = queue.Queue(MAX_WAITING_STOPS)
        self._thread: threading.Thread | None = None  # started by a stop request, ends when idle
        self._thread_lock = threading.Lock()  # guards _thread against the thread ending as a stop is queued
        #: Read on the control thread without a lock: a plain attribute store is atomic.
        self.active = False
        self._previous: Any = None
        self._had_previous = False
        self._undo_fork: Callable[[], None] = lambda: None
        #: The bound method registered, kept so that uninstall can tell it is still the one there.
        self._handler: Callable[[Any, Any, Any], None] = self.handle

    def install(self) -> None:
        """Register the handler (the stop thread starts with the first stop request: most kernels never get one)."""
        self._had_previous = REQUEST in self._handlers
        self._previous = self._handlers.get(REQUEST)
        self._undo_fork = _fork.on_fork_child(self._forget_in_child)
        self.active = True
        # One dict store, atomic under the GIL: the control thread's next lookup finds it.
        self._handlers[REQUEST] = self._handler

    def uninstall(self) -> None:
        """Remove the handler (if it is still ours), end the stop thread. Idempotent."""
        self.active = False
        self._undo_fork()
        if self._handlers.get(REQUEST) is self._handler:
            if self._had_previous:
                self._handlers[REQUEST] = self._previous
            else:
                del self._handlers[REQUEST]
        elif REQUEST in self._handlers:
            log.info("nbcoord: the control handler was replaced by someone else; left in place")
        thread = self._thread
        if thread is not None and thread.is_alive():
            try:
                self._stops.put(None, timeout=_JOIN_TIMEOUT_S)
            except queue.Full:
                log.warning("nbcoord: the control stop thread is behind; not waiting for it")
                return
            if thread is not threading.current_thread():
                thread.join(_JOIN_TIMEOUT_S)

    def _forget_in_child(self) -> None:
        """In a forked child: take no lock, do nothing from now on."""
        self.active = False

    # -------------------------------------------------------------------------- on the control thread
    def handle(self, stream: Any, idents: Any, msg: Any) -> None:
        """ipykernel's control handler for ``nbcoord_request``; never raises into the kernel."""
        if not self.active or not _fork.in_owner():
            return
        try:
            self._handle(stream, idents, msg)
        except Exception:
            log.warning("nbcoord: a control request failed", exc_info=True)

    def _handle(self, stream: Any, idents: Any, msg: Any) -> None:
        content = msg.get("content") if isinstance(msg, Mapping) else None
        try:
            request = parse_request(content)
            stop = request["stop"]
            if stop is not None and stop["scope"] == "cell" and (
                stop["cell"] is None or self._host.registry.cell(stop["cell"]) is None
            ):
                raise SchemaError(f"no cell [{stop['cell']}] has run in this kernel since nbcoord was loaded")
        except SchemaError as error:
            _log_rejected("nbcoord: refused a control request (%s): %s", error, short(content))
            self._send(stream, idents, msg, error_reply("invalid", str(error)))
            return
        except (ArithmeticError, TypeError, ValueError, RecursionError) as error:
            # A value the schema's checks choked on (a grace of 10**400 overflows a float): still refused, and
            # answered: a request without a reply leaves the server waiting out its timeout.
            _log_rejected("nbcoord: refused a malformed control request (%s): %s", type(error).__name__, short(content))
            self._send(stream, idents, msg, error_reply("invalid", f"malformed request ({type(error).__name__})"))
            return
        if request["action"] == "waits":
            self._send(stream, idents, msg, self._waits_reply())
            return
        if stop is None:
            self._send(stream, idents, msg, self._summary_reply())
            return
        with self._thread_lock:  # queued, then a thread started if none runs: an idle one ending sees the stop
            try:
                self._stops.put_nowait((stop, stream, idents, msg))
            except queue.Full:
                self._send(stream, idents, msg, error_reply(
                    "unavailable", f"{MAX_WAITING_STOPS} stops are already waiting in this kernel; try again shortly"))
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run_stops, name=STOP_THREAD_NAME, daemon=True)
                self._thread.start()

    def _summary_reply(self) -> dict[str, Any]:
        try:
            summary = build_summary(self._host.snapshot(), __version__)
        except Exception as error:
            log.warning("nbcoord: the summary for the server failed", exc_info=True)
            return error_reply("failed", f"the snapshot failed: {type(error).__name__}: {error}")
        return ok_reply("summary", "summary", summary)

    def _waits_reply(self) -> dict[str, Any]:
        try:
            waits = self._host.waits()
        except Exception as error:
            log.warning("nbcoord: the waits report for the server failed", exc_info=True)
            return error_reply("failed", f"the waits report failed: {type(error).__name__}: {error}")
        return ok_reply("waits", "waits", waits)

    def _send(self, stream: Any, idents: Any, parent: Any, content: dict[str, Any]) -> None:
        """Send a reply; on the control thread only (the stream is not thread-safe)."""
        try:
            self._session.send(stream, REPLY, content, parent, idents)
        except Exception:
            log.warning("nbcoord: could not send a control reply", exc_info=True)

    # ------------------------------------------------------------------------------ on the stop thread
    def _run_stops(self) -> None:
        while True:
            try:
                job = self._stops.get(timeout=STOP_THREAD_IDLE_S)
            except queue.Empty:
                with self._thread_lock:
                    if self._stops.empty():
                        self._thread = None
                        return
                continue
            if job is None or not self.active:
                return
            stop, stream, idents, parent = job
            try:
                kind = cast(ScopeKind, stop["scope"])
                report = self._host.stop(kind, grace=stop["grace"], force=stop["force"], cell=stop["cell"])
                content = ok_reply("stop", "report", report)
            except (ValueError, TypeError) as error:  # the one stop's own checks (a cell it no longer knows)
                content = error_reply("invalid", str(error))
            except Exception as error:  # the stop itself never raises; this is a bug of ours, said in the reply
                log.warning("nbcoord: a stop requested by the server failed", exc_info=True)
                content = error_reply("failed", f"the stop failed: {type(error).__name__}: {error}")
            # Back to the control thread's loop, the one place where its stream may be written.
            self._loop.add_callback(self._send, stream, idents, parent, content)


# ------------------------------------------------------------------------------------------------ summary
def _wire(value: object) -> str:
    """A name or a sentence as the schema bounds it (MAX_TEXT characters)."""
    return bounded(value, MAX_TEXT)


def _count(value: object) -> int | None:
    return len(value) if isinstance(value, list) else None


def _cells(threads: list[Any]) -> list[CellThreads]:
    counts: dict[int, list[int]] = {}
    for row in threads:
        if row["cell"] is not None:
            entry = counts.setdefault(row["cell"], [0, 0])
            entry[0] += 1
            entry[1] += row["zombie"] is not None
    ranked = sorted(counts.items(), key=lambda item: (-item[1][1], -item[1][0], -item[0]))
    return [CellThreads(cell=cell, threads=n, zombies=z) for cell, (n, z) in ranked[:MAX_CELLS]]


def _queues(rows: list[dict[str, Any]]) -> list[QueueFill]:
    """One row per queue name (a queue polled in two sessions is one queue to a reader), fullest first."""
    by_name: dict[str, QueueFill] = {}
    for row in rows:
        name = _wire(row.get("name") or row.get("id") or "?")
        size = row.get("size")
        capacity = row.get("capacity")
        capacity = capacity if isinstance(capacity, int) and capacity > 0 else -1
        size = size if isinstance(size, int) else None
        fill = size / capacity if size is not None and capacity > 0 else None
        known = by_name.get(name)
        if known is None or (fill or 0.0) > (known["fill"] or 0.0):
            by_name[name] = QueueFill(name=name, size=size, capacity=capacity, fill=fill)
    ranked = sorted(by_name.values(), key=lambda q: (-(q["fill"] or 0.0), q["name"]))
    return ranked[:MAX_QUEUES]


def _blocked(rows: list[dict[str, Any]]) -> list[BlockedRun]:
    runs = [
        BlockedRun(
            thread=_wire(row.get("thread", "?")),
            seconds=float(row["seconds"]) if isinstance(row.get("seconds"), (int, float)) else 0.0,
            text=_wire(row["text"]) if isinstance(row.get("text"), str) else None,
        )
        for row in rows
    ]
    runs.sort(key=lambda run: -run["seconds"])
    return runs[:MAX_BLOCKED]


def _last_stop(report: Mapping[str, Any] | None) -> LastStop | None:
    if not report:
        return None
    alive = report.get("alive") or []
    return LastStop(
        scope=str(report.get("scope", "?")),
        cell=report.get("cell"),
        started_at=float(report.get("started_at") or 0.0),
        took_s=float(report.get("took_s") or 0.0),
        stopped=len(report.get("stopped") or []),
        alive=len(alive),
        alive_names=[_wire(row.get("name", "?")) for row in alive[:MAX_NAMES]],
        errors=len(report.get("stopper_errors") or []),
    )


def build_summary(snapshot: Snapshot, version: str) -> KernelSummary:
    """A kernel's summary for the server: counts from one snapshot, a few rows, nothing per thread."""
    live = [row for row in snapshot["threads"] if row["alive"]]
    user = [row for row in live if row["user"]]
    states = Counter(row["state"] for row in user)
    reasons = Counter(row["zombie"] for row in user if row["zombie"] is not None)
    running = next((c for c in reversed(snapshot["cells"]) if c["ended_at"] is None), None)
    resources = snapshot["resources"] or {}
    devices = (resources.get("gpu") or {}).get("devices") or []
    blocked = _blocked(snapshot["blocked_runs"])
    extra = cast(dict[str, Any], snapshot)
    return KernelSummary(
        pid=snapshot["pid"],
        taken_at=snapshot["taken_at"],
        nbcoord_version=version,
        threads=len(user),
        threads_by_state={state: states.get(state, 0) for state in THREAD_STATES},
        kernel_threads=len(live) - len(user),
        zombies=sum(reasons.values()),
        zombie_reasons=dict(reasons),
        cells=_cells(user),
        running_cell=running["execution_count"] if running is not None else None,
        running_since=running["started_at"] if running is not None else None,
        tasks=_count(extra.get("tasks")),
        worker_processes=_count(resources.get("children")),
        blocked_runs=len(snapshot["blocked_runs"]),
        blocked_seconds=blocked[0]["seconds"] if blocked else 0.0,
        blocked=blocked,
        queues=_queues(snapshot["queues"]),
        queues_total=len({str(row.get("name") or row.get("id")) for row in snapshot["queues"]}),
        failures=len(snapshot["failures"]),
        rss=(resources.get("host") or {}).get("rss"),
        gpu=[GpuUse(index=int(d["index"]), process_used=d.get("process_used")) for d in devices],
        last_stop=_last_stop(snapshot["last_stop"]),
    )
