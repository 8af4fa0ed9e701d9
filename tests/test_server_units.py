"""The server extension's parts without a server: the request schema, the kernel's summary, the view's order, the
metrics, the kernel command, GPU memory by pid (with the FAKE NVML of tests/fake_nvml.py), and the activity list."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import fake_nvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nbcoord.core.schema import (
    MAX_CELLS,
    MAX_QUEUES,
    MAX_TEXT,
    REPLY,
    REQUEST,
    SchemaError,
    parse_request,
    parse_stop,
    stop_request,
)
from nbcoord.kernel import control as _control
from nbcoord.server import untrack_messages
from nbcoord.server._gpu import GpuRead, GpuStatus, Nvml
from nbcoord.server._kernels import (
    CLASS_NAME,
    DEFAULT_CLASS,
    EXTENSION_ARGUMENT,
    is_ipython_kernel,
    use_in,
    with_nbcoord,
)
from nbcoord.server._metrics import FleetCollector
from nbcoord.server._model import KernelRow, attention, sort_key
from nbcoord.server._outside import Outside, gpu_held
from nbcoord.server._summary import OffSchema, bounded_report, check_summary


# ------------------------------------------------------------------------------------------------------ schema
def test_a_stop_request_round_trips() -> None:
    stop = parse_stop({"scope": "cell", "cell": 4, "grace": 2, "force": True})
    assert stop == {"scope": "cell", "cell": 4, "grace": 2.0, "force": True}
    assert parse_request(stop_request(stop)) == {"action": "stop", "stop": stop}
    assert parse_stop({"scope": "zombies"}) == {"scope": "zombies", "cell": None, "grace": None, "force": False}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, "JSON object"),
        ({"scope": "all", "cell": None, "x": 1}, "unknown field(s): x"),
        ({"scope": 1}, '"scope" must be one of'),
        ({"scope": "thread"}, '"scope" must be one of'),
        ({"scope": "cell", "cell": True}, '"cell" must be'),
        ({"scope": "cell", "cell": -1}, '"cell" must be'),
        ({"scope": "cell", "cell": 2**40}, '"cell" must be'),
        ({"scope": "all", "grace": math.nan}, '"grace" must be a number'),
        ({"scope": "all", "grace": 31}, "between 0 and 30"),
        ({"scope": "all", "force": 1}, '"force" must be true or false'),
    ],
)
def test_a_malformed_stop_says_what_is_wrong(body: Any, words: str) -> None:
    with pytest.raises(SchemaError, match=None) as raised:
        parse_stop(body)
    assert words in str(raised.value)


@pytest.mark.parametrize(
    "content",
    [None, [], {"action": "summary", "schema": 2}, {"action": "summary", "schema": "1"}, {"action": "eval"},
     {"action": "summary", "code": "print(1)"}],
)  # fmt: skip
def test_a_request_that_is_not_the_schemas_is_refused(content: Any) -> None:
    with pytest.raises(SchemaError):
        parse_request(content)


def test_message_types_are_nbcoords_own() -> None:
    assert (REQUEST, REPLY) == ("nbcoord_request", "nbcoord_reply")


# ----------------------------------------------------------------------------------------------------- summary
def thread_row(tid: str, *, user: bool = True, state: str = "waiting", zombie: str | None = None,
               cell: int | None = 1, alive: bool = True) -> dict[str, Any]:  # fmt: skip
    return {"tid": tid, "name": f"name-{tid}" * 50, "alive": alive, "user": user, "state": state, "zombie": zombie,
            "cell": cell}  # fmt: skip


def snapshot(**sections: Any) -> Any:
    base: dict[str, Any] = {
        "schema": 1, "taken_at": 100.0, "pid": 42, "threads": [], "cells": [], "failures": [], "zombie_count": 0,
        "queues": [], "blocked_runs": [], "sessions": [], "resources": None, "last_stop": None,
    }  # fmt: skip
    base.update(sections)
    return base


def test_the_summary_counts_and_never_lists_threads() -> None:
    threads = [
        thread_row("t1", state="running", zombie="cell-error", cell=3),
        thread_row("t2", state="waiting", zombie="cell-error", cell=3),
        thread_row("t3", state="waiting", cell=5),
        thread_row("t4", user=False, cell=None),  # the kernel's own
        thread_row("t5", alive=False, cell=5),  # finished
        *[thread_row(f"x{i}", cell=100 + i) for i in range(MAX_CELLS + 5)],
    ]
    queues = [
        {"id": "q1", "name": "input", "size": 5, "capacity": 10},
        {"id": "q1", "name": "input", "size": 9, "capacity": 10},  # the same queue in another session: the fuller
        {"id": "q2", "name": "unbounded", "size": 7, "capacity": -1},
        *[{"id": f"f{i}", "name": f"filler-{i:02d}", "size": 0, "capacity": 4} for i in range(MAX_QUEUES + 3)],
    ]
    blocked = [{"thread": "MainThread", "seconds": 12.5, "text": "waits on dequeue of input"},
               {"thread": "runner", "seconds": 3.0}]  # fmt: skip
    resources = {"host": {"rss": 123}, "children": [{"pid": 7}], "gpu": {"devices": [{"index": 0,
                 "process_used": 2048}]}}  # fmt: skip
    last = {"scope": "zombies", "cell": None, "started_at": 90.0, "took_s": 0.5, "stopped": [{"name": "a"}],
            "alive": [{"name": "stubborn"}], "stopper_errors": []}  # fmt: skip
    cells = [{"execution_count": 6, "ended_at": None, "started_at": 95.0}]
    summary = _control.build_summary(
        snapshot(threads=threads, queues=queues, blocked_runs=blocked, resources=resources, last_stop=last,
                 cells=cells, failures=[{}]),
        "9.9",
    )  # fmt: skip
    assert summary["threads"] == 3 + MAX_CELLS + 5
    assert summary["threads_by_state"] == {"running": 1, "waiting": 2 + MAX_CELLS + 5, "stopping": 0}
    assert summary["kernel_threads"] == 1
    assert summary["zombies"] == 2
    assert summary["zombie_reasons"] == {"cell-error": 2}
    assert summary["cells"][0] == {"cell": 3, "threads": 2, "zombies": 2}, "zombies first"
    assert len(summary["cells"]) == MAX_CELLS
    assert summary["running_cell"] == 6 and summary["running_since"] == 95.0
    assert summary["tasks"] is None
    assert summary["worker_processes"] == 1
    assert summary["blocked_runs"] == 2 and summary["blocked_seconds"] == 12.5
    assert summary["blocked"][0]["text"] == "waits on dequeue of input"
    assert summary["queues"][0] == {"name": "input", "size": 9, "capacity": 10, "fill": 0.9}
    assert len(summary["queues"]) == MAX_QUEUES
    assert summary["queues_total"] == 2 + MAX_QUEUES + 3
    assert summary["failures"] == 1
    assert summary["rss"] == 123
    assert summary["gpu"] == [{"index": 0, "process_used": 2048}]
    assert summary["last_stop"] == {"scope": "zombies", "cell": None, "started_at": 90.0, "took_s": 0.5,
                                    "stopped": 1, "alive": 1, "alive_names": ["stubborn"], "errors": 0}  # fmt: skip
    assert "t1" not in repr(summary), "no thread ids or rows: the reply stays small"


def test_summary_texts_are_cut() -> None:
    blocked = [{"thread": "x" * 10_000, "seconds": 1.0, "text": "y" * 10_000}]
    summary = _control.build_summary(snapshot(blocked_runs=blocked), "1")
    assert len(summary["blocked"][0]["thread"]) == MAX_TEXT
    assert len(summary["blocked"][0]["text"] or "") == MAX_TEXT


def test_tasks_are_counted_when_the_snapshot_has_them() -> None:
    assert _control.build_summary(snapshot(tasks=[{}, {}]), "1")["tasks"] == 2


def test_no_route_where_the_kernel_offers_none() -> None:
    class Shell:
        kernel = None

    extension = SimpleNamespace(shell=Shell(), degraded_routes={})
    undo = _control.install(extension)
    undo()  # nothing was installed; the undo does nothing
    extension.shell.kernel = SimpleNamespace(control_handlers={}, control_thread=None, session=None)
    _control.install(extension)()
    assert extension.shell.kernel.control_handlers == {}


# ---------------------------------------------------------------------------------------------------- the view
def row(**fields: Any) -> KernelRow:
    base: dict[str, Any] = {
        "id": "k", "name": "python3", "path": "a.ipynb", "execution_state": "idle", "last_activity": None,
        "connections": 0, "pid": 1, "rss": 1, "gpu": [], "worker_processes": 0, "status": "ok", "error": None,
        "answer_ms": 1.0, "nbcoord": None, "attention": [],
    }  # fmt: skip
    base.update(fields)
    result: KernelRow = base  # type: ignore[assignment]
    result["attention"] = attention(result)
    return result


def summary_with(zombies: int = 0, blocked: int = 0) -> Any:
    return {"zombies": zombies, "blocked_runs": blocked}


def test_what_needs_attention_comes_first() -> None:
    gpu = [{"index": 0, "bytes": 10, "workers_bytes": 0}]
    rows = [
        row(id="quiet", path="a.ipynb", nbcoord=summary_with()),
        row(id="dead", path="b.ipynb", status="dead"),
        row(id="stuck", path="c.ipynb", status="not-answering"),
        row(id="blocked", path="d.ipynb", nbcoord=summary_with(blocked=1)),
        row(id="gpu", path="e.ipynb", gpu=gpu),
        row(id="zombies", path="f.ipynb", nbcoord=summary_with(zombies=1)),
        row(id="both", path="g.ipynb", nbcoord=summary_with(zombies=3), gpu=gpu),
        row(id="no-session", path=None),
    ]
    ordered = [r["id"] for r in sorted(rows, key=sort_key)]
    assert ordered == ["both", "zombies", "gpu", "stuck", "blocked", "dead", "quiet", "no-session"]
    assert row(nbcoord=summary_with(zombies=1), gpu=gpu)["attention"] == ["zombies", "gpu"]


def test_gpu_memory_is_attributed_to_the_kernel_and_to_its_workers() -> None:
    outside = Outside(descendants={10: [11, 12]}, gpu=GpuRead(GpuStatus(available=True, reason=None, devices=[]),
                       by_pid={10: {0: 5}, 11: {0: 7, 1: 2}, 99: {0: 1000}}))  # fmt: skip
    assert gpu_held(10, outside) == [{"index": 0, "bytes": 5, "workers_bytes": 7},
                                      {"index": 1, "bytes": 0, "workers_bytes": 2}]  # fmt: skip
    assert gpu_held(12, outside) == []
    assert gpu_held(None, outside) == []


# ----------------------------------------------------------------------------------------------------- metrics
def test_metrics_of_a_view() -> None:
    summary = {"threads_by_state": {"running": 2, "waiting": 1, "stopping": 0}, "kernel_threads": 8, "zombies": 1,
               "tasks": None, "blocked_runs": 0, "blocked_seconds": 0.0, "failures": 0,
               "queues": [{"name": "in", "size": 1, "capacity": 4, "fill": 0.25},
                          {"name": "unbounded", "size": 3, "capacity": -1, "fill": None}],
               "last_stop": None}  # fmt: skip
    view: Any = {
        "took_ms": 12.0,
        "kernels": [
            row(id="a", path='we"ird\nname.ipynb', nbcoord=summary, gpu=[{"index": 0, "bytes": 5, "workers_bytes": 1}]),
            row(id="b", path=None, status="dead", rss=None, pid=None, worker_processes=None, answer_ms=None),
        ],
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(view))
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    key_a = (("kernel_id", "a"), ("notebook", 'we"ird\\x0aname.ipynb'))  # a label is one line, escaped
    key_b = (("kernel_id", "b"), ("notebook", ""))
    assert samples[("nbcoord_kernel_zombie_threads", key_a)] == 1
    assert samples[("nbcoord_kernel_threads", tuple(sorted((*key_a, ("state", "running")))))] == 2
    assert samples[("nbcoord_kernel_gpu_memory_bytes", tuple(sorted((*key_a, ("gpu", "0")))))] == 5
    assert samples[("nbcoord_kernel_queue_fill_ratio", tuple(sorted((*key_a, ("queue", "in")))))] == 0.25
    assert not [k for k in samples if k[0] == "nbcoord_kernel_queue_fill_ratio" and ("queue", "unbounded") in k[1]]
    assert samples[("nbcoord_kernel_up", key_b)] == 0
    assert samples[("nbcoord_kernels", (("status", "dead"),))] == 1
    assert ("nbcoord_kernel_rss_bytes", key_b) not in samples
    assert samples[("nbcoord_view_seconds", ())] == pytest.approx(0.012)


# ---------------------------------------------------------------------------------------- the kernel command
@pytest.mark.parametrize(
    ("argv", "ipython"),
    [
        (["/env/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], True),
        (["python", "-m", "ipykernel", "-f", "c.json"], True),
        (["/x/ipykernel_launcher.py", "-f", "c.json"], True),
        (["R", "--slave", "-e", "IRkernel::main()", "--args", "c.json"], False),
        (["python", "-m", "xeus_python", "-f", "c.json"], False),
    ],
)
def test_only_ipython_kernels_get_the_extension(argv: list[str], ipython: bool) -> None:
    assert is_ipython_kernel(argv) is ipython
    changed = with_nbcoord(argv)
    assert (changed == [*argv, EXTENSION_ARGUMENT]) is ipython
    assert with_nbcoord(changed) == changed, "never twice"


def test_the_kernel_manager_class_is_replaced_only_when_it_is_the_servers_default() -> None:
    default = SimpleNamespace(kernel_manager_class=DEFAULT_CLASS)
    assert use_in(default) and default.kernel_manager_class == CLASS_NAME
    custom = SimpleNamespace(kernel_manager_class="enterprise_gateway.RemoteKernelManager")
    assert not use_in(custom) and custom.kernel_manager_class == "enterprise_gateway.RemoteKernelManager"


def test_our_messages_are_not_user_activity() -> None:
    manager = SimpleNamespace(untracked_message_types=["kernel_info_request", "status"])
    page: dict[str, Any] = {"untracked_message_types": ["kernel_info_request", "status"]}
    serverapp = SimpleNamespace(kernel_manager=manager, web_app=SimpleNamespace(settings={"page_config_data": page}))
    untrack_messages(serverapp)
    untrack_messages(serverapp)  # twice: no duplicates
    assert manager.untracked_message_types == ["kernel_info_request", "status", REQUEST, REPLY]
    assert page["untracked_message_types"] == manager.untracked_message_types


# ---------------------------------------------------------------------------------------------------------- GPU
@pytest.fixture
def nvml() -> Any:
    fake_nvml.reset()
    yield fake_nvml
    fake_nvml.reset()


def test_gpu_memory_by_pid(nvml: Any) -> None:
    nvml.reset([
        nvml.FakeDevice(processes=[nvml.FakeProcess(10, 100), nvml.FakeProcess(11, None)]),
        nvml.FakeDevice(name="second", processes=[nvml.FakeProcess(10, 5)]),
    ])  # fmt: skip
    read = Nvml("fake_nvml", pid_exists=lambda pid: pid in (10, 11)).read()
    assert read.status["available"] is True
    assert [d["name"] for d in read.status["devices"]] == ["NVIDIA Fake GPU", "second"]
    assert all(d["processes_visible"] for d in read.status["devices"])
    assert read.by_pid == {10: {0: 100, 1: 5}, 11: {0: 0}}


def test_pids_of_another_namespace_are_attributed_to_no_kernel(nvml: Any) -> None:
    nvml.reset([nvml.FakeDevice(processes=[nvml.FakeProcess(424242, 100)])])
    read = Nvml("fake_nvml", pid_exists=lambda pid: False).read()
    assert read.status["devices"][0]["processes_visible"] is False
    assert read.by_pid == {}


def test_a_process_list_that_cannot_be_read_leaves_the_devices(nvml: Any) -> None:
    nvml.reset([nvml.FakeDevice(processes_error=nvml.NVML_ERROR_NO_PERMISSION)])
    read = Nvml("fake_nvml", pid_exists=lambda pid: True).read()
    assert read.status["devices"][0]["processes_visible"] is False
    assert read.status["devices"][0]["total"] == 80 * 2**30


def test_no_gpu_says_why(nvml: Any) -> None:
    nvml.reset(fail_init=nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    read = Nvml("fake_nvml").read()
    assert read.status == {"available": False, "reason": "NVML could not start: NVML Shared Library Not Found",
                           "devices": []}  # fmt: skip
    missing = Nvml("no_such_nvml_module").read()
    assert missing.status["reason"] == "nvidia-ml-py is not installed in the server's environment"


# ------------------------------------------------------------------------------------------ hostile kernels
def test_a_real_summary_is_the_schemas_and_an_off_schema_one_is_named() -> None:
    summary = _control.build_summary(snapshot(last_stop={"scope": "all", "alive": [{"name": "n" * 500}]}), "1")
    assert check_summary(summary) == summary
    for field, value, words in [
        ("zombies", "many", '"zombies" must be a whole number >= 0'),
        ("threads_by_state", 5, '"threads_by_state" must be an object of counts'),
        ("blocked_seconds", math.inf, '"blocked_seconds" must be a finite number'),
        ("cells", [{"cell": 1, "threads": "x" * 10_000, "zombies": 0}], '"cells[0].threads"'),
    ]:
        with pytest.raises(OffSchema) as raised:
            check_summary({**summary, field: value})
        assert words in str(raised.value) and len(str(raised.value)) < 200
    with pytest.raises(OffSchema, match='"pid" is missing'):
        check_summary({k: v for k, v in summary.items() if k != "pid"})
    assert "extra" not in check_summary({**summary, "extra": 1}), "a newer nbcoord's fields are dropped"


def test_a_stop_report_is_bounded() -> None:
    report = {"stopped": [{"name": "\u202e" + "n" * 100_000, "reason": "r" * 10_000, "took": math.nan}]}
    row = bounded_report(report)["stopped"][0]
    assert len(row["name"]) == 200 and len(row["reason"]) == 500 and row["took"] is None


def test_open_metrics_are_totals_and_labels_are_escaped() -> None:
    summary = {"threads_by_state": {"running": 2, "waiting": 1, "stopping": 0}, "kernel_threads": 8, "zombies": 1,
               "tasks": None, "blocked_runs": 0, "blocked_seconds": 0.0, "failures": 0, "queues": [],
               "last_stop": None}  # fmt: skip
    view: Any = {"took_ms": 1.0, "kernels": [
        row(id="a", path="x\u202ey.ipynb", nbcoord=summary, gpu=[{"index": 0, "bytes": 5, "workers_bytes": 1}]),
        row(id="b", path="secret.ipynb", rss=10),
    ]}  # fmt: skip

    def samples(per_kernel: bool) -> list[Any]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector(view, per_kernel=per_kernel))
        text = generate_latest(registry).decode()
        assert "\u202e" not in text
        return [s for f in text_string_to_metric_families(text) for s in f.samples]

    totals = samples(per_kernel=False)
    assert not {"kernel_id", "notebook"} & {label for s in totals for label in s.labels}
    by_name = {(s.name, tuple(s.labels.items())): s.value for s in totals}
    assert by_name[("nbcoord_kernels_rss_bytes", ())] == 11
    assert by_name[("nbcoord_kernels_gpu_memory_bytes", (("gpu", "0"),))] == 6
    assert by_name[("nbcoord_kernels_zombie_threads", ())] == 1
    assert by_name[("nbcoord_kernels_threads", (("state", "running"),))] == 2
    notebooks = {s.labels.get("notebook") for s in samples(per_kernel=True)}
    assert "x\\u202ey.ipynb" in notebooks
