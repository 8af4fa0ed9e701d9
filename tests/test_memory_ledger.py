"""The memory ledger per cell (nbcoord/resources/memory.py): pure rules in-process, then a real kernel.

The kernel's GPU is tests/fake_nvml.py, a FAKE of nvidia-ml-py's ``pynvml`` behind the same interface (this machine
has no GPU): it is put in ``sys.modules["pynvml"]`` before nbcoord loads, so the extension's probe imports it as it
would the real binding, and a cell "allocates" GPU memory by raising the kernel's entry in the fake's process list.
Host memory is real: NumPy arrays of a few hundred MiB, written so that their pages are resident.

Before the lead wires ``_memory.install`` into the extension's load, :data:`AFTER_LOAD` installs it from a cell (removed
by ``%unload_ext`` like the rest); once wired, ``_ext.memory`` exists and that line does nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import Kernel, KernelOptions, wait_until

from nbcoord.core.registry import Registry
from nbcoord.resources.memory import NOTABLE_BYTES, CellMemory, MemoryLedger, growth_held, summary
from nbcoord.resources.probes import ResourceProbe

MiB, GiB = 2**20, 2**30
TESTS = Path(__file__).resolve().parent

SETUP = f"""import os, sys, gc, json, time
sys.path.insert(0, {str(TESTS)!r})
import fake_nvml
fake_nvml.reset([fake_nvml.FakeDevice(processes=[fake_nvml.FakeProcess(os.getpid(), 512 * 2**20)])])
sys.modules["pynvml"] = fake_nvml  # the FAKE NVML, where the probe imports the real one
"""

#: After ``%load_ext nbcoord`` (the kernel's :class:`helpers.KernelOptions` runs :data:`SETUP`, the load, then this).
AFTER_LOAD = """import numpy as np
import nbcoord
from nbcoord.resources import memory as _memory
_ext = nbcoord._extension
_ledger = getattr(_ext, "memory", None)
if _ledger is None:  # before the wiring: install it here, removed by %unload_ext like the rest
    _ledger = _memory.install(_ext)
    _ext.host.add_undo(_ledger.uninstall)
%nbcoord config monitor_interval=0.1
def gpu(delta):
    fake_nvml.devices[0].processes[0].usedGpuMemory += delta
def rows():
    return {r["cell"]: r for r in nbcoord.snapshot()["cell_memory"]}
_deadline = time.monotonic() + 10
while _ext.probe.last_sample is None and time.monotonic() < _deadline:  # the monitor's first GPU read
    time.sleep(0.02)
assert _ext.probe.last_sample is not None
"""

#: The module's kernel (conftest's ``kernel``): the fake NVML in place, nbcoord loaded, the ledger installed.
KERNEL_OPTIONS = [KernelOptions(setup=SETUP, after=AFTER_LOAD)]


def row(**fields: Any) -> CellMemory:
    base: dict[str, Any] = {
        "cell": 7, "rss_before": GiB, "rss_after": GiB, "rss_peak": GiB, "gpu_before": None, "gpu_after": None,
        "gpu_peak": None, "held": False, "started_at": 1.0, "ended_at": 2.0, "rss_now": GiB, "rss_peak_exact": False,
        "rss_held": False, "gpu_held": False, "gpu_devices": [], "summary": "",
    }
    base.update(fields)
    return base  # type: ignore[return-value]


def test_growth_is_held_while_half_of_it_remains() -> None:
    assert growth_held(GiB, 2 * GiB, 2 * GiB)
    assert growth_held(GiB, 2 * GiB, int(1.5 * GiB))
    assert not growth_held(GiB, 2 * GiB, int(1.4 * GiB))
    assert not growth_held(GiB, GiB + NOTABLE_BYTES - 1, 2 * GiB), "small growth is not called growth"
    assert not growth_held(None, GiB, GiB)
    assert not growth_held(GiB, None, GiB)


def test_once_judged_held_changes_only_past_a_margin() -> None:
    before, after = GiB, GiB + 20 * MiB  # grew 20 MiB: the half-way mark at 10 MiB, a margin of 2 MiB
    assert growth_held(before, after, before + 10 * MiB)
    assert growth_held(before, after, before + 9 * MiB, was_held=True), "RSS moving a MiB flipped the verdict"
    assert not growth_held(before, after, before + 7 * MiB, was_held=True)
    assert not growth_held(before, after, before + 11 * MiB, was_held=False)
    assert growth_held(before, after, before + 13 * MiB, was_held=False)
    big = GiB + GiB  # grew 1 GiB: a margin of a tenth of it
    assert growth_held(GiB, big, GiB + 450 * MiB, was_held=True)
    assert not growth_held(GiB, big, GiB + 400 * MiB, was_held=True)
    assert not growth_held(GiB, big, GiB + 600 * MiB, was_held=False)


def test_a_rows_verdict_holds_while_rss_hovers_at_the_half_way_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry()
    ledger = MemoryLedger(ResourceProbe())
    rss = [GiB]

    class FakeRss:  # the process's RSS as the test sets it
        def __call__(self) -> int:
            return rss[0]

        def close(self) -> None:
            pass

    ledger._rss.close()
    monkeypatch.setattr(ledger, "_rss", FakeRss())
    try:
        cell = registry.cell_started(1, None, "grow()")
        ledger.on_cell("started", cell)
        rss[0] = GiB + 20 * MiB
        ledger.on_cell("finished", cell)
        verdicts = []
        for now in (11, 9, 11, 9, 10, 7, 9, 11, 13, 11):  # MiB of the growth left
            rss[0] = GiB + now * MiB
            (only,) = ledger.rows()
            assert only["rss_now"] == rss[0], "a kept row showed an old RSS"
            verdicts.append((only["held"], only["summary"].endswith("still held")))
        held = [True] * 5 + [False] * 3 + [True] * 2
        assert verdicts == [(h, h) for h in held]
    finally:
        ledger.uninstall()


def test_summaries_say_where_and_whether_held() -> None:
    gpu = {"index": 0, "before": GiB, "after": int(3.1 * GiB), "peak": int(3.1 * GiB), "now": int(3.1 * GiB)}
    assert summary(row(gpu_devices=[gpu], held=True)) == "cell [7]: +2.1 GiB on GPU 0, still held"
    assert (
        summary(row(rss_after=GiB + 400 * MiB, rss_peak=GiB + 1200 * MiB))
        == "cell [7]: +400.0 MiB host (peak +1.2 GiB), given back"
    )
    assert summary(row()) == "cell [7]: no notable change"
    assert summary(row(ended_at=None, rss_now=GiB + 300 * MiB)) == "cell [7]: running, +300.0 MiB host so far"


def cell_row(kernel: Kernel, count: int, ready: str = "True") -> dict[str, Any]:
    """The ledger's row for cell ``count``, once ``ready`` (an expression of ``r``, the row) holds."""

    def found() -> dict[str, Any] | None:
        value = kernel.evaluate(f"[r for r in [rows().get({count})] if r is not None and ({ready})]")
        return value[0] if value else None

    result = wait_until(found, 20, 0.2, f"the ledger's row of cell [{count}] with {ready}")
    assert result is not None
    return result


