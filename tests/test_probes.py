"""The resource probe (nbcoord.resources.probes): GPU through a fake NVML, host memory, native threads, children.

GPU code runs against ``fake_nvml``, a FAKE of nvidia-ml-py's ``pynvml`` (see its docstring): CI has no
NVIDIA hardware. Everything else is real: real child processes (subprocess and multiprocessing) attributed
to synthetic cell windows, a real zombie, real allocations, real threads; TensorFlow runs in a subprocess so
that it stays out of the pytest process. Kernel-level tests (a probe wired into a real kernel) live with the
lifecycle's tests.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import fake_nvml
import psutil
import pytest
from helpers import wait_until

from nbcoord.resources import proc as procfs
from nbcoord.resources.probes import (
    DRIVER_NOT_LOADED,
    NO_DEVICE,
    NO_DRIVER,
    NO_LIBRARY,
    CellWindow,
    ResourceProbe,
    Resources,
    cell_for_time,
    format_bytes,
)
from nbcoord.tensorflow import memory as tensorflow_memory
from nbcoord.tensorflow.memory import TF_HOLDS_GPU, TF_NOT_STARTED

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MiB = 2**20
GiB = 2**30
IMPOSSIBLE_PID = 2**22 + 17  # above Linux's largest pid_max: a PID of another namespace
LINUX = sys.platform.startswith("linux")
# Says it is up (so its exec and interpreter start are done), then lives until its stdin closes.
WAITER = [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"]


def later_than(moment: float, gap: float = 0.03) -> None:
    """Wait until the wall clock is past ``moment + gap``: cell windows a few clock ticks apart, as real
    cells are, since Linux records process starts to 10 ms."""
    wait_until(lambda: time.time() > moment + gap)


def native_id(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return thread.native_id


def python_threads() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def sample(probe: ResourceProbe, cells: list[CellWindow] | None = None) -> Resources:
    return probe.sample(cells or [], python_threads())


@pytest.fixture(autouse=True)
def without_real_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide a TensorFlow that another test imported into this process: the probe reads TF's figures whenever
    it is imported, and these tests decide themselves whether TF is there (a fake one, or none)."""
    for name in ("tensorflow", "tensorflow.python.eager.context"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture(autouse=True)
def tensorflow_part() -> Iterator[None]:
    """TensorFlow's memory hooks registered, as the wiring registers them once TensorFlow is imported (they run
    only while a TensorFlow, fake or real, is in sys.modules)."""
    remove = tensorflow_memory.register()
    yield
    remove()


@pytest.fixture
def nvml() -> Iterator[Any]:
    fake_nvml.reset()
    yield fake_nvml
    fake_nvml.reset()


@pytest.fixture(params=["proc", "psutil"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of reading threads and children: Linux's /proc directly, and psutil (other systems)."""
    if request.param == "proc" and not procfs.HAS_PROC:
        pytest.skip("no Linux /proc")
    monkeypatch.setattr(procfs, "HAS_PROC", request.param == "proc")
    return str(request.param)


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start waiter processes; closes their stdin and reaps them after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(args: list[str] = WAITER) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        if args is WAITER:
            assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # blocks until it is up
        return proc

    yield start
    for proc in started:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def child_row(res: Resources, pid: int) -> dict[str, Any]:
    rows = [c for c in res["children"] if c["pid"] == pid]
    assert len(rows) == 1, f"pid {pid} not among {[c['pid'] for c in res['children']]}"
    return dict(rows[0])


# --- pure helpers ------------------------------------------------------------------------------------------


def test_format_bytes() -> None:
    assert format_bytes(None) == "n/a"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(200 * MiB) == "200.0 MiB"
    assert format_bytes(80 * GiB) == "80.0 GiB"
    assert format_bytes(3 * 1024 * GiB) == "3.0 TiB"


def test_cell_for_time_picks_the_window_that_holds_the_start() -> None:
    cells = [CellWindow(1, 100.0, 101.0), CellWindow(2, 102.0, 103.0), CellWindow(3, 104.0, None)]
    assert cell_for_time(100.5, cells) == 1
    assert cell_for_time(101.0, cells) == 1  # the window's edge is inside
    assert cell_for_time(101.5, cells) is None  # between cells
    assert cell_for_time(99.0, cells) is None
    assert cell_for_time(500.0, cells) == 3  # the cell still running
    # a start recorded in 10 ms ticks, rounded down: 101.995 may really be 102.001, in cell 2
    assert cell_for_time(101.995, cells, 0.01) == 2
    # ... but a window that opens exactly where the tick ends did not hold it
    assert cell_for_time(101.99, cells, 0.01) is None
    # two windows share the tick: the one covering more of it wins
    tight = [CellWindow(7, 10.0, 10.002), CellWindow(8, 10.002, None)]
    assert cell_for_time(10.0, tight, 0.01) == 8
    assert cell_for_time(10.0, tight) == 7


# --- GPU through the fake NVML -----------------------------------------------------------------------------


def test_gpu_rows_with_this_process_and_a_child(nvml: Any, spawn: Callable[..., Any]) -> None:
    child = spawn()
    nvml.reset(
        [
            nvml.FakeDevice(
                name="NVIDIA H100",
                total=80 * GiB,
                used=5 * GiB,
                processes=[nvml.FakeProcess(os.getpid(), 3 * GiB), nvml.FakeProcess(IMPOSSIBLE_PID, GiB)],
            ),
            nvml.FakeDevice(total=24 * GiB, used=GiB, processes=[nvml.FakeProcess(child.pid, GiB)]),
        ]
    )
    res = sample(ResourceProbe(nvml=nvml))
    gpu = res["gpu"]
    assert gpu["available"] and gpu["reason"] is None and gpu["tf_note"] is None
    first, second = gpu["devices"]
    assert (first["index"], first["name"], first["used"]) == (0, "NVIDIA H100", 5 * GiB)
    assert (second["index"], second["total"]) == (1, 24 * GiB)
    assert first["process_visible"] and first["process_used"] == 3 * GiB
    assert first["tf_current"] is None and first["tf_peak"] is None  # TensorFlow not imported
    # this process is not on the second device, but its list shows our child: visible, and 0 for us
    assert second["process_visible"] and second["process_used"] == 0
    assert child_row(res, child.pid)["gpu_mem"] == GiB
    json.dumps(res)


@pytest.mark.parametrize(
    "device",
    [
        fake_nvml.FakeDevice(processes=[]),  # a container's NVML lists nothing
        fake_nvml.FakeDevice(processes=[fake_nvml.FakeProcess(IMPOSSIBLE_PID, 2 * GiB)]),  # the host's PIDs
        fake_nvml.FakeDevice(processes_error=fake_nvml.NVML_ERROR_NOT_SUPPORTED),
        fake_nvml.FakeDevice(processes_error=fake_nvml.NVML_ERROR_NO_PERMISSION),
    ],
    ids=["empty-list", "foreign-pids", "not-supported", "no-permission"],
)
def test_gpu_process_use_not_visible_is_not_zero(nvml: Any, spawn: Callable[..., Any], device: Any) -> None:
    child = spawn()
    nvml.reset([device])
    res = sample(ResourceProbe(nvml=nvml))
    (row,) = res["gpu"]["devices"]
    assert row["process_visible"] is False
    assert row["process_used"] is None
    assert row["used"] == device.used  # the device's own figures are still there
    assert child_row(res, child.pid)["gpu_mem"] is None


def test_gpu_process_use_unknown_to_the_driver(nvml: Any) -> None:
    nvml.reset([nvml.FakeDevice(processes=[nvml.FakeProcess(os.getpid(), None)])])  # Windows WDDM
    (row,) = sample(ResourceProbe(nvml=nvml))["gpu"]["devices"]
    assert row["process_visible"] is True and row["process_used"] is None


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, NO_DRIVER),
        (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, DRIVER_NOT_LOADED),
        (fake_nvml.NVML_ERROR_NO_PERMISSION, "NVML error: Insufficient Permissions"),
    ],
)
def test_gpu_reason_when_nvml_cannot_start(nvml: Any, code: int, reason: str) -> None:
    nvml.reset([nvml.FakeDevice()], fail_init=code)
    probe = ResourceProbe(nvml=nvml, min_native_interval=0, max_duty=None)
    gpu = sample(probe)["gpu"]
    assert gpu == {"available": False, "reason": reason, "devices": [], "tf_note": None}
    sample(probe)
    assert nvml.calls == ["nvmlInit"]  # a failed start is not retried at every sample
    probe.close()
    assert nvml.calls == ["nvmlInit"]  # nothing to shut down


