"""asyncio tasks in the ledger (S11), in real kernels: ipykernel 7 on every kernel Python, and ipykernel 6.

A cell that is interrupted leaves tasks on the kernel's event loop (one that swallows ``CancelledError``, one that a
task of that cell created); they are in ``snapshot()["ledger"]`` and ``%nbcoord`` with their cell, the reason and
the line they wait on; ``%nbcoord stop --zombies`` (in a cell, on the loop's own thread) cancels them and says
they end when the cell returns, which ``asyncio.all_tasks()`` then shows; a stop from another thread awaits them
and names the one that swallowed the cancellation. Tasks of a loop that a cell's thread runs (``asyncio.run``)
belong to that cell and are stopped by a stop of it. A task factory the user set is chained and is back after
unload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import IK6, KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

#: Run after ``%load_ext nbcoord``. Until nbcoord/_wiring.py installs the ledger itself, the test installs it (a no-op
#: once it does).
LOAD = """import nbcoord
from nbcoord.ledger import ledger as _ledger
if _ledger.current() is None:
    nbcoord._extension.host.add_undo(_ledger.watch(nbcoord._extension.host, nbcoord._extension.probe))
"""

SETUP = """import asyncio, json, threading, time
RELEASE = False
async def poll_forever():
    while True:
        await asyncio.sleep(0.02)
async def stubborn():
    while not RELEASE:
        try:
            await asyncio.sleep(0.02)  # where it waits
        except asyncio.CancelledError:
            pass  # swallowed
async def parent():
    global CHILD
    CHILD = asyncio.ensure_future(poll_forever())
    await asyncio.sleep(3600)
def others():
    # The tests' own tasks on the kernel's loop (the kernel runs tasks of its own there too).
    names = (t.get_coro().__qualname__ for t in asyncio.all_tasks())
    return sorted(n for n in names if n in ("poll_forever", "stubborn", "parent"))
