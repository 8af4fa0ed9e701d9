"""Tier 1: the registry and the thread hooks on their own (no IPython, no TensorFlow, no kernel).

Every test that patches ``Thread.start`` does it through the ``hooks`` fixture, which uninstalls in teardown and
checks that the process is left as it was.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from helpers import wait_until

from nbcoord.core.records import Owner, ThreadRecord
from nbcoord.core.registry import Registry
from nbcoord.core.stop import ThreadStopped
from nbcoord.core.threads import ThreadHooks, executor_owner


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Park:
    """Threads that wait until the test ends (or until ``release``), joined in teardown."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, target: Callable[[], object] | None = None, daemon: bool = True) -> threading.Thread:
        thread = threading.Thread(target=target or self.release.wait, name=name, daemon=daemon)
        thread.start()
        self.threads.append(thread)
        return thread

    def close(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(timeout=5)


def after(go: threading.Event, action: Callable[[], object]) -> Callable[[], None]:
    """A thread body that waits for ``go``, then does ``action``."""

    def run() -> None:
        go.wait(5)
        action()

    return run


def ignore_stopped(exc: BaseException) -> bool:
    return isinstance(exc, ThreadStopped)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Registry:
    return Registry(clock=clock)


@pytest.fixture
def hooks(registry: Registry) -> Iterator[ThreadHooks]:
    original_start, original_hook = threading.Thread.start, threading.excepthook
    installed = ThreadHooks(registry, ignore_exception=ignore_stopped)
    installed.install()
    try:
        yield installed
    finally:
        installed.uninstall()
        assert threading.Thread.start is original_start
        assert threading.excepthook is original_hook


@pytest.fixture
def park() -> Iterator[Park]:
    parked = Park()
    try:
        yield parked
    finally:
        parked.close()


def record_of(registry: Registry, thread: threading.Thread) -> ThreadRecord:
    record = registry.for_thread(thread)
    assert record is not None, f"{thread.name} is not registered"
    return record


# ------------------------------------------------------------------------------------------------ attribution
def test_thread_is_attributed_to_the_running_cell(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    cell = registry.cell_started(7, "cell-abc", "\n\n  start_workers()  \nmore()")
    inside = park.start("inside-cell")
    registry.cell_finished(7, "ok")
    outside = park.start("after-cell")

    record = record_of(registry, inside)
    assert record.cell is cell
    assert (cell.execution_count, cell.cell_id, cell.first_line, cell.outcome) == (
        7,
        "cell-abc",
        "start_workers()",
        "ok",
    )
    assert record.name == "inside-cell"
    assert record.ident == inside.ident and record.native_id == inside.native_id
    assert record.daemon is True and record.preexisting is False
    assert record.parent_name == threading.main_thread().name
    # The creation stack's innermost frame is the code that called start() (Park.start, in this file).
    file, _line, function = record.creation_frames()[0]
    assert (file, function) == (__file__, "start")
    assert any(f == "test_thread_is_attributed_to_the_running_cell" for _, _, f in record.creation_frames())
    assert record_of(registry, outside).cell is None


def test_cell_finished_renumbers_a_provisional_count(registry: Registry) -> None:
    registry.cell_started(4, None, "x = 1")
    cell = registry.cell_finished(5, "error", "ValueError: no")
    assert cell is not None and cell.execution_count == 5 and cell.outcome == "error"
    assert registry.cell(5) is cell and registry.cell(4) is None
    assert registry.current_cell() is None
    assert registry.cell_finished(6, "ok") is None  # no cell is running


def test_thread_started_by_a_thread_inherits_its_cell(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    go = threading.Event()
    children: list[threading.Thread] = []

    def parent() -> None:
        go.wait(5)
        children.append(park.start("grandchild"))  # started after the cell has ended

    registry.cell_started(3, None, "spawn()")
    first = park.start("child", target=parent)
    registry.cell_finished(3, "ok")
    registry.cell_started(4, None, "other()")  # the cell running now is not the one that counts
    go.set()
    wait_until(lambda: children, what="the grandchild to start")

    child, grandchild = record_of(registry, first), record_of(registry, children[0])
    assert child.cell is not None and child.cell.execution_count == 3
    assert grandchild.cell is child.cell
    assert grandchild.parent_tid == child.tid and grandchild.parent_name == "child"


def test_thread_started_by_an_unregistered_thread_has_no_cell(registry: Registry, park: Park) -> None:
    # A thread that nbcoord never saw start (no hooks yet) starts another once hooks are on.
    go = threading.Event()
    children: list[threading.Thread] = []
    unseen = park.start("unseen", target=after(go, lambda: children.append(park.start("its-child"))))
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        registry.cell_started(1, None, "x")
        go.set()
        wait_until(lambda: children, what="the child to start")
    finally:
        hooks.uninstall()
    record = record_of(registry, children[0])
    assert record.cell is None and record.parent_name == unseen.name and record.parent_tid is None


def test_executor_threads_name_their_executor(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    registry.cell_started(2, None, "pool = ThreadPoolExecutor()")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="loader") as pool:
        futures = [pool.submit(park.release.wait, 5) for _ in range(2)]
        workers = [t for t in threading.enumerate() if t.name.startswith("loader")]
        assert len(workers) == 2
        for worker in workers:
            record = record_of(registry, worker)
            assert [(o.kind, o.label) for o in record.owners] == [("executor", "ThreadPoolExecutor 'loader'")]
            assert record.cell is not None and record.cell.execution_count == 2
            assert record.owners[0].closed() is False
        park.release.set()
        for future in futures:
            future.result(timeout=5)
    # Shut down: the owner counts as closed.
    assert record.owners[0].closed() is True


def test_plain_threads_and_subclasses_are_registered(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    class Worker(threading.Thread):
        def start(self) -> None:
            super().start()

    worker = Worker(target=park.release.wait, name="subclassed", daemon=True)
    worker.start()
    park.threads.append(worker)
    assert record_of(registry, worker).owners == []


def test_internal_threads_are_hidden(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    mine = park.start("nbcoord-monitor-test")
    go = threading.Event()
    child: list[threading.Thread] = []
    spawner = park.start("nbcoord-spawner", target=after(go, lambda: child.append(park.start("spawned-by-nbcoord"))))
    record_of(registry, spawner)  # registered before it starts anything
    go.set()
    spawner.join(5)
    user = park.start("user")
    assert record_of(registry, mine).internal and record_of(registry, child[0]).internal
    visible = registry.records()
    assert user in [r.thread for r in visible] and mine not in [r.thread for r in visible]
    assert mine in [r.thread for r in registry.records(include_internal=True)]


def test_a_child_started_at_once_inherits_the_cell(
    registry: Registry, hooks: ThreadHooks, park: Park, monkeypatch: pytest.MonkeyPatch
) -> None:
    note_started = registry.note_started

    def late_in_main(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.05)  # the main thread is descheduled right after its start() returned
        note_started(*args, **kwargs)

    monkeypatch.setattr(registry, "note_started", late_in_main)
    children: list[threading.Thread] = []
    registry.cell_started(9, None, "spawn()")
    parent = park.start("parent", target=lambda: children.append(park.start("child")))
    registry.cell_finished(9, "ok")
    parent.join(5)
    assert record_of(registry, parent).cell is not None
    assert record_of(registry, children[0]).cell is record_of(registry, parent).cell


def test_concurrent_starts_are_all_registered_once(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    started: list[threading.Thread] = []
    lock = threading.Lock()

    def spawn() -> None:
        for i in range(25):
            t = park.start(f"burst-{threading.current_thread().name}-{i}")
            with lock:
                started.append(t)

    spawners = [park.start(f"spawner{n}", target=spawn) for n in range(4)]
    for s in spawners:
        s.join(10)
    assert len(started) == 100
    tids = [record_of(registry, t).tid for t in started]
    assert len(set(tids)) == 100


def test_a_lookup_during_another_threads_drain_waits_for_the_thread_being_registered(
    registry: Registry, hooks: ThreadHooks, park: Park
) -> None:
    """A thread calling wait_for_stop() looks itself up; when another thread has just taken its start from the
    queue and is registering it, the lookup found the queue empty and missed it (one of 1000 threads died of a
    RuntimeError in a full test run). The lookup must wait for that registration instead."""
    inside, release, drain, look = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    found: list[ThreadRecord | None] = []
    worker: list[threading.Thread] = []
    # The two helpers start (and are registered) first: the queue then holds the worker's start alone.
    drainer = threading.Thread(target=lambda: drain.wait(10) and registry.records(), name="drainer")
    looker = threading.Thread(target=lambda: look.wait(10) and found.append(registry.for_thread(worker[0])))
    drainer.start()
    looker.start()
    registry.records()
    registry.cell_started(3, None, "burst()")
    worker.append(park.start("burst-0"))  # queued, not registered yet
    register = registry._register

    def slow_register(*args: Any) -> ThreadRecord:
        inside.set()
        release.wait(10)
        return register(*args)

    registry._register = slow_register  # type: ignore[method-assign]
    drain.set()
    assert inside.wait(10)  # the drainer took the worker's start from the queue and is registering it
    look.set()

    def waiting_or_done() -> bool:
        frame = sys._current_frames().get(looker.ident or 0)
        return not looker.is_alive() or (frame is not None and frame.f_code.co_name == "_drain")

    wait_until(waiting_or_done, 10, 0.001, "the lookup to wait in _drain, or to end")
    release.set()
    looker.join(10)
    drainer.join(10)
    assert found and found[0] is not None and found[0].thread is worker[0]
    assert found[0].cell is not None and found[0].cell.execution_count == 3


# ------------------------------------------------------------------------------------------------ preexisting
def test_adopt_existing_marks_preexisting_threads(clock: FakeClock, park: Park) -> None:
    before = park.start("before-load")
    internal = park.start("nbcoord-old")
    registry = Registry(clock=clock)
    registry.adopt_existing(internal=lambda t: t.name.startswith("nbcoord-"))
    registry.adopt_existing()  # a second adoption adds nothing
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        registry.cell_started(1, None, "go()")
        after = park.start("after-load")  # started by the main thread in a cell: the user's
    finally:
        hooks.uninstall()
    before_record = record_of(registry, before)
    assert before_record.preexisting and before_record.cell is None and before_record.creation_stack == []
    assert record_of(registry, internal).internal and record_of(registry, internal).preexisting
    main_record = registry.for_ident(threading.main_thread().ident or 0)
    assert main_record is not None and main_record.preexisting
    after_record = record_of(registry, after)
    assert after_record.preexisting is False and after_record.cell is not None
    assert sum(1 for r in registry.records(include_internal=True) if r.thread is before) == 1


def test_threads_started_by_preexisting_threads_are_preexisting(clock: FakeClock, park: Park) -> None:
    go = threading.Event()
    children: list[threading.Thread] = []
    kernel_thread = park.start("kernel-io", target=after(go, lambda: children.append(park.start("kernel-child"))))
    registry = Registry(clock=clock)
    registry.adopt_existing()
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        registry.cell_started(1, None, "x")
        go.set()
        wait_until(lambda: children, what="the kernel thread's child")
    finally:
        hooks.uninstall()
    record = record_of(registry, children[0])
    assert record.preexisting and record.parent_name == kernel_thread.name and record.cell is None


# ------------------------------------------------------------------------------------------- weak references
def test_owner_is_not_kept_alive(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    class Session:
        closed = False

    session = Session()
    thread = park.start("runner")
    registry.add_owner(
        thread,
        Owner("session", "Session 1", weakref.ref(session), is_closed=lambda s: bool(s.closed)),  # type: ignore[attr-defined]
    )
    record = record_of(registry, thread)
    assert record.owners[0].closed() is False
    session.closed = True
    assert record.owners[0].closed() is True
    session.closed = False
    probe = weakref.ref(session)
    del session
    gc.collect()
    assert probe() is None, "the registry kept the owner alive"
    assert record.owners[0].closed() is True  # a collected owner counts as closed


def test_executor_is_not_kept_alive(registry: Registry, hooks: ThreadHooks) -> None:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weak")
    pool.submit(lambda: None).result(timeout=5)
    worker = next(t for t in threading.enumerate() if t.name.startswith("weak"))
    owner = record_of(registry, worker).owners[0]
    pool.shutdown(wait=True)
    probe = weakref.ref(pool)
    del pool, worker
    gc.collect()
    assert probe() is None, "the registry kept the executor alive"
    assert owner.closed() is True


def test_finished_thread_is_not_kept_alive(registry: Registry, hooks: ThreadHooks) -> None:
    thread = threading.Thread(target=lambda: None, name="short-lived")
    thread.start()
    thread.join()
    record = record_of(registry, thread)
    tid = record.tid
    probe = weakref.ref(thread)
    del thread
    gc.collect()
    assert probe() is None, "the registry kept a finished Thread alive"
    assert record.thread is None and not record.is_alive()
    assert all(r.tid != tid for r in registry.records())
    assert registry.get(tid) is None  # pruned


def test_owner_label_from_executor_owner_survives_collection() -> None:
    pool = ThreadPoolExecutor(thread_name_prefix="lbl")
    owner = executor_owner(pool)
    pool.shutdown()
    del pool
    gc.collect()
    assert owner.label == "ThreadPoolExecutor 'lbl'" and owner.closed()


# --------------------------------------------------------------------------------------------------- zombies
@pytest.mark.parametrize(
    ("outcome", "reason"), [("interrupted", "cell-interrupted"), ("error", "cell-error"), ("ok", None)]
)
def test_zombie_reason_from_the_cell_outcome(
    registry: Registry, hooks: ThreadHooks, park: Park, outcome: Any, reason: str | None
) -> None:
    registry.cell_started(1, None, "go()")
    record = record_of(registry, park.start("worker"))
    assert registry.zombie_reason(record, 1.0) is None  # the cell is still running
    registry.cell_finished(1, outcome)
    assert registry.zombie_reason(record, 1.0) == reason


def test_zombie_reason_stop_ignored_after_grace(
    registry: Registry, hooks: ThreadHooks, park: Park, clock: FakeClock
) -> None:
    registry.cell_started(1, None, "go()")
    record = record_of(registry, park.start("stubborn"))
    registry.request_stop([record])
    assert record.stop_requested_at == clock.now
    clock.advance(1.5)
    assert registry.zombie_reason(record, grace_period=2.0) is None
    clock.advance(1.0)
    assert registry.zombie_reason(record, grace_period=2.0) == "stop-ignored"
    registry.request_stop([record])  # a second request keeps the first moment
    assert registry.zombie_reason(record, grace_period=2.0) == "stop-ignored"


def test_zombie_reason_owner_closed(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    class Runner:
        done = False

    runner = Runner()
    registry.cell_started(1, None, "go()")
    thread = park.start("runner")
    registry.add_owner(thread, Owner("runner", "Runner", weakref.ref(runner), is_closed=lambda r: bool(r.done)))  # type: ignore[attr-defined]
    record = record_of(registry, thread)
    assert registry.zombie_reason(record, 1.0) is None
    runner.done = True
    assert registry.zombie_reason(record, 1.0) == "owner-closed"


def test_owner_whose_check_raises_is_not_closed(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    target = Owner  # any live object

    def broken(_obj: object) -> bool:
        raise RuntimeError("state unknown")

    owner = Owner("x", "x", weakref.ref(target), is_closed=broken)
    assert owner.closed() is False


def test_dead_and_internal_threads_are_never_zombies(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    registry.cell_started(1, None, "go()")
    done = threading.Thread(target=lambda: None, name="done")
    done.start()
    done.join()
    dead = record_of(registry, done)  # before another thread may reuse its ident
    internal = record_of(registry, park.start("nbcoord-helper"))
    registry.cell_finished(1, "interrupted")
    assert registry.zombie_reason(dead, 1.0) is None
    assert registry.zombie_reason(internal, 1.0) is None


def test_threads_no_cell_started_are_never_the_users(
    registry: Registry, hooks: ThreadHooks, park: Park, clock: FakeClock
) -> None:
    # Started on the main thread between cells (as ipykernel starts its parent poller after loading extensions):
    # the kernel's, whatever happens to it.
    class Thing:
        pass

    thing = Thing()
    kernel_thread = park.start("Thread-1 (poller)")
    child = threading.Thread(target=park.release.wait, name="poller-child", daemon=True)
    registry.add_owner(kernel_thread, Owner("thing", "Thing", weakref.ref(thing), is_closed=lambda _t: True))
    record = record_of(registry, kernel_thread)
    assert record.cell is None and not record.user
    registry.request_stop([record])
    clock.advance(10)
    assert registry.zombie_reason(record, 1.0) is None  # neither a closed owner nor an ignored stop counts
    park.threads.append(child)
    child.start()
    assert not record_of(registry, child).user


def test_a_claimed_thread_is_the_users(registry: Registry, hooks: ThreadHooks, park: Park) -> None:
    class Runner:
        done = True

    runner = Runner()
    thread = park.start("QueueRunner-from-before")
    assert not record_of(registry, thread).user
    registry.add_owner(thread, Owner("runner", "R", weakref.ref(runner), is_closed=lambda r: True), claim=True)
    record = record_of(registry, thread)
    assert record.user and registry.zombie_reason(record, 1.0) == "owner-closed"


def test_zombie_reasons_accumulate_first_cause_first(
    registry: Registry, hooks: ThreadHooks, park: Park, clock: FakeClock
) -> None:
    class Thing:
        pass

    thing = Thing()
    registry.cell_started(1, None, "go()")
    thread = park.start("all-reasons")
    clock.advance(1)
    registry.cell_finished(1, "interrupted")
    record = record_of(registry, thread)
    assert registry.zombie_reason(record, 1.0) == "cell-interrupted"
    clock.advance(1)
    registry.add_owner(thread, Owner("thing", "Thing", weakref.ref(thing), is_closed=lambda _t: True))
    registry.sample_activity()  # the monitor's sample sees the owner closed
    clock.advance(1)
    registry.request_stop([record])
    clock.advance(2)
    reasons = registry.zombie_reasons(record, 1.0)
    assert [reason for reason, _ in reasons] == ["cell-interrupted", "owner-closed", "stop-ignored"]
    assert [since for _, since in reasons] == [1001.0, 1002.0, 1003.0]
    assert registry.zombie_reason(record, 1.0) == "cell-interrupted"  # the first cause stays first


# -------------------------------------------------------------------------------------------------- failures
def test_thread_failure_is_kept_and_reported_once(
    registry: Registry, park: Park, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous_calls: list[BaseException | None] = []

    def previous(args: Any) -> None:
        previous_calls.append(args.exc_value)

    monkeypatch.setattr(threading, "excepthook", previous)
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    go = threading.Event()
    try:
        registry.cell_started(3, None, "launch()")

        def boom() -> None:
            go.wait(5)
            raise ValueError("disk on fire")

        failing = threading.Thread(target=boom, name="failing")
        failing.start()
        record = record_of(registry, failing)
        go.set()
        failing.join()
    finally:
        hooks.uninstall()
    assert threading.excepthook is previous
    assert len(previous_calls) == 1 and isinstance(previous_calls[0], ValueError)  # chained to the previous hook

    failures = registry.take_unreported_failures()
    assert len(failures) == 1
    failure = failures[0]
    assert (failure.thread_name, failure.cell, failure.exc_type, failure.message) == (
        "failing",
        3,
        "ValueError",
        "disk on fire",
    )
    assert failure.tid == record.tid and record.last_exception is failure
    assert "raise ValueError" in failure.traceback and "in boom" in failure.traceback
    assert registry.take_unreported_failures() == []
    assert registry.failures() == [failure]


def slow_registration(registry: Registry, monkeypatch: pytest.MonkeyPatch, delay: float = 0.05) -> None:
    """Make the parent's part of Thread.start late, as when the parent is descheduled right after the start."""
    note_started = registry.note_started

    def late(*args: Any, **kwargs: Any) -> None:
        time.sleep(delay)
        note_started(*args, **kwargs)

    monkeypatch.setattr(registry, "note_started", late)


def test_immediate_failure_keeps_its_cell(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the injected delay this fails 100 of 100 times here too: the new thread holds the GIL until it has
    # raised; the delay only makes it independent of the scheduler.
    monkeypatch.setattr(threading, "excepthook", lambda _args: None)
    slow_registration(registry, monkeypatch)
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        registry.cell_started(5, None, "threading.Thread(target=lambda: 1 / 0).start()")
        failing = threading.Thread(target=lambda: 1 / 0, name="fails-at-once")
        failing.start()
        failing.join()
    finally:
        hooks.uninstall()
    [failure] = registry.failures()
    assert failure.thread_name == "fails-at-once"
    assert failure.cell == 5 and failure.tid is not None


def test_thread_stopped_is_not_a_failure(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    previous_calls: list[object] = []
    monkeypatch.setattr(threading, "excepthook", previous_calls.append)
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:

        def stopped() -> None:
            raise ThreadStopped

        t = threading.Thread(target=stopped, name="stopped")
        t.start()
        t.join()
    finally:
        hooks.uninstall()
    assert registry.failures() == [] and previous_calls == []


def test_failure_recording_error_still_chains(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    previous_calls: list[object] = []
    monkeypatch.setattr(threading, "excepthook", previous_calls.append)

    def broken_record(*_args: object) -> None:
        raise RuntimeError("registry broken")

    monkeypatch.setattr(registry, "thread_failed", broken_record)
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        t = threading.Thread(target=lambda: 1 / 0, name="div")
        t.start()
        t.join()
    finally:
        hooks.uninstall()
    assert len(previous_calls) == 1


def test_registration_error_does_not_break_thread_start(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("registry broken")

    monkeypatch.setattr(registry, "note_started", broken)
    ran = threading.Event()
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        t = threading.Thread(target=ran.set, name="still-runs")
        t.start()
        t.join(5)
    finally:
        hooks.uninstall()
    assert ran.is_set()


def test_a_new_thread_never_sees_a_dead_threads_stop_flag(
    registry: Registry, hooks: ThreadHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_registration(registry, monkeypatch)  # the parent's part of start() comes late
    seen: list[bool] = []
    for _attempt in range(20):
        old = threading.Thread(target=lambda: None, name="old")
        old.start()
        old.join()
        registry.request_stop([record_of(registry, old)])  # stopped; its record is not pruned yet
        seen.clear()
        new = threading.Thread(target=lambda: seen.append(registry.stop_requested_for_current()), name="new")
        new.start()
        new.join()
        if new.ident == old.ident:
            break
    else:
        pytest.skip("the OS did not reuse a thread id in 20 tries")
    assert seen == [False], "a brand-new thread was told to stop"


def test_a_thread_whose_start_returned_but_not_yet_running_is_alive_and_kept(
    registry: Registry, hooks: ThreadHooks
) -> None:
    # Thread.start() returns once the new thread signals that it started, a moment before the thread puts itself
    # in threading's running table (under threading's own lock, which the test holds here to keep that moment
    # open). A read of the registry then must neither take the thread for ended nor forget it: the thread, looking
    # up its own record an instant later (wait_for_stop), was told it was no cell's thread and died.
    registry.cell_started(7, None, "burst")
    looked_up: list[bool] = []
    thread = threading.Thread(target=lambda: looked_up.append(registry.stop_event_for_current() is not None))
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        thread.start()
        assert thread.ident is not None and thread.ident not in threading._active  # type: ignore[attr-defined]
        assert [r.thread for r in registry.records() if r.thread is thread], "the starting thread was forgotten"
        assert record_of(registry, thread).is_alive()
    thread.join(5)
    assert looked_up == [True], "the thread did not find its own record"


# -------------------------------------------------------------------------------------------------- activity
def _frame_name(thread: threading.Thread) -> str | None:
    frame = sys._current_frames().get(thread.ident or 0)
    return frame.f_code.co_name if frame is not None else None


def test_activity_of_a_looping_and_a_blocked_thread(
    registry: Registry, hooks: ThreadHooks, park: Park, clock: FakeClock
) -> None:
    def step_one() -> None:
        time.sleep(0.001)

    def step_two() -> None:
        time.sleep(0.001)

    def loop() -> None:
        while not park.release.is_set():
            step_one()
            step_two()

    looping = record_of(registry, park.start("looping", target=loop))
    blocked_thread = park.start("blocked")
    blocked = record_of(registry, blocked_thread)
    wait_until(lambda: _frame_name(blocked_thread) == "wait", what="the blocked thread to block")

    registry.sample_activity()
    first = clock.now
    assert looping.last_active == first and blocked.last_active == first
    samples = 0

    def sample() -> bool:
        nonlocal samples
        clock.advance(1.0)
        registry.sample_activity()
        samples += 1
        time.sleep(0.003)
        return looping.last_active > first and samples >= 20

    wait_until(sample, timeout=10, interval=0, what="the looping thread's activity to advance")
    assert blocked.last_active == first, "a thread blocked in Event.wait looked active"
    assert clock.now - blocked.last_active >= 20  # idle for 20 (fake) seconds


def test_cpu_time_counts_as_activity(registry: Registry, hooks: ThreadHooks, park: Park, clock: FakeClock) -> None:
    record = record_of(registry, park.start("cpu"))
    assert record.native_id is not None
    registry.note_cpu({record.native_id: 1.0})
    start = record.last_active
    clock.advance(5)
    registry.note_cpu({record.native_id: 1.0})  # no change
    assert record.last_active == start and record.cpu_s == 1.0
    clock.advance(5)
    registry.note_cpu({record.native_id: 1.5})
    assert record.last_active == clock.now and record.cpu_s == 1.5


# ----------------------------------------------------------------------------------------------------- hooks
def test_hooks_install_and_uninstall_restore_exactly(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    def previous(args: Any) -> None:
        pass

    monkeypatch.setattr(threading, "excepthook", previous)
    original_start = threading.Thread.start
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        patched = threading.Thread.start
        assert patched is not original_start
        assert patched.__wrapped__ is original_start  # type: ignore[attr-defined]
        assert threading.excepthook is not previous
        hooks.install()  # twice: harmless, nothing wrapped twice
        assert threading.Thread.start is patched
    finally:
        hooks.uninstall()
    assert threading.Thread.start is original_start
    assert threading.excepthook is previous
    hooks.uninstall()  # twice: harmless
    assert threading.Thread.start is original_start

    t = threading.Thread(target=lambda: None, name="after-uninstall")
    t.start()
    t.join()
    assert registry.for_thread(t) is None


def test_uninstall_leaves_a_later_patch_in_place(registry: Registry, park: Park) -> None:
    original_start = threading.Thread.start
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    ours = threading.Thread.start
    calls: list[str] = []

    def theirs(thread: threading.Thread) -> None:
        calls.append(thread.name)
        ours(thread)

    try:
        threading.Thread.start = theirs  # type: ignore[method-assign,assignment]
        hooks.uninstall()
        assert threading.Thread.start is theirs
        thread = park.start("through-theirs")
        assert calls == ["through-theirs"]
        assert registry.for_thread(thread) is None  # nbcoord's part is off
    finally:
        threading.Thread.start = original_start  # type: ignore[method-assign]


# -------------------------------------------------------------------------------------------------- history
def test_old_cells_are_forgotten_unless_something_refers_to_them(
    clock: FakeClock, park: Park, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbcoord.core import registry as _registry

    registry = Registry(clock=clock, keep_cells=lambda: {7})
    hooks = ThreadHooks(registry, ignore_exception=ignore_stopped)
    hooks.install()
    try:
        for n in range(1, 10_001):
            registry.cell_started(n, None, f"cell {n}")
            if n == 5:
                park.start("lives-on")  # a live thread keeps its cell
            registry.cell_finished(n, "ok")
            clock.advance(0.001)
        counts = [cell.execution_count for cell in registry.cells()]
        assert len(counts) <= _registry.RECENT_CELLS + _registry._CELL_SLACK + 2
        assert 5 in counts and 7 in counts, "a cell that something refers to was forgotten"
        assert counts[-_registry.RECENT_CELLS :] == list(range(10_001 - _registry.RECENT_CELLS, 10_001))
        assert registry.cell(5) is not None and registry.cell(6) is None
    finally:
        hooks.uninstall()
