"""Child processes in the ledger (S12), and kernel shutdown with every kind leaked, in real kernels.

- The process tree per cell: a shell a cell started and the ``sleep`` it runs (a grandchild), with their cell,
  parent and command line; an interrupted cell's processes are zombies, and the stop of the zombies ends them.
- A zombie process (exited, not reaped) is shown as such and reaped by a stop that owns it: through its
  ``subprocess.Popen`` (which keeps its exit status), or with ``waitpid`` for a bare ``os.fork`` child.
- Kernel shutdown (as a front end asks for it) with a task, a ``multiprocessing.Pool``, a ``ProcessPoolExecutor``
  (and, where installed, loky's executor and a DataLoader) leaked: the kernel exits by itself with status 0 before
  jupyter_client would send SIGTERM, and no process it started is left.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

#: Run after ``%load_ext nbcoord``: the ledger watches the kernel.
LOAD = """
import nbcoord
from nbcoord.ledger import ledger as _ledger
if _ledger.current() is None:
    nbcoord._extension.host.add_undo(_ledger.watch(nbcoord._extension.host, nbcoord._extension.probe))
"""

#: The test's KernelManager waits this long for the exit before it kills (jupyter_client's default is 5 s, SIGTERM at
#: half of it). Waiting longer here tells "exits by itself" from "killed" on a loaded machine too: the 1.5 s target
#: is measured per kind of leak against a baseline in bench/bench_ledger.py.
SHUTDOWN_WAIT_S = 60.0


#: The module's kernel (conftest's ``kernel``), one per interpreter: nbcoord loaded, the ledger watching.
KERNEL_OPTIONS = kernel_params(KERNEL_PYTHONS, after=LOAD + "import os, subprocess, time\n")


def process_rows(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate(
        "[r for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'process']"
    )
    return rows


def test_the_process_tree_of_an_interrupted_cell(kernel: Kernel, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    msg_id = kernel.submit(
        # A session of its own, as servers are started: the Interrupt (SIGINT to the kernel's process group) does
        # not reach it, so the shell and its sleep outlive the cell.
        f"SHELL = subprocess.Popen(['sh', '-c', 'touch {marker}; sleep 120 & wait'], start_new_session=True)\n"
        "time.sleep(120)"
    )
    wait_until(marker.exists, timeout=30, what="the shell to start")
    shell_pid = next(c.pid for c in psutil.Process(kernel.pid).children() if c.name() == "sh")  # the cell still runs
    sleeper = wait_until(
        lambda: [c.pid for c in psutil.Process(shell_pid).children() if c.name() == "sleep"],
        timeout=10,
        what="the shell's sleep",
    )[0]
    kernel.interrupt()
    result = kernel.collect(msg_id)
    assert result.status == "error"
    cell = int(result.reply["content"]["execution_count"])

    def both() -> dict[int, dict[str, Any]]:
        rows = {row["pids"][0]: row for row in process_rows(kernel)}
        return rows if {shell_pid, sleeper} <= set(rows) else {}

    rows = wait_until(both, timeout=10, what="rows for the shell and its sleep")
    for pid in (shell_pid, sleeper):
        assert rows[pid]["cell"] == cell and rows[pid]["zombie"] == "cell-interrupted", rows[pid]
    assert "sleep 120" in rows[sleeper]["detail"] and f"child of {shell_pid}" in rows[sleeper]["detail"]

    stop = kernel.run("%nbcoord stop --zombies").stdout
    assert "child processes: 2 terminated" in stop, stop
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
    wait_until(lambda: not [r for r in process_rows(kernel) if r["pids"][0] in (shell_pid, sleeper)], timeout=10)


def test_an_exited_child_nobody_reaped_is_reaped_by_the_stop(kernel: Kernel) -> None:
    result = kernel.run(
        # Linux records a process's start to the 10 ms tick: a child made in the cell's first milliseconds may be
        # counted in the cell before (cell_for_time takes the cell that covers most of the tick).
        "time.sleep(0.02)\n"
        "DONE = subprocess.Popen(['sh', '-c', 'exit 3'])\n"
        "FORKED = os.fork()\n"
        "if FORKED == 0:\n"
        "    os._exit(5)"
    )
    cell = int(result.reply["content"]["execution_count"])
    pids = [kernel.evaluate("DONE.pid"), kernel.evaluate("FORKED")]
    wait_until(
        lambda: all(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids),
        timeout=10,
        what="both children to exit",
    )

    def exited() -> list[dict[str, Any]]:
        rows = [r for r in process_rows(kernel) if r["pids"][0] in pids]
        return rows if len(rows) == 2 and all(r["state"] == "exited, not reaped" for r in rows) else []

    rows = wait_until(exited, timeout=10, what="rows of both exited children")
    assert {row["cell"] for row in rows} == {cell}

    items = kernel.evaluate(f"[i for i in nbcoord.stop_all(cell={cell})['items'] if i['kind'] == 'process']")
    reasons = {item["label"].split()[1]: item["reason"] for item in items if item["stopped"]}
    assert reasons == {
        str(pids[0]): "reaped through its subprocess.Popen (exit status 3)",
        str(pids[1]): "reaped (exit status 5)",
    }, items
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert kernel.evaluate("DONE.returncode") == 3  # its own object still knows how it ended


# ----------------------------------------------------------------------------------------------- shutdown
#: What each kind leaks, left running by an ordinary cell; (kind, code, needs).
LEAKS = [
    ("task", "import asyncio\nasync def spin():\n    while True:\n        await asyncio.sleep(0.01)\n"
             "TASK = asyncio.ensure_future(spin())", None),
    ("Pool", "import multiprocessing as mp\nPOOL = mp.get_context('fork').Pool(4)\n"
             "BUSY = POOL.map_async(time.sleep, [60] * 8)", None),
    ("ProcessPoolExecutor", "import concurrent.futures as cf, multiprocessing as mp\n"
                            "EX = cf.ProcessPoolExecutor(4, mp_context=mp.get_context('fork'))\n"
                            "FS = [EX.submit(time.sleep, 60) for _ in range(8)]", None),
    ("loky", "from joblib.externals.loky import get_reusable_executor\n"
             "LOKY = get_reusable_executor(max_workers=4)\nLF = [LOKY.submit(time.sleep, 60) for _ in range(8)]",
     "joblib"),
    ("DataLoader", "import torch\nfrom torch.utils.data import DataLoader, Dataset\n"
                   "class Slow(Dataset):\n    def __len__(self): return 1000\n"
                   "    def __getitem__(self, i):\n        time.sleep(60); return i\n"
                   "LOADER = iter(DataLoader(Slow(), num_workers=4, persistent_workers=True))", "torch"),
]


def _available(python: str, module: str | None) -> bool:
    if module is None:
        return True
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def shutdown_kernel(k: Kernel) -> int | None:
    """Shut the kernel down as a front end does, but with :data:`SHUTDOWN_WAIT_S` before any kill; its exit
    status (negative: the signal that killed it)."""
    process = k.process  # the provisioner lets it go at the end of the shutdown
    k.kc.stop_channels()
    k.km.shutdown_wait_time = SHUTDOWN_WAIT_S
    began = time.monotonic()
    k.km.shutdown_kernel()
    print(f"the kernel's shutdown took {time.monotonic() - began:.2f} s")
    status: int | None = process.wait(10)
    return status


@pytest.mark.parametrize("own_kernel", kernel_params(KERNEL_PYTHONS, after=LOAD + "import time\n"), indirect=True)
def test_shutdown_with_every_kind_leaked(own_kernel: Kernel) -> None:
    k, python = own_kernel, own_kernel.python
    leaked: list[psutil.Process] = []
    try:
        kinds = [kind for kind, code, needs in LEAKS if _available(python, needs)]
        for kind, code, _needs in LEAKS:
            if kind in kinds:
                k.run(code, timeout=120)
        wait_until(
            lambda: len(psutil.Process(k.pid).children(recursive=True)) >= 4 * (len(kinds) - 1),
            timeout=60,
            what="every pool's workers",
        )
        rows = k.evaluate("sorted({r['kind'] for r in nbcoord.snapshot()['ledger']})")
        assert {"task", "pool", "process"} <= set(rows), rows
        leaked = psutil.Process(k.pid).children(recursive=True)
        status = shutdown_kernel(k)
        assert status == 0, f"the kernel did not exit by itself ({status}) with {kinds} leaked"

        def orphans() -> list[str]:
            found = []
            for process in leaked:
                try:
                    if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                        found.append(f"{process.pid} {process.name()} (parent {process.ppid()})")
                except psutil.NoSuchProcess:
                    continue
            return found

        # Helpers such as a resource tracker leave once the kernel's end of their pipe closes: give them a moment.
        wait_until(lambda: not orphans(), timeout=5, what=f"no process left after the kernel: {orphans()}")
    finally:
        for process in leaked:
            with contextlib.suppress(psutil.Error):
                process.kill()
