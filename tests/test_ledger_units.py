"""The ledger without a kernel: its internals and their fallbacks, the task factory, the escalation of a stop,
install and unload in an in-process shell, and the forked child where nothing of it acts.

Internals are taken away one at a time (``monkeypatch``, restored after each test) on real objects of the
libraries, and each fallback is checked along with what :func:`degraded` says.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.pool import Pool, ThreadPool
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from helpers import wait_until
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output

import nbcoord
from nbcoord.core.fallbacks import Fallbacks
from nbcoord.ledger import internals, processes, task_cells, tasks
from nbcoord.ledger import ledger as ledger_module
from nbcoord.ledger.pools import PoolLedger
from nbcoord.ledger.stopping import WorkerStop, wait_all
from nbcoord.ledger.task_cells import make_factory
from nbcoord.ledger.tasks import innermost_frames

FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def no_running_loop() -> Iterator[None]:
    """These tests run event loops in pytest's main thread. Playwright's sync API (the browser tests' Chromium, kept
    for the whole session) leaves its own loop marked as running there, so hide it for the test and put it back."""
    running = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(running)


@pytest.fixture(autouse=True)
def fresh_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "_fallbacks", Fallbacks())


# ------------------------------------------------------------------------------------------------ internals
def test_pool_internals_and_their_fallbacks() -> None:
    with ThreadPool(2) as pool:
        assert len(internals.pool_workers(pool)) == 2
        assert internals.pool_state(pool) == "RUN"
        assert len(internals.pool_threads(pool)) == 3
        assert internals.degraded() == {}
    bare = SimpleNamespace()
    assert internals.pool_workers(bare) == [] and internals.pool_state(bare) is None
    assert internals.pool_threads(bare) == []
    assert set(internals.degraded()) == {"Pool._pool", "Pool._state", "Pool._worker_handler"}


def test_executor_internals_and_their_fallbacks() -> None:
    executor = ProcessPoolExecutor(1, mp_context=FORK)
    try:
        assert internals.executor_processes(executor) == []  # no worker before the first submit
        assert internals.executor_shut_down(executor) is False
        assert internals.executor_threads(executor) == []
        assert executor.submit(abs, -2).result(timeout=30) == 2
        assert len(internals.executor_processes(executor)) == 1
        assert [t.name for t in internals.executor_threads(executor)] != []
        assert internals.degraded() == {}
    finally:
        executor.shutdown()
    assert internals.executor_shut_down(executor) is True
    bare = SimpleNamespace()
    assert internals.executor_processes(bare) == [] and internals.executor_shut_down(bare) is None
    assert internals.executor_threads(bare) == []
    assert set(internals.degraded()) == {
        "ProcessPoolExecutor._processes",
        "ProcessPoolExecutor._shutdown_thread",
        "ProcessPoolExecutor._executor_manager_thread",
    }


def test_queue_feeder_threads_and_their_fallback() -> None:
    queue = FORK.Queue()
    holder = SimpleNamespace(queues=[queue], missing=None)
    assert internals.queue_feeder_threads(holder, ("queues", "missing")) == []  # no put yet: no thread
    queue.put(1)
    assert queue.get(timeout=10) == 1
    assert len(internals.queue_feeder_threads(holder, ("queues",))) == 1
    queue.close()
    queue.join_thread()
    assert internals.queue_feeder_threads(SimpleNamespace(q=object()), ("q",)) == []
    assert "multiprocessing.Queue._thread" in internals.degraded()


def test_cancel_delivery_and_its_fallback() -> None:
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(asyncio.sleep(10))
        loop.run_until_complete(asyncio.sleep(0))
        task.cancel()
        assert internals.cancel_delivered(task) is False  # requested, not yet thrown in
        loop.run_until_complete(asyncio.sleep(0))
        assert task.done() and internals.cancel_delivered(task) is True
    finally:
        loop.close()
    assert internals.cancel_delivered(object()) is None
    assert "Task._must_cancel / _fut_waiter" in internals.degraded()


def test_loader_internals_fall_back_on_an_unknown_object() -> None:
    bare = SimpleNamespace()
    assert internals.loader_iterator_class(SimpleNamespace()) is None
    assert internals.loader_workers(bare) == [] and internals.loader_shut_down(bare) is False
    assert internals.loader_shutdown_method(bare) is None and internals.loader_pin_memory_thread(bare) is None
    assert internals.loader_settings(bare) == (None, False)
    internals.loader_forget_worker_pids(bare)
    assert set(internals.degraded()) == {
        "torch.utils.data.dataloader._MultiProcessingDataLoaderIter",
        "_MultiProcessingDataLoaderIter._workers",
        "_MultiProcessingDataLoaderIter._shutdown",
        "_MultiProcessingDataLoaderIter._shutdown_workers",
        "torch.utils.data._utils.signal_handling._remove_worker_pids",
    }


@pytest.mark.skipif("torch" not in sys.modules and __import__("importlib").util.find_spec("torch") is None,
                    reason="PyTorch is not installed")
def test_loader_internals_on_pytorchs_own_iterator() -> None:
    from torch.utils.data import DataLoader, dataloader

    iterator = iter(DataLoader(list(range(8)), num_workers=2, persistent_workers=True))
    try:
        assert internals.loader_iterator_class(dataloader) is type(iterator)
        assert len(internals.loader_workers(iterator)) == 2
        assert internals.loader_settings(iterator) == (2, True)
        assert internals.loader_shut_down(iterator) is False
        internals.loader_forget_worker_pids(iterator)
        assert iterator._worker_pids_set is False
    finally:
        shutdown = internals.loader_shutdown_method(iterator)
        shutdown()
    assert internals.loader_shut_down(iterator) is True
    assert internals.degraded() == {}


def test_helper_processes_and_their_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    pid = resource_tracker._resource_tracker._pid
    assert internals.helper_processes()[pid] == "multiprocessing's resource tracker"
    monkeypatch.setattr(resource_tracker, "_resource_tracker", SimpleNamespace())
    assert pid not in internals.helper_processes()
    assert "multiprocessing.resource_tracker._resource_tracker._pid" in internals.degraded()


def test_a_resource_tracker_retired_at_shutdown_cleans_up_and_is_not_relaunched() -> None:
    from multiprocessing import resource_tracker

    tracker = resource_tracker.ResourceTracker()  # one of its own: the test process keeps its real one
    tracker.ensure_running()
    pid = tracker._pid
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    internals._retire_tracker(tracker)()
    assert not psutil.pid_exists(pid), "the tracker exits once the kernel's end of its pipe is gone, and is reaped"
    tracker.ensure_running()  # what a queue collected late does: no new tracker is launched
    assert tracker._pid is None


def test_helper_stops_fall_back_to_killing(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import resource_tracker

    monkeypatch.setattr(resource_tracker, "_resource_tracker", SimpleNamespace(_pid=os.getpid()))
    assert (os.getpid(), "multiprocessing's resource tracker", None) in internals.helper_stops()
    assert "multiprocessing.resource_tracker._resource_tracker" in internals.degraded()


# ------------------------------------------------------------------------------------------------- tasks
def test_the_factory_chains_and_records_only_cells_tasks() -> None:
    recorded: list[Any] = []
    made: list[str] = []

    def users(loop: Any, coro: Any, **kwargs: Any) -> Any:
        made.append(coro.__name__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def work() -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(make_factory(users))
        await asyncio.create_task(work())  # no cell: not recorded
        task_cells.CELL.set(recorded.append)  # what a cell's start sets: that cell's recorder
        task = asyncio.create_task(work(), name="named")
        await task
        assert task.get_name() == "named"
        assert recorded == [task]

    asyncio.run(main())
    assert made[:2] == ["work", "work"]  # then asyncio.run's own shutdown tasks


def test_where_a_task_waits_is_its_innermost_frame() -> None:
    async def inner() -> None:
        await asyncio.sleep(10)

    async def outer() -> None:
        await inner()

    async def main() -> list[str]:
        task = asyncio.create_task(outer())
        await asyncio.sleep(0)
        names = [frame.f_code.co_name for frame in innermost_frames(task.get_coro())]
        task.cancel()
        return names

    assert asyncio.run(main()) == ["outer", "inner", "sleep"]


# ----------------------------------------------------------------------------------------- worker stops
def _ignore_sigterm_and_sleep() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def test_a_worker_that_ignores_sigterm_is_killed_before_the_deadline() -> None:
    worker = FORK.Process(target=_ignore_sigterm_and_sleep, daemon=True)
    worker.start()
    item: Any = {"id": "pool-9", "kind": "pool", "label": "a test pool", "cell": 3, "stopped": False, "reason": None}
    stop = WorkerStop(item, "nothing", None, [worker])
    started = time.monotonic()
    wait_all([stop], started, started + 1.0)
    outcome = stop.outcome()
    assert outcome["stopped"], outcome
    assert outcome["reason"] == "1 worker(s) got SIGTERM; 1 worker(s) got SIGKILL", outcome
    assert time.monotonic() - started < 1.0
    assert worker.exitcode == -signal.SIGKILL  # reaped through its own object: the status is kept


# ---------------------------------------------------------------------------------------- in-process shell
@pytest.fixture
def shell() -> Iterator[Any]:
    """The in-process shell with nbcoord and its ledger loaded; unloaded afterwards."""
    globalipapp.start_ipython()  # type: ignore[no-untyped-call]
    ip = globalipapp.get_ipython()  # type: ignore[no-untyped-call]
    assert nbcoord._extension is None
    ip.run_line_magic("load_ext", "nbcoord")
    if ledger_module.current() is None:  # until nbcoord/_wiring.py installs it itself
        nbcoord._extension.host.add_undo(ledger_module.watch(nbcoord._extension.host, nbcoord._extension.probe))
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "nbcoord")


def run(ip: Any, code: str) -> int:
    with capture_output():
        result = ip.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec
    return int(result.execution_count)


def test_unload_puts_back_exactly_what_it_changed(shell: Any) -> None:
    import concurrent.futures.process as cf_process

    policy = internals.event_loop_policy()
    assert "new_event_loop" in vars(policy)
    assert hasattr(vars(Pool)["__init__"], "__wrapped__")
    assert hasattr(vars(cf_process.ProcessPoolExecutor)["__init__"], "__wrapped__")
    shell.run_line_magic("unload_ext", "nbcoord")
    try:
        assert "new_event_loop" not in vars(policy)
        assert not hasattr(vars(Pool)["__init__"], "__wrapped__")
        assert not hasattr(vars(cf_process.ProcessPoolExecutor)["__init__"], "__wrapped__")
        assert ledger_module.current() is None
    finally:
        shell.run_line_magic("load_ext", "nbcoord")
        if ledger_module.current() is None:
            nbcoord._extension.host.add_undo(ledger_module.watch(nbcoord._extension.host, nbcoord._extension.probe))


def test_a_thread_pool_and_a_threads_loop_are_their_cells(shell: Any) -> None:
    cell = run(
        shell,
        "import asyncio, threading\n"
        "from multiprocessing.pool import ThreadPool\n"
        "POOL = ThreadPool(2)\n"
        "async def forever():\n"
        "    await asyncio.sleep(3600)\n"
        "async def main():\n"
        "    try:\n"
        "        await asyncio.gather(forever(), forever())\n"
        "    except asyncio.CancelledError:\n"
        "        pass\n"
        "RUNNER = threading.Thread(target=asyncio.run, args=(main(),))\n"
        "RUNNER.start()",
    )

    def rows() -> list[dict[str, Any]]:
        found = [r for r in nbcoord.snapshot()["ledger"] if r["cell"] == cell]
        return found if len(found) == 4 else []

    found = wait_until(rows, timeout=10, what="the pool and three tasks")
    assert sorted(r["kind"] for r in found) == ["pool", "task", "task", "task"]
    pool = next(r for r in found if r["kind"] == "pool")
    assert pool["label"] == "multiprocessing.ThreadPool, 2 threads" and pool["pids"] == []
    report = nbcoord.stop_all(cell=cell)
    assert sorted((i["kind"], i["stopped"]) for i in report["items"]) == [
        ("pool", True),
        ("task", True),
        ("task", True),
        ("task", True),
    ], report["items"]
    wait_until(lambda: not shell.user_ns["RUNNER"].is_alive(), timeout=5)
    assert [r for r in nbcoord.snapshot()["ledger"] if r["cell"] == cell] == []


def _in_child(directory: str) -> None:
    """In a forked child of a process with the ledger loaded: nothing of it acts, everything still works."""
    ledger = ledger_module.current()
    pools = next(kind for kind in ledger.kinds if isinstance(kind, PoolLedger)) if ledger is not None else None
    before = len(pools._pools) if pools is not None else -1
    with ThreadPool(1) as pool:
        squares = pool.map(abs, [-1, -2])

    async def main() -> int:
        return await asyncio.create_task(asyncio.sleep(0, result=7))

    out = {
        "active": ledger.active if ledger is not None else None,
        "pools_registered": (len(pools._pools) if pools is not None else -1) - before,
        "squares": squares,
        "asyncio": asyncio.run(main()),
    }
    Path(directory, "child.json").write_text(json.dumps(out))


def test_nothing_of_the_ledger_acts_in_a_forked_child(shell: Any, tmp_path: Path) -> None:
    run(shell, "x = 1")  # a cell ran: a pool made now would be that cell's in the parent
    child = FORK.Process(target=_in_child, args=(str(tmp_path),))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    out = json.loads((tmp_path / "child.json").read_text())
    assert out == {"active": False, "pools_registered": 0, "squares": [1, 2], "asyncio": 7}
    ledger = ledger_module.current()
    assert ledger is not None and ledger.active, "the parent's ledger is untouched"


def test_a_policy_the_user_installs_is_watched_from_the_next_cell(shell: Any) -> None:
    old = internals.event_loop_policy()
    try:
        run(shell, "import asyncio\nasyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())")
        new = internals.event_loop_policy()
        assert new is not old and "new_event_loop" not in vars(new)
        cell = run(shell, "LOOP = asyncio.new_event_loop()")  # the next cell watches the new policy
        assert "new_event_loop" in vars(new) and "new_event_loop" not in vars(old)
        run(shell, "async def forever():\n    await asyncio.sleep(3600)\nT = LOOP.create_task(forever())")
        rows = [r for r in nbcoord.snapshot()["ledger"] if r["kind"] == "task" and r["cell"] == cell + 1]
        assert len(rows) == 1 and "forever()" in rows[0]["label"], rows
        run(shell, "T.cancel(); LOOP.run_until_complete(asyncio.sleep(0)); LOOP.close()")
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the policy system is deprecated from 3.14 on
            asyncio.set_event_loop_policy(old)


class _Broken:
    """A kind whose stop fails: the others must still stop, and the report must say so."""

    name = "broken"

    def rows(self) -> list[Any]:
        raise RuntimeError("no rows")

    def begin_stop(self, scope: Any) -> list[Any]:
        raise RuntimeError("boom")

    def tick(self) -> None:
        pass

    def uninstall(self) -> None:
        pass


def test_a_failing_kind_keeps_neither_the_others_nor_the_snapshot_from_working(shell: Any) -> None:
    ledger = ledger_module.current()
    assert ledger is not None
    remove = ledger.add_kind(_Broken())
    try:
        cell = run(shell, "from multiprocessing.pool import ThreadPool\nPOOL = ThreadPool(1)")
        assert [r["kind"] for r in nbcoord.snapshot()["ledger"] if r["cell"] == cell] == ["pool"]
        items = {i["kind"]: i for i in nbcoord.stop_all(cell=cell)["items"]}
        assert items["pool"]["stopped"] is True
        assert items["broken"]["stopped"] is False
        assert items["broken"]["reason"] == "the stop failed: RuntimeError: boom"
    finally:
        remove()


def test_the_process_tree_is_the_same_from_thread_lists_and_from_one_pass_over_proc() -> None:
    # A kernel with more than TASK_SCAN_LIMIT threads reads its tree from /proc/*/stat instead of each thread's
    # children list (20 ms at 1000 threads): both must find the same descendants, a grandchild included.
    import subprocess

    from nbcoord.resources import proc

    if not proc.HAS_CHILDREN_LISTS:
        pytest.skip("no /proc/<pid>/task/<tid>/children here")
    # Each in its own session, so that the grandchild is killed with its group and leaves no orphan.
    commands = (["sleep", "30"], ["sh", "-c", "sleep 30 & wait"])
    children = [subprocess.Popen(command, start_new_session=True) for command in commands]
    try:
        me = os.getpid()

        def grandchild_seen() -> bool:
            tree = proc.descendants_from_stat(me)
            return any(parent == children[1].pid for _pid, parent in tree)

        wait_until(grandchild_seen, 10, what="the shell's own sleep")
        by_threads = proc.descendants(me)
        by_stat = proc.descendants_from_stat(me)
        assert by_threads is not None
        assert set(by_threads) == set(by_stat)
        assert {children[0].pid, children[1].pid} <= {pid for pid, parent in by_stat if parent == me}
        stop = threading.Event()
        extra = [threading.Thread(target=stop.wait) for _ in range(proc.TASK_SCAN_LIMIT + 1)]
        for thread in extra:
            thread.start()
        try:
            assert set(proc.descendants(me) or []) == set(by_stat)  # now through the one pass
        finally:
            stop.set()
            for thread in extra:
                thread.join()
    finally:
        for child in children:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_cells_queues_stay_bounded_between_the_monitors_ticks(shell: Any) -> None:
    """Every look for new tasks walks the cells' queues: cells run faster than the monitor ticks, so making a cell's
    queue prunes too. The queue of a cell with a live task is kept, and its task keeps its cell."""
    ledger = ledger_module.current()
    assert ledger is not None
    kind = next(k for k in ledger.kinds if k.name == "task")
    assert isinstance(kind, tasks.TaskLedger)
    cell = run(
        shell,
        "import asyncio\nLOOP = asyncio.new_event_loop()\n"
        "async def forever():\n    await asyncio.sleep(3600)\nT = LOOP.create_task(forever())",
    )
    limit = tasks.RECENT_QUEUES + tasks.QUEUE_SLACK
    try:
        for _ in range(limit + 50):
            run(shell, "pass")
            assert len(kind._queues) <= limit
        rows = [r for r in nbcoord.snapshot()["ledger"] if r["kind"] == "task" and "forever()" in r["label"]]
        assert [r["cell"] for r in rows] == [cell], rows
    finally:
        run(shell, "T.cancel(); LOOP.run_until_complete(asyncio.sleep(0)); LOOP.close()")


def test_a_child_reaped_by_its_owner_while_the_stop_reaps_is_reaped_not_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stop saw an exited child; before its waitpid, the child's owner (a pool's management thread) reaped it:
    # waitpid says it is no child of ours any more. That is reaped, not "could not be reaped" (the demo notebook
    # 13 reported a loky worker STILL ALIVE that way, at random).
    pid = os.getppid()  # a process that exists and is not our child: waitpid raises ChildProcessError for it
    seen = iter([True, True, False])  # there at the stop's first two looks, gone after the waitpid
    monkeypatch.setattr(processes, "_exists", lambda _pid: next(seen))
    assert processes.reap({pid}) == {pid: "already reaped by its owner"}
