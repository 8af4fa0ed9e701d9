"""What each blocked thread waits on, and deadlocks (nbcoord/core/waits.py): real threads blocked in real
primitives, then real kernels, where ``%nbcoord threads`` names a deadlock of a cell's threads and the control
channel's ``waits`` request answers while the main thread itself is deadlocked.

Every test waits for its threads to be where it wants them (their innermost frame at the blocking line) with a
deadline, and lets them go at its end.
"""

from __future__ import annotations

import gc
import linecache
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import KERNEL_PYTHONS

from nbcoord import report as _report
from nbcoord.core import lockexpr
from nbcoord.core.schema import SchemaError, parse_request, waits_request
from nbcoord.core.waits import analyse

KERNEL_OPTIONS = kernel_params(KERNEL_PYTHONS)


# ------------------------------------------------------------------------------------------------- helpers
def frames() -> dict[int, Any]:
    found = sys._current_frames()
    found.pop(threading.get_ident(), None)
    return found


def at(thread: threading.Thread, line: str) -> bool:
    """Whether the thread's innermost Python frame is at the source line ``line`` (stripped)."""
    frame = sys._current_frames().get(thread.ident or -1)
    try:
        return frame is not None and linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() == line
    finally:
        del frame


def in_function(thread: threading.Thread, *names: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    try:
        return frame is not None and frame.f_code.co_name in names
    finally:
        del frame


def start(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def row_of(report: Any, thread: threading.Thread) -> dict[str, Any]:
    rows = [row for row in report["threads"] if row["tid"] == thread.native_id]
    assert rows, f"{thread.name} is not in {report['threads']}"
    return dict(rows[0])


@pytest.fixture
def ended() -> Iterator[list[threading.Thread]]:
    """Threads a test started: each must have ended by the test's end (the test lets them go)."""
    threads: list[threading.Thread] = []
    yield threads
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} did not end"


# ------------------------------------------------------------------------------------------------ locks
def start_deadlock(a: threading.Lock, b: threading.Lock) -> tuple[threading.Thread, threading.Thread]:
    """Threads 'one' (holds a, then waits for b at ``with b:``) and 'two' (holds b, waits for a at ``with a:``).
    The test lets them go by releasing ``a``: two takes it and ends, releasing b, and one ends."""
    got_a, got_b = threading.Event(), threading.Event()

    def one() -> None:
        try:
            with a:
                got_a.set()
                got_b.wait(10)
                with b:
                    pass
        except RuntimeError:  # released by the test: one's exit finds a released
            pass

    def two() -> None:
        try:
            with b:
                got_b.set()
                got_a.wait(10)
                with a:
                    pass
        except RuntimeError:
            pass

    return start(one, "one"), start(two, "two")


def test_a_two_lock_deadlock_is_named_with_both_locks_and_stacks(ended: list[threading.Thread]) -> None:
    a, b = threading.Lock(), threading.Lock()
    first, second = start_deadlock(a, b)
    ended += [first, second]
    try:
        wait_until(lambda: at(first, "with b:") and at(second, "with a:"), what="both threads at their second lock")
        report = analyse(frames())
    finally:
        a.release()  # two takes a and ends, releasing b: one takes b and ends
    assert len(report["deadlocks"]) == 1, report
    deadlock = report["deadlocks"][0]
    assert sorted(deadlock["tids"]) == sorted([first.native_id, second.native_id])
    assert "thread 'one' holds a and waits for b" in deadlock["text"]
    assert "thread 'two' holds b and waits for a" in deadlock["text"]
    assert deadlock["text"].startswith("deadlock: ")
    one_row, two_row = row_of(report, first), row_of(report, second)
    assert one_row["waits"] == f"Lock b, held by thread 'two' (tid {second.native_id})"
    assert one_row["owner_tid"] == second.native_id and two_row["owner_tid"] == first.native_id
    assert one_row["holds"] == ["a"] and two_row["holds"] == ["b"]
    assert one_row["stack"][-1].endswith("in one") and two_row["stack"][-1].endswith("in two")
    assert report["threads"][:2] == [report["threads"][0], report["threads"][1]]
    assert {report["threads"][0]["name"], report["threads"][1]["name"]} == {"one", "two"}, "deadlocked ones first"


class _Guarded:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            pass

    def take(self) -> None:
        self.lock.acquire(True, 10)
        self.lock.release()


def test_a_lock_named_through_an_attribute_and_an_acquire_call(ended: list[threading.Thread]) -> None:
    guarded = _Guarded()
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with guarded.lock:
            held.set()
            release.wait(10)

    ended.append(start(holder, "holder"))
    held.wait(10)
    entering, taking = start(guarded.enter, "entering"), start(guarded.take, "taking")
    ended += [entering, taking]
    try:
        wait_until(lambda: at(entering, "with self.lock:") and at(taking, "self.lock.acquire(True, 10)"),
                   what="both threads at the lock")
        report = analyse(frames())
    finally:
        release.set()
    holder_tid = ended[0].native_id
    for thread in (entering, taking):
        row = row_of(report, thread)
        assert row["waits"] == f"Lock self.lock, held by thread 'holder' (tid {holder_tid})"
        assert row["owner_tid"] == holder_tid
    assert row_of(report, ended[0])["holds"] == ["guarded.lock"]
    assert row_of(report, ended[0])["waits"] == "Event release", "the holder waits too, on something else"
    assert report["deadlocks"] == []


def test_an_rlock_names_its_owner(ended: list[threading.Thread]) -> None:
    r = threading.RLock()
    held, release = threading.Event(), threading.Event()

    def owner() -> None:
        r.acquire()  # no with: the owner comes from the RLock itself
        held.set()
        release.wait(10)
        r.release()

    def waiter() -> None:
        with r:
            pass

    first = start(owner, "rlock-owner")
    held.wait(10)
    second = start(waiter, "rlock-waiter")
    ended += [first, second]
    try:
        wait_until(lambda: at(second, "with r:"), what="the waiter at the RLock")
        report = analyse(frames())
    finally:
        release.set()
    row = row_of(report, second)
    assert row["waits"] == f"RLock r, held by thread 'rlock-owner' (tid {first.native_id})"
    assert row["owner_tid"] == first.native_id
    assert row_of(report, first)["waits"] == "Event release"
    assert row_of(report, first)["holds"] == [], "acquired without a with: the RLock itself names its owner"


def test_a_free_lock_at_a_with_is_no_wait() -> None:
    frame = sys._getframe()
    assert lockexpr.blocking_call(frame, frozenset({"acquire"})) is None
    report = analyse({threading.get_ident(): frame})
    del frame
    assert report == {"threads": [], "deadlocks": []}


# ------------------------------------------------------------------------------------ Python-level waits
def test_event_queue_condition_join_semaphore_and_simplequeue(ended: list[threading.Thread]) -> None:
    ready = threading.Event()
    jobs: queue.Queue[int] = queue.Queue()
    full: queue.Queue[int] = queue.Queue(maxsize=1)
    full.put(0)
    cond = threading.Condition()
    sem = threading.Semaphore(0)
    simple: queue.SimpleQueue[int] = queue.SimpleQueue()

    def on_event() -> None:
        ready.wait()

    def on_get() -> None:
        jobs.get()

    def on_put() -> None:
        full.put(1)

    def on_condition() -> None:
        with cond:
            cond.wait()

    def on_semaphore() -> None:
        sem.acquire()

    def on_simple() -> None:
        simple.get()

    waiters = {f.__name__: start(f, f.__name__) for f in (on_event, on_get, on_put, on_condition, on_semaphore,
                                                          on_simple)}
    event_thread = waiters["on_event"]

    def on_join() -> None:
        event_thread.join()

    waiters["on_join"] = start(on_join, "on_join")
    ended += list(waiters.values())
    try:
        wait_until(lambda: all(in_function(t, "wait", "_wait_for_tstate_lock", "join", "on_simple")
                               for t in waiters.values()) and at(waiters["on_simple"], "simple.get()"),
                   what="every thread waiting")
        report = analyse(frames())
    finally:
        ready.set()
        jobs.put(1)
        full.get()
        with cond:
            cond.notify_all()
        sem.release()
        simple.put(1)
    said = {name: row_of(report, thread)["waits"] for name, thread in waiters.items()}
    assert said == {
        "on_event": "Event ready",
        "on_get": "Queue jobs (empty)",
        "on_put": "Queue full (full)",
        "on_condition": "Condition cond",
        "on_semaphore": "Semaphore sem",
        "on_simple": "SimpleQueue simple (empty)",
        "on_join": f"thread 'on_event' (tid {event_thread.native_id}) to end",
    }
    assert row_of(report, waiters["on_join"])["owner_tid"] == event_thread.native_id
    assert row_of(report, waiters["on_condition"])["holds"] == [], "Condition.wait let its lock go"
    assert report["deadlocks"] == []


def test_sleep_is_no_wait_and_a_timer_is_an_event(ended: list[threading.Thread]) -> None:
    stop = threading.Event()

    def sleeper() -> None:
        while not stop.is_set():
            time.sleep(0.01)

    thread = start(sleeper, "sleeper")
    ended.append(thread)
    try:
        wait_until(lambda: at(thread, "time.sleep(0.01)"), what="the sleeper in sleep")
        report = analyse(frames())
    finally:
        stop.set()
    assert all(row["name"] != "sleeper" for row in report["threads"])


def test_a_join_cycle_is_a_deadlock(ended: list[threading.Thread]) -> None:
    lock = threading.Lock()
    joined: list[threading.Thread] = []
    started, go = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with lock:
                started.set()
                go.wait(10)
                joined[0].join(10)
        except RuntimeError:
            pass

    def blocked() -> None:
        try:
            with lock:
                pass
        except RuntimeError:
            pass

    second = threading.Thread(target=blocked, name="blocked", daemon=True)
    joined.append(second)
    first = start(holder, "joiner")
    started.wait(10)
    second.start()
    go.set()
    ended += [first, second]
    try:
        wait_until(lambda: at(second, "with lock:") and in_function(first, "join", "_wait_for_tstate_lock"),
                   what="a join and a lock in a cycle")
        report = analyse(frames())
    finally:
        lock.release()
    assert len(report["deadlocks"]) == 1
    text = report["deadlocks"][0]["text"]
    assert f"thread 'joiner' holds lock and waits for thread 'blocked' (tid {second.native_id}) to end" in text
    assert "thread 'blocked' waits for lock" in text


# ---------------------------------------------------------------------------------- what it never does
class _Sly:
    """A lock behind a property: reading it would run user code, which the analysis never does."""

    reads = 0

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @property
    def lock(self) -> threading.Lock:
        type(self).reads += 1
        return self._lock

    def enter(self) -> None:
        with self.lock:
            pass


def test_no_user_code_runs_and_nothing_is_kept(ended: list[threading.Thread]) -> None:
    sly = _Sly()
    sly._lock.acquire()
    thread = start(sly.enter, "sly")
    ended.append(thread)

    class Payload:
        pass

    payload = Payload()
    kept = weakref.ref(payload)
    go = threading.Event()
    lock = threading.Lock()
    lock.acquire()

    def holding(item: object) -> None:
        with lock:
            del item

    holder = threading.Thread(target=holding, args=(payload,), name="holding", daemon=True)
    holder.start()
    del payload  # only the blocked thread's frame refers to it now
    ended.append(holder)
    try:
        wait_until(lambda: at(thread, "with self.lock:") and at(holder, "with lock:"), what="both blocked")
        reads = _Sly.reads
        report = analyse(frames())
        assert _Sly.reads == reads, "the property ran"
        assert all(row["name"] != "sly" for row in report["threads"]), "a lock behind a property is not named"
        assert row_of(report, holder)["waits"] == "Lock lock, owner unknown"
    finally:
        sly._lock.release()
        lock.release()
        go.set()
    holder.join(10)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        wait_until(lambda: kept() is None, what="the frame's object freed by reference counting alone")
    finally:
        if gc_was:
            gc.enable()


def test_parsed_sources_are_cached(ended: list[threading.Thread]) -> None:
    lock = threading.Lock()
    lock.acquire()

    def blocked() -> None:
        with lock:
            pass

    thread = start(blocked, "cached")
    ended.append(thread)
    try:
        wait_until(lambda: at(thread, "with lock:"), what="the thread at the lock")
        analyse(frames())
        parsed = lockexpr.SITES.parsed
        for _ in range(3):
            analyse(frames())
        assert lockexpr.SITES.parsed == parsed
    finally:
        lock.release()


def test_a_hundred_waiting_threads_and_a_deadlock_in_milliseconds(ended: list[threading.Thread]) -> None:
    gate = threading.Event()
    a, b = threading.Lock(), threading.Lock()
    def idle() -> None:
        gate.wait()

    many = [start(idle, f"idle-{i}") for i in range(100)]
    first, second = start_deadlock(a, b)
    ended += [*many, first, second]
    try:
        wait_until(lambda: at(first, "with b:") and at(second, "with a:")
                   and all(in_function(t, "wait") for t in many), what="all threads waiting")
        analyse(frames())  # warm: sources parsed once
        began = time.perf_counter()
        report = analyse(frames())
        took = time.perf_counter() - began
    finally:
        gate.set()
        a.release()
    print(f"analyse: {len(report['threads'])} threads listed (64 at most) in {took * 1000:.1f} ms")
    assert len(report["deadlocks"]) == 1
    assert len(report["threads"]) == 64 and {r["name"] for r in report["threads"][:2]} == {"one", "two"}
    assert took < 2.0


# ---------------------------------------------------------------------------------------- schema, view
def test_the_waits_request_is_part_of_the_schema() -> None:
    assert parse_request(waits_request()) == {"action": "waits", "stop": None}
    with pytest.raises(SchemaError, match="unknown field"):
        parse_request({"schema": 1, "action": "waits", "tid": 3})


def test_the_report_names_a_deadlock_with_both_stacks() -> None:
    waits = {
        "threads": [
            {"tid": 11, "name": "one", "waits": "Lock b, held by thread 'two' (tid 12)", "owner_tid": 12,
             "holds": ["a"], "stack": ["cell [3], line 5 in one"]},
            {"tid": 12, "name": "two", "waits": "Lock a, held by thread 'one' (tid 11)", "owner_tid": 11,
             "holds": ["b"], "stack": ["cell [3], line 11 in two"]},
        ],
        "deadlocks": [{"tids": [11, 12], "text": "deadlock: thread 'one' holds a and waits for b; ..."}],
    }
    lines = _report.deadlocks_section({"waits": waits})  # type: ignore[typeddict-item]
    assert lines[0] == "Deadlock: deadlock: thread 'one' holds a and waits for b; ..."
    assert "  thread 'one' (tid 11): holds a; waits on Lock b, held by thread 'two' (tid 12)" in lines
    assert "      cell [3], line 5 in one" in lines and "      cell [3], line 11 in two" in lines
    assert _report.deadlocks_section({"waits": None}) == []  # type: ignore[typeddict-item]


# ------------------------------------------------------------------------------------------------ kernels
BACKGROUND = """\
import threading
a = threading.Lock(); b = threading.Lock()
got_a = threading.Event(); got_b = threading.Event()
def one():
    try:
        with a:
            got_a.set(); got_b.wait(30)
            with b:
                pass
    except RuntimeError:
        pass
def two():
    try:
        with b:
            got_b.set(); got_a.wait(30)
            with a:
                pass
    except RuntimeError:
        pass
dl_one = threading.Thread(target=one, name="dl-one", daemon=True); dl_one.start()
dl_two = threading.Thread(target=two, name="dl-two", daemon=True); dl_two.start()
"""


def _line(source: str, text: str, occurrence: int = 1) -> int:
    lines = [i + 1 for i, line in enumerate(source.splitlines()) if line.strip() == text]
    return lines[occurrence - 1]


@pytest.mark.kernel
def test_threads_magic_names_a_deadlock_of_a_cells_threads(kernel: Kernel) -> None:
    cell = kernel.run(BACKGROUND).reply["content"]["execution_count"]
    try:
        def deadlocked() -> str | None:
            text = kernel.run("%nbcoord threads").stdout
            return text if "Deadlock:" in text else None

        text = wait_until(deadlocked, timeout=20, interval=0.1, what="%nbcoord threads naming the deadlock")
    finally:
        kernel.run("a.release(); dl_one.join(10); dl_two.join(10)")
    assert "thread 'dl-one' holds a and waits for b" in text
    assert "thread 'dl-two' holds b and waits for a" in text
    assert f"cell [{cell}], line {_line(BACKGROUND, 'with b:', 1)} in one" in text
    assert f"cell [{cell}], line {_line(BACKGROUND, 'with a:', 2)} in two" in text
    assert "waits on Lock b, held by thread 'dl-two'" in text, "the thread's own line says what it waits on"
    assert kernel.evaluate("[dl_one.is_alive(), dl_two.is_alive()]") == [False, False]


def ask(kernel: Kernel, content: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
    """Send an ``nbcoord_request`` on the control channel, as the server does; its reply's content."""
    msg_id = kernel.send_control("nbcoord_request", content)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = kernel.kc.control_channel.get_msg(timeout=0.5)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["header"]["msg_type"] == "nbcoord_reply"
            content_: dict[str, Any] = reply["content"]
            return content_
    raise AssertionError(f"no reply to {content} within {timeout} s")


MAIN_BLOCKED = """\
import threading
a = threading.Lock(); b = threading.Lock(); got_b = threading.Event()
def helper():
    with b:
        got_b.set()
        with a:
            pass
with a:
    threading.Thread(target=helper, name="helper", daemon=True).start()
    got_b.wait(30)
    with b:
        pass
"""


@pytest.mark.kernel
def test_the_control_channel_names_a_deadlock_of_the_main_thread(kernel: Kernel) -> None:
    msg_id = kernel.submit(MAIN_BLOCKED)
    try:
        def deadlocked() -> dict[str, Any] | None:
            answer = ask(kernel, waits_request())
            assert answer["status"] == "ok", answer
            return answer if answer["waits"]["deadlocks"] else None

        answer = wait_until(deadlocked, timeout=20, interval=0.1, what="a waits reply naming the deadlock")
    finally:
        kernel.interrupt()  # the main thread's acquire is interrupted: its `with a:` lets a go, the helper ends
        kernel.collect(msg_id)
    assert answer["action"] == "waits" and answer["schema"] == 1
    deadlock = answer["waits"]["deadlocks"][0]
    assert "thread 'MainThread' holds a and waits for b" in deadlock["text"]
    assert "thread 'helper' holds b and waits for a" in deadlock["text"]
    rows = {row["name"]: row for row in answer["waits"]["threads"]}
    main = rows["MainThread"]
    assert set(deadlock["tids"]) == {main["tid"], rows["helper"]["tid"]}
    assert main["holds"] == ["a"] and main["owner_tid"] == rows["helper"]["tid"]
    assert main["stack"][-1].endswith(f"line {_line(MAIN_BLOCKED, 'with b:', 2)} in <module>"), main["stack"]
    assert main["stack"][-1].startswith("cell [")
    assert rows["helper"]["stack"][-1].endswith(f"line {_line(MAIN_BLOCKED, 'with a:', 1)} in helper")
    assert kernel.evaluate("1 + 1") == 2, "the kernel goes on after the interrupt"


def test_lock_internals_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbcoord.core import internals
    from nbcoord.core.fallbacks import Fallbacks

    monkeypatch.setattr(internals, "_fallbacks", Fallbacks())
    r = threading.RLock()
    assert internals.rlock_owner(r) is None
    with r:
        assert internals.rlock_owner(r) == threading.get_ident()
    python_rlock = threading._RLock()  # type: ignore[attr-defined]
    with python_rlock:
        assert internals.rlock_owner(python_rlock) == threading.get_ident()
    assert internals.condition_lock(threading.Condition(r)) is r
    monkeypatch.delattr(threading, "_RLock")
    assert len(internals.lock_types()) == 2
    assert internals.condition_lock(object()) is None
    assert {"threading._RLock", "Condition._lock"} <= set(internals.degraded())
