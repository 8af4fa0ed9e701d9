"""The TensorFlow integration's framework-free parts, in process: post-import hook, wakeup-fd watcher, patches.

No kernel and no TensorFlow: a throwaway package stands in for ``tensorflow``, and SIGINT is sent to this
process with a no-op Python handler in place (the C-level handler still writes the wakeup fd).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import wait_until

from nbcoord.core import imports as _imports
from nbcoord.core.patches import ClassPatches
from nbcoord.tensorflow.records import CloseRecord, QueueState
from nbcoord.tensorflow.runs import InterruptWatcher, RunTracker


@pytest.fixture
def fake_package(tmp_path: Path) -> Iterator[str]:
    """A package that is not imported yet, importable from ``tmp_path``."""
    name = f"nbcoord_fake_{os.getpid()}_{len(os.listdir(tmp_path))}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 42\nfrom . import sub\n")
    (package / "sub.py").write_text("READY = True\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def test_post_import_hook_fires_after_the_module_ran_and_leaves(fake_package: str) -> None:
    seen: list[tuple[int, bool]] = []

    def callback(module: ModuleType) -> None:
        seen.append((module.VALUE, f"{fake_package}.sub" in sys.modules))

    remove = _imports.when_imported(fake_package, callback)
    assert _imports.hook_installed()
    module = importlib.import_module(fake_package)
    assert seen == [(42, True)], "the callback runs once the package's own code (and its imports) ran"
    assert not _imports.hook_installed(), "a fired hook leaves sys.meta_path"
    assert type(module.__loader__).__name__ == "SourceFileLoader", "the module gets its own loader back"
    assert module.__spec__ is not None and module.__spec__.loader is module.__loader__
    remove()  # harmless after firing
    assert not _imports.hook_installed()


def test_post_import_hook_removed_before_the_import_never_fires(fake_package: str) -> None:
    seen: list[ModuleType] = []
    remove = _imports.when_imported(fake_package, seen.append)
    remove()
    assert not _imports.hook_installed()
    importlib.import_module(fake_package)
    assert seen == []


def test_post_import_hook_calls_back_at_once_for_an_imported_module() -> None:
    seen: list[ModuleType] = []
    remove = _imports.when_imported("json", seen.append)
    assert [m.__name__ for m in seen] == ["json"]
    assert not _imports.hook_installed()
    remove()


def test_a_failing_callback_does_not_break_the_import(fake_package: str, caplog: pytest.LogCaptureFixture) -> None:
    def boom(_module: ModuleType) -> None:
        raise RuntimeError("callback failed")

    _imports.when_imported(fake_package, boom)
    assert importlib.import_module(fake_package).VALUE == 42
    assert "post-import hook" in caplog.text


@pytest.fixture
def quiet_sigint() -> Iterator[list[int]]:
    """SIGINT handled by a Python handler that only counts (the C handler still writes the wakeup fd)."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: calls.append(signum))
    try:
        yield calls
    finally:
        signal.signal(signal.SIGINT, previous)


def test_watcher_sees_sigint_chains_the_previous_wakeup_fd_and_restores_it(quiet_sigint: list[int]) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    os.set_blocking(read_fd, False)
    before = signal.set_wakeup_fd(write_fd)
    seen = threading.Event()
    watcher = InterruptWatcher(seen.set)
    try:
        assert watcher.install()
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(seen.is_set, 5, what="the watcher to see SIGINT")
        wait_until(lambda: quiet_sigint, 5, what="the Python handler to run too")
        forwarded = wait_until(lambda: _read(read_fd), 5, what="the byte passed on to the previous fd")
        assert forwarded == bytes([signal.SIGINT])
        watcher.uninstall()
        assert signal.set_wakeup_fd(write_fd) == write_fd, "uninstall gives the previous fd back"
        assert not any(t.name == "nbcoord-tf-interrupt" for t in threading.enumerate())
    finally:
        watcher.uninstall()
        signal.set_wakeup_fd(before)
        os.close(read_fd)
        os.close(write_fd)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 16)
    except BlockingIOError:
        return b""


def test_watcher_needs_the_main_thread() -> None:
    outcome: list[bool] = []
    watcher = InterruptWatcher(lambda: None)
    thread = threading.Thread(target=lambda: outcome.append(watcher.install()))
    thread.start()
    thread.join()
    assert outcome == [False]
    assert signal.set_wakeup_fd(-1) == -1


class _Session:
    def _call_tf_sessionrun(self, *args: Any) -> Any:
        if args[0] == "fail":
            raise RuntimeError(
                "MISMATCH of original and normalized active exception types: ORIGINAL OutOfRangeError "
                "REPLACED BY KeyboardInterrupt: <EMPTY MESSAGE>"
            )
        return args


