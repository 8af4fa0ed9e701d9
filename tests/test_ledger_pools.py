"""Process pools in the ledger (S12), in real kernels on every kernel Python: ``multiprocessing.Pool``,
``concurrent.futures.ProcessPoolExecutor``, and loky's reusable executor (joblib's) where joblib is installed.

Each pool is left by an interrupted cell with four busy workers (Jupyter's Interrupt reaches the workers too: a
``multiprocessing`` pool replaces the workers it loses), seen in ``snapshot()["ledger"]`` and ``%nbcoord`` with its
cell, the reason and its workers' pids (each worker named by its pool in a process row), stopped by
``%nbcoord stop --zombies`` through its own API, and then gone from the process table with its threads.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

#: Run after ``%load_ext nbcoord``. Until nbcoord/_wiring.py installs the ledger itself, the test installs it (a no-op
#: once it does).
LOAD = """
import nbcoord
from nbcoord.ledger import ledger as _ledger
if _ledger.current() is None:
    nbcoord._extension.host.add_undo(_ledger.watch(nbcoord._extension.host, nbcoord._extension.probe))
import json, threading, time
"""

#: How each kind of pool is made busy: four workers, each in a long sleep; the label its row gets.
LEAKS = {
    "Pool": (
        "import multiprocessing as mp\nPOOL = mp.get_context('fork').Pool(4)\n"
        "RESULT = POOL.map_async(busy, range(8))",
        "multiprocessing.Pool, 4 workers",
        "terminate() took",
    ),
    "ProcessPoolExecutor": (
        "import concurrent.futures as cf, multiprocessing as mp\n"
        "POOL = cf.ProcessPoolExecutor(4, mp_context=mp.get_context('fork'))\n"
        "FUTURES = [POOL.submit(busy, i) for i in range(8)]",
        "concurrent.futures.ProcessPoolExecutor, 4 workers",
        "shutdown(cancel_futures=True) took",
    ),
    "loky": (
        "from joblib.externals.loky import get_reusable_executor\n"
        "POOL = get_reusable_executor(max_workers=4)\n"
        "FUTURES = [POOL.submit(busy, i) for i in range(8)]",
        "joblib's reusable loky executor, 4 workers",
        "kill_workers=True) took",
    ),
}


def _has_joblib(python: str) -> bool:
    return subprocess.run([python, "-c", "import joblib"], capture_output=True, check=False).returncode == 0


#: Loky's case runs where joblib is installed (tools/dev.py installs it in .venv).
LOKY_PYTHONS = [p for p in KERNEL_PYTHONS if _has_joblib(str(p.values[0]))]


#: The module's kernel (conftest's ``kernel``), one per interpreter: nbcoord loaded, the ledger watching.
KERNEL_OPTIONS = kernel_params(KERNEL_PYTHONS, after=LOAD)


def workers_of(kernel: Kernel) -> list[psutil.Process]:
    """The kernel's descendants that are not multiprocessing's or loky's kernel-wide helpers."""
    found = []
    for child in psutil.Process(kernel.pid).children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
        except psutil.ZombieProcess:
            found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def pool_rows(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate("[r for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'pool']")
    return rows


def leak_and_stop(kernel: Kernel, kind: str, tmp_path: Path) -> None:
    code, label, how = LEAKS[kind]
    # Each task writes a file when a worker starts it, then sleeps: the interrupt comes once four workers are busy.
    kernel.run(
        "def busy(i, directory=" + repr(str(tmp_path)) + "):\n"
        "    open(f'{directory}/busy-{i}', 'w').close()\n"
        "    time.sleep(120)"
    )
    msg_id = kernel.submit(f"{code}\ntime.sleep(120)")
    wait_until(lambda: len(list(tmp_path.glob("busy-*"))) >= 4, timeout=60, what=f"four busy workers of the {kind}")
    kernel.interrupt()
    result = kernel.collect(msg_id)
    assert result.status == "error", result.text
    cell = int(result.reply["content"]["execution_count"])

    def four_workers() -> list[dict[str, Any]]:
        # A multiprocessing pool loses its workers to the interrupt and starts others: wait for those.
        rows = pool_rows(kernel)
        return rows if len(rows) == 1 and rows[0]["detail"].startswith("4 worker(s) running") else []

    row = wait_until(four_workers, timeout=30, what=f"the {kind}'s row with four workers")[0]
    assert row["label"].startswith(label), row
    assert row["cell"] == cell and row["zombie"] == "cell-interrupted", row
    pids = row["pids"]
    assert len(pids) == 4
    roles = kernel.evaluate(
        "{r['pids'][0]: r['detail'] for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'process'"
        f" and r['pids'][0] in {pids}}}"
    )
    assert len(roles) == 4 and all(f"of 4, {row['id']}" in detail for detail in roles.values()), roles
    report = kernel.run("%nbcoord").stdout
    assert f"{row['id']}  {row['label']}" in report and f"ZOMBIE: cell [{cell}] interrupted" in report, report

    stop = kernel.run("%nbcoord stop --zombies").stdout
    assert f"stopped: {row['label']} ({row['id']}): " in stop and how in stop, stop
    assert "STILL ALIVE" not in stop, stop
    # Nothing left: no worker in the process table (not even unreaped), no row, no thread of the pool.
    assert [p.pid for p in workers_of(kernel)] == [], "workers left in the process table"
    assert pool_rows(kernel) == []
    threads = kernel.evaluate("[t['name'] for t in nbcoord.snapshot()['threads'] if t['owners']]")
    assert threads == [], threads


@pytest.mark.parametrize("kind", ["Pool", "ProcessPoolExecutor"])
def test_pool_left_by_an_interrupted_cell(kernel: Kernel, kind: str, tmp_path: Path) -> None:
    leak_and_stop(kernel, kind, tmp_path)


@pytest.mark.parametrize("own_kernel", kernel_params(LOKY_PYTHONS, after=LOAD), indirect=True)
def test_loky_executor_left_by_an_interrupted_cell(own_kernel: Kernel, tmp_path: Path) -> None:
    leak_and_stop(own_kernel, "loky", tmp_path)


def test_a_pool_made_by_a_cells_thread_is_that_cells(kernel: Kernel) -> None:
    result = kernel.run(
        "import multiprocessing as mp\n"
        "def make():\n"
        "    global THREAD_POOL\n"
        "    THREAD_POOL = mp.get_context('fork').Pool(2)\n"
        "maker = threading.Thread(target=make)\n"
        "maker.start(); maker.join()"
    )
    cell = int(result.reply["content"]["execution_count"])
    row = wait_until(lambda: pool_rows(kernel), timeout=10, what="the pool's row")[0]
    assert row["cell"] == cell and row["zombie"] is None, row
    items = kernel.evaluate(f"[i['stopped'] for i in nbcoord.stop_all(cell={cell})['items'] if i['kind'] == 'pool']")
    assert items == [True]
    assert kernel.evaluate("THREAD_POOL._state") == "TERMINATE"


def test_a_pool_used_and_closed_as_usual_is_left_alone(kernel: Kernel) -> None:
    codes = kernel.evaluate(
        "(lambda pool: (pool.map(abs, range(-8, 0)), pool.close(), pool.join(),"
        " [w.exitcode for w in pool._pool])[3])(__import__('multiprocessing').get_context('fork').Pool(2))"
    )
    assert codes == [0, 0], codes
    assert pool_rows(kernel) == []
    assert kernel.evaluate("nbcoord.snapshot()['zombie_count']") == 0
