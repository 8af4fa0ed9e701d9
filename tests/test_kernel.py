"""Tier 3: nbcoord in a real IPython kernel driven through jupyter_client.

One kernel serves the whole module (kernel starts are the expensive part); each test starts threads with names
of its own, looks only at those, and ends them, so the tests do not depend on each other or on their order.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import CellResult, Kernel, KernelOptions, wait_until

pytestmark = pytest.mark.kernel


#: One kernel for the module (conftest's ``kernel``); what load replaced is kept in ``_before`` to check unload against.
KERNEL_OPTIONS = [
    pytest.param(
        KernelOptions(
            setup="import json, signal, threading, time\n"
            "_before = (threading.Thread.start, threading.excepthook, signal.getsignal(signal.SIGTERM),\n"
            "           get_ipython().kernel.do_shutdown.__func__)",
            after="import nbcoord",
        ),
        id="py",
    )
]


def count_of(result: CellResult) -> int:
    return int(result.reply["content"]["execution_count"])


def thread_rows(kernel: Kernel, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate(f"[r for r in nbcoord.snapshot()['threads'] if r['name'] == {name!r}]")
    return rows


def one_row(kernel: Kernel, name: str) -> dict[str, Any]:
    rows = thread_rows(kernel, name)
    assert len(rows) == 1, rows
    return rows[0]


def cell_row(kernel: Kernel, count: int) -> dict[str, Any]:
    row: dict[str, Any] = kernel.evaluate(
        f"next(c for c in nbcoord.snapshot()['cells'] if c['execution_count'] == {count})"
    )
    return row


def execute_with_cell_id(kernel: Kernel, code: str, cell_id: str) -> CellResult:
    """An execute request as JupyterLab sends it: the cell's id in the message metadata ("cellId")."""
    result = kernel.collect(kernel.submit(code, cell_id=cell_id))
    assert result.status == "ok", result.errors
    return result


def interrupted(kernel: Kernel, msg_id: str) -> CellResult:
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=30)
    assert result.status == "error" and result.reply["content"]["ename"] == "KeyboardInterrupt", result.reply
    return result


# ---------------------------------------------------------------------------------------------- attribution
def test_threads_are_attributed_to_cells_with_counts_and_cell_ids(kernel: Kernel) -> None:
    plain = kernel.run(
        "attr_stop = threading.Event()\nthreading.Thread(target=attr_stop.wait, name='attr-plain', daemon=True).start()"
    )
    with_id = execute_with_cell_id(
        kernel,
        "# started from JupyterLab\nthreading.Thread(target=attr_stop.wait, name='attr-lab', daemon=True).start()",
        "0f1e2d3c-cell",
    )
    try:
        assert one_row(kernel, "attr-plain")["cell"] == count_of(plain)
        assert one_row(kernel, "attr-lab")["cell"] == count_of(with_id)
        plain_cell, lab_cell = cell_row(kernel, count_of(plain)), cell_row(kernel, count_of(with_id))
        assert plain_cell["cell_id"] is None and plain_cell["first_line"] == "attr_stop = threading.Event()"
        assert plain_cell["outcome"] == "ok"
        assert lab_cell["cell_id"] == "0f1e2d3c-cell" and lab_cell["first_line"] == "# started from JupyterLab"
        report = kernel.run("%nbcoord").stdout
        assert f"Cell [{count_of(plain)}] (ok): attr_stop = threading.Event()" in report
    finally:
        kernel.run("attr_stop.set()")


