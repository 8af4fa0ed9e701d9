"""SIGTERM sent to one of the kernel's threads other than the main one ends the kernel as promptly as without nbcoord
(issue 21), on ipykernel 7 and 6.

nbcoord's SIGTERM handler is a Python-level one: CPython runs it in the main thread, only when that thread runs
bytecode. A signal that the kernel delivers to another thread (``tgkill``; a process-directed SIGTERM usually goes to
the main thread, so this showed at random) does not wake a main thread waiting in its event loop's ``epoll_wait`` or
sleeping in a cell. Measured before the fix: an idle kernel was alive 15 s after SIGTERM to its IOPub thread (a
kernel without nbcoord dies in 0.01 s), and so was one whose cell sleeps.

Each kernel case sends the signal to one thread only, from outside, and waits for the process to end by that
signal. The last cases run :class:`nbcoord.kernel.shutdown.ShutdownHooks` in this process (its main thread), with a
previous handler that raises so that nothing ends the test run, and a real :class:`nbcoord.core.monitor.Monitor` whose
thread reads the signal pipe (as in a kernel: nbcoord has no thread of its own for it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import IK6

from nbcoord.core import internals as _internals
from nbcoord.core.fallbacks import Fallbacks
from nbcoord.core.monitor import MONITOR_THREAD_NAME, Monitor
from nbcoord.kernel import shutdown as _shutdown

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill (a signal to one thread) is Linux's"),
]

PYTHONS = [pytest.param(sys.executable, id="ipykernel7"), IK6]

#: Seconds to wait for the kernel to end. Before the fix it never did: the handler waited for the main thread, which
#: sat in a poll until something else woke it. The deadline tells an end from a hang; how soon it comes is a row of
#: bench/bench_shutdown.py against the same kernel without nbcoord (a 2.4 s bound here failed on a loaded machine).
END_DEADLINE_S = 30

#: The syscall number of tgkill, for a libc that does not export tgkill() itself (glibc before 2.30).
_SYS_TGKILL = {"x86_64": 234, "aarch64": 131, "riscv64": 131, "i686": 270, "armv7l": 268, "ppc64le": 250}


def tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` only (``os.kill`` lets the kernel pick the thread)."""
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "tgkill"):
        result = libc.tgkill(pid, tid, signum)
    else:
        result = libc.syscall(_SYS_TGKILL[platform.machine()], pid, tid, signum)
    if result != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum}) failed")


def native_ids(kernel: Kernel) -> dict[str, int]:
    """The kernel's Python threads, name -> native thread id."""
    ids: dict[str, int] = kernel.evaluate("{t.name: t.native_id for t in __import__('threading').enumerate()}")
    return ids


def wakeup_fd(kernel: Kernel) -> int:
    """The signal wakeup fd of the kernel, read in its main thread (a cell)."""
    kernel.run("import signal as _signal\n_wakeup = _signal.set_wakeup_fd(-1)\n_signal.set_wakeup_fd(_wakeup)")
    value: int = kernel.evaluate("_wakeup")
    return value


def sigterm_thread_and_wait(kernel: Kernel, tid: int) -> int | None:
    """SIGTERM to the kernel's thread ``tid`` (native id) only; the exit status (None: still alive at the deadline)."""
    started = time.monotonic()
    tgkill(kernel.pid, tid, signal.SIGTERM)
    status = kernel.wait_exit(timeout=END_DEADLINE_S)
    print(f"the kernel ended {time.monotonic() - started:.2f} s after SIGTERM to thread {tid}")
    return status


def mark_the_stop(kernel: Kernel, directory: Path) -> Path:
    """Have the kernel's shutdown stop create a file (an ``on_stop`` callback); returns its path."""
    stopped = directory / "stopped"
    kernel.run(f"import nbcoord; nbcoord.on_stop(lambda: open({str(stopped)!r}, 'w').close())")
    return stopped


@pytest.mark.parametrize("own_kernel", PYTHONS, indirect=True)  # conftest's: nbcoord loaded, on ipykernel 7 or 6
@pytest.mark.parametrize("thread", ["IOPub", "Heartbeat", "Control"])
def test_sigterm_to_another_thread_ends_an_idle_kernel(own_kernel: Kernel, thread: str, tmp_path: Path) -> None:
    stopped = mark_the_stop(own_kernel, tmp_path)
    status = sigterm_thread_and_wait(own_kernel, native_ids(own_kernel)[thread])
    assert status is not None, f"the kernel is alive {END_DEADLINE_S} s after SIGTERM to its {thread} thread"
    assert status == -signal.SIGTERM, f"exit status {status}: the kernel must end by the signal, as without nbcoord"
    assert stopped.exists(), "the kernel ended without nbcoord's shutdown stop"


@pytest.mark.parametrize("own_kernel", PYTHONS, indirect=True)
def test_sigterm_to_another_thread_ends_a_kernel_whose_cell_sleeps(own_kernel: Kernel, tmp_path: Path) -> None:
    kernel = own_kernel
    stopped = mark_the_stop(kernel, tmp_path)
    iopub = native_ids(kernel)["IOPub"]  # before the cell: the kernel answers nothing while it sleeps
    sleeping = tmp_path / "sleeping"
    kernel.submit(f"import time; open({str(sleeping)!r}, 'w').close(); time.sleep({END_DEADLINE_S * 2})")
    wait_until(sleeping.exists, timeout=30, what="the cell to start sleeping")
    status = sigterm_thread_and_wait(kernel, iopub)
    assert status is not None, f"the kernel is alive {END_DEADLINE_S} s after SIGTERM to its IOPub thread (cell asleep)"
    assert status == -signal.SIGTERM, f"exit status {status}"
    assert stopped.exists(), "the kernel ended without nbcoord's shutdown stop"


