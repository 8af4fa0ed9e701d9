"""Stuck input pipelines, found and restarted (S8: "record each thread's last active time, detect a stuck thread,
and restart the pipeline through its coordinator").

- Progress: a runner thread makes progress each time one of its enqueue runs completes. The monitor samples the
  per-thread count of completed runs (kept by the run hook anyway), so the hot path pays nothing; a run in
  flight since T says the previous one completed just before T.
- Stuck: a runner's enqueue thread that completed no enqueue for ``stuck_after`` seconds while its queue had
  room (a runner waiting on a full queue is not stuck: its consumer is slow). The row names the op it waits on:
  a dequeue from an upstream queue (with that queue's fill level and producers), or its own enqueue op when
  nothing upstream explains the wait (an input op is slow or hung).
- Restart: a session's queue runners are stopped through the one stop, the queues that stop closed are reset
  (a closed queue cannot be reopened; a reset destroys it and the next step creates it again, empty), and each
  runner starts again with ``create_threads`` and one fresh Coordinator. The report says what stopped, what was
  reset (and how many elements that dropped), what restarted, and what would not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from nbcoord.core.registry import Registry
from nbcoord.tensorflow.blocked import BlockedRuns
from nbcoord.tensorflow.internals import runner_active_in
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import QueueInfo, RunnerInfo, SessionInfo, session_is_open
from nbcoord.tensorflow.runs import RunTracker

log = logging.getLogger("nbcoord")

#: Default seconds without an enqueue, while the queue has room, after which a runner thread is stuck.
DEFAULT_STUCK_AFTER_S = 30.0


class RestartedRunner(TypedDict):
    runner: str
    queue: str
    threads: list[str]
    tids: list[str]
    note: str | None


class ResetQueue(TypedDict):
    queue: str
    dropped: int | None
    reopened: bool


class RestartReport(TypedDict):
    """What a restart of a session's queue runners did (JSON-serialisable)."""

    session: str
    started_at: float
    took_s: float
    coordinator: str | None
    stopped: list[dict[str, Any]]
    alive: list[dict[str, Any]]
    queues_reset: list[ResetQueue]
    restarted: list[RestartedRunner]
    errors: list[str]
    text: str


@dataclass(frozen=True)
class Stuck:
    """Whether a runner thread is stuck, for how long, and on what."""

    stuck: bool
    for_s: float
    waits_on: str | None


#: Stops runner threads through the one stop: (threads, grace, why) -> the stop's report, as a dict.
StopThreads = Callable[[list[threading.Thread], float, str], dict[str, Any]]


