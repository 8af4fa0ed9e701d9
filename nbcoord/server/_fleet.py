"""Every kernel of the server, one view: what the server sees from outside, and what nbcoord says from inside.

For each view (:meth:`Fleet.view`), all at once:

- from outside, on a worker thread: each kernel process's RSS, its descendants, and GPU memory by pid (NVML), for
  every kernel the server can see, with nbcoord or without;
- from inside, in parallel: an ``nbcoord_request`` summary on each kernel's control channel, each with the same
  deadline (``reply_timeout``), so that a kernel that does not answer (busy in native code, dead) is shown as such
  and never delays the others by more than that deadline.

Whether a kernel has nbcoord is learnt once per kernel process: a first request is followed by a
``kernel_info_request`` on the same channel. The kernel answers control requests in order, so a kernel_info reply
with no nbcoord reply before it means nbcoord is not loaded there (ipykernel logs the unknown request type once). Such
a kernel is asked again only after it has been used (its ``last_activity`` moved) and ``absent_recheck`` seconds
have passed: someone may have run ``%load_ext nbcoord`` since.

Concurrent views share one collection (the page and Prometheus asking at once cost one round).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from nbcoord.core.schema import (
    REQUEST,
    KernelSummary,
    StopRequest,
    stop_request,
    summary_request,
    waits_request,
)
from nbcoord.server._gpu import GpuStatus, Nvml
from nbcoord.server._link import KernelLink, LinkClosed, Reply
from nbcoord.server._model import VIEW_SCHEMA, FleetView, KernelRow, Status, attention, sort_key
from nbcoord.server._outside import Outside, gpu_held, is_alive, kernel_pid, no_outside, read_outside
from nbcoord.server._summary import OffSchema, bounded_report, check_summary, checked_waits
from nbcoord.server._text import ECHO_CHARS, TEXT_CHARS, shown

log = logging.getLogger("nbcoord.server")

#: The server's execution states of a kernel whose process is not (yet) there, and that is not dead.
_STARTING = frozenset({"starting", "restarting", "autorestarting"})
#: A view collected less than this many seconds ago answers a request (5 open JupyterLab pages polling every 3 s
#: cost the server 1.55 % of a core with a collection each, bench/bench_labextension.py).
VIEW_REUSE_S = 1.0
#: How long a view waits for the outside reads (the process table, NVML) before it goes on without them.
OUTSIDE_TIMEOUT_S = 2.0
#: How often a stop request checks that its kernel is still alive while it waits.
_ALIVE_POLL_S = 0.25
#: How long past the grace period the server waits for a stop's report, and the grace assumed when none is given
#: (the kernel then uses its own ``NBCoord.grace_period``).
STOP_MARGIN_S = 5.0
DEFAULT_GRACE_BUDGET_S = 10.0

Presence = Literal["unknown", "present", "absent"]


class FleetError(Exception):
    """A request about one kernel that cannot be served: an HTTP status and one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Kernel:
    """What the fleet remembers about one kernel between views."""

    link: KernelLink | None = None
    pid: int | None = None
    presence: Presence = "unknown"
    probed_activity: str | None = None
    probed_at: float = 0.0
    off_schema_logged: bool = False  # an off-schema summary is logged once per kernel process


@dataclass
class _Answer:
    status: Status
    summary: KernelSummary | None = None
    error: str | None = None
    answer_ms: float | None = None


def _answer(reply: Reply, elapsed_ms: float) -> _Answer:
    """The answer in a summary reply; an error (one sentence) when the reply says so or is not the schema's."""
    error = _reply_error(reply)
    if error is not None:
        return _Answer("error", error=f"nbcoord answered: {error[1]}", answer_ms=elapsed_ms)
    try:
        summary: KernelSummary = check_summary(_content(reply).get("summary"))
    except OffSchema as off:
        return _Answer("error", error=f"{OFF_SCHEMA}: {off}", answer_ms=elapsed_ms)
    return _Answer("ok", summary=summary, answer_ms=elapsed_ms)


#: The start of the sentence that says a kernel's answer is not the schema's.
OFF_SCHEMA = "nbcoord in this kernel answered off-schema (another nbcoord version, or a patched one)"