def test_gpu_reason_no_device(nvml: Any) -> None:
    nvml.reset([])
    gpu = sample(ResourceProbe(nvml=nvml))["gpu"]
    assert (gpu["available"], gpu["reason"], gpu["devices"]) == (False, NO_DEVICE, [])


def test_gpu_reason_library_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    gpu = sample(ResourceProbe())["gpu"]
    assert (gpu["available"], gpu["reason"]) == (False, NO_LIBRARY)


def test_real_pynvml_says_why_or_shows_devices() -> None:
    """The real nvidia-ml-py: on machines without NVIDIA hardware it must say so, not fail."""
    pytest.importorskip("pynvml")
    probe = ResourceProbe()
    gpu = sample(probe)["gpu"]
    probe.close()
    if gpu["available"]:
        assert all(d["total"] > 0 for d in gpu["devices"])
    else:
        assert gpu["reason"] in {NO_DRIVER, DRIVER_NOT_LOADED, NO_DEVICE}
        assert os.path.exists("/dev/nvidiactl") or gpu["reason"] == NO_DRIVER


def test_nvml_started_lazily_once_and_shut_down_by_close(nvml: Any) -> None:
    nvml.reset([nvml.FakeDevice()])
    probe = ResourceProbe(nvml=nvml, min_native_interval=0, max_duty=None)
    assert nvml.calls == []  # constructing the probe touches nothing
    for _ in range(3):
        sample(probe)
    assert nvml.calls.count("nvmlInit") == 1
    assert nvml.calls.count("nvmlDeviceGetMemoryInfo") == 3
    probe.close()
    assert not nvml.initialised() and nvml.calls[-1] == "nvmlShutdown"
    probe.close()
    assert nvml.calls.count("nvmlShutdown") == 1
    assert sample(probe)["gpu"]["available"]  # a sample after close starts NVML again
    probe.close()


