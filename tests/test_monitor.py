"""nbcoord's monitor thread (issue 26): ticks at the base interval while a task watches something live, quiet while
none does, awake again on an event; jobs with their own schedule; readers served also while paused.

Unit tests on a real Monitor and its real thread (no kernel): each waits on the state it expects, with a deadline.
The kernel-level cases (an idle kernel's one thread, quiet; a thread a cell starts wakes it) are in
tests/test_kernel_threads.py.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator

import pytest
from helpers import wait_until

from nbcoord.core.monitor import QUIET_INTERVAL_S, Monitor

BASE_S = 0.05


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    monitor = Monitor(lambda: BASE_S)
    yield monitor
    monitor.stop()


class Counter:
    """A task that counts its calls and says whether something is live."""

    def __init__(self, live: bool) -> None:
        self.live = live
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.live


def test_a_task_that_watches_something_live_keeps_the_base_interval(monitor: Monitor) -> None:
    task = Counter(live=True)
    monitor.add_task("live", task)
    monitor.start()
    wait_until(lambda: task.calls >= 5, 10, what="five ticks at the base interval")
    assert not monitor.quiet


def test_nothing_live_makes_it_quiet_and_the_next_tick_a_quiet_interval_away(monitor: Monitor) -> None:
    task = Counter(live=False)
    monitor.add_task("idle", task)
    monitor.start()
    wait_until(lambda: monitor.quiet, 10, what="quiet after a tick where nothing was live")
    with monitor._lock:
        assert monitor._next_tick - monitor._last_tick == pytest.approx(QUIET_INTERVAL_S)
    assert task.calls == 1


def test_an_event_wakes_a_quiet_monitor_at_once(monitor: Monitor) -> None:
    task = Counter(live=False)
    monitor.add_task("idle", task)
    monitor.start()
    wait_until(lambda: monitor.quiet, 10, what="quiet")
    monitor.wake()  # a thread started, a cell began
    assert not monitor.quiet
    wait_until(lambda: task.calls == 2, 10, what="a tick right after the event, not a minute later")
    wait_until(lambda: monitor.quiet, 10, what="quiet again once the tick saw nothing live")


def test_an_event_during_a_tick_keeps_the_base_interval(monitor: Monitor) -> None:
    # The race wake() must not lose: a thread registered while the tasks run (after the activity task looked).
    calls: list[int] = []

    def task() -> bool:
        calls.append(1)
        if len(calls) == 1:
            monitor.wake()
        return False

    monitor.add_task("racing", task)
    monitor.start()
    wait_until(lambda: len(calls) >= 2, 10, what="a second tick at the base interval after the event")
    wait_until(lambda: monitor.quiet, 10, what="quiet after the tick that saw no event")


def test_a_failing_task_does_not_count_as_nothing_live(monitor: Monitor, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> bool:
        raise RuntimeError("broken task")

    monitor.add_task("broken", broken)
    assert monitor.tick() is True
    assert "monitor task 'broken' failed" in caplog.text


def test_a_job_runs_when_due_and_when_poked(monitor: Monitor) -> None:
    runs: list[float] = []
    due: list[float | None] = [None]

    def run(now: float) -> None:
        runs.append(now)
        due[0] = None

    monitor.add_job("job", lambda: due[0], run)
    monitor.start()
    due[0] = -1.0  # due long ago
    monitor.poke()
    wait_until(lambda: len(runs) == 1, 10, what="the job run after the poke")


def test_removing_a_job_waits_for_its_run_in_progress(monitor: Monitor) -> None:
    entered, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def run(now: float) -> None:
        entered.set()
        release.wait(10)
        finished.append(True)

    remove = monitor.add_job("slow", lambda: None if entered.is_set() else -1.0, run)
    monitor.start()
    assert entered.wait(10), "the job never ran"
    threading.Timer(0.1, release.set).start()
    remove()
    assert finished == [True], "the remover returned while the job still ran"


def test_a_reader_is_served_and_let_go_of(monitor: Monitor) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    got = bytearray()
    try:
        remove = monitor.add_reader(read_fd, lambda: got.extend(os.read(read_fd, 64)))
        monitor.start()
        os.write(write_fd, b"\x0f")
        wait_until(lambda: bytes(got) == b"\x0f", 10, what="the byte read by the monitor thread")
        assert remove() is True
        assert read_fd not in monitor._selecting
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_paused_it_runs_no_task_but_still_reads(monitor: Monitor) -> None:
    task = Counter(live=True)
    monitor.add_task("live", task)
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    got = bytearray()
    try:
        monitor.add_reader(read_fd, lambda: got.extend(os.read(read_fd, 64)))
        monitor.start()
        wait_until(lambda: task.calls >= 1, 10, what="a first tick")
        monitor.pause()
        calls = task.calls
        os.write(write_fd, b"\x0f")
        wait_until(lambda: bytes(got) == b"\x0f", 10, what="the byte read while paused")
        assert task.calls == calls, "a task ran after pause() returned"
    finally:
        monitor.stop()
        os.close(read_fd)
        os.close(write_fd)


def test_stop_ends_the_thread_and_closes_its_pipe() -> None:
    monitor = Monitor(lambda: BASE_S)
    monitor.start()
    wake_read = monitor._wake_read
    monitor.stop()
    assert monitor.native_id is None
    with pytest.raises(OSError):
        os.fstat(wake_read)


def test_no_poke_is_lost_however_they_interleave_with_the_drain(monitor: Monitor) -> None:
    # Each poke must make the thread look again: a poke lost once (its byte read while the flag that skips writing
    # stays set) would leave every later one lost too, and the panel would stop updating while the monitor is quiet.
    # A thread pokes without pause, so that pokes come while the monitor drains its pipe (its read lets them in);
    # then one poke must still be seen.
    runs: list[int] = []
    wanted: list[bool] = [False]

    def run(now: float) -> None:
        wanted[0] = False
        runs.append(1)

    monitor.add_job("job", lambda: -math.inf if wanted[0] else None, run)
    monitor.start()
    wait_until(lambda: monitor.quiet, 10, what="quiet (no task: the next tick a minute away)")
    def hammer() -> None:
        for _ in range(300_000):
            monitor.poke()

    for storm in range(1, 4):
        poker = threading.Thread(target=hammer)
        poker.start()
        poker.join()
        wanted[0] = True
        monitor.poke()
        wait_until(lambda storm=storm: len(runs) >= storm, 10, what=f"the run after poke storm {storm}")