def test_threads_started_by_threads_and_executors(kernel: Kernel) -> None:
    spawn = kernel.run(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "fam_go, fam_stop = threading.Event(), threading.Event()\n"
        "def fam_parent():\n"
        "    fam_go.wait()\n"
        "    threading.Thread(target=fam_stop.wait, name='fam-child', daemon=True).start()\n"
        "    fam_stop.wait()\n"
        "threading.Thread(target=fam_parent, name='fam-parent', daemon=True).start()\n"
        "fam_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix='fam-pool')\n"
        "fam_pool.submit(fam_stop.wait)"
    )
    try:
        kernel.run("fam_go.set()")  # the child starts during a later cell; it still belongs to the first one
        wait_until(lambda: thread_rows(kernel, "fam-child"), timeout=10, what="the child thread")
        parent, child = one_row(kernel, "fam-parent"), one_row(kernel, "fam-child")
        worker = one_row(kernel, "fam-pool_0")
        assert parent["cell"] == child["cell"] == worker["cell"] == count_of(spawn)
        assert child["parent"] == "fam-parent"
        assert [(o["kind"], o["label"], o["closed"]) for o in worker["owners"]] == [
            ("executor", "ThreadPoolExecutor 'fam-pool'", False)
        ]
        kernel.run("fam_pool.shutdown(wait=False)")
        assert one_row(kernel, "fam-pool_0")["owners"][0]["closed"] is True
    finally:
        kernel.run("fam_go.set(); fam_stop.set(); fam_pool.shutdown(wait=True)")


# ------------------------------------------------------------------------------------------------- zombies
def test_interrupted_cell_leaves_a_named_zombie(kernel: Kernel) -> None:
    msg_id = kernel.submit_until_printed(
        "irq_stop = threading.Event()\n"
        "threading.Thread(target=irq_stop.wait, name='irq-victim', daemon=True).start()\n"
        "print('started', flush=True)\n"
        "time.sleep(60)",
        "started",
    )
    result = interrupted(kernel, msg_id)
    count = count_of(result)
    try:
        zombie_lines = [line for line in result.stderr.splitlines() if line.startswith("nbcoord:")]
        assert zombie_lines == [
            f"nbcoord: cell [{count}] was interrupted and left 1 thread(s) running: irq-victim. "
            "See %nbcoord zombies; stop them with %nbcoord stop --zombies."
        ], result.text
        zombies = kernel.run("%nbcoord zombies").stdout
        section = zombies.split(f"Cell [{count}] (interrupted): irq_stop = threading.Event()", 1)
        assert len(section) == 2, zombies
        assert "irq-victim" in section[1].split("Cell [", 1)[0]
        assert f"ZOMBIE: cell [{count}] interrupted" in zombies
        assert one_row(kernel, "irq-victim")["zombie"] == "cell-interrupted"
    finally:
        kernel.run("irq_stop.set()")


def test_error_cell_leaves_a_cell_error_zombie(kernel: Kernel) -> None:
    result = kernel.run(
        "err_stop = threading.Event()\n"
        "threading.Thread(target=err_stop.wait, name='err-victim', daemon=True).start()\n"
        "raise ValueError('cell failed')",
        allow_error=True,
    )
    try:
        assert result.status == "error"
        assert result.stderr.count("nbcoord:") == 1
        assert f"nbcoord: cell [{count_of(result)}] failed and left 1 thread(s) running: err-victim." in result.stderr
        row = one_row(kernel, "err-victim")
        assert row["zombie"] == "cell-error" and row["cell"] == count_of(result)
        assert cell_row(kernel, count_of(result))["error"] == "ValueError: cell failed"
    finally:
        kernel.run("err_stop.set()")


def test_thread_exception_is_reported_once_in_the_next_cell(kernel: Kernel) -> None:
    starting = kernel.run(
        "exc_go = threading.Event()\n"
        "def exc_fail():\n"
        "    exc_go.wait()\n"
        "    raise RuntimeError('lost the connection')\n"
        "exc_t = threading.Thread(target=exc_fail, name='exc-thread')\n"
        "exc_t.start()"
    )
    running = kernel.run("exc_go.set(); exc_t.join()")  # the thread fails while this other cell runs
    following = kernel.run("x = 1")
    expected = (
        f"nbcoord: thread 'exc-thread' started by cell [{count_of(starting)}] failed: "
        f"RuntimeError: lost the connection. Its traceback is under cell [{count_of(starting)}]; "
        "%nbcoord keeps it too."
    )
    lines = [line for line in following.stderr.splitlines() if "exc-thread" in line]
    assert lines == [expected], following.text
    # Neither Python's own traceback nor nbcoord's routed one landed in the cell that was running.
    assert "Traceback" not in running.text and "lost the connection" not in running.text, running.text
    later = kernel.run("x = 2")
    assert "exc-thread" not in later.text
    failures = kernel.evaluate("[f for f in nbcoord.snapshot()['failures'] if f['thread_name'] == 'exc-thread']")
    assert len(failures) == 1 and "raise RuntimeError('lost the connection')" in failures[0]["traceback"]