# --- child processes ---------------------------------------------------------------------------------------

GRANDPARENT = textwrap.dedent(
    """
    import subprocess, sys
    sys.stdin.readline()
    waiter = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    grandchild = subprocess.Popen(waiter, stdin=subprocess.PIPE)
    print(grandchild.pid, flush=True)
    sys.stdin.readline()
    """
)


def test_children_attributed_to_their_cells(nvml: Any, spawn: Callable[..., Any]) -> None:
    fork = multiprocessing.get_context("fork")
    t0 = time.time()
    by_subprocess = spawn()
    t1 = time.time()
    later_than(t1)
    t2 = time.time()
    by_multiprocessing = fork.Process(target=time.sleep, args=(60,), daemon=True)
    by_multiprocessing.start()
    assert by_multiprocessing.pid is not None
    t3 = time.time()
    later_than(t3)
    t4 = time.time()
    parent = spawn([sys.executable, "-c", GRANDPARENT])
    t5 = time.time()
    later_than(t5)
    t6 = time.time()  # cell 4 runs while the cell-3 child starts a grandchild
    parent.stdin.write(b"go\n")
    parent.stdin.flush()
    grandchild_pid = int(parent.stdout.readline())
    t7 = time.time()
    later_than(t7)
    outside = spawn()  # no cell runs
    cells = [CellWindow(1, t0, t1), CellWindow(2, t2, t3), CellWindow(3, t4, t5), CellWindow(4, t6, t7)]
    try:
        res = ResourceProbe(nvml=nvml).sample(cells, {})
        assert child_row(res, by_subprocess.pid)["cell"] == 1
        assert child_row(res, by_multiprocessing.pid)["cell"] == 2
        assert child_row(res, parent.pid)["cell"] == 3
        # started during cell 4, by a process that cell 3 started: it belongs to cell 3
        grandchild = child_row(res, grandchild_pid)
        assert grandchild["cell"] == 3 and grandchild["started_at"] >= t6 - 0.01
        assert child_row(res, outside.pid)["cell"] is None
        row = child_row(res, by_subprocess.pid)
        assert row["status"] in {"sleeping", "running"} and "sys.stdin.read()" in row["cmdline"]
        assert row["rss"] and row["rss"] > MiB and row["gpu_mem"] is None  # fake NVML: no device
        assert t0 - 0.011 <= row["started_at"] <= t1
        assert res["host"]["children_rss"] == sum(c["rss"] or 0 for c in res["children"]) > 0
        live = {p.pid for p in ResourceProbe(nvml=nvml).children()}
        assert {by_subprocess.pid, by_multiprocessing.pid, parent.pid, grandchild_pid, outside.pid} <= live
    finally:
        by_multiprocessing.terminate()
        by_multiprocessing.join(10)


