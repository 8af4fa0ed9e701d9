"""The resource probe's part in one loaded nbcoord: the monitor's samples (per-thread CPU, the probe's history),
the snapshot's ``resources`` section, and the child processes a stop's scope holds."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from nbcoord.core.host import Host
from nbcoord.core.stop import ScopeKind
from nbcoord.resources.probes import CellWindow, ResourceProbe, Resources
from nbcoord.resources.proc import thread_cpu_seconds

#: Threads whose CPU time is read per monitor tick (about 18 us each): bounds the monitor's cost.
CPU_SAMPLES_PER_TICK = 64


class ResourceWatch:
    """Feeds the probe from the monitor and answers the stop's question "which children are in scope"."""

    def __init__(self, host: Host, probe: ResourceProbe) -> None:
        self._host = host
        self.probe = probe
        self._cpu_cursor = 0
        self._loaded_at = time.time()

    def install(self) -> Callable[[], None]:
        """Add the monitor tasks, the snapshot source and the stop's child finder; returns the undo."""
        host = self._host
        undo = [
            host.monitor.add_task("activity", host.registry.sample_activity),
            host.monitor.add_task("thread-cpu", self._sample_thread_cpu),
            host.monitor.add_task("resources", self._monitor_resources),
            host.snapshots.add_source("resources", self._resources_section),
            host.add_cells_in_use("resources", self._cells_of_children),
        ]
        host.find_children = self.children_in_scope

        def remove() -> None:
            host.find_children = None
            for step in reversed(undo):
                step()
            self.probe.close()

        return remove

    def _cell_windows(self) -> list[CellWindow]:
        return [CellWindow(c.execution_count, c.started_at, c.ended_at) for c in self._host.registry.cells()]

    def sample(self) -> Resources:
        """One resource sample (cheap between the probe's rate-limited full reads)."""
        return self.probe.sample(self._cell_windows(), self._host.registry.native_names())

    def _monitor_resources(self) -> bool:
        """The monitor's sample: keeps the probe's history going, and feeds per-thread CPU from each new read.
        Returns whether the kernel has child processes (live things to watch)."""
        noted = self.probe.read_at
        resources = self.sample()
        if self.probe.read_at != noted:
            self._host.registry.note_cpu({t["native_id"]: t["cpu_s"] for t in resources["native_threads"]})
        return bool(resources["children"])

    def _sample_thread_cpu(self) -> bool:
        """CPU time of the user's threads, a bounded number per tick, so that a busy thread never looks idle
        (its innermost frame can look the same at every sample while it works). Whether there were any."""
        registry = self._host.registry
        records = [r for r in registry.records() if r.user and r.native_id is not None]
        if not records:
            return False
        start = self._cpu_cursor % len(records)
        batch = (records[start:] + records[:start])[:CPU_SAMPLES_PER_TICK]
        self._cpu_cursor = start + len(batch)
        cpu: dict[int, float] = {}
        for record in batch:
            seconds = thread_cpu_seconds(record.native_id) if record.native_id is not None else None
            if record.native_id is not None and seconds is not None:
                cpu[record.native_id] = seconds
        registry.note_cpu(cpu)
        return True

    def _resources_section(self) -> dict[str, Any]:
        return {"resources": self.sample()}

    def _cells_of_children(self) -> set[int]:
        sample = self.probe.last_sample
        if sample is None:
            return set()
        return {child["cell"] for child in sample["children"] if child["cell"] is not None}

    def children_in_scope(self, kind: ScopeKind, cell: int | None) -> Sequence[psutil.Process]:
        """Child processes started since load by the cells in scope (exact start times against their runs)."""
        if kind == "thread":
            return []
        spared = self._host.spared_pids()
        chosen: list[psutil.Process] = []
        for child, owner, started_at in self.probe.children_in_cells(self._cell_windows()):
            if started_at + 0.02 < self._loaded_at:
                continue  # not ours to stop: it existed before nbcoord was loaded
            if child.pid in spared:
                continue  # the kernel's helper (a resource tracker): it leaves with the kernel
            if (
                kind == "all"
                or (kind == "cell" and owner == cell)
                or (kind == "zombies" and owner is not None and self._host.cell_failed(owner))
            ):
                chosen.append(child)
        return chosen