class Health:
    """Progress and stuck state of runner threads; the restart of a session's runners."""

    def __init__(self, objects: TFObjects, tracker: RunTracker, blocked: BlockedRuns, registry: Registry) -> None:
        self.objects = objects
        self.tracker = tracker
        self.blocked = blocked
        self.registry = registry

    # ------------------------------------------------------------------------------------------ progress
    def sample(self) -> None:
        """The monitor's part: note which runner threads completed runs since the last sample."""
        now = time.time()
        for runner in self.objects.runners():
            thread = runner.thread_ref()
            state = self.tracker.state_of(thread) if thread is not None else None
            runs = state.runs if state is not None else 0
            if runs != runner.seen_runs:
                if runner.seen_runs >= 0 or runs > 0:
                    runner.progress_at = now
                runner.seen_runs = runs

    def last_progress(self, runner: RunnerInfo) -> float:
        """When the thread last completed an enqueue (time.time()), to within a monitor interval."""
        thread = runner.thread_ref()
        state = self.tracker.state_of(thread) if thread is not None else None
        since = state.since if state is not None else 0.0
        if since:
            started = time.time() - (time.monotonic() - since)
            return max(runner.progress_at, started)
        return runner.progress_at

    def stuck(self, runner: RunnerInfo, after: float) -> Stuck:
        """Whether an enqueue thread made no progress for ``after`` seconds while its queue had room."""
        thread = runner.thread_ref()
        state = self.tracker.state_of(thread) if thread is not None else None
        view = state.current() if state is not None else None
        if runner.role != "enqueue" or view is None or thread is None or not thread.is_alive():
            return Stuck(False, 0.0, None)
        age = time.time() - self.last_progress(runner)
        if age < after or not self._has_room(runner):
            return Stuck(False, age, None)
        waits_on: str | None = None
        try:
            for blocking in self.blocked.blocking(view, fresh=False):
                if blocking.use.kind == "dequeue" and blocking.queue is not runner.queue:
                    waits_on = self.blocked.describe(thread.name, age, blocking, view.session, state).split(
                        " in ", 1
                    )[-1]
                    break
        except Exception:
            log.debug("nbcoord: could not analyse a stuck runner's run", exc_info=True)
        if waits_on is None:
            op = f"`{runner.op_name}`" if runner.op_name else "its enqueue op"
            waits_on = f"{op} (no queue upstream explains the wait: an input op is slow or hung)"
        return Stuck(True, age, waits_on)

    def _has_room(self, runner: RunnerInfo) -> bool:
        queue = runner.queue
        session = runner.session_ref()
        sinfo = self.objects.session_info(session) if session is not None else None
        if queue is None or sinfo is None:
            return True
        state = queue.states.get(sinfo.sid)
        if state is None or state.size is None:
            return True
        if state.closed:
            return False
        return queue.capacity <= 0 or state.size + (runner.per_run or 1) <= queue.capacity

    def runner_row(self, runner: RunnerInfo, after: float) -> dict[str, Any]:
        """One runner thread as a row: its queue, runner, coordinator, progress, and whether it is stuck."""
        thread = runner.thread_ref()
        record = self.registry.for_thread(thread) if thread is not None else None
        qr = runner.runner_ref()
        coord = runner.coord_ref() if runner.coord_ref is not None else None
        cinfo = self.objects.coord_info(coord) if coord is not None else None
        stuck = self.stuck(runner, after)
        row: dict[str, Any] = {
            "tid": record.tid if record is not None else None,
            "name": thread.name if thread is not None else "?",
            "role": runner.role,
            "runner": getattr(qr, "name", None),
            "queue": runner.queue.qid if runner.queue is not None else None,
            "queue_name": runner.queue.name if runner.queue is not None else None,
            "op": runner.op_name or None,
            "coordinator": cinfo.cid if cinfo is not None else None,
            "cell": runner.cell,
            "runs": max(runner.seen_runs, 0),
            "last_progress": round(self.last_progress(runner), 1),
            "stuck": stuck.stuck,
            "waits_on": stuck.waits_on,
            "text": None,
        }
        if stuck.stuck and thread is not None:
            queue = runner.queue
            room = f" while queue `{queue.name}` had room" if queue is not None else ""
            # The duration is written as f"{seconds:.1f} s", with "seconds" and "since", like a blocked run's
            # sentence: the panel draws the growing figure itself.
            row["seconds"] = round(stuck.for_s, 1)
            row["since"] = row["last_progress"]
            row["text"] = (
                f"{thread.name} is stuck: no enqueue for {stuck.for_s:.1f} s{room}; it waits in {stuck.waits_on}"
            )
        return row

    def session_extra(self, info: SessionInfo, after: float) -> dict[str, Any]:
        """Fields of a session row: its runner threads with progress and stuck state, and what a restart would do."""
        session = info.ref()
        runners = [r for r in self.objects.runners() if session is not None and r.session_ref() is session]
        rows = [self.runner_row(r, after) for r in runners]
        return {
            "runners": rows,
            "stuck_runners": sum(1 for row in rows if row["stuck"]),
            "restartable": bool(len(info.started)) and session is not None and session_is_open(session),
        }

    def queue_extra(self, queue: QueueInfo, sid: str | None, after: float) -> dict[str, Any]:
        """Fields of a queue row: how many of its runner threads are stuck."""
        if sid is None:
            return {"stuck_runners": 0}
        count = 0
        for runner in self.objects.runners():
            sinfo = self.objects.session_info(runner.session_ref())
            if runner.queue is queue and sinfo is not None and sinfo.sid == sid and self.stuck(runner, after).stuck:
                count += 1
        return {"stuck_runners": count}

    # ---------------------------------------------------------------------------------------------- restart
    def restart(
        self, sid: str, *, grace: float, stop_threads: StopThreads, coordinator_cls: Any, current_cell: int | None
    ) -> RestartReport:
        """Stop a session's queue runners (the one stop), reset what that closed, start them again.

        Raises
        ------
        ValueError
            No open session has this id, or it has no queue runners started.
        """
        started_at, started = time.time(), time.monotonic()
        sinfo = self.objects.session_by_id(sid)
        session = sinfo.live_session() if sinfo is not None else None
        if sinfo is None or session is None:
            raise ValueError(f"No open session has the id {sid!r}; %nbcoord json lists them under 'sessions'.")
        runners = [(qr, daemon) for qr, daemon in list(sinfo.started.items())]
        if not runners:
            raise ValueError(f"Session {sid} has no queue runners started: there is nothing to restart.")
        errors: list[str] = []
        threads = [t for r in self.objects.runners() if r.session_ref() is session and (t := r.thread_ref())]
        report = stop_threads(threads, grace, f"restart of session {sid}") if threads else {"stopped": [], "alive": []}
        alive_names = {row["name"] for row in report.get("alive", [])}
        resets = self._reset_queues(sinfo, session, [qr for qr, _ in runners], errors)
        coord = coordinator_cls()
        cinfo = self.objects.add_coordinator(coord)
        restarted: list[RestartedRunner] = []
        for qr, daemon in runners:
            restarted.append(self._start(qr, session, coord, daemon=daemon, alive=alive_names, errors=errors))
        took = time.monotonic() - started
        result = RestartReport(
            session=sid,
            started_at=started_at,
            took_s=round(took, 3),
            coordinator=cinfo.cid,
            stopped=list(report.get("stopped", [])),
            alive=list(report.get("alive", [])),
            queues_reset=resets,
            restarted=restarted,
            errors=errors,
            text="",
        )
        result["text"] = restart_text(result, current_cell)
        return result

    def _reset_queues(
        self, sinfo: SessionInfo, session: Any, runners: list[Any], errors: list[str]
    ) -> list[ResetQueue]:
        """Reset the runners' queues (and the queues they read from) that are closed now."""
        self.objects.poll(sinfo)
        queues: dict[str, QueueInfo] = {}
        for qr in runners:
            own = self.objects.queue_info(qr.queue)
            if own is not None:
                queues[own.qid] = own
            try:
                names = self.blocked.analyzer.upstream_queues(session.graph, list(qr.enqueue_ops))
            except Exception:
                names = set()
            for name in names:
                upstream = self.objects.queue_by_op(session.graph, name)
                if upstream is not None:
                    queues[upstream.qid] = upstream
        closed = [q for q in queues.values() if (s := q.states.get(sinfo.sid)) is not None and s.closed]
        sizes = {q.qid: q.states[sinfo.sid].size for q in closed}
        resettable = [q for q in closed if q.ops is not None and q.ops.reset is not None]
        done: list[ResetQueue] = []
        if resettable:
            try:
                session.run([q.ops.reset for q in resettable if q.ops is not None])
            except Exception as exc:
                errors.append(f"resetting the queues failed: {type(exc).__name__}: {exc}")
                resettable = []
            self.objects.poll(sinfo)  # the next step creates them again: do it now
        for queue in closed:
            state = queue.states.get(sinfo.sid)
            reopened = queue in resettable and state is not None and state.closed is False
            done.append(ResetQueue(queue=queue.name, dropped=sizes.get(queue.qid), reopened=reopened))
            if not reopened:
                errors.append(f"queue `{queue.name}` is closed and could not be reopened (a reference-typed queue)")
        return done

    def _start(
        self, qr: Any, session: Any, coord: Any, *, daemon: bool, alive: set[str], errors: list[str]
    ) -> RestartedRunner:
        name = str(getattr(qr, "name", "?"))
        queue = self.objects.queue_info(qr.queue)
        if runner_active_in(qr, session):
            left = sorted(n for n in alive if name in n) or ["its threads"]
            note = f"not restarted: {', '.join(left)} still running"
            errors.append(f"QueueRunner `{name}` {note}")
            return RestartedRunner(runner=name, queue=queue.name if queue else "?", threads=[], tids=[], note=note)
        try:
            threads = qr.create_threads(session, coord=coord, daemon=daemon, start=True)
        except Exception as exc:
            errors.append(f"QueueRunner `{name}` could not start: {type(exc).__name__}: {exc}")
            threads = []
        records = [self.registry.for_thread(t) for t in threads]
        return RestartedRunner(
            runner=name,
            queue=queue.name if queue else "?",
            threads=[t.name for t in threads],
            tids=[r.tid for r in records if r is not None],
            note=None if threads else "create_threads started no thread",
        )


def restart_text(report: RestartReport, cell: int | None = None) -> str:
    """A restart report as text, for the magic."""
    started = sum(len(r["threads"]) for r in report["restarted"])
    lines = [
        f"nbcoord restart of session {report['session']}: {len(report['stopped'])} stopped, "
        f"{len(report['alive'])} still alive; {sum(1 for r in report['restarted'] if r['threads'])} QueueRunner(s) "
        f"restarted with {started} thread(s) and Coordinator {report['coordinator']}, in "
        f"{report['took_s'] * 1000:.0f} ms"
    ]
    for queue in report["queues_reset"]:
        dropped = f", {queue['dropped']} element(s) dropped" if queue["dropped"] else ""
        lines.append(f"  queue `{queue['queue']}` " + (f"reset{dropped}" if queue["reopened"] else "NOT reopened"))
    for runner in report["restarted"]:
        what = ", ".join(runner["threads"]) if runner["threads"] else (runner["note"] or "no thread")
        lines.append(f"  QueueRunner `{runner['runner']}`: {what}")
    for row in report["alive"]:
        lines.append(f"  STILL ALIVE: {row['name']} ({row['tid']}): {row['reason']}")
    for error in report["errors"]:
        lines.append(f"  {error}")
    return "\n".join(lines)