def test_child_rows_from_either_reader(nvml: Any, reader: str, spawn: Callable[..., Any]) -> None:
    t0 = time.time()
    child = spawn()
    t1 = time.time()
    # a wide window: psutil's create_time() on Linux can be up to a second early (see procfs.boot_to_wall)
    row = child_row(sample(ResourceProbe(nvml=nvml), [CellWindow(5, t0 - 2, t1 + 2)]), child.pid)
    assert row["cmdline"] == " ".join(WAITER)
    assert row["status"] in {"sleeping", "running"}
    assert row["rss"] is not None and row["rss"] > MiB
    assert (row["cell"], row["gpu_mem"]) == (5, None)
    assert t0 - 1.02 <= row["started_at"] <= t1


def test_defunct_child_shown_as_zombie(nvml: Any, reader: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once; not reaped until wait()
    try:
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
        row = child_row(sample(ResourceProbe(nvml=nvml)), child.pid)
        assert row["status"] == "zombie"
        assert row["cmdline"].endswith("<defunct>")
        assert row["rss"] == 0
    finally:
        child.wait()


# --- host memory and history -------------------------------------------------------------------------------


def test_memory_figures_move_with_an_allocation(nvml: Any) -> None:
    probe = ResourceProbe(nvml=nvml, min_native_interval=0, max_duty=None)
    before = sample(probe)["host"]
    block = bytearray(b"\x01") * (200 * MiB)  # written, so resident
    during = sample(probe)["host"]
    del block
    after = sample(probe)["host"]
    assert during["rss"] - before["rss"] >= 150 * MiB
    assert during["uss"] is not None and before["uss"] is not None
    assert during["uss"] - before["uss"] >= 150 * MiB
    assert during["rss"] - after["rss"] >= 150 * MiB  # a large block goes back to the OS when freed
    assert 0 < during["available"] < during["total"]


def test_rss_stays_live_between_expensive_reads(nvml: Any) -> None:
    probe = ResourceProbe(nvml=nvml, min_native_interval=3600)
    before = sample(probe)["host"]
    block = bytearray(b"\x01") * (200 * MiB)
    during = sample(probe)["host"]
    del block
    assert during["rss"] - before["rss"] >= 150 * MiB
    assert during["uss"] == before["uss"]  # USS is one of the expensive reads: cached


def test_history_is_a_bounded_ring_with_one_point_per_expensive_read(nvml: Any) -> None:
    now = [0.0]
    probe = ResourceProbe(nvml=nvml, min_native_interval=1.0, history_len=3, clock=lambda: now[0])
    for step in range(5):
        now[0] = float(step)
        sample(probe)
        sample(probe)  # inside the interval: no new point
    points = probe.history()
    assert len(points) == 3
    assert [p["sampled_at"] for p in points] == sorted(p["sampled_at"] for p in points)
    assert all(p["rss"] > 0 and p["native_threads"] >= 1 and p["gpu_used"] is None for p in points)
    points[0]["rss"] = -1  # a copy: the ring is not changed through it
    assert probe.history()[0]["rss"] > 0
    json.dumps(points)


# --- native threads ----------------------------------------------------------------------------------------


def test_native_threads_with_os_name_cpu_and_python_name(nvml: Any, reader: str) -> None:
    release = threading.Event()

    def burn_then_wait() -> None:
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        release.wait(30)

    worker = threading.Thread(target=burn_then_wait, name="probe-worker", daemon=True)
    worker.start()
    tid, main = native_id(worker), native_id(threading.main_thread())
    try:
        if LINUX:  # give the OS thread a name, as native libraries do
            Path(f"/proc/self/task/{tid}/comm").write_text("nbc-native")
        wait_until(lambda: _thread_cpu(tid) >= 0.09)
        names = {main: "MainThread", tid: "probe-worker"}
        rows = {r["native_id"]: r for r in ResourceProbe(nvml=nvml).sample([], names)["native_threads"]}
        row = rows[tid]
        assert row["python_name"] == "probe-worker" and row["cpu_s"] >= 0.09
        assert row["name"] == ("nbc-native" if reader == "proc" else "")
        assert rows[main]["python_name"] == "MainThread"
        assert all(r["python_name"] is None for tid, r in rows.items() if tid not in names)
    finally:
        release.set()
        worker.join(10)


def _thread_cpu(native_id: int) -> float:
    return next((t.user_time + t.system_time for t in psutil.Process().threads() if t.id == native_id), 0.0)


class CountingProcess:
    """A psutil.Process that counts the calls that cost (all but memory_info)."""

    COUNTED = frozenset({"threads", "children", "memory_full_info"})

    def __init__(self) -> None:
        self.inner = psutil.Process()
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.COUNTED:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def test_expensive_reads_at_most_once_per_interval(nvml: Any, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: psutil calls on the probe's process object, the probe's own /proc reads, NVML."""
    reads: list[str] = []
    read_small = procfs.read_small

    def counted_read(path: str) -> bytes | None:
        reads.append(path)
        return read_small(path)

    monkeypatch.setattr(procfs, "read_small", counted_read)
    nvml.reset([nvml.FakeDevice()])
    now = [100.0]
    process = CountingProcess()
    probe = ResourceProbe(
        nvml=nvml, min_native_interval=1.0, clock=lambda: now[0], process=cast(psutil.Process, process)
    )

    pid, main = os.getpid(), native_id(threading.main_thread())

    def enumerations() -> tuple[int, int, int, int]:
        """(thread enumerations, child enumerations, USS reads, NVML reads) so far. A pass over /proc reads
        the main thread's stat once, and this process's stat once (finding children)."""
        return (
            process.counts.get("threads", 0) + reads.count(f"/proc/{pid}/task/{main}/stat"),
            process.counts.get("children", 0) + reads.count(f"/proc/{pid}/stat"),
            process.counts.get("memory_full_info", 0),
            nvml.calls.count("nvmlDeviceGetMemoryInfo"),
        )

    for _ in range(10):
        res = probe.sample([], {})
    assert enumerations() == (1, 1, 1, 1)
    reads_after_first = len(reads)
    # between expensive reads the cached rows still get the current Python names
    assert {r["python_name"] for r in res["native_threads"] if r["native_id"] == main} == {None}
    res = probe.sample([], {main: "MainThread"})
    assert {r["python_name"] for r in res["native_threads"] if r["native_id"] == main} == {"MainThread"}
    now[0] += 0.999
    probe.sample([], {})
    assert enumerations() == (1, 1, 1, 1) and len(reads) == reads_after_first
    now[0] += 0.001
    probe.sample([], {})
    assert enumerations() == (2, 2, 2, 2)


def test_expensive_reads_spaced_to_keep_their_share_of_a_core(nvml: Any) -> None:
    now = [0.0]
    process = CountingProcess()
    real_full_info = process.inner.memory_full_info

    def slow_full_info() -> Any:
        now[0] += 0.02  # this expensive read "takes" 20 ms of the probe's clock
        return real_full_info()

    process.inner.memory_full_info = slow_full_info  # type: ignore[method-assign]
    probe = ResourceProbe(
        nvml=nvml,
        min_native_interval=1.0,
        max_duty=0.005,
        clock=lambda: now[0],
        process=cast(psutil.Process, process),
    )
    probe.sample([], {})
    assert process.counts["memory_full_info"] == 1
    now[0] = 3.9  # past min_native_interval, but 20 ms at 0.5 % of a core means 4 s apart
    probe.sample([], {})
    assert process.counts["memory_full_info"] == 1
    now[0] = 4.02
    probe.sample([], {})
    assert process.counts["memory_full_info"] == 2


# --- imports and TensorFlow --------------------------------------------------------------------------------


def run_python(code: str, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_the_probe_imports_neither_nvml_nor_tensorflow() -> None:
    out = run_python(
        "import sys, nbcoord.resources.probes as p; p.ResourceProbe(); "
        "print(sorted(m for m in ('pynvml', 'tensorflow') if m in sys.modules))"
    )
    assert out == "[]"


TF_SCRIPT = textwrap.dedent(
    """
    import json, os, threading
    import fake_nvml
    from nbcoord.resources.probes import ResourceProbe
    from nbcoord.core.imports import when_imported
    from nbcoord.tensorflow.memory import register

    when_imported("tensorflow", lambda module: register())  # registered once it is imported (as the wiring does)
    fake_nvml.reset([fake_nvml.FakeDevice(processes=[fake_nvml.FakeProcess(os.getpid(), 2**30)])])
    import tensorflow as tf
    from tensorflow.python.eager import context

    def names():
        return {t.native_id: t.name for t in threading.enumerate()}

    probe = ResourceProbe(nvml=fake_nvml, min_native_interval=0, max_duty=None)
    before = probe.sample([], names())
    started_by_probe = context.context()._initialized
    tf.linalg.matmul(tf.ones((300, 300)), tf.ones((300, 300))).numpy()  # starts the runtime and its pools
    after = probe.sample([], names())
    try:  # TensorFlow's CPU allocator keeps statistics on some machines only (seen: none on an AMD EPYC here)
        tf.config.experimental.get_memory_info("CPU:0")
        cpu_stats = True
    except ValueError:
        cpu_stats = False
    print(json.dumps({"started_by_probe": started_by_probe, "before": before, "after": after, "cpu_stats": cpu_stats}))
    """
)


@pytest.mark.tensorflow
def test_tensorflow_native_threads_and_notes() -> None:
    out = json.loads(run_python(TF_SCRIPT))
    before, after = out["before"], out["after"]
    assert out["started_by_probe"] is False  # the probe never starts TensorFlow's runtime
    # not started, and this process holds GPU memory (as graph-mode sessions do): TensorFlow keeps it
    assert before["gpu"]["tf_note"] == TF_HOLDS_GPU
    # started, with no TensorFlow GPU device (CPU build): the process's GPU memory is not TensorFlow's
    assert after["gpu"]["tf_note"] is None
    assert before["host"]["tf_cpu_peak"] is None  # not read before the runtime started
    if out["cpu_stats"]:
        assert after["host"]["tf_cpu_peak"] >= 300 * 300 * 4  # the matmul's result, at least
        assert 0 <= after["host"]["tf_cpu_current"] <= after["host"]["tf_cpu_peak"]
    else:  # an allocator without statistics: no figure, rather than a wrong one
        assert after["host"]["tf_cpu_peak"] is None and after["host"]["tf_cpu_current"] is None

    def native(res: dict[str, Any]) -> list[str]:
        return [r["name"] for r in res["native_threads"] if r["python_name"] is None]

    assert len(native(after)) > len(native(before))
    assert any(name.startswith("tf_") for name in native(after)), native(after)


def fake_tensorflow(
    monkeypatch: pytest.MonkeyPatch,
    *,
    started: bool,
    gpus: list[dict[str, int] | None],
    cpu: dict[str, int] | None = None,
) -> None:
    """Put a FAKE ``tensorflow`` in sys.modules: the calls the probe makes, with the given allocator figures
    (None: the device raises ValueError, as devices without allocator statistics do)."""

    def get_memory_info(device: str) -> dict[str, int]:
        kind, index = device.split(":")
        info = cpu if kind == "CPU" else gpus[int(index)]
        if info is None:
            raise ValueError(f"No allocator statistics for {device}")
        return info

    def list_logical_devices(kind: str) -> list[str]:
        return [f"/device:GPU:{i}" for i in range(len(gpus))] if kind == "GPU" else ["/device:CPU:0"]

    tf = types.ModuleType("tensorflow")
    tf.config = types.SimpleNamespace(  # type: ignore[attr-defined]
        experimental=types.SimpleNamespace(get_memory_info=get_memory_info),
        list_logical_devices=list_logical_devices,
    )
    context = types.ModuleType("tensorflow.python.eager.context")
    context.context_safe = lambda: types.SimpleNamespace(_initialized=started)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setitem(sys.modules, "tensorflow.python.eager.context", context)


def test_tensorflow_allocator_figures_on_device_rows(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_tensorflow(
        monkeypatch,
        started=True,
        gpus=[{"current": GiB, "peak": 2 * GiB}, None],
        cpu={"current": 5, "peak": 10},
    )
    nvml.reset([nvml.FakeDevice(), nvml.FakeDevice()])
    res = sample(ResourceProbe(nvml=nvml))
    first, second = res["gpu"]["devices"]
    assert (first["tf_current"], first["tf_peak"]) == (GiB, 2 * GiB)
    assert (second["tf_current"], second["tf_peak"]) == (None, None)  # ValueError: no statistics
    assert (res["host"]["tf_cpu_current"], res["host"]["tf_cpu_peak"]) == (5, 10)
    assert res["gpu"]["tf_note"] == TF_HOLDS_GPU


def test_tensorflow_gpu_index_follows_cuda_visible_devices(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake_tensorflow(monkeypatch, started=True, gpus=[{"current": 3, "peak": 4}])
    nvml.reset([nvml.FakeDevice(), nvml.FakeDevice()])
    first, second = sample(ResourceProbe(nvml=nvml))["gpu"]["devices"]
    assert first["tf_peak"] is None and second["tf_peak"] == 4


def test_tensorflow_note_without_nvml(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No NVML, but TensorFlow runs on a GPU: the note still says a restart is what frees it."""
    fake_tensorflow(monkeypatch, started=True, gpus=[{"current": 0, "peak": 0}])
    nvml.reset([], fail_init=nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    gpu = sample(ResourceProbe(nvml=nvml))["gpu"]
    assert (gpu["available"], gpu["reason"], gpu["tf_note"]) == (False, NO_DRIVER, TF_HOLDS_GPU)


def test_tensorflow_not_started_is_not_read(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runtime not started (graph mode), no GPU use seen: figures are not read, and the note says why."""
    fake_tensorflow(monkeypatch, started=False, gpus=[{"current": 1, "peak": 1}], cpu={"current": 1, "peak": 1})
    nvml.reset([nvml.FakeDevice(processes=[])])
    res = sample(ResourceProbe(nvml=nvml))
    assert res["gpu"]["tf_note"] == TF_NOT_STARTED
    assert res["gpu"]["devices"][0]["tf_peak"] is None and res["host"]["tf_cpu_peak"] is None
    nvml.reset([])  # and on a machine without a GPU, nothing to say
    assert sample(ResourceProbe(nvml=nvml))["gpu"]["tf_note"] is None


def test_a_failing_read_is_logged_once_however_many_threads_meet_it(caplog: pytest.LogCaptureFixture) -> None:
    import threading
    import time as _time

    class SlowSet(set[str]):
        def __contains__(self, item: object) -> bool:
            _time.sleep(0.01)  # widen the window between the check and the add
            return super().__contains__(item)

    probe = ResourceProbe(nvml=None)
    probe._logged = SlowSet()

    def broken() -> int:
        raise OSError("proc is gone")

    threads = [threading.Thread(target=probe._guard, args=("rss", broken, 0)) for _ in range(10)]
    with caplog.at_level("WARNING", logger="nbcoord"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
    assert sum("reading rss failed" in r.getMessage() for r in caplog.records) == 1