def _content(reply: Reply) -> dict[str, Any]:
    content = reply.get("content") if isinstance(reply, dict) else None
    return content if isinstance(content, dict) else {}


def _reply_error(reply: Reply) -> tuple[str, str] | None:
    """(code, message) of an nbcoord error reply, or None when it is ok; the message cut and escaped (it is shown
    to people as it is)."""
    content = _content(reply)
    if content.get("status") == "ok":
        return None
    code = shown(content.get("code", "failed"), ECHO_CHARS)
    return code, shown(content.get("error", "nbcoord answered with an error"), TEXT_CHARS)


class Fleet:
    """The server's view of its kernels, and stops sent to them; see the module docstring.

    Parameters
    ----------
    kernel_manager
        The server's ``MappingKernelManager``.
    session_manager
        The server's ``SessionManager`` (notebook paths).
    reply_timeout
        Seconds each kernel has to answer a summary request.
    absent_recheck
        Seconds before a kernel without nbcoord that has been used since is asked again.
    nvml
        The GPU reader.
    """

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        *,
        reply_timeout: float = 0.15,
        absent_recheck: float = 30.0,
        nvml: Nvml | None = None,
    ) -> None:
        self._kernels = kernel_manager
        self._sessions = session_manager
        self.reply_timeout = reply_timeout
        self.absent_recheck = absent_recheck
        self._nvml = nvml if nvml is not None else Nvml()
        self._known: dict[str, _Kernel] = {}
        # One worker thread: the outside reads (the process table, NVML) never run on the server's event loop.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nbcoord-outside")
        self._collecting: asyncio.Future[FleetView] | None = None
        self._collected_at = float("-inf")
        self._outside_job: asyncio.Future[Outside] | None = None

    # ------------------------------------------------------------------------------------------ the view
    async def view(self, *, recent: bool = False) -> FleetView:
        """One view of every kernel: concurrent callers share one collection; with ``recent``, a collection that
        ended less than :data:`VIEW_REUSE_S` ago is the answer (the JupyterLab extension's periodic polls: open pages
        poll unsynchronised, each every 3 s; a stop makes the next view fresh)."""
        running = self._collecting
        if running is not None and not running.done():
            return await asyncio.shield(running)
        young = time.monotonic() - self._collected_at < VIEW_REUSE_S
        if recent and young and running is not None and not running.cancelled() and running.exception() is None:
            return running.result()
        self._collecting = asyncio.ensure_future(self._collect())
        view = await asyncio.shield(self._collecting)
        self._collected_at = time.monotonic()
        return view

    def fresh_next(self) -> None:
        """The next view is collected afresh (after a stop)."""
        self._collected_at = float("-inf")

    async def _collect(self) -> FleetView:
        started = time.monotonic()
        ids = [str(kid) for kid in self._kernels.list_kernel_ids()]
        await self._forget_gone(ids)
        paths = await self._paths()
        managers = {kid: km for kid in ids if (km := self._manager(kid)) is not None}
        pids = {kid: kernel_pid(km) for kid, km in managers.items()}
        outside_job = self._read_outside([pid for pid in pids.values() if pid is not None])
        answers = await asyncio.gather(*(self._ask(kid, km, pids[kid]) for kid, km in managers.items()))
        outside = await self._outside_result(outside_job)
        rows = [
            self._safe_row(kid, managers[kid], pids[kid], path=paths.get(kid), answer=answer, outside=outside)
            for kid, answer in zip(managers, answers, strict=True)
        ]
        rows.sort(key=sort_key)
        gpu = outside.gpu.status if outside.gpu is not None else GpuStatus(available=False, reason="not read",
                                                                           devices=[])
        return FleetView(
            schema=VIEW_SCHEMA,
            taken_at=time.time(),
            took_ms=round((time.monotonic() - started) * 1000, 1),
            gpu=gpu,
            kernels=rows,
        )

    def _read_outside(self, pids: list[int]) -> asyncio.Future[Outside] | None:
        """Start the outside reads on the worker thread; None while an earlier read has not come back (a stuck
        driver call must not pile up reads behind it)."""
        if self._outside_job is not None and not self._outside_job.done():
            return None
        loop = asyncio.get_running_loop()
        self._outside_job = loop.run_in_executor(self._executor, read_outside, pids, self._nvml)
        return self._outside_job

    async def _outside_result(self, job: asyncio.Future[Outside] | None) -> Outside:
        if job is None:
            return Outside(gpu=no_outside("an earlier read of processes and GPUs has not come back"))
        try:
            return await asyncio.wait_for(asyncio.shield(job), OUTSIDE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("nbcoord: reading processes and GPUs took over %.0f s; going on without", OUTSIDE_TIMEOUT_S)
            return Outside(gpu=no_outside("reading processes and GPUs is slow"))
        except Exception:
            log.warning("nbcoord: reading processes from outside failed", exc_info=True)
            return Outside(gpu=no_outside("reading processes and GPUs failed"))

    def _manager(self, kernel_id: str) -> Any:
        try:
            return self._kernels.get_kernel(kernel_id)
        except KeyError:
            return None  # shut down between the listing and now

    async def _paths(self) -> dict[str, str]:
        """Kernel id -> the path of its session (notebook, console, file)."""
        try:
            sessions = await self._sessions.list_sessions()
        except Exception:
            log.warning("nbcoord: listing sessions failed", exc_info=True)
            return {}
        return {
            str(s["kernel"]["id"]): str(s.get("path") or "")
            for s in sessions
            if isinstance(s, dict) and isinstance(s.get("kernel"), dict)
        }

    def _model(self, kernel_id: str) -> dict[str, Any]:
        try:
            model: dict[str, Any] = self._kernels.kernel_model(kernel_id)
        except Exception:
            return {}
        return model

    def _safe_row(
        self, kernel_id: str, km: Any, pid: int | None, *, path: str | None, answer: _Answer, outside: Outside
    ) -> KernelRow:
        """One kernel's row; a row that cannot be made is shown as an error without what the kernel said, so that
        one kernel never takes the view of the others down."""
        if answer.status == "error" and answer.error is not None and answer.error.startswith(OFF_SCHEMA):
            self._log_off_schema(kernel_id, answer.error)
        try:
            return self._row(kernel_id, km, pid, path=path, answer=answer, outside=outside)
        except Exception as error:
            log.warning("nbcoord: the row of kernel %s could not be made", shown(kernel_id), exc_info=True)
            failed = _Answer("error", error=shown(f"the server could not show this kernel: {type(error).__name__}: "
                                                  f"{error}", TEXT_CHARS))  # fmt: skip
            return self._row(kernel_id, km, pid, path=path, answer=failed, outside=Outside())

    def _log_off_schema(self, kernel_id: str, sentence: str) -> None:
        state = self._known.get(kernel_id)
        if state is None or state.off_schema_logged:
            return
        state.off_schema_logged = True
        log.warning("nbcoord: kernel %s: %s; it is shown as an error until it answers the schema (logged once)",
                    shown(kernel_id), sentence)  # fmt: skip

    def _row(
        self, kernel_id: str, km: Any, pid: int | None, *, path: str | None, answer: _Answer, outside: Outside
    ) -> KernelRow:
        model = self._model(kernel_id)
        descendants = outside.descendants.get(pid) if pid is not None else None
        row = KernelRow(
            id=kernel_id,
            name=str(getattr(km, "kernel_name", "") or model.get("name", "")),
            path=path,
            execution_state=model.get("execution_state"),
            last_activity=model.get("last_activity"),
            connections=int(model.get("connections") or 0),
            pid=pid,
            rss=outside.rss.get(pid) if pid is not None and answer.status != "dead" else None,
            gpu=gpu_held(pid, outside) if answer.status != "dead" else [],
            worker_processes=len(descendants) if descendants is not None else None,
            status=answer.status,
            error=answer.error,
            answer_ms=answer.answer_ms,
            nbcoord=answer.summary,
            attention=[],
        )
        row["attention"] = attention(row)
        return row

    # --------------------------------------------------------------------------------------- one kernel
    def _state(self, kernel_id: str, pid: int | None) -> _Kernel:
        state = self._known.setdefault(kernel_id, _Kernel())
        if state.pid != pid:  # a new process (a restart): learn again whether nbcoord is there
            state.pid, state.presence, state.probed_at = pid, "unknown", 0.0
            state.off_schema_logged = False
        return state

    def _link(self, state: _Kernel, km: Any) -> KernelLink:
        if state.link is None or state.link.closed:
            state.link = KernelLink(km)
        return state.link

    async def _ask(self, kernel_id: str, km: Any, pid: int | None) -> _Answer:
        """A summary from one kernel, or why there is none; never raises, never waits past ``reply_timeout``."""
        try:
            return await self._ask_summary(kernel_id, km, pid)
        except Exception as error:
            log.warning("nbcoord: asking kernel %s failed", shown(kernel_id), exc_info=True)
            return _Answer("error", error=shown(f"the server could not ask this kernel: {type(error).__name__}: "
                                                f"{error}", TEXT_CHARS))  # fmt: skip

    async def _ask_summary(self, kernel_id: str, km: Any, pid: int | None) -> _Answer:
        if not await is_alive(km):
            return self._not_running(kernel_id)
        state = self._state(kernel_id, pid)
        if state.presence == "absent" and not self._recheck_due(kernel_id, state):
            return _Answer("no-nbcoord", error="nbcoord is not loaded in this kernel")
        link = self._link(state, km)
        started = time.monotonic()
        reply, probed = await self._exchange(link, state, summary_request(), self.reply_timeout)
        elapsed_ms = round((time.monotonic() - started) * 1000, 2)
        if reply is not None:
            return _answer(reply, elapsed_ms)
        if probed:
            self._mark_absent(kernel_id, state)
            return _Answer("no-nbcoord", error="nbcoord is not loaded in this kernel")
        if not await is_alive(km):
            return _Answer("dead", error="the kernel died during the request")
        return _Answer(
            "not-answering",
            error=f"no answer within {self.reply_timeout * 1000:.0f} ms: the kernel may be starting, or busy in "
            "native code that holds the GIL",
        )

    def _not_running(self, kernel_id: str) -> _Answer:
        if self._model(kernel_id).get("execution_state") in _STARTING:
            return _Answer("not-answering", error="the kernel is starting")
        return _Answer("dead", error="the kernel process is not running")

    def _mark_absent(self, kernel_id: str, state: _Kernel) -> None:
        state.presence = "absent"
        state.probed_at = time.monotonic()
        state.probed_activity = self._model(kernel_id).get("last_activity")

    def _recheck_due(self, kernel_id: str, state: _Kernel) -> bool:
        activity = self._model(kernel_id).get("last_activity")
        return activity != state.probed_activity and time.monotonic() - state.probed_at >= self.absent_recheck

    async def _exchange(
        self, link: KernelLink, state: _Kernel, content: dict[str, Any], timeout: float
    ) -> tuple[Reply | None, bool]:
        """Send one request (and, while nbcoord's presence is not known, the kernel_info probe behind it).

        Returns (the reply or None, whether the probe showed that nbcoord is absent). Updates ``state``.
        """
        msg_id, future = link.request(REQUEST, content)
        probe_id, probe = link.request("kernel_info_request", {}) if state.presence != "present" else ("", None)
        try:
            pending = {future} if probe is None else {future, probe}
            deadline = time.monotonic() + timeout
            while not future.done():
                left = deadline - time.monotonic()
                if left <= 0 or (probe is not None and probe.done()):
                    break
                await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            link.forget(msg_id, probe_id)
        if future.done() and not future.cancelled() and future.exception() is None:
            state.presence = "present"
            return future.result(), False
        absent = probe is not None and probe.done() and not probe.cancelled() and probe.exception() is None
        if not absent:
            # No answer at all: busy, or nbcoord was unloaded. The next request probes again to tell which.
            state.presence = "unknown"
        return None, absent

    # -------------------------------------------------------------------------------------------- waits
    async def ask_waits(self, kernel_id: str, timeout: float) -> dict[str, Any] | None:
        """What the kernel says its threads wait on (``action: waits``), checked and cut; None where it does not
        answer within ``timeout`` (a C call holds its GIL) or has no nbcoord."""
        km = self._manager(kernel_id)
        if km is None or not await is_alive(km):
            return None
        state = self._state(kernel_id, kernel_pid(km))
        if state.presence == "absent":
            return None
        try:
            reply, _absent = await self._exchange(self._link(state, km), state, waits_request(), timeout)
        except (LinkClosed, Exception):
            log.debug("nbcoord: asking kernel %s for waits failed", shown(kernel_id), exc_info=True)
            return None
        if reply is None or _reply_error(reply) is not None:
            return None
        return checked_waits(_content(reply).get("waits"))

    # --------------------------------------------------------------------------------------------- stop
    async def stop(self, kernel_id: str, request: StopRequest) -> dict[str, Any]:
        """Run one kernel's bounded stop through its control channel and return its report.

        Raises
        ------
        FleetError
            404 no such kernel; 409 not running, or no nbcoord; 400 the kernel refused the request (an unknown
            cell); 502 the kernel died while the request waited; 503 too many stops wait there; 504 no answer in
            time (the request stays queued in the kernel, and acts when the kernel can).
        """
        shown_id = shown(kernel_id, ECHO_CHARS)
        if kernel_id not in self._kernels:
            raise FleetError(404, f"no kernel {shown_id} on this server")
        km = self._manager(kernel_id)
        if km is None:
            raise FleetError(404, f"no kernel {shown_id} on this server")
        if not await is_alive(km):
            raise FleetError(409, f"kernel {shown_id} is not running")
        # Asked even when the last view found no nbcoord there: it may have been loaded since (a user's click).
        state = self._state(kernel_id, kernel_pid(km))
        budget = (request["grace"] if request["grace"] is not None else DEFAULT_GRACE_BUDGET_S) + STOP_MARGIN_S
        try:
            reply = await self._stop_exchange(kernel_id, km, state, request, budget)
        finally:
            self.fresh_next()
        error = _reply_error(reply)
        if error is not None:
            code, message = error
            # Any other code is the kernel's failure, not the server's: a bad gateway, never a 500.
            status = {"invalid": 400, "unavailable": 503}.get(code, 502)
            raise FleetError(status, f"kernel {shown_id}: {message}")
        report = _content(reply).get("report")
        if not isinstance(report, dict):
            raise FleetError(502, f"kernel {shown_id} answered the stop off-schema (no report)")
        return {"kernel_id": kernel_id, "report": bounded_report(report)}

    async def _stop_exchange(
        self, kernel_id: str, km: Any, state: _Kernel, request: StopRequest, budget: float
    ) -> Reply:
        link = self._link(state, km)
        shown_id = shown(kernel_id, ECHO_CHARS)
        if state.presence != "present":
            # A stop's reply comes when the stop ends, so the probe cannot follow it: ask a summary first.
            _reply, absent = await self._exchange(link, state, summary_request(), max(self.reply_timeout, 1.0))
            if absent:
                self._mark_absent(kernel_id, state)
                raise FleetError(409, f"nbcoord is not loaded in kernel {shown_id}: run %load_ext nbcoord there")
        msg_id, future = link.request(REQUEST, stop_request(request))
        deadline = time.monotonic() + budget
        try:
            while True:
                await asyncio.wait({future}, timeout=_ALIVE_POLL_S)
                if future.done():
                    break
                if not await is_alive(km):
                    raise FleetError(502, f"kernel {shown_id} died during the request")
                if time.monotonic() >= deadline:
                    raise FleetError(
                        504,
                        f"kernel {shown_id} did not answer within {budget:.0f} s: its main thread may hold the GIL "
                        "in native code; the stop stays queued there and acts when the kernel can",
                    )
        finally:
            link.forget(msg_id)
        try:
            reply = future.result()
        except (LinkClosed, asyncio.CancelledError) as error:
            raise FleetError(502, f"kernel {shown_id} went away during the request") from error
        state.presence = "present"
        return reply

    # ------------------------------------------------------------------------------------------ cleanup
    async def _forget_gone(self, ids: list[str]) -> None:
        for kernel_id in [k for k in self._known if k not in set(ids)]:
            state = self._known.pop(kernel_id)
            if state.link is not None:
                await state.link.close()

    async def close(self) -> None:
        """Close every link, the worker thread and NVML."""
        await self._forget_gone([])
        self._executor.shutdown(wait=False)
        self._nvml.close()
