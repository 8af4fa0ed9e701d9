"""pytest plugin for another project's suite (``-p pytest_cells``): each test's outcome, and optionally each test
run as one notebook cell.

- ``NBCOORD_SUITE_REPORT``: where to write ``{"tests": {nodeid: {"outcome", "seconds"}}, ...}`` at the end; the
  runner (suites/run.py) compares these, test by test, between the runs with and without nbcoord.
- ``NBCOORD_SUITE_CELLS=1``: the suite runs in this process, so frame each test (setup, call, teardown: what a user's
  cell would hold) with the shell's cell events (suites/cells.py), nbcoord loaded when ``NBCOORD_SUITE_WITH=1``.
- ``NBCOORD_SUITE_KERNEL_CHECK=1``: the suite starts its own kernels (ipykernel's), which load nbcoord through the
  IPython profile of ``IPYTHONDIR``; start one kernel first and record whether nbcoord is loaded in it, so that a
  profile that silently stopped working cannot pass for a run with nbcoord.

Upstream's ``flaky`` marker is registered here without the flaky plugin: every test runs once, never retried (a
test that is flaky by itself is deselected in its known-outcomes file instead).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from typing import Any

import pytest

_outcomes: dict[str, dict[str, Any]] = {}
_errors: dict[str, BaseException] = {}
_started: dict[str, float] = {}
_cells: Any = None
_kernel_has_nbcoord: bool | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _cells
    config.addinivalue_line("markers", "flaky: upstream's retry marker; registered only, tests run once")
    if os.environ.get("NBCOORD_SUITE_CELLS") == "1" and _cells is None:
        from cells import Cells  # suites/ is on PYTHONPATH (run.py)

        _cells = Cells()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _kernel_has_nbcoord
    if os.environ.get("NBCOORD_SUITE_KERNEL_CHECK") == "1":
        _kernel_has_nbcoord = _ask_a_kernel()


def _ask_a_kernel() -> bool | None:
    """Whether a kernel started as the suite starts them (jupyter_client's default kernel) has nbcoord loaded."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(startup_timeout=60)
    try:
        reply = client.execute_interactive(
            "print('nbcoord' in get_ipython().extension_manager.loaded)",
            timeout=60,
            output_hook=_remember_output,
        )
        if reply["content"]["status"] != "ok":
            return None
        return _kernel_said.strip() == "True"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


_kernel_said = ""


def _remember_output(message: dict[str, Any]) -> None:
    global _kernel_said
    if message["msg_type"] == "stream":
        _kernel_said += message["content"]["text"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    _started[item.nodeid] = time.monotonic()
    result = _cells.begin(item.nodeid) if _cells is not None else None
    try:
        yield
    finally:
        if result is not None:
            _cells.end(result, _errors.get(item.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        _errors.setdefault(item.nodeid, call.excinfo.value)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0})
    wasxfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if wasxfail:
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
        else:
            entry["outcome"] = report.outcome
    elif report.failed:  # setup or teardown
        entry["outcome"] = "error" if entry["outcome"] == "passed" else entry["outcome"]
    elif report.skipped and report.when == "setup":
        entry["outcome"] = "xfailed" if wasxfail else "skipped"
    if report.when == "teardown":
        entry["seconds"] = round(time.monotonic() - _started.get(report.nodeid, time.monotonic()), 3)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("NBCOORD_SUITE_REPORT")
    if not path:
        return
    report = {
        "tests": _outcomes,
        "collected": session.testscollected,
        "exitstatus": int(exitstatus),
        "kernel_has_nbcoord": _kernel_has_nbcoord,
        "nbcoord_loaded": _cells is not None and "nbcoord" in _cells.shell.extension_manager.loaded,
    }
    with open(path, "w", encoding="utf-8") as file:
        json.dump(report, file, indent=1, sort_keys=True)