# ---------------------------------------------------------------------------------------------------- stop
COOPERATIVE = """
def {name}_work():
    while not nbcoord.should_stop():
        time.sleep(0.01)
{name}_thread = threading.Thread(target={name}_work, name="{name}", daemon=True)
{name}_thread.start()
"""


def test_stop_magic_stops_a_cooperative_thread(kernel: Kernel) -> None:
    kernel.run(COOPERATIVE.format(name="coop"))
    out = kernel.run("%nbcoord stop --grace 5").stdout
    assert out.startswith("nbcoord stop (all): ")
    stopped = [line.strip() for line in out.splitlines() if line.strip().startswith("stopped: coop ")]
    assert len(stopped) == 1, out
    assert kernel.evaluate("coop_thread.is_alive()") is False
    last = kernel.evaluate("nbcoord.snapshot()['last_stop']")
    assert last["scope"] == "all" and "coop" in [row["name"] for row in last["stopped"]]


def test_stop_on_interrupt_stops_the_interrupted_cells_threads(kernel: Kernel) -> None:
    kernel.run("%nbcoord config stop_on_interrupt=true")
    try:
        msg_id = kernel.submit_until_printed(
            COOPERATIVE.format(name="soi")
            + "soi_release = threading.Event()\n"
            + "threading.Thread(target=soi_release.wait, name='soi-stubborn', daemon=True).start()\n"
            + "print('started', flush=True)\ntime.sleep(60)",
            "started",
        )
        result = interrupted(kernel, msg_id)
        lines = [line for line in result.text.splitlines() if line.startswith("nbcoord:")]
        assert lines == [
            f"nbcoord: cell [{count_of(result)}] was interrupted: stopped 1 thread(s); 1 still running "
            "(soi-stubborn): see %nbcoord zombies; %nbcoord stop --zombies --force."
        ], result.text
        assert "Stop them with: %nbcoord stop --zombies --force" in kernel.run("%nbcoord zombies").stdout
        assert kernel.evaluate("soi_thread.is_alive()") is False
        kernel.run("soi_release.set()")
    finally:
        kernel.run("%nbcoord config stop_on_interrupt=false")


# ------------------------------------------------------------------------------------------------ snapshot
def test_snapshot_is_json_serialisable(kernel: Kernel) -> None:
    kernel.run(
        "snap_stop = threading.Event()\nthreading.Thread(target=snap_stop.wait, name='snap', daemon=True).start()"
    )
    try:
        # json.dumps without default=: raises in the kernel if anything is not plain JSON.
        snapshot = kernel.evaluate("nbcoord.snapshot(stacks=True)")
        [row] = [r for r in snapshot["threads"] if r["name"] == "snap"]
        assert row["stack"] and row["creation_stack"] and row["state"] == "waiting"
        assert snapshot["pid"] == kernel.pid and snapshot["schema"] >= 1
        assert json.loads(kernel.run("%nbcoord json").stdout)["pid"] == kernel.pid
    finally:
        kernel.run("snap_stop.set()")


