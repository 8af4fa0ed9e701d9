"""The kernel's own threads are never harmed: only threads that cells started are the user's.

Real kernels, nbcoord loaded by ``%load_ext`` and by IPython's configuration (as a server-wide set-up loads it,
before ipykernel starts its parent poller outside any cell). Every stop route is tried against the kernel's threads
(IOPub, Control, heartbeat, shell channel, parent poller): each is refused by name, none is touched, and the kernel
answers and shuts down normally afterwards.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import Kernel, kernel_params
from interpreters import KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

KERNEL_THREADS = """
import json, threading, nbcoord
kernel_rows = [r for r in nbcoord.snapshot()["threads"] if r["alive"] and not r["user"]]
kernel_objects = {t.ident: t for t in threading.enumerate() if t is not threading.main_thread()}
"""


#: A kernel per test (conftest's ``own_kernel``: the tests end it), on every kernel interpreter, nbcoord loaded.
KERNEL_OPTIONS = kernel_params(KERNEL_PYTHONS)


def kernel_threads(kernel: Kernel) -> list[dict[str, Any]]:
    kernel.run(KERNEL_THREADS)
    rows: list[dict[str, Any]] = kernel.evaluate("[{'tid': r['tid'], 'name': r['name']} for r in kernel_rows]")
    return rows


def all_kernel_threads_alive(kernel: Kernel) -> bool:
    return bool(kernel.evaluate("all(t.is_alive() for t in kernel_objects.values())"))


def assert_exits_cleanly(kernel: Kernel) -> float:
    started = time.monotonic()
    kernel.request_shutdown()
    status = kernel.wait_exit(timeout=10)
    took = time.monotonic() - started
    assert status == 0, f"exit status {status} after a shutdown request"
    return took


def test_stop_by_id_refuses_every_kernel_thread(own_kernel: Kernel) -> None:
    loaded_kernel = own_kernel
    rows = kernel_threads(loaded_kernel)
    names = {row["name"] for row in rows}
    assert {"Control", "IOPub"} <= names or len(rows) >= 3, names
    for row in rows:
        result = loaded_kernel.run(f"%nbcoord stop --thread {row['tid']} --force --grace 0.2", allow_error=True)
        assert result.status == "error"
        message = result.errors[0]["evalue"] if result.errors else result.text
        assert row["tid"] in message and "not started by a cell" in message, message
    # The API refuses the same way, with a ValueError.
    loaded_kernel.run(
        "refusals = []\n"
        "for r in kernel_rows:\n"
        "    try:\n"
        "        nbcoord.stop_all(thread=r['tid'], force=True, grace=0.2)\n"
        "    except ValueError as exc:\n"
        "        refusals.append(str(exc))\n"
    )
    refusals = loaded_kernel.evaluate("refusals")
    assert len(refusals) == len(rows) and all("not started by a cell" in text for text in refusals)
    # Neither a stop of everything, forced, nor of the zombies touches them.
    report = loaded_kernel.evaluate("nbcoord.stop_all(force=True, grace=0.3)")
    assert report["stopped"] == [] and report["alive"] == []
    loaded_kernel.evaluate("nbcoord.stop_all(zombies=True, force=True, grace=0.3)['stopped']")
    assert all_kernel_threads_alive(loaded_kernel)
    assert loaded_kernel.evaluate("1 + 1") == 2
    assert_exits_cleanly(loaded_kernel)


# nbcoord loaded by IPython's configuration, before ipykernel starts its parent poller.
@pytest.mark.parametrize("own_kernel", kernel_params(KERNEL_PYTHONS, nbcoord="config"), indirect=True)
def test_loaded_by_configuration_the_parent_poller_is_the_kernels(own_kernel: Kernel) -> None:
    configured_kernel = own_kernel
    configured_kernel.run("import nbcoord")
    assert configured_kernel.evaluate("nbcoord._extension is not None")
    rows = kernel_threads(configured_kernel)
    user = configured_kernel.evaluate("[r['name'] for r in nbcoord.snapshot()['threads'] if r['user']]")
    assert user == [], f"kernel threads counted as the user's: {user}"
    assert configured_kernel.evaluate("nbcoord.snapshot()['zombie_count']") == 0
    report = configured_kernel.evaluate("nbcoord.stop_all(force=True, grace=0.3)")
    assert report["stopped"] == [] and report["alive"] == []
    assert rows and all_kernel_threads_alive(configured_kernel)
    # A thread a cell starts is the user's, and stops; the kernel's stay.
    configured_kernel.run(
        "import threading\n"
        "def coop():\n"
        "    while not nbcoord.should_stop():\n"
        "        threading.Event().wait(0.01)\n"
        "threading.Thread(target=coop, name='cell-thread').start()"
    )
    report = configured_kernel.evaluate("nbcoord.stop_all(grace=5)")
    assert [row["name"] for row in report["stopped"]] == ["cell-thread"]
    assert all_kernel_threads_alive(configured_kernel)
    assert_exits_cleanly(configured_kernel)


@pytest.mark.parametrize("own_kernel", kernel_params(KERNEL_PYTHONS, nbcoord="off"), indirect=True)
def test_threads_of_the_loading_cell_are_that_cells(own_kernel: Kernel) -> None:
    kernel = own_kernel
    result = kernel.run(
        "%load_ext nbcoord\n"
        "import threading, nbcoord\n"
        "def coop():\n"
        "    while not nbcoord.should_stop():\n"
        "        threading.Event().wait(0.01)\n"
        "same_cell = threading.Thread(target=coop, name='same-cell-as-load')\n"
        "same_cell.start()"
    )
    count = int(result.reply["content"]["execution_count"])
    row = kernel.evaluate("next(r for r in nbcoord.snapshot()['threads'] if r['name'] == 'same-cell-as-load')")
    assert row["user"] and row["cell"] == count
    report = kernel.evaluate(f"nbcoord.stop_all(cell={count}, grace=5)")
    assert [r["name"] for r in report["stopped"]] == ["same-cell-as-load"]


IDLE_WINDOW_S = 3.0


def test_an_idle_kernel_has_one_thread_of_nbcoords_whose_monitor_sleeps_while_nothing_is_live(
    own_kernel: Kernel,
) -> None:
    """Issue 26: with nothing live the monitor ticks only on events (a cell ends: one tick), not every interval;
    with a thread a cell started alive it keeps the interval. Ticks are counted by a task added for the test, over
    a window of many intervals with no cell running (a measured span: the counts, not the time, are asserted)."""
    own_kernel.run(
        "%nbcoord config monitor_interval=0.1\n"
        "import threading, time, nbcoord\n"
        "ticks = []\n"
        "nbcoord._extension.host.monitor.add_task('test-ticks', lambda: ticks.append(time.monotonic()) and False)"
    )
    own_kernel.run("mark = time.monotonic()")
    time.sleep(IDLE_WINDOW_S)  # the kernel idle, no cell running: the window the ticks are counted over
    quiet_ticks = own_kernel.evaluate("len([t for t in ticks if t > mark])")
    names = own_kernel.evaluate("sorted(t.name for t in threading.enumerate() if t.name.startswith('nbcoord-'))")
    assert names == ["nbcoord-monitor"], names
    # At the interval there would be about 30; the cell that set `mark` ended: one tick for that event.
    assert quiet_ticks <= 2, f"{quiet_ticks} monitor ticks in {IDLE_WINDOW_S} s with nothing live"

    own_kernel.run(
        "stop_sleeper = threading.Event()\n"
        "threading.Thread(target=stop_sleeper.wait, name='sleeper').start()\n"
        "mark = time.monotonic()"
    )
    time.sleep(IDLE_WINDOW_S)  # the same window with a thread a cell started alive (it waits, changing nothing)
    live_ticks = own_kernel.evaluate("len([t for t in ticks if t > mark])")
    own_kernel.run("stop_sleeper.set()")
    assert live_ticks >= 10, f"only {live_ticks} monitor ticks in {IDLE_WINDOW_S} s while a cell's thread was alive"
