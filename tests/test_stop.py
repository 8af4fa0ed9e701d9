"""Tier 1: the one bounded stop (nbcoord.core.stop.StopMechanism) with a real Registry and ThreadHooks, no IPython.

Timing assertions are bounds with generous margins (the machine may be loaded), never tight measurements.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from helpers import wait_until

from nbcoord.core import fork as _fork
from nbcoord.core.records import ThreadRecord
from nbcoord.core.registry import Registry
from nbcoord.core.stop import ScopeKind, StopMechanism, StopReport, StopScope, ThreadStopped
from nbcoord.core.threads import ThreadHooks

#: Set at teardown so that cooperative threads a test did not stop end too.
_RELEASE_ALL = threading.Event()


class Threads:
    """Threads a test starts; teardown releases and joins them so nothing leaks into the next test."""

    def __init__(self) -> None:
        _RELEASE_ALL.clear()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, target: Callable[[], object]) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def close(self) -> None:
        self.release.set()
        _RELEASE_ALL.set()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.fixture
def registry() -> Registry:
    """A registry in which a cell is running: the threads a test starts are that cell's, so the user's."""
    fresh = Registry()
    fresh.cell_started(100, None, "the test's cell")
    return fresh


@pytest.fixture
def hooks(registry: Registry) -> Iterator[ThreadHooks]:
    installed = ThreadHooks(registry, ignore_exception=lambda exc: isinstance(exc, ThreadStopped))
    installed.install()
    try:
        yield installed
    finally:
        installed.uninstall()


@pytest.fixture
def threads() -> Iterator[Threads]:
    started = Threads()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def stopper(registry: Registry, hooks: ThreadHooks) -> StopMechanism:
    return StopMechanism(registry)


def cooperative(registry: Registry, linger: float = 0.0) -> Callable[[], None]:
    """A thread body that waits for its stop flag, then takes ``linger`` seconds to finish."""

    def run() -> None:
        event = wait_until(registry.stop_event_for_current, what="the thread's registration")
        assert event is not None
        while not event.wait(0.05):
            if _RELEASE_ALL.is_set():
                return
        if linger:
            time.sleep(linger)

    return run


def stopped_names(report: StopReport) -> set[str]:
    return {row["name"] for row in report["stopped"]}


def alive_names(report: StopReport) -> set[str]:
    return {row["name"] for row in report["alive"]}


def record_of(registry: Registry, thread: threading.Thread) -> ThreadRecord:
    record = registry.for_thread(thread)
    assert record is not None
    return record


# ------------------------------------------------------------------------------------------------- all threads
def test_stop_all_stops_100_cooperative_threads(registry: Registry, stopper: StopMechanism, threads: Threads) -> None:
    started = [threads.start(f"coop-{i}", cooperative(registry)) for i in range(100)]
    wait_until(lambda: all(t.is_alive() for t in started) and len(registry.records()) == 100)
    report = stopper.stop("all", grace=10.0)
    assert stopped_names(report) == {t.name for t in started}
    assert report["alive"] == [] and report["stopper_errors"] == []
    assert not any(t.is_alive() for t in started)
    assert report["scope"] == "all" and report["force"] is False and report["grace"] == 10.0
    assert 0 <= report["took_s"] < 10.0


def test_a_raising_stopper_does_not_prevent_the_others(
    registry: Registry, stopper: StopMechanism, threads: Threads
) -> None:
    calls: list[tuple[str, ScopeKind, int]] = []

    def bad(scope: StopScope) -> None:
        calls.append(("bad", scope.kind, len(scope.records)))
        raise RuntimeError("queue already closed")

    def good(scope: StopScope) -> None:
        calls.append(("good", scope.kind, len(scope.records)))

    stopper.add_stopper("bad", bad)
    stopper.add_stopper("good", good)
    worker = threads.start("coop", cooperative(registry))
    wait_until(lambda: registry.for_thread(worker))
    report = stopper.stop("all", grace=5.0)
    assert calls == [("bad", "all", 1), ("good", "all", 1)]
    assert report["stopper_errors"] == [{"stopper": "bad", "error": "RuntimeError: queue already closed"}]
    assert stopped_names(report) == {"coop"}


def test_removed_stopper_does_not_run(stopper: StopMechanism) -> None:
    calls: list[str] = []
    remove = stopper.add_stopper("once", lambda _scope: calls.append("ran"))
    stopper.stop("all", grace=0.1)
    remove()
    stopper.stop("all", grace=0.1)
    assert calls == ["ran"]


def test_stop_report_listener(stopper: StopMechanism) -> None:
    reports: list[StopReport] = []
    stopper.on_report = reports.append
    report = stopper.stop("all", grace=0.1)
    assert reports == [report]


# ----------------------------------------------------------------------------------------------------- force
def test_force_raises_in_a_python_loop_that_ignores_the_flag(
    registry: Registry, stopper: StopMechanism, threads: Threads
) -> None:
    outcome: list[str] = []

    def spin() -> None:
        try:
            n = 0
            while not threads.release.is_set():
                n += 1
            outcome.append("released")
        except ThreadStopped:
            outcome.append("stopped")

    without = threads.start("spinner", spin)
    wait_until(lambda: registry.for_thread(without))
    report = stopper.stop("all", grace=0.3)
    assert alive_names(report) == {"spinner"}  # without force it ignores the flag...
    assert report["alive"][0]["reason"] is not None and "ignored the stop request" in report["alive"][0]["reason"]
    assert outcome == []

    started = time.monotonic()
    report = stopper.stop("all", grace=10.0, force=True, force_after=0.1)
    assert time.monotonic() - started < 5.0
    assert report["force"] is True
    assert [(r["name"], r["reason"]) for r in report["stopped"]] == [("spinner", "forced")]
    assert report["alive"] == []
    assert outcome == ["stopped"]


def test_thread_blocked_in_c_is_unstoppable_and_the_stop_keeps_its_deadline(
    registry: Registry, stopper: StopMechanism, threads: Threads
) -> None:
    blocked_in: list[str] = []

    def blocked() -> None:
        try:
            threads.release.wait()
        except ThreadStopped:  # arrives once the wait returns, at teardown
            blocked_in.append("late ThreadStopped")

    thread = threads.start("blocked", blocked)
    wait_until(lambda: registry.for_thread(thread))
    grace = 0.5
    started = time.monotonic()
    report = stopper.stop("all", grace=grace, force=True, force_after=0.1)
    took = time.monotonic() - started
    assert took < grace + 2.0, f"the stop took {took:.2f} s with a {grace} s grace period"
    assert report["took_s"] >= grace * 0.9  # it did wait for the thread, up to the deadline
    assert report["stopped"] == []
    [row] = report["alive"]
    assert row["name"] == "blocked" and row["reason"] is not None
    assert row["reason"].startswith("unstoppable")
    assert row["stack"] is not None and any("in wait" in line for line in row["stack"])
    assert thread.is_alive()


def test_blocked_thread_without_force_is_reported_with_its_stack(
    registry: Registry, stopper: StopMechanism, threads: Threads
) -> None:
    thread = threads.start("waiter", threads.release.wait)
    wait_until(lambda: registry.for_thread(thread))
    report = stopper.stop("all", grace=0.2)
    [row] = report["alive"]
    assert row["reason"] is not None and row["reason"].startswith("ignored the stop request at ")
    assert row["stack"] is not None and "in wait" in row["stack"][-1]


# ---------------------------------------------------------------------------------------------------- joins
def test_joins_are_parallel(registry: Registry, stopper: StopMechanism, threads: Threads) -> None:
    linger = 0.3
    started = [threads.start(f"slow-{i}", cooperative(registry, linger=linger)) for i in range(10)]
    wait_until(lambda: len(registry.records()) == 10)
    report = stopper.stop("all", grace=10.0)
    assert len(report["stopped"]) == 10 and report["alive"] == []
    assert not any(t.is_alive() for t in started)
    # Each thread needs 0.3 s after the flag: one after another would be 3 s; together, about 0.3 s.
    assert linger * 0.9 <= report["took_s"] < 10 * linger / 2, report["took_s"]


# ------------------------------------------------------------------------------------------------ executors
def test_executor_pending_futures_are_cancelled(registry: Registry, stopper: StopMechanism) -> None:
    running = threading.Event()

    def task() -> str:
        running.set()
        cooperative(registry)()
        return "finished"

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stop-pool")
    try:
        first = pool.submit(task)
        pending = [pool.submit(time.sleep, 0) for _ in range(5)]
        assert running.wait(5)
        report = stopper.stop("all", grace=5.0)
        assert all(f.cancelled() for f in pending)
        assert first.result(timeout=5) == "finished"
        assert stopped_names(report) == {"stop-pool_0"}
        assert report["alive"] == [] and report["stopper_errors"] == []
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------------------------------- scopes
def _in_cell(registry: Registry, threads: Threads, count: int, names: Sequence[str], outcome: str = "ok") -> None:
    registry.cell_started(count, None, f"cell {count}")
    for name in names:
        threads.start(name, cooperative(registry))
    registry.cell_finished(count, outcome)  # type: ignore[arg-type]


def test_cell_scope_stops_only_that_cell(registry: Registry, stopper: StopMechanism, threads: Threads) -> None:
    _in_cell(registry, threads, 1, ["c1-a", "c1-b"])
    _in_cell(registry, threads, 2, ["c2-a"])
    wait_until(lambda: len(registry.records()) == 3)
    report = stopper.stop("cell", cell=1, grace=5.0)
    assert report["scope"] == "cell" and report["cell"] == 1
    assert stopped_names(report) == {"c1-a", "c1-b"} and report["alive"] == []
    assert [r.name for r in registry.records()] == ["c2-a"]


def test_thread_scope_stops_only_that_thread(registry: Registry, stopper: StopMechanism, threads: Threads) -> None:
    _in_cell(registry, threads, 1, ["one", "two"])
    wait_until(lambda: len(registry.records()) == 2)
    target = next(r for r in registry.records() if r.name == "two")
    report = stopper.stop("thread", tid=target.tid, grace=5.0)
    assert stopped_names(report) == {"two"}
    assert [r.name for r in registry.records()] == ["one"]


def test_zombies_scope_stops_only_zombies(registry: Registry, stopper: StopMechanism, threads: Threads) -> None:
    _in_cell(registry, threads, 1, ["interrupted-a", "interrupted-b"], outcome="interrupted")
    _in_cell(registry, threads, 2, ["healthy"], outcome="ok")
    _in_cell(registry, threads, 3, ["failed"], outcome="error")
    wait_until(lambda: len(registry.records()) == 4)
    report = stopper.stop("zombies", grace=5.0)
    assert stopped_names(report) == {"interrupted-a", "interrupted-b", "failed"}
    assert [r.name for r in registry.records()] == ["healthy"]


def test_preexisting_threads_are_not_stopped_by_all(threads: Threads) -> None:
    own_flag = threading.Event()
    before = threads.start("kernel-thread", own_flag.wait)
    registry = Registry()
    registry.adopt_existing()
    hooks = ThreadHooks(registry, ignore_exception=lambda exc: isinstance(exc, ThreadStopped))
    hooks.install()
    try:
        stopper = StopMechanism(registry)
        registry.cell_started(1, None, "start()")
        user = threads.start("user-thread", cooperative(registry))
        wait_until(lambda: registry.for_thread(user))
        report = stopper.stop("all", grace=2.0, force=True)
        record = record_of(registry, before)
        assert stopped_names(report) == {"user-thread"} and report["alive"] == []
        assert before.is_alive() and record.stop_requested_at is None
        # Not by its id either: no request names a thread into a stop that no cell started.
        report = stopper.stop("thread", tid=record.tid, grace=0.1, force=True)
        assert report["stopped"] == [] and report["alive"] == []
        assert before.is_alive() and record.stop_requested_at is None
    finally:
        hooks.uninstall()
        own_flag.set()


def test_threads_started_outside_any_cell_are_never_stopped(threads: Threads) -> None:
    # ipykernel starts its parent poller from the main thread after extensions load, outside any cell.
    registry = Registry()
    hooks = ThreadHooks(registry, ignore_exception=lambda exc: isinstance(exc, ThreadStopped))
    hooks.install()
    try:
        stopper = StopMechanism(registry)
        poller = threads.start("Thread-1 (poller)", cooperative(registry))
        record = wait_until(lambda: registry.for_thread(poller))
        for kind in ("all", "zombies", "thread"):
            report = stopper.stop(kind, tid=record.tid, grace=0.2, force=True)  # type: ignore[arg-type]
            assert report["stopped"] == [] and report["alive"] == [], kind
        assert poller.is_alive() and record.stop_requested_at is None
    finally:
        hooks.uninstall()


def test_the_caller_and_the_main_thread_are_never_selected(registry: Registry, stopper: StopMechanism) -> None:
    registry.adopt_existing()
    main = registry.for_ident(threading.main_thread().ident or 0)
    assert main is not None
    report = stopper.stop("thread", tid=main.tid, grace=0.1)
    assert report["stopped"] == [] and report["alive"] == []
    assert main.stop_requested_at is None


def test_stop_from_a_thread_in_scope_does_not_wait_for_itself(
    registry: Registry, stopper: StopMechanism, threads: Threads
) -> None:
    reports: list[StopReport] = []
    go = threading.Event()

    def stop_everything() -> None:
        go.wait(5)
        reports.append(stopper.stop(grace=5.0))

    worker = threads.start("stops-all", stop_everything)
    wait_until(lambda: registry.for_thread(worker))
    go.set()
    worker.join(10)
    assert reports and reports[0]["stopped"] == [] and reports[0]["alive"] == []


# ----------------------------------------------------------------------------------------- child processes
def _spawn(ignore_sigterm: bool) -> subprocess.Popen[str]:
    code = "import signal, sys, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_child_processes_in_scope_are_terminated_then_killed(registry: Registry, hooks: ThreadHooks) -> None:
    polite, stubborn = _spawn(ignore_sigterm=False), _spawn(ignore_sigterm=True)
    asked: list[tuple[ScopeKind, int | None]] = []

    def find_children(kind: ScopeKind, cell: int | None) -> Sequence[psutil.Process]:
        asked.append((kind, cell))
        return [psutil.Process(polite.pid), psutil.Process(stubborn.pid)]

    try:
        stopper = StopMechanism(registry, find_children)
        grace = 0.5
        report = stopper.stop("cell", cell=4, grace=grace)
        assert asked == [("cell", 4)]
        children = report["children"]
        assert sorted(children["terminated"]) == sorted([polite.pid, stubborn.pid])
        assert children["killed"] == [stubborn.pid] and children["alive"] == []
        # psutil reaped them (so Popen cannot see their status); both are gone.
        assert polite.poll() is not None and stubborn.poll() is not None
        assert report["took_s"] < grace + 2.0
    finally:
        for child in (polite, stubborn):
            if child.poll() is None:
                child.kill()
            child.wait()
            assert child.stdout is not None
            child.stdout.close()


def test_children_that_already_exited_are_no_error(registry: Registry, hooks: ThreadHooks) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    process = psutil.Process(child.pid)
    child.wait()
    stopper = StopMechanism(registry, lambda _kind, _cell: [process])
    report = stopper.stop("all", grace=0.2)
    assert report["children"] == {"terminated": [], "killed": [], "alive": []}


# ------------------------------------------------------------------------------------------ one stop at a time
def _slow_stopper(started: threading.Event, release: threading.Event, calls: list[StopScope]) -> Callable[..., None]:
    def stopper(scope: StopScope) -> None:
        calls.append(scope)
        started.set()
        release.wait(5)

    return stopper


def test_an_equal_request_during_a_stop_joins_it(registry: Registry, stopper: StopMechanism) -> None:
    started, release, calls = threading.Event(), threading.Event(), []
    stopper.add_stopper("slow", _slow_stopper(started, release, calls))
    reports: list[StopReport] = []
    first = threading.Thread(target=lambda: reports.append(stopper.stop("all", grace=5.0)), daemon=True)
    first.start()
    assert started.wait(5)
    joiners = [
        threading.Thread(target=lambda: reports.append(stopper.stop("all", grace=5.0)), daemon=True) for _ in range(20)
    ]
    for joiner in joiners:
        joiner.start()
    wait_until(lambda: stopper.running() is not None)
    release.set()
    for thread in [first, *joiners]:
        thread.join(10)
    assert len(calls) == 1, "twenty-one equal requests ran more than one stop"
    assert len(reports) == 21 and all(report is reports[0] for report in reports)


def test_a_different_request_waits_for_the_running_stop_within_its_own_grace(
    registry: Registry, stopper: StopMechanism
) -> None:
    started, release, calls = threading.Event(), threading.Event(), []
    stopper.add_stopper("slow", _slow_stopper(started, release, calls))
    first = threading.Thread(target=lambda: stopper.stop("all", grace=5.0), daemon=True)
    first.start()
    assert started.wait(5)
    begun = time.monotonic()
    report = stopper.stop("zombies", grace=0.3)
    assert time.monotonic() - begun < 2.0
    assert "another stop (all) has been running" in report["stopper_errors"][0]["error"]
    assert len(calls) == 1  # it did not run beside the running stop
    release.set()
    first.join(5)
    report = stopper.stop("zombies", grace=0.3)  # once the first is done, it runs
    assert report["stopper_errors"] == [] and len(calls) == 2


def test_a_stop_requested_from_a_stopper_does_not_deadlock(registry: Registry, stopper: StopMechanism) -> None:
    inner: list[StopReport] = []
    stopper.add_stopper("reentrant", lambda scope: inner.append(stopper.stop("cell", cell=1, grace=5.0)))
    begun = time.monotonic()
    stopper.stop("all", grace=5.0)
    assert time.monotonic() - begun < 2.0
    assert "cannot start another stop" in inner[0]["stopper_errors"][0]["error"]


def test_daemon_threads_get_their_own_short_deadline(registry: Registry, stopper: StopMechanism) -> None:
    release = threading.Event()
    blocked = threading.Thread(target=release.wait, name="daemon-blocked-in-c", daemon=True)
    blocked.start()
    try:
        wait_until(lambda: registry.for_thread(blocked))
        report = stopper.stop("all", grace=3.0, force=True, force_after=0.05, daemon_grace=0.2)
        assert alive_names(report) == {"daemon-blocked-in-c"}
        assert report["took_s"] < 1.0, "a daemon thread that cannot stop was waited for the whole grace period"
    finally:
        release.set()
        blocked.join(5)


def test_a_forked_child_stops_nothing(
    registry: Registry, stopper: StopMechanism, threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = threads.start("parents-worker", cooperative(registry))
    record = wait_until(lambda: registry.for_thread(worker))
    monkeypatch.setattr(_fork, "forked", True)
    report = stopper.stop("all", grace=0.5, force=True)
    assert report["stopped"] == [] and "forked child" in report["stopper_errors"][0]["error"]
    assert worker.is_alive() and record.stop_requested_at is None


def test_stoppers_added_and_removed_while_stops_run(registry: Registry, stopper: StopMechanism) -> None:
    # The table of stoppers is changed by other threads (integrations installing, on_stop removers) while a stop
    # iterates it: no stop may fail for it, and a stopper present for the whole run runs.
    ran: list[str] = []
    stopper.add_stopper("steady", lambda scope: ran.append("steady"))
    done = threading.Event()
    errors: list[BaseException] = []

    def churn(n: int) -> None:
        try:
            while not done.is_set():
                remove = stopper.add_stopper(f"churn-{n}", lambda scope: time.sleep(0.0005))
                remove()
        except BaseException as exc:  # the test reports whatever broke
            errors.append(exc)

    workers = [threading.Thread(target=churn, args=(n,), daemon=True) for n in range(4)]
    for worker in workers:
        worker.start()
    try:
        reports = [stopper.stop("all", grace=0.2) for _ in range(30)]
    finally:
        done.set()
        for worker in workers:
            worker.join(5)
    assert errors == [] and ran == ["steady"] * 30
    assert all(report["stopper_errors"] == [] for report in reports)