# ---------------------------------------------------------------------------------------------- load/unload
def test_unload_restores_the_kernel_and_reload_works(kernel: Kernel) -> None:
    restored = (
        "(threading.Thread.start is _before[0], threading.excepthook is _before[1], "
        "signal.getsignal(signal.SIGTERM) == _before[2], 'do_shutdown' in vars(get_ipython().kernel))"
    )
    assert kernel.evaluate(restored) == [False, False, False, True]
    kernel.run("%unload_ext nbcoord")
    try:
        assert kernel.evaluate(restored) == [True, True, True, False]
        assert kernel.evaluate("get_ipython().kernel.do_shutdown.__func__ is _before[3]") is True
    finally:
        kernel.run("%load_ext nbcoord")
    kernel.run("%reload_ext nbcoord")
    assert kernel.evaluate(restored) == [False, False, False, True]
    kernel.run("rl_stop = threading.Event()\nthreading.Thread(target=rl_stop.wait, name='rl', daemon=True).start()")
    try:
        assert one_row(kernel, "rl")["preexisting"] is False
    finally:
        kernel.run("rl_stop.set()")


def test_mem_shows_native_threads_and_a_child_started_a_moment_ago(kernel: Kernel) -> None:
    started = kernel.run(
        "import subprocess, sys\n"
        "mem_child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "mem_stop = threading.Event()\n"
        "def mem_work():\n"
        "    sum(range(10**7))  # CPU time enough to rank among the busiest threads listed\n"
        "    mem_stop.wait()\n"
        "threading.Thread(target=mem_work, name='mem-thread', daemon=True).start()"
    )
    try:
        out = kernel.run("%nbcoord mem").stdout
        pid = kernel.evaluate("mem_child.pid")
        assert "Native threads: " in out and "mem-thread: cpu " in out, out
        child_lines = [line for line in out.splitlines() if line.strip().startswith(f"{pid} ")]
        assert len(child_lines) == 1 and f"cell [{count_of(started)}]" in child_lines[0], out
    finally:
        kernel.run("mem_child.kill(); mem_child.wait(); mem_stop.set()")


CHATTER = """
import logging, threading
def chatter():
    for i in range(30):
        logging.getLogger("nbcoord").warning("probe %d from a thread \\x1b[31m", i)
print("cell starts", flush=True)
t = threading.Thread(target=chatter)
t.start(); t.join()
print("cell ends", flush=True)
"""


@pytest.mark.parametrize("own_kernel", [KernelOptions(log=True)], indirect=True, ids=["log"])
def test_nbcoords_log_goes_to_the_servers_log_never_into_the_running_cell(own_kernel: Kernel) -> None:
    # ipykernel 7 points file descriptor 2 (sys.__stderr__ too) at a pipe whose text it sends to the running cell.
    kernel = own_kernel
    result = kernel.run(CHATTER)
    wait_until(lambda: "probe 29 from a thread" in kernel.log_text(), 10, 0.05, "nbcoord's log in the kernel's")
    after = kernel.run("import sys; sys.stderr.flush(); sys.stdout.flush()")
    assert result.stdout == "cell starts\ncell ends\n" and result.stderr == ""
    assert "probe" not in after.text
    assert "\x1b" not in kernel.log_text(), "a control character reached the log raw"
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate("len(__import__('logging').getLogger('nbcoord').handlers)") == 0


def test_the_history_thread_ipython_restarts_after_a_fork_in_a_cell_stays_the_kernels(kernel: Kernel) -> None:
    # IPython 9 stops its history-saving thread before a fork and starts a new one when the next cell's input is
    # stored: in the main thread, during that cell.
    fork = kernel.run("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)")
    assert fork.status == "ok", fork.text
    cell = kernel.run(
        "history = get_ipython().history_manager.save_thread\n"
        "print(type(history).__name__, history is not None and history.is_alive())"
    )
    assert cell.status == "ok", cell.text
    if "HistorySavingThread True" not in cell.stdout:
        pytest.fail(f"this IPython did not restart its history thread after the fork: {cell.stdout!r}")
    rows = kernel.evaluate(
        "[(r['name'], r['cell'], r['user']) for r in __import__('nbcoord').snapshot()['threads']"
        " if r['tid'] and r['name'] == history.name]"
    )
    assert rows and all(cell is None and not user for _, cell, user in rows), rows
    assert "IPythonHistorySavingThread" not in kernel.run("%nbcoord threads").stdout
