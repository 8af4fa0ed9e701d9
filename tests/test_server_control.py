"""How a kernel answers the server: ``nbcoord_request`` on the control channel of real kernels (no server).

Each kernel is driven through ``jupyter_client`` exactly as the server extension asks it: a request on the control
channel, its reply matched by ``msg_id``. On every kernel interpreter (tests/interpreters.py, ipykernel 7) and on
ipykernel 6.
"""

from __future__ import annotations

import contextlib
import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import IK6, KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

#: One kernel per interpreter and on ipykernel 6 (conftest's ``kernel``), nbcoord loaded.
KERNEL_OPTIONS = kernel_params([*KERNEL_PYTHONS, IK6])

SUMMARY = {"schema": 1, "action": "summary"}
STUBBORN = """\
import threading, time, nbcoord
def _stubborn():
    while True:          # ignores the stop flag: a stop reports it alive
        time.sleep(0.01)
threading.Thread(target=_stubborn, name={name!r}, daemon=True).start()
"""


def send(kernel: Kernel, content: dict[str, Any], msg_type: str = "nbcoord_request") -> str:
    return kernel.send_control(msg_type, content)


def replies(kernel: Kernel, msg_ids: list[str], timeout: float = 15.0) -> dict[str, dict[str, Any]]:
    """The replies to these requests, in the order they arrived (dict order); fails after ``timeout``."""
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(msg_ids):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no reply to {set(msg_ids) - set(got)} within {timeout} s")
        try:
            reply = kernel.kc.control_channel.get_msg(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        parent = reply["parent_header"].get("msg_id")
        if parent in msg_ids:
            got[parent] = reply
    return got


def ask(kernel: Kernel, content: dict[str, Any]) -> dict[str, Any]:
    msg_id = send(kernel, content)
    reply = replies(kernel, [msg_id])[msg_id]
    assert reply["header"]["msg_type"] == "nbcoord_reply"
    result: dict[str, Any] = reply["content"]
    return result


def test_a_summary_while_the_main_thread_loops_in_python(kernel: Kernel, tmp_path: Path) -> None:
    flag = tmp_path / "done"
    msg_id = kernel.submit(f"import os\nwhile not os.path.exists({str(flag)!r}):\n    pass")
    try:
        def running() -> dict[str, Any] | None:
            answer = ask(kernel, SUMMARY)
            return answer if answer["summary"]["running_cell"] is not None else None

        answer = wait_until(running, timeout=20, interval=0.05, what="a summary naming the running cell")
    finally:
        flag.write_text("done")
        kernel.collect(msg_id)
    assert answer["status"] == "ok"
    assert answer["schema"] == 1
    summary = answer["summary"]
    assert summary["pid"] == kernel.pid
    assert summary["nbcoord_version"]
    assert summary["kernel_threads"] >= 3  # Control, IOPub, heartbeat...: counted, never listed


def test_requests_that_are_not_valid_get_an_error_reply_and_nothing_runs(kernel: Kernel) -> None:
    for content, words in [
        ({"action": "run", "code": "1/0"}, '"action" must be'),
        ({"schema": 99, "action": "summary"}, "unsupported schema"),
        ({"schema": 1, "action": "stop", "scope": "thread"}, '"scope" must be one of'),
        ({"schema": 1, "action": "stop", "scope": "all", "tid": "t1"}, "unknown field(s): tid"),
        ({"schema": 1, "action": "stop", "scope": "cell", "cell": 9999}, "no cell [9999]"),
        ({"schema": 1, "action": "stop", "scope": "all", "grace": -3}, '"grace" must be between'),
        ({"schema": 1, "action": "stop", "scope": "all", "grace": 10**400}, '"grace" must be between'),
    ]:
        answer = ask(kernel, content)
        assert answer["status"] == "error", answer
        assert answer["code"] == "invalid"
        assert words in answer["error"]
    assert ask(kernel, SUMMARY)["status"] == "ok", "the kernel still answers"


def test_a_stop_runs_off_the_control_channel_and_returns_its_report(kernel: Kernel) -> None:
    name = f"stubborn-{os.getpid()}-{time.monotonic_ns()}"
    kernel.run(STUBBORN.format(name=name))
    stop_id = send(kernel, {"schema": 1, "action": "stop", "scope": "all", "grace": 1.0})
    # Summaries asked while the stop runs (its grace is 1 s) are answered at once: the channel is not held. The stop
    # starts on a thread of its own, so the first summaries may come before it marks the thread: ask until one
    # shows it stopping, each answered before the stop's own reply.
    seen: dict[str, dict[str, Any]] = {}
    stopping_seen = False
    deadline = time.monotonic() + 15
    while stop_id not in seen and not stopping_seen:
        summary_id = send(kernel, SUMMARY)
        while summary_id not in seen:
            assert time.monotonic() < deadline, "no reply to a summary within 15 s"
            with contextlib.suppress(queue.Empty):
                reply = kernel.kc.control_channel.get_msg(timeout=0.5)
                seen[reply["parent_header"].get("msg_id")] = reply
        if stop_id not in seen:
            stopping_seen = seen[summary_id]["content"]["summary"]["threads_by_state"]["stopping"] >= 1
    assert stopping_seen, "every summary came before the stop marked the thread, or after the stop ended"
    stop_reply = seen[stop_id] if stop_id in seen else replies(kernel, [stop_id])[stop_id]
    report = stop_reply["content"]["report"]
    assert [row["name"] for row in report["alive"]] == [name]
    assert "ignored the stop request" in report["alive"][0]["reason"]
    last = ask(kernel, SUMMARY)["summary"]["last_stop"]
    assert last["scope"] == "all"
    assert last["alive"] >= 1


def test_unload_removes_the_handler_and_load_puts_it_back(kernel: Kernel) -> None:
    kernel.run("%unload_ext nbcoord")
    try:
        assert kernel.evaluate("'nbcoord_request' in get_ipython().kernel.control_handlers") is False
        request_id = send(kernel, SUMMARY)
        probe_id = send(kernel, {}, "kernel_info_request")
        # Control requests are answered in order: the probe's reply, with none before it, means no answer.
        got = replies(kernel, [probe_id])
        assert list(got) == [probe_id]
        with pytest.raises(AssertionError, match="no reply"):
            replies(kernel, [request_id], timeout=0.5)
    finally:
        kernel.run("%load_ext nbcoord")
    assert ask(kernel, SUMMARY)["status"] == "ok"


def test_too_many_waiting_stops_are_refused(kernel: Kernel) -> None:
    kernel.run(STUBBORN.format(name="slow-to-stop"))
    # Different scopes, so that none joins another: one runs, four wait, the sixth is refused.
    requests = [{"schema": 1, "action": "stop", "scope": "all", "grace": 0.3 + i / 100} for i in range(6)]
    ids = [send(kernel, content) for content in requests]
    got = replies(kernel, ids, timeout=30)
    refused = [r["content"] for r in got.values() if r["content"]["status"] == "error"]
    assert len(refused) >= 1, [r["content"]["status"] for r in got.values()]
    assert refused[0]["code"] == "unavailable"
    assert "already waiting" in refused[0]["error"]


def test_in_a_forked_child_the_handler_does_nothing(kernel: Kernel) -> None:
    code = """\
import os
_handler = get_ipython().kernel.control_handlers["nbcoord_request"]
_pid = os.fork()
if _pid == 0:
    try:
        _sent = []
        _handler.__self__._session.send = lambda *a, **k: _sent.append(a)
        _handler(None, [b"id"], {"content": {"schema": 1, "action": "summary"}, "header": {}})
        os._exit(0 if not _sent else 3)
    except BaseException:
        os._exit(4)
_, _status = os.waitpid(_pid, 0)
_fork_exit = os.waitstatus_to_exitcode(_status)
"""
    kernel.run(code)
    assert kernel.evaluate("_fork_exit") == 0
    assert ask(kernel, SUMMARY)["status"] == "ok", "the parent still answers"