"""

#: The cell run after the load: the ledger watching, then :data:`SETUP`.
AFTER_LOAD = LOAD + SETUP

#: The line of that cell where ``stubborn`` waits.
STUBBORN_LINE = next(n for n, line in enumerate(AFTER_LOAD.splitlines(), 1) if "# where it waits" in line)

#: A task factory of the user's, set before nbcoord loads: it must stay in charge, and be back after unload.
USERS_FACTORY = (
    "import asyncio\nMADE = []\n"
    "def users_factory(loop, coro, **kw):\n"
    "    MADE.append(coro.__qualname__)\n"
    "    return asyncio.Task(coro, loop=loop, **kw)\n"
    "asyncio.get_running_loop().set_task_factory(users_factory)"
)

#: The module's kernel (conftest's ``kernel``): every kernel Python with ipykernel 7, and ipykernel 6.
KERNEL_OPTIONS = kernel_params([*KERNEL_PYTHONS, IK6], setup=USERS_FACTORY, after=AFTER_LOAD)


def setup_cell(kernel: Kernel) -> int:
    """The execution count of the cell that defined ``stubborn`` (the kernel's set-up cell after the load)."""
    count: int = kernel.evaluate("min(i for i, source in enumerate(In) if 'async def stubborn' in source)")
    return count


def interrupt_cell(kernel: Kernel, code: str, tmp_path: Path) -> int:
    """Run ``code`` in a cell, interrupt it once it wrote its marker, return its execution count."""
    marker = tmp_path / "running"
    msg_id = kernel.submit(f"{code}\nopen({str(marker)!r}, 'w').close()\ntime.sleep(120)")
    wait_until(marker.exists, timeout=30, what="the cell to start its tasks")
    kernel.interrupt()
    result = kernel.collect(msg_id)
    assert result.status == "error" and result.errors[0]["ename"] == "KeyboardInterrupt", result.text
    return int(result.reply["content"]["execution_count"])


def task_rows(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate("[r for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'task']")
    return rows


def test_tasks_left_by_an_interrupted_cell(kernel: Kernel, tmp_path: Path) -> None:
    cell = interrupt_cell(
        kernel,
        "T1 = asyncio.ensure_future(poll_forever())\n"
        "T2 = asyncio.get_running_loop().create_task(stubborn())\n"
        "T3 = asyncio.ensure_future(parent())",
        tmp_path,
    )
    # In the ledger, with the cell, the reason and where each waits (the child: created by a task of the cell).
    rows = wait_until(lambda: (r := task_rows(kernel)) and len(r) == 4 and r, timeout=10, what="4 task rows")
    assert sorted(row["label"].rsplit(": ", 1)[1] for row in rows) == [
        "parent()",
        "poll_forever()",
        "poll_forever()",
        "stubborn()",
    ]
    setup = setup_cell(kernel)
    for row in rows:
        assert row["cell"] == cell, row
        assert row["zombie"] == "cell-interrupted", row
        assert row["id"].startswith("task-")
        assert "on the kernel's event loop" in row["detail"], row
    stubborn = next(row for row in rows if "stubborn" in row["label"])
    assert f"waits at cell [{setup}], line {STUBBORN_LINE} in stubborn (in sleep)" in stubborn["detail"], stubborn
    # The text report lists them with the other things cells left running.
    report = kernel.run("%nbcoord").stdout
    assert "Also running:" in report
    assert report.count(f"ZOMBIE: cell [{cell}] interrupted") >= 4, report
    zombies = kernel.evaluate("nbcoord.snapshot()['zombie_count']")
    assert zombies >= 4

    # %nbcoord stop in a cell runs on the kernel's loop: it requests the cancellations, which happen once it ends.
    stop = kernel.run("%nbcoord stop --zombies").stdout
    assert stop.count("cancel requested: it ends once this cell returns") == 4, stop
    assert kernel.evaluate("others()") == ["stubborn"], "only the task that swallows CancelledError is left"

    # A stop from another thread (the panel's route) awaits the tasks, and names the one that swallowed it.
    report = kernel.evaluate(
        "(lambda r: [(i['stopped'], i['reason']) for i in r['items'] if i['kind'] == 'task'])"
        "(await asyncio.to_thread(nbcoord.stop_all, zombies=True, grace=0.3))"
    )
    assert len(report) == 1 and report[0][0] is False, report
    assert "swallowed the CancelledError" in report[0][1], report
    assert f"cell [{setup}], line {STUBBORN_LINE} in stubborn" in report[0][1], report

    def stubborn_row() -> dict[str, Any]:
        return next(r for r in task_rows(kernel) if "stubborn" in r["label"])

    assert stubborn_row()["state"] == "cancelling"
    # Once the grace period has passed since the first stop, it has also ignored a stop (first cause first).
    wait_until(
        lambda: [z["reason"] for z in stubborn_row()["zombie_reasons"]] == ["cell-interrupted", "stop-ignored"],
        timeout=5,
        what="the stubborn task to count as having ignored a stop",
    )

    kernel.run("RELEASE = True")
    wait_until(lambda: kernel.evaluate("others()") == [], timeout=10, what="the stubborn task to end")
    assert task_rows(kernel) == []
    # The user's factory made every task all along (nbcoord chains it, or needs none).
    made = kernel.evaluate("MADE")
    assert {"poll_forever", "stubborn", "parent"} <= set(made), made


def test_tasks_of_a_loop_run_by_a_cells_thread(kernel: Kernel) -> None:
    result = kernel.run(
        "LOOP = None\n"
        "async def main():\n"
        "    global LOOP\n"
        "    LOOP = asyncio.get_running_loop()\n"
        "    workers = [asyncio.create_task(poll_forever(), name=f'worker-{i}') for i in range(3)]\n"
        "    try:\n"
        "        await asyncio.gather(*workers)\n"
        "    except asyncio.CancelledError:\n"
        "        pass\n"
        "RUNNER = threading.Thread(target=asyncio.run, args=(main(),), name='loop-thread')\n"
        "RUNNER.start()"
    )
    cell = int(result.reply["content"]["execution_count"])
    rows = wait_until(lambda: (r := task_rows(kernel)) and len(r) == 4 and r, timeout=10, what="4 task rows")
    for row in rows:
        assert row["cell"] == cell and row["zombie"] is None, row
        assert "on the event loop of thread 'loop-thread'" in row["detail"], row
    labels = sorted(r["label"] for r in rows)
    assert labels[-3:] == [f"asyncio task worker-{i}: poll_forever()" for i in range(3)], labels
    assert labels[0].endswith(": main()"), labels

    # A stop of that cell from the main thread: cancelled on the thread's loop, and awaited.
    items = kernel.evaluate(
        f"[(i['stopped'], i['reason']) for i in nbcoord.stop_all(cell={cell})['items'] if i['kind'] == 'task']"
    )
    assert len(items) == 4 and all(stopped for stopped, _ in items), items
    wait_until(lambda: kernel.evaluate("not RUNNER.is_alive() and LOOP.is_closed()"), timeout=5, what="the loop")
    assert task_rows(kernel) == []


def test_unload_gives_the_loop_its_own_factory_back(kernel: Kernel) -> None:
    # Python 3.10-3.11: nbcoord's factory, chained to the user's; 3.12+: no factory of nbcoord's at all.
    assert kernel.evaluate(
        "__import__('nbcoord.ledger.tasks').ledger.tasks.READ_CONTEXT"
        " == (asyncio.get_running_loop().get_task_factory() is users_factory)"
    )
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate("asyncio.get_running_loop().get_task_factory() is users_factory")
    assert kernel.evaluate("'new_event_loop' not in vars(asyncio.get_event_loop_policy())")
    kernel.run("t = asyncio.ensure_future(poll_forever()); t.cancel()")
    kernel.run("%load_ext nbcoord\n" + LOAD)  # loaded again: attributes again, on top of the user's factory
    cell = int(kernel.run("t = asyncio.ensure_future(poll_forever())").reply["content"]["execution_count"])
    rows = wait_until(lambda: task_rows(kernel), timeout=10, what="the new task's row")
    assert [row["cell"] for row in rows] == [cell]
    kernel.run("t.cancel()")


def test_a_stop_while_a_cell_holds_the_loop_cancels_when_it_returns(kernel: Kernel, tmp_path: Path) -> None:
    cell = interrupt_cell(kernel, "T4 = asyncio.ensure_future(poll_forever())", tmp_path)
    wait_until(lambda: [r for r in task_rows(kernel) if r["cell"] == cell], timeout=10, what="the task's row")
    # As a panel click does while a cell runs: the stop comes from another thread, the loop is busy in the cell.
    reasons = kernel.evaluate(
        "(lambda out: (threading.Thread(target=lambda: out.append(nbcoord.stop_all(zombies=True))).start(),"
        " time.sleep(0.5), [i['reason'] for i in out[0]['items'] if i['kind'] == 'task'])[2])([])"
    )
    assert len(reasons) == 1 and reasons[0].startswith("cancel requested: its event loop is busy"), reasons
    wait_until(lambda: "poll_forever" not in kernel.evaluate("others()"), timeout=10, what="the task to end")
    assert [r for r in task_rows(kernel) if r["cell"] == cell] == []
