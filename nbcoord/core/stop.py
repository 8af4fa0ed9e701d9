"""The one bounded stop behind the magic, the panel's button, the Python API and the pre-shutdown hook.

In order, against one deadline:

1. the stop flag of every thread in scope is set (``nbcoord.should_stop()`` turns True there);
2. every registered stopper runs (integrations, ``nbcoord.on_stop`` callbacks), and every owner in scope that
   knows how to stop (a ``concurrent.futures`` executor: shut down with pending work cancelled) is stopped;
   child processes in scope are sent SIGTERM;
3. all threads are joined together against the deadline (a shared deadline, so the wait is parallel, never
   one full timeout after another); daemon threads may be given a shorter deadline of their own (at exit the
   interpreter would not wait for them at all);
4. with ``force``, threads still alive at 70% of the grace period get :class:`ThreadStopped` raised in them; a
   thread blocked in a C call cannot receive it and is reported as unstoppable instead of being waited on;
5. child processes still alive are killed.

Only the user's threads are ever in scope: those a cell started (directly or through its threads) and those an
integration claimed. The kernel's own threads (IOPub, Control, heartbeat, the shell channel, the parent poller)
and nbcoord's are never selected, whatever the request names.

One stop runs at a time. A request for the same scope that arrives while a stop runs joins it and gets its
report (a burst of clicks is one stop); another request waits for the running stop, inside its own grace
period. The stop never raises: what would not stop is in the report.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import psutil

from nbcoord.core import fork as _fork
from nbcoord.core.callbacks import Callbacks
from nbcoord.core.internals import current_frames, raise_in_thread
from nbcoord.core.records import ThreadRecord
from nbcoord.core.registry import Registry
from nbcoord.core.snapshot import CellOfFile, format_stack

log = logging.getLogger("nbcoord")

#: What a stop concerns. "threads" (a set of thread ids) is for integrations (a session's runners), not the UI.
ScopeKind = Literal["all", "cell", "thread", "threads", "zombies"]
#: Part of the grace period spent waiting before a forced stop is tried.
FORCE_AT = 0.7
#: How long an idle join poll sleeps; short so that a stop that finishes early returns early.
JOIN_POLL_S = 0.005
#: How long past its own deadline a running stop is waited for before it is taken as stuck (a stopper that
#: does not return).
STUCK_AFTER_S = 1.0


class ThreadStopped(BaseException):
    """Raised inside a thread by a forced stop. A BaseException, so that ``except Exception`` does not eat it."""


@dataclass
class StopScope:
    """What a stopper is asked to stop: these threads (and their owners), before ``deadline`` (monotonic)."""

    kind: ScopeKind
    records: list[ThreadRecord]
    cell: int | None
    deadline: float

    def remaining(self) -> float:
        """Seconds left before the deadline."""
        return max(0.0, self.deadline - time.monotonic())


#: A stopper may return the outcomes of the items (not threads) it stopped; they go into the report.
Stopper = Callable[[StopScope], "list[ItemOutcome] | None"]
ChildFinder = Callable[[ScopeKind, "int | None"], Sequence[psutil.Process]]


class ThreadOutcome(TypedDict):
    tid: str
    name: str
    cell: int | None
    reason: str | None
    stack: list[str] | None


class StopperError(TypedDict):
    stopper: str
    error: str


class ItemOutcome(TypedDict):
    """What a stop did to something that is not a thread (a task, a pool, a data loader): stoppers return these."""

    id: str
    kind: str
    label: str
    cell: int | None
    stopped: bool
    reason: str | None  # why it is still alive, or how it was stopped


class ChildOutcome(TypedDict):
    terminated: list[int]
    killed: list[int]
    alive: list[int]


class StopReport(TypedDict):
    scope: str
    cell: int | None
    grace: float
    force: bool
    started_at: float
    took_s: float
    stopped: list[ThreadOutcome]
    alive: list[ThreadOutcome]
    stopper_errors: list[StopperError]
    children: ChildOutcome
    items: list[ItemOutcome]


@dataclass(frozen=True)
class StopRequest:
    """What a stop was asked to do; two equal requests are one stop when the second arrives during the first."""

    kind: ScopeKind = "all"
    cell: int | None = None
    tid: str | None = None
    force: bool = False
    tids: tuple[str, ...] = ()


@dataclass(eq=False)
class _Running:
    request: StopRequest
    deadline: float
    thread: threading.Thread
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    report: StopReport | None = None


def _empty_report(request: StopRequest, grace: float, error: str) -> StopReport:
    return StopReport(
        scope=request.kind,
        cell=request.cell,
        grace=grace,
        force=request.force,
        started_at=time.time(),
        took_s=0.0,
        stopped=[],
        alive=[],
        stopper_errors=[StopperError(stopper="stop", error=error)],
        children=ChildOutcome(terminated=[], killed=[], alive=[]),
        items=[],
    )


class StopMechanism:
    """Runs stops, one at a time; see the module docstring."""

    def __init__(
        self, registry: Registry, find_children: ChildFinder | None = None, cell_of: CellOfFile | None = None
    ) -> None:
        self._registry = registry
        self._find_children = find_children
        self._cell_of = cell_of
        self._stoppers: Callbacks[Stopper] = Callbacks()
        self._lock = threading.Lock()  # guards _running
        self._running: _Running | None = None
        self.on_report: Callable[[StopReport], None] | None = None
        #: The process this mechanism was made in: it never acts in another one (a forked child of it).
        self._pid = os.getpid()

    def add_stopper(self, name: str, stopper: Stopper) -> Callable[[], None]:
        """Register a stopper; returns the function that removes it."""
        return self._stoppers.add(name, stopper)

    def running(self) -> StopRequest | None:
        """The request of the stop running now, if any."""
        running = self._running
        return running.request if running is not None else None

    # ------------------------------------------------------------------------------------------- scope
    def select(
        self, kind: ScopeKind, *, cell: int | None, tid: str | None, grace: float, tids: tuple[str, ...] = ()
    ) -> list[ThreadRecord]:
        """The live threads of the user a stop of this scope concerns (never the caller or the main thread)."""
        me = threading.current_thread()
        main = threading.main_thread()
        candidates = [r for r in self._registry.records() if r.user and r.thread is not me and r.thread is not main]
        if kind == "thread":
            return [r for r in candidates if r.tid == tid]
        if kind == "threads":
            wanted = set(tids)
            return [r for r in candidates if r.tid in wanted]
        if kind == "cell":
            return [r for r in candidates if r.cell is not None and r.cell.execution_count == cell]
        if kind == "zombies":
            return [r for r in candidates if self._registry.zombie_reason(r, grace) is not None]
        return candidates

    # -------------------------------------------------------------------------------------------- stop
    def stop(
        self,
        kind: ScopeKind = "all",
        *,
        grace: float = 1.0,
        force: bool = False,
        cell: int | None = None,
        tid: str | None = None,
        force_after: float | None = None,
        daemon_grace: float | None = None,
        tids: tuple[str, ...] = (),
    ) -> StopReport:
        """Stop the threads (and child processes) in scope within ``grace`` seconds; never raises.

        ``force_after`` is when, in seconds from the start, a forced stop is tried (default: 70% of ``grace``).
        ``daemon_grace``: daemon threads are waited for this long at most (the exit does not wait for them).
        Time spent waiting for another stop to finish counts towards ``grace``.
        """
        started = time.monotonic()
        deadline = started + grace
        request = StopRequest(kind, cell, tid, force, tuple(tids))
        if _fork.forked or os.getpid() != self._pid:
            return _empty_report(request, grace, "not run: this is a forked child, where nbcoord does nothing")
        mine = self._claim_or_join(request, deadline, grace)
        if not isinstance(mine, _Running):
            return mine
        try:
            records = self.select(kind, cell=cell, tid=tid, grace=grace, tids=tuple(tids))
            scope = StopScope(kind, records, cell, deadline)
            force_at = started + (grace * FORCE_AT if force_after is None else min(force_after, grace))
            daemon_deadline = None if daemon_grace is None else min(deadline, time.monotonic() + daemon_grace)
            report = self._run(
                scope, grace=grace, force_at=force_at if force else None, daemon_deadline=daemon_deadline
            )
            report["took_s"] = time.monotonic() - started
        except Exception as exc:  # a bug of nbcoord's own must not break the caller's cell
            log.warning("nbcoord: the stop failed", exc_info=True)
            report = _empty_report(request, grace, f"the stop failed: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._running = None
        mine.report = report
        mine.done.set()
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:
                log.warning("nbcoord: stop report listener failed", exc_info=True)
        return report

    def _claim_or_join(self, request: StopRequest, deadline: float, grace: float) -> _Running | StopReport:
        """Become the running stop (returns its state), or join an equal one that runs (returns its report).

        A different running stop is waited for until this request's deadline: one stop at a time, each bounded.
        """
        me = threading.current_thread()
        while True:
            with self._lock:
                running = self._running
                if running is None:
                    self._running = _Running(request, deadline, me)
                    return self._running
            if running.thread is me:
                return _empty_report(request, grace, "not run: a stop cannot start another stop (from a stopper)")
            wait = max(0.0, (deadline if running.request != request else running.deadline) - time.monotonic())
            finished = running.done.wait(wait + (STUCK_AFTER_S if running.request == request else 0.0))
            if finished and running.request == request and running.report is not None:
                return running.report  # joined: one stop, one report
            if not finished:
                late = time.monotonic() - running.started
                return _empty_report(
                    request,
                    grace,
                    f"not run: another stop ({running.request.kind}) has been running for {late:.1f} s",
                )
            # The other stop finished: try again to become the running one.

    def _run(
        self, scope: StopScope, *, grace: float, force_at: float | None, daemon_deadline: float | None
    ) -> StopReport:
        wall_start = time.time()
        self._registry.request_stop(scope.records)
        items: list[ItemOutcome] = []
        errors = self._run_stoppers(scope, items)
        errors += self._stop_owners(scope)
        children = list(self._find_children(scope.kind, scope.cell)) if self._find_children else []
        children = [child for child in children if child.pid != os.getpid()]
        terminated = _signal_children(children, kill=False)
        forced = _join_all(scope.records, scope.deadline, force_at, daemon_deadline)
        child_outcome = _finish_children(children, terminated, scope.deadline)
        stopped, alive = _outcomes(scope.records, forced, self._cell_of)
        report = StopReport(
            scope=scope.kind,
            cell=scope.cell,
            grace=grace,
            force=force_at is not None,
            started_at=wall_start,
            took_s=0.0,
            stopped=stopped,
            alive=alive,
            stopper_errors=errors,
            children=child_outcome,
            items=items,
        )
        if alive:
            log.info("nbcoord: %d thread(s) still alive after stop: %s", len(alive), [a["name"] for a in alive])
        return report

    def _run_stoppers(self, scope: StopScope, items: list[ItemOutcome]) -> list[StopperError]:
        stoppers = self._stoppers.items()
        errors: list[StopperError] = []
        for name, stopper in stoppers:
            try:
                outcomes = stopper(scope)
                if outcomes:
                    items.extend(outcomes)
            except Exception as exc:  # one failing stopper must not keep the others from running
                log.warning("nbcoord: stopper %r failed", name, exc_info=True)
                errors.append(StopperError(stopper=name, error=f"{type(exc).__name__}: {exc}"))
        return errors

    def _stop_owners(self, scope: StopScope) -> list[StopperError]:
        errors: list[StopperError] = []
        seen: set[int] = set()
        for record in scope.records:
            for owner in record.owners:
                target = owner.ref() if owner.ref is not None else None
                if target is None or owner.stop is None or id(target) in seen:
                    continue
                seen.add(id(target))
                try:
                    owner.stop(target)
                except Exception as exc:
                    log.warning("nbcoord: stopping %s failed", owner.label, exc_info=True)
                    errors.append(StopperError(stopper=owner.label, error=f"{type(exc).__name__}: {exc}"))
        return errors


def _join_all(
    records: list[ThreadRecord], deadline: float, force_at: float | None, daemon_deadline: float | None = None
) -> set[str]:
    """Wait for all threads together until the deadline (daemon threads: ``daemon_deadline``, when given);
    returns the tids that were forced."""
    forced: set[str] = set()
    pending = [r for r in records if r.is_alive()]
    while pending:
        now = time.monotonic()
        if force_at is not None and now >= force_at and not forced:
            forced = _force(pending)
        if daemon_deadline is not None and now >= daemon_deadline:
            pending = [r for r in pending if not r.daemon]
            if not pending:
                break
        if now >= deadline:
            break
        # Join the first pending thread briefly; the others are checked on the next turn. The shared deadline
        # bounds the whole wait, whatever the number of threads.
        thread = pending[0].thread
        if thread is not None:
            thread.join(timeout=min(JOIN_POLL_S * 4, max(0.0, deadline - now)))
            if not thread.is_alive() and pending[0].is_alive():
                # An interrupted join() on CPython 3.11 marks a live thread stopped; join then returns at once.
                time.sleep(JOIN_POLL_S)
        pending = [r for r in pending if r.is_alive()]
    return forced


def _force(records: list[ThreadRecord]) -> set[str]:
    forced: set[str] = set()
    for record in records:
        if record.ident is not None and record.is_alive() and raise_in_thread(record.ident, ThreadStopped):
            forced.add(record.tid)
    return forced


def _outcomes(
    records: list[ThreadRecord], forced: set[str], cell_of: CellOfFile | None = None
) -> tuple[list[ThreadOutcome], list[ThreadOutcome]]:
    frames = current_frames()
    stopped: list[ThreadOutcome] = []
    alive: list[ThreadOutcome] = []
    for record in records:
        cell = record.cell.execution_count if record.cell is not None else None
        if not record.is_alive():
            reason = "forced" if record.tid in forced else None
            stopped.append(ThreadOutcome(tid=record.tid, name=record.name, cell=cell, reason=reason, stack=None))
            continue
        frame = frames.get(record.ident) if record.ident is not None else None
        stack = format_stack(frame, cell_of=cell_of) if frame is not None else None
        where = f" at {stack[-1]}" if stack else ""
        if record.tid in forced:
            reason = f"unstoppable: blocked in a C call{where}; an exception was raised in it but cannot arrive"
        else:
            reason = f"ignored the stop request{where}"
        alive.append(ThreadOutcome(tid=record.tid, name=record.name, cell=cell, reason=reason, stack=stack))
    return stopped, alive


def _signal_children(children: list[psutil.Process], *, kill: bool) -> list[int]:
    done: list[int] = []
    for child in children:
        try:
            child.kill() if kill else child.terminate()
            done.append(child.pid)
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            log.warning("nbcoord: could not signal child %d", child.pid, exc_info=True)
    return done


def _finish_children(children: list[psutil.Process], terminated: list[int], deadline: float) -> ChildOutcome:
    if not children:
        return ChildOutcome(terminated=[], killed=[], alive=[])
    _gone, alive = psutil.wait_procs(children, timeout=max(0.05, deadline - time.monotonic()))
    killed = _signal_children(alive, kill=True)
    _gone, still = psutil.wait_procs(alive, timeout=0.2) if alive else ([], [])
    return ChildOutcome(terminated=terminated, killed=killed, alive=[p.pid for p in still])
