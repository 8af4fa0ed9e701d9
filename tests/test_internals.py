"""Every private internal of CPython and IPython that nbcoord's core uses (nbcoord/core/internals.py), removed one at a
time: nbcoord still imports, loads and works, does what the accessor's docstring names instead, and ``%nbcoord``
says so. TensorFlow's are tested in tests/test_tf_internals.py, ipykernel's routes in tests/test_fastcomm.py and
tests/test_server_control.py.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from nbcoord.core import internals as _internals
from nbcoord.core.fallbacks import Fallbacks


@pytest.fixture(autouse=True)
def fresh_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_internals, "_fallbacks", Fallbacks())


def test_running_threads_falls_back_to_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _internals.running_threads() is threading._active  # type: ignore[attr-defined]
    monkeypatch.delattr(threading, "_active")
    assert _internals.running_threads() is None
    assert "threading._active" in _internals.degraded()


def test_executor_internals(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadPoolExecutor(thread_name_prefix="named") as pool:
        assert _internals.executor_name(pool) == "named" and _internals.executor_shut_down(pool) is False
    assert _internals.executor_shut_down(pool) is True
    assert _internals.executor_spawn_code() is ThreadPoolExecutor._adjust_thread_count.__code__
    monkeypatch.delattr(ThreadPoolExecutor, "_adjust_thread_count")
    bare = SimpleNamespace()
    assert _internals.executor_spawn_code() is None
    assert _internals.executor_name(bare) == "SimpleNamespace" and _internals.executor_shut_down(bare) is False
    assert {"ThreadPoolExecutor._adjust_thread_count", "ThreadPoolExecutor._shutdown"} <= set(_internals.degraded())


def test_register_before_thread_join_falls_back_to_atexit(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.delattr(threading, "_register_atexit")
    monkeypatch.setattr(atexit, "register", registered.append)
    assert _internals.register_before_thread_join(print) == "atexit" and registered == [print]


def test_abandon_thread_falls_back_to_false(monkeypatch: pytest.MonkeyPatch) -> None:
    thread = threading.Thread(target=lambda: None)
    monkeypatch.setattr(threading, "_shutdown_locks", None, raising=False)
    assert _internals.abandon_thread(thread) is False
    assert "threading._shutdown_locks" in _internals.degraded()


def test_frames_fall_back_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _internals.calling_frame(0) is sys._getframe(0)
    # Every thread's frame but the caller's own (see current_frames: that entry would close a reference cycle).
    frames = _internals.current_frames()
    assert threading.get_ident() not in frames and threading.main_thread().ident is not None
    waiting = threading.Event()
    other = threading.Thread(target=waiting.wait, args=(10,))
    other.start()
    try:
        assert other.ident in _internals.current_frames()
    finally:
        waiting.set()
        other.join()
    del frames
    monkeypatch.delattr(sys, "_getframe")
    monkeypatch.delattr(sys, "_current_frames")
    assert _internals.frame_getter() is None and _internals.calling_frame(1) is None
    assert _internals.current_frames() == {}
    assert {"sys._getframe", "sys._current_frames"} <= set(_internals.degraded())


def test_running_cell_falls_back_to_none() -> None:
    result = SimpleNamespace(execution_count=4, info=SimpleNamespace(cell_id="c", raw_cell="go()"))
    assert _internals.running_cell(SimpleNamespace(displayhook=SimpleNamespace(exec_result=result))) == (4, "c", "go()")
    assert _internals.running_cell(SimpleNamespace(displayhook=SimpleNamespace(exec_result=None))) is None
    assert _internals.running_cell(SimpleNamespace(displayhook=object())) is None
    assert "IPython displayhook.exec_result" in _internals.degraded()


def test_raise_in_thread_falls_back_to_false(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    monkeypatch.delattr(ctypes, "pythonapi")
    assert _internals.raise_in_thread(threading.get_ident(), RuntimeError) is False
    assert "PyThreadState_SetAsyncExc" in _internals.degraded()


#: A process where the internals the core reads are gone: nbcoord imports, loads, registers, stops and says so.
WITHOUT_INTERNALS = """
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
from nbcoord.core import internals as _internals

class Without:
    # The module as nbcoord sees it, less some names (deleting them from the real module would break CPython).
    def __init__(self, module, *missing):
        self._module, self._missing = module, missing
    def __getattr__(self, name):
        if name in self._missing:
            raise AttributeError(name)
        return getattr(self._module, name)

_internals.threading = Without(threading, "_active", "_register_atexit", "_shutdown_locks")
_internals.sys = Without(sys, "_current_frames")
_internals.ThreadPoolExecutor = Without(ThreadPoolExecutor, "_adjust_thread_count")
import nbcoord
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "nbcoord")
cell = shell.run_cell(
    "import threading, nbcoord\\n"
    "def coop():\\n"
    "    while not nbcoord.should_stop():\\n"
    "        threading.Event().wait(0.01)\\n"
    "t = threading.Thread(target=coop, name='coop'); t.start()",
    store_history=True,
)
report = nbcoord.stop_all(grace=5)
from io import StringIO
from contextlib import redirect_stdout
out = StringIO()
with redirect_stdout(out):
    shell.run_line_magic("nbcoord", "")
print("@@" + json.dumps({"stopped": [r["name"] for r in report["stopped"]], "report": out.getvalue()}))
"""


def test_nbcoord_works_without_the_internals_and_says_so() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_INTERNALS], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("@@"))
    result = json.loads(line[2:])
    assert result["stopped"] == ["coop"]
    report = result["report"]
    assert "Degraded here:" in report
    for name in ("threading._active", "ThreadPoolExecutor._adjust_thread_count", "sys._current_frames"):
        assert name in report, report