def test_run_hook_records_the_run_in_flight_and_counts_runs() -> None:
    tracker = RunTracker()
    inside: list[Any] = []
    original = _Session.__dict__["_call_tf_sessionrun"]

    def run(session: Any, *args: Any) -> Any:
        state = tracker.state_of(threading.current_thread())
        assert state is not None
        view = state.current()
        inside.append((view.session is session, view.fetches, view.targets) if view else None)
        return original(session, *args)

    hook = tracker.make_hook(run)
    session = _Session()
    assert hook(session, None, {}, ["f"], ["t"], None) == (None, {}, ["f"], ["t"], None)
    state = tracker.state_of(threading.current_thread())
    assert state is not None and state.runs == 1 and state.current() is None
    with pytest.raises(KeyboardInterrupt):
        hook(session, "fail", {}, [], [], None)  # the interrupt pybind11 swallowed comes back
    assert state.runs == 1 and state.current() is None
    assert inside == [(True, ["f"], ["t"]), (True, [], [])], "each run is seen in flight, with its fetches"


def test_class_patches_restore_exactly_and_leave_foreign_patches() -> None:
    class Target:
        def method(self) -> str:
            return "original"

        def other(self) -> str:
            return "other"

    original = Target.__dict__["method"]
    patches = ClassPatches()
    patches.patch(Target, "method", lambda orig: lambda self: "patched " + orig(self))
    patches.patch(Target, "other", lambda orig: lambda self: "patched " + orig(self))
    assert Target().method() == "patched original"
    assert Target.__dict__["method"].__wrapped__ is original
    foreign = lambda self: "theirs"  # noqa: E731
    Target.other = foreign  # type: ignore[method-assign]
    assert patches.restore() == ["test_class_patches_restore_exactly_and_leave_foreign_patches.<locals>.Target.other"]
    assert Target.__dict__["method"] is original
    assert Target.__dict__["other"] is foreign


def test_class_patches_wrap_an_inherited_attribute_and_remove_it_again() -> None:
    class Base:
        def names(self) -> list[str]:
            return ["a", "nbcoord/x"]

    class Graph(Base):
        pass

    patches = ClassPatches()
    patches.patch(Graph, "names", lambda orig: lambda self: [n for n in orig(self) if "/" not in n], inherited=True)
    assert Graph().names() == ["a"] and Base().names() == ["a", "nbcoord/x"]
    patches.restore()
    assert "names" not in vars(Graph), "the wrapper on the subclass is removed, the base's method shows again"
    assert Graph().names() == ["a", "nbcoord/x"]


class _Node:
    def __init__(self, name: str) -> None:
        self.name = name


class _GraphDef:
    def __init__(self, names: list[str]) -> None:
        self.node = [_Node(n) for n in names]


def test_hidden_ops_leave_counts_and_graph_defs_alone_for_other_graphs() -> None:
    from nbcoord.tensorflow.graph import HiddenOps

    class Graph:
        pass

    mine, other = Graph(), Graph()
    hidden = HiddenOps()
    hidden.hide(mine, [_Node("nbcoord/q_size"), _Node("nbcoord/q_close")])
    ops = [_Node("q"), _Node("nbcoord/q_size"), _Node("nbcoord/q_close")]
    assert [op.name for op in hidden.filter_operations(mine, ops)] == ["q"]
    assert hidden.filter_operations(other, ops) is ops, "a graph nbcoord added nothing to is not copied"
    assert hidden.names(object()) == frozenset()


def test_a_note_is_added_once_and_python_3_10_gets_the_notes_list() -> None:
    from nbcoord.tensorflow.explain import add_note

    error = ValueError("queue closed")
    add_note(error, "queue `q` was closed by nbcoord's stop.")
    add_note(error, "a second sentence is not added")
    assert error.__notes__ == ["nbcoord: queue `q` was closed by nbcoord's stop."]

    class NoAddNote(Exception):
        add_note = None  # as on Python 3.10

    old = NoAddNote("x")
    add_note(old, "said anyway.")
    assert old.__notes__ == ["nbcoord: said anyway."]


def test_a_poll_read_before_a_close_ran_keeps_who_closed_the_queue() -> None:
    """A poll reads a queue's closed flag, then stores it: a reading older than the close nbcoord knows of (or
    made while that close ran) leaves who closed it alone; one made after it is believed (a reset reopens)."""
    state = QueueState()
    stop = CloseRecord("nbcoord-stop", "nbcoord", 4, 0.0, "the stop of all")
    read_before = time.monotonic()
    assert state.note_close(stop, in_flight=True)
    read_while = time.monotonic()
    state.observe_closed(False, read_before)
    state.observe_closed(False, read_while)
    assert state.closed_by is stop and state.closed is None
    assert not state.note_close(CloseRecord("runner-end", "QueueRunnerThread", 2, 0.0), in_flight=False)
    state.settle_close(stop)
    state.observe_closed(False, read_while)
    assert state.closed_by is stop, "still a reading from before the close ran"
    state.observe_closed(True, time.monotonic())
    assert state.closed is True and state.closed_seen_at is not None and state.closed_by is stop
    state.observe_closed(False, time.monotonic())
    assert state.closed is False and state.closed_by is None, "reset: open again, nobody closed it"