@pytest.mark.parametrize("own_kernel", kernel_params(PYTHONS, nbcoord="off"), indirect=True)
def test_unload_and_fork_give_back_the_wakeup_fd(own_kernel: Kernel, tmp_path: Path) -> None:
    """``%unload_ext`` restores the wakeup fd the kernel had before nbcoord (here one the kernel set itself), and so
    does a forked child; after the unload, SIGTERM to another thread still ends the kernel (by the default
    action)."""
    kernel = own_kernel
    kernel.run(
        "import signal, socket\n"
        "_a, _b = socket.socketpair()\n"
        "_b.setblocking(False)\n"
        "signal.set_wakeup_fd(_b.fileno())"
    )
    before = wakeup_fd(kernel)
    assert before >= 0
    kernel.run("%load_ext nbcoord")
    child_file = tmp_path / "child.json"
    kernel.run(
        "import json, os, signal\n"
        "_pid = os.fork()\n"
        "if _pid == 0:\n"
        "    _fd = signal.set_wakeup_fd(-1)\n"
        f"    open({str(child_file)!r}, 'w').write(json.dumps(_fd))\n"
        "    os._exit(0)\n"
        "os.waitpid(_pid, 0)"
    )
    assert json.loads(child_file.read_text()) == before, "a forked child must have the kernel's own wakeup fd"
    kernel.run("%unload_ext nbcoord")
    assert wakeup_fd(kernel) == before, "the wakeup fd after %unload_ext is not the one before %load_ext"
    assert not [name for name in native_ids(kernel) if name.startswith("nbcoord-")], "a thread of nbcoord is left"
    status = sigterm_thread_and_wait(kernel, native_ids(kernel)["IOPub"])
    assert status == -signal.SIGTERM, f"exit status {status} after the unload"


# ------------------------------------------------------------------------------------------------ in this process
class Terminated(Exception):
    """Raised by the previous SIGTERM handler of the in-process cases: ends the main thread's sleep."""


def wakeup_fd_here() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


@pytest.fixture
def hooks_here() -> Iterator[tuple[_shutdown.ShutdownHooks, list[str], list[int]]]:
    """ShutdownHooks installed in this process over a previous handler that records and raises :class:`Terminated`;
    yields the hooks, the routes its action ran and the signals the previous handler got."""
    routes: list[str] = []
    received: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        received.append(signum)
        raise Terminated

    saved = signal.signal(signal.SIGTERM, previous)
    with running_monitor() as monitor:
        hooks = _shutdown.ShutdownHooks(routes.append, watch_fd=monitor.add_reader)
        try:
            hooks.install(object())
            yield hooks, routes, received
        finally:
            hooks.uninstall()
            signal.signal(signal.SIGTERM, saved)


@contextlib.contextmanager
def running_monitor() -> Iterator[Monitor]:
    """A started monitor, stopped at the end (no task: it only serves readers)."""
    monitor = Monitor(lambda: 1.0)
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.stop()


def test_sigterm_to_another_thread_wakes_a_sleeping_main_thread(hooks_here: Any) -> None:
    _, routes, received = hooks_here

    def send() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread only

    sender = threading.Thread(target=send)
    started = time.monotonic()
    sender.start()
    with pytest.raises(Terminated):
        time.sleep(60)  # without the wake-up the handler runs when the sleep ends
    took = time.monotonic() - started
    sender.join()
    assert took < 30, f"the main thread ran the handler {took:.2f} s after SIGTERM reached another thread"
    assert routes == ["sigterm"] and received == [signal.SIGTERM], "the stop, then the previous handler, once each"


def test_install_and_uninstall_give_back_the_wakeup_fd() -> None:
    before = wakeup_fd_here()
    saved = signal.getsignal(signal.SIGTERM)
    threads_before = {t.name for t in threading.enumerate()}
    with running_monitor() as monitor:
        hooks = _shutdown.ShutdownHooks(lambda route: None, watch_fd=monitor.add_reader)
        hooks.install(object())
        try:
            pipe = wakeup_fd_here()
            assert pipe not in (-1, before), "no wakeup fd of nbcoord's"
            added = {t.name for t in threading.enumerate()} - threads_before
            assert added == {MONITOR_THREAD_NAME}, f"the waker added a thread of its own: {added}"
            wait_until(lambda: len(monitor._selecting) == 1, 10, what="the monitor reads the pipe's other end")
        finally:
            hooks.uninstall()
        assert not monitor._selecting, "the monitor still reads the pipe after uninstall"
    assert wakeup_fd_here() == before
    assert signal.getsignal(signal.SIGTERM) == saved
    with pytest.raises(OSError):
        os.fstat(pipe)  # the pipe is closed


def test_no_wakeup_fd_falls_back_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_internals, "_fallbacks", Fallbacks())

    def refuse(fd: int, **kwargs: Any) -> int:
        raise ValueError("refused for the test")

    before = wakeup_fd_here()
    saved = signal.getsignal(signal.SIGTERM)
    hooks = _shutdown.ShutdownHooks(lambda route: None, watch_fd=lambda fd, read: lambda: True)
    with monkeypatch.context() as patch:
        patch.setattr(signal, "set_wakeup_fd", refuse)
        hooks.install(object())
    try:
        assert signal.getsignal(signal.SIGTERM) == hooks._on_sigterm, "the handler is installed all the same"
        assert wakeup_fd_here() == before
        (why,) = (text for name, text in _internals.degraded().items() if "SIGTERM" in name)
        assert "main thread next runs Python" in why and "refused for the test" in why
    finally:
        hooks.uninstall()
    assert signal.getsignal(signal.SIGTERM) == saved
