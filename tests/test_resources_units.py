"""The resources' shared readers and plug-in point, alone: the one NVML reader (against tests/fake_nvml.py, a FAKE
of nvidia-ml-py's ``pynvml``), the one /proc reader, and the registry of framework memory hooks."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import fake_nvml
import pytest

from nbcoord.core import imports
from nbcoord.resources import frameworks, nvml, proc
from nbcoord.resources.reclaim import release_frameworks
from nbcoord.tensorflow import integration as tensorflow_integration
from nbcoord.tensorflow import watch as tensorflow_watch


@pytest.fixture
def fake() -> Iterator[Any]:
    fake_nvml.reset()
    yield fake_nvml
    fake_nvml.reset()


# ---------------------------------------------------------------------------------------------------- NVML
def test_one_reading_gives_devices_and_process_lists_as_nvml_says(fake: Any) -> None:
    fake.reset([
        fake.FakeDevice(processes=[fake.FakeProcess(10, 100), fake.FakeProcess(11, None)]),
        fake.FakeDevice(name="second", processes_error=fake.NVML_ERROR_NO_PERMISSION),
    ])  # fmt: skip
    reading = nvml.Nvml(fake).read()
    assert reading.unavailable is None
    first, second = reading.devices
    assert (first.index, first.name) == (0, "NVIDIA Fake GPU")
    assert first.processes == (nvml.Process(10, 100), nvml.Process(11, None))
    assert (second.index, second.name, second.processes) == (1, "second", None)  # the list is unreadable here


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, "driver"),
        (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver-not-loaded"),
        (fake_nvml.NVML_ERROR_NO_PERMISSION, "start"),
    ],
)
def test_a_failed_start_says_why_and_is_not_retried(fake: Any, code: int, kind: str) -> None:
    fake.reset([fake.FakeDevice()], fail_init=code)
    reader = nvml.Nvml(fake)
    assert reader.read().unavailable == nvml.Unavailable(kind, str(fake.NVMLError(code)))
    reader.read()
    reader.close()
    assert fake.calls == ["nvmlInit"]


def test_no_library_and_no_device(fake: Any) -> None:
    assert nvml.Nvml("no_such_nvml_module").read().unavailable == nvml.Unavailable("library")
    fake.reset([])
    assert nvml.Nvml("fake_nvml").read().unavailable == nvml.Unavailable("no-device")


def test_close_shuts_down_and_a_later_read_starts_again(fake: Any) -> None:
    fake.reset([fake.FakeDevice()])
    reader = nvml.Nvml(fake)
    assert fake.calls == []  # constructing the reader touches nothing
    reader.read()
    reader.close()
    reader.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert reader.read().devices
    assert fake.calls.count("nvmlInit") == 2
    reader.close()


def test_cuda_indices_map_to_nvml_through_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 0")
    assert [nvml.nvml_index(i) for i in range(3)] == [2, 0, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5b1d")  # UUIDs: the order is CUDA's own
    assert nvml.nvml_index(0) == 0


# --------------------------------------------------------------------------------------------------- /proc
def test_walk_is_breadth_first_once_each_and_bounded() -> None:
    tree = {1: [2, 3], 2: [4], 3: [1], 4: [5]}  # 3 -> 1: a pid reused during the read makes a cycle
    assert proc.walk(1, lambda pid: tree.get(pid, [])) == [(2, 1), (3, 1), (4, 2), (5, 4)]
    assert proc.walk(1, lambda pid: tree.get(pid, []), max_depth=2) == [(2, 1), (3, 1), (4, 2)]
    assert proc.walk(1, lambda pid: tree.get(pid, []), max_depth=None) == [(2, 1), (3, 1), (4, 2), (5, 4)]


@pytest.mark.skipif(not proc.HAS_PROC, reason="no Linux /proc")
def test_stat_of_a_child_and_its_start() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        stat = proc.read_stat(f"/proc/{child.pid}/stat")
        assert stat is not None and stat.ppid == os.getpid()
        started = proc.started_at(child.pid)
        assert started is not None and abs(started - proc.boot_to_wall() - stat.start_ticks / proc.CLOCK_TICKS) < 0.1
        assert (child.pid, os.getpid()) in proc.descendants_from_stat(os.getpid())
        if proc.HAS_CHILDREN_LISTS:
            assert (child.pid, os.getpid()) in (proc.descendants(os.getpid()) or [])
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert proc.read_stat(f"/proc/{child.pid}/stat") is None  # gone: None, never an error
    assert proc.started_at(child.pid) is None


# ---------------------------------------------------------------------------------------------- frameworks
def test_a_framework_runs_only_while_imported_in_report_order(monkeypatch: pytest.MonkeyPatch) -> None:
    def action(label: str) -> Any:
        return lambda _note: frameworks.FrameworkAction(framework=label, action="done", note=None)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    late = frameworks.add(frameworks.Framework("nbc_fake_late", "Late", 99, release=action("Late")))
    early = frameworks.add(frameworks.Framework("nbc_fake_early", "Early", 1, release=action("Early")))
    try:
        assert [a["framework"] for a in release_frameworks(None) if a["framework"] != "glibc"] == []
        monkeypatch.setitem(sys.modules, "nbc_fake_late", types.ModuleType("nbc_fake_late"))
        monkeypatch.setitem(sys.modules, "nbc_fake_early", types.ModuleType("nbc_fake_early"))
        names = [a["framework"] for a in release_frameworks(None) if a["framework"] != "glibc"]
        assert names == ["Early", "Late"]
    finally:
        late()
        early()
        late()  # a remover is safe to call twice
    assert not [f for f in frameworks.registered() if f.module.startswith("nbc_fake")]


def test_tensorflows_part_registers_once_tensorflow_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    fired: list[Any] = []
    started: list[Any] = []

    def fake_when_imported(name: str, callback: Any) -> Any:
        fired.append((name, callback))
        return lambda: fired.append("hook removed")

    def fake_start(host: Any, *, scan: bool) -> Any:
        started.append((host, scan))
        return lambda: started.append("integration undone")

    monkeypatch.setattr(tensorflow_watch, "when_imported", fake_when_imported)
    monkeypatch.setattr(tensorflow_integration, "start", fake_start)
    host = object()
    undo = tensorflow_watch.watch(host)  # type: ignore[arg-type]
    assert [f for f in frameworks.registered() if f.module == "tensorflow"] == [] and started == []
    ((name, callback),) = fired
    assert name == "tensorflow"
    callback(types.ModuleType("tensorflow"))  # what the post-import hook does after `import tensorflow`
    assert [f.label for f in frameworks.registered() if f.module == "tensorflow"] == ["TensorFlow"]
    assert started == [(host, False)], "the integration installed without a scan (nothing predates the import)"
    undo()
    assert fired[-1] == "hook removed" and started[-1] == "integration undone"
    assert [f for f in frameworks.registered() if f.module == "tensorflow"] == []
    assert imports.when_imported is not fake_when_imported  # only the TensorFlow part's name was replaced