@pytest.mark.kernel
def test_a_cell_that_keeps_memory_is_named_and_then_given_back(kernel: Kernel) -> None:
    take = kernel.run("big = np.ones(256 * 2**20 // 8); gpu(2 * 2**30); time.sleep(0.3)")
    count = take.reply["content"]["execution_count"]
    taken = cell_row(kernel, count, "r['gpu_after'] is not None")
    assert taken["rss_after"] - taken["rss_before"] >= 200 * MiB
    assert taken["rss_held"] and taken["held"]
    (device,) = taken["gpu_devices"]
    assert device["index"] == 0 and device["after"] - device["before"] == 2 * GiB
    assert taken["gpu_after"] - taken["gpu_before"] == 2 * GiB
    assert taken["gpu_held"]
    assert re.fullmatch(rf"cell \[{count}\]: \+2[0-9.]+ MiB host, \+2\.0 GiB on GPU 0, still held", taken["summary"])
    kernel.run("del big; gc.collect(); gpu(-2 * 2**30)")
    given = cell_row(kernel, count, "not r['held']")
    assert not given["rss_held"] and not given["gpu_held"]
    assert given["summary"].endswith(", given back")


@pytest.mark.kernel
def test_the_peak_of_a_cell_that_gave_its_memory_back(kernel: Kernel) -> None:
    # More than any cell before it, by 384 MiB: the process's own high-water mark rises, so the peak is exact. The
    # size is measured, not assumed: what the kernel's earlier cells (and its imports) raised the mark to is read first.
    hwm, rss = kernel.evaluate(
        "[__import__('resource').getrusage(__import__('resource').RUSAGE_SELF).ru_maxrss * 1024,"
        " __import__('psutil').Process().memory_info().rss]"
    )
    size = max(0, hwm - rss) + 384 * MiB
    result = kernel.run(f"tmp = np.ones({size} // 8); del tmp; gc.collect()")
    count = result.reply["content"]["execution_count"]
    peak = cell_row(kernel, count)
    why = f"mark {hwm / MiB:.0f} MiB at {rss / MiB:.0f} MiB; the cell took {size / MiB:.0f} MiB"
    assert peak["rss_peak_exact"], why
    assert peak["rss_peak"] - peak["rss_before"] >= size - 34 * MiB
    assert abs(peak["rss_after"] - peak["rss_before"]) < 64 * MiB
    assert not peak["held"]
    shown = re.search(r"\(peak \+([0-9.]+) (MiB|GiB)\)", peak["summary"])
    assert shown, peak["summary"]
    summary_peak = float(shown[1]) * (GiB if shown[2] == "GiB" else MiB)
    assert abs(summary_peak - (peak["rss_peak"] - peak["rss_before"])) < 0.06 * GiB


@pytest.mark.kernel
def test_the_running_cell_and_the_json(kernel: Kernel) -> None:
    result = kernel.run("""
now = rows()
running = [r for r in now.values() if r["ended_at"] is None]
print(json.dumps({"running": [r["summary"] for r in running], "json": len(json.loads(json.dumps(now))) > 0}))""")
    line = result.stdout.strip().splitlines()[-1]
    count = result.reply["content"]["execution_count"]
    assert re.fullmatch(rf'\{{"running": \["cell \[{count}\]: running, [+-][0-9.]+ \w+ host so far"\], "json": true}}',
                        line), line


@pytest.mark.kernel
def test_unload_removes_the_ledger(kernel: Kernel) -> None:
    result = kernel.run("""
%unload_ext nbcoord
print(json.dumps([
    _ledger._active,
    "memory" in dict(_ext.host._cell_listeners.items()),
    "memory" in dict(_ext.host.monitor._tasks.items()),
    "cell_memory" in dict(_ext.host.snapshots._sources.items()),
]))
%load_ext nbcoord""")
    assert result.stdout.strip().splitlines()[-1] == "[false, false, false, false]"
