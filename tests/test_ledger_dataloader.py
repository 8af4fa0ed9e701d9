"""PyTorch DataLoader iterators in the ledger (S12), in a real kernel with PyTorch's CPU build (.venv, Python 3.11).

- Interrupted while iterating: Jupyter's Interrupt reaches the workers too, and they exit, but nobody reaps them
  (the iterator, kept alive by the cell's traceback, is not read again): the iterator's row says so, each worker
  has a process row "exited, not reaped" with its role, and ``%nbcoord stop --zombies`` runs PyTorch's own shutdown,
  which reaps them and ends the queues' threads.
- Persistent workers busy in the dataset's code, in an iterator a cell kept: a stop runs PyTorch's shutdown, which
  would wait 5 s for each busy worker; the workers are terminated within the grace period instead, after being
  taken out of PyTorch's SIGCHLD check (which would otherwise raise in the kernel's main thread).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Kernel, KernelOptions, wait_until

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch (CPU build) is not installed"),
]

#: Run after ``%load_ext nbcoord``: the ledger watches the kernel.
LOAD = """
import nbcoord
from nbcoord.ledger import ledger as _ledger
if _ledger.current() is None:
    nbcoord._extension.host.add_undo(_ledger.watch(nbcoord._extension.host, nbcoord._extension.probe))
"""

SETUP = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __init__(self, delay, directory):
        self.delay, self.directory = delay, directory
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        open(f"{self.directory}/item-{i}", "w").close()
        time.sleep(self.delay)
        return i
"""


#: The module's kernel (conftest's ``kernel``): nbcoord loaded, the ledger watching, PyTorch and the dataset defined.
KERNEL_OPTIONS = [KernelOptions(after=LOAD + SETUP, timeout=120)]


def loader_rows(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate(
        "[r for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'loader']"
    )
    return rows


def descendants(kernel: Kernel) -> list[int]:
    return [p.pid for p in psutil.Process(kernel.pid).children(recursive=True)]


def test_workers_of_an_interrupted_loop_are_reaped_by_the_stop(kernel: Kernel, tmp_path: Path) -> None:
    msg_id = kernel.submit(
        f"loader = DataLoader(Slow(0.05, {str(tmp_path)!r}), num_workers=4, persistent_workers=True)\n"
        "for batch in loader:\n"
        "    time.sleep(0.05)"
    )
    wait_until(lambda: len(list(tmp_path.glob("item-*"))) >= 8, timeout=60, what="the workers to load items")
    kernel.interrupt()
    result = kernel.collect(msg_id)
    assert result.status == "error"
    cell = int(result.reply["content"]["execution_count"])

    def exited() -> list[dict[str, Any]]:
        rows = loader_rows(kernel)
        return rows if len(rows) == 1 and rows[0]["state"] == "workers exited" else []

    row = wait_until(exited, timeout=20, what="the iterator's row with its workers exited")[0]
    assert row["label"] == "DataLoader iterator over Slow, 4 workers (persistent)", row
    assert row["cell"] == cell and row["zombie"] == "cell-interrupted", row
    assert row["detail"].startswith("0 worker(s) running, 4 exited and not reaped"), row
    processes = kernel.evaluate(
        "[r for r in nbcoord.snapshot()['ledger'] if r['kind'] == 'process' and r['pids'][0] in "
        f"{row['pids']}]"
    )
    assert len(processes) == 4, processes
    for process in processes:
        assert process["state"] == "exited, not reaped", process
        assert f"of 4 of cell [{cell}], {row['id']}" in process["detail"], process
        assert process["zombie"] is None, "the iterator's row carries the zombie, not each worker"
    assert all(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in row["pids"])

    stop = kernel.run("%nbcoord stop --zombies").stdout
    assert f"stopped: {row['label']} ({row['id']}): PyTorch's worker shutdown took" in stop, stop
    assert "STILL ALIVE" not in stop, stop
    assert descendants(kernel) == [], "the exited workers were not reaped"
    assert loader_rows(kernel) == []
    assert kernel.evaluate("[t['name'] for t in nbcoord.snapshot()['threads'] if t['owners']]") == []


def test_busy_persistent_workers_are_stopped_within_the_grace(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run(
        f"busy = DataLoader(Slow(60, {str(tmp_path)!r}), num_workers=4, persistent_workers=True)\n"
        "IT = iter(busy)"
    )
    wait_until(lambda: len(list(tmp_path.glob("item-*"))) >= 4, timeout=60, what="four busy workers")
    row = wait_until(lambda: loader_rows(kernel), timeout=10, what="the iterator's row")[0]
    assert row["state"] == "running" and row["zombie"] is None and len(row["pids"]) == 4, row
    items = kernel.evaluate("[i for i in nbcoord.stop_all(grace=1.5)['items'] if i['kind'] == 'loader']")
    assert len(items) == 1 and items[0]["stopped"], items
    assert "4 worker(s) got SIGTERM" in items[0]["reason"], items
    assert descendants(kernel) == []
    # PyTorch's SIGCHLD check did not raise in the kernel: the next cell runs, the iterator is shut down.
    assert kernel.evaluate("IT._shutdown") is True
