"""Tier 1: the snapshot builder on its own registry (no IPython, no kernel): rows shared between snapshots while
nothing in them changes, read-only, and dropped by every change the registry makes."""

from __future__ import annotations

import copy
import json
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import wait_until

from nbcoord.core import snapshot as _snapshot
from nbcoord.core.records import Owner
from nbcoord.core.registry import Registry
from nbcoord.core.snapshot import SharedRow, SnapshotBuilder
from nbcoord.core.threads import ThreadHooks


@pytest.fixture
def registry() -> Iterator[Registry]:
    registry = Registry()
    hooks = ThreadHooks(registry, ignore_exception=lambda exc: False)
    hooks.install()
    try:
        yield registry
    finally:
        hooks.uninstall()


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def start(name: str, release: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=release.wait, name=name, daemon=True)
    thread.start()
    wait_until(lambda: sys._current_frames().get(thread.ident or 0) is not None, what=f"{name} to run")
    return thread


def rows(builder: SnapshotBuilder) -> dict[str, Any]:
    return {row["name"]: row for row in builder.build()["threads"]}


def test_an_unchanged_row_is_shared_and_read_only(registry: Registry, release: threading.Event) -> None:
    registry.cell_started(1, None, "start()")
    start("idle", release)
    registry.cell_finished(1, "ok")
    builder = SnapshotBuilder(registry, lambda: 1.0)
    first, second = rows(builder)["idle"], rows(builder)["idle"]
    assert first is second and isinstance(first, SharedRow)
    assert (first["cell"], first["state"]) == (1, "waiting")
    edits: list[Callable[[], object]] = [
        lambda: first.__setitem__("name", "x"),
        lambda: first.__delitem__("name"),
        lambda: first.update(name="x"),
        lambda: first.pop("name"),
        lambda: first.setdefault("new", 1),
        first.clear,
    ]
    for edit in edits:
        with pytest.raises(TypeError, match="read-only"):
            edit()
    assert first["name"] == "idle"
    pickled = pickle.loads(pickle.dumps(first))
    for editable in (dict(first), first.copy(), copy.copy(first), copy.deepcopy(first), pickled):
        assert type(editable) is dict and editable == first
        editable["name"] = "mine"
    assert json.loads(json.dumps(builder.build()))["threads"][0]["name"] == "idle"
    builder.build(stacks=True)  # rows with stacks are made anew, and leave the kept ones kept
    assert rows(builder)["idle"] is first
    cells = builder.build()["cells"]
    assert cells[0] is builder.build()["cells"][0] and isinstance(cells[0], SharedRow)


def test_every_change_the_registry_makes_shows_in_the_next_snapshot(
    registry: Registry, release: threading.Event
) -> None:
    registry.cell_started(1, None, "start()")
    thread = start("before", release)
    record = registry.for_thread(thread)
    assert record is not None and record.native_id is not None
    registry.sample_activity()  # its first activity reading: later ones see no change (it waits)
    builder = SnapshotBuilder(registry, lambda: 1.0)
    running = rows(builder)["before"]
    registry.sample_activity()
    assert rows(builder)["before"] is running, "nothing changed, yet the row was made anew"
    registry.cell_finished(1, "error", "ValueError")  # the thread's cell failed: a zombie reason
    after_cell = rows(builder)["before"]
    assert after_cell is not running and after_cell["zombie"] == "cell-error"
    thread.name = "after"
    registry.sample_activity()  # the monitor's refresh of names
    assert "after" in rows(builder) and "before" not in rows(builder)
    registry.note_cpu({record.native_id: 2.5})
    assert rows(builder)["after"]["cpu_s"] == 2.5
    registry.thread_failed(thread, ValueError("in the thread"))
    assert rows(builder)["after"]["last_exception"] == "ValueError: in the thread"
    registry.add_owner(thread, Owner(kind="executor", label="pool P"))
    assert [o["label"] for o in rows(builder)["after"]["owners"]] == ["pool P"]
    registry.request_stop([record])
    stopping = rows(builder)["after"]
    assert stopping["state"] == "stopping" and stopping["stop_requested_at"] is not None
    assert rows(builder)["after"] is not stopping, "a row with a stop request is made anew (its grace runs out)"


def test_a_thread_that_ended_leaves_the_next_snapshot_also_when_its_id_is_reused(registry: Registry) -> None:
    builder = SnapshotBuilder(registry, lambda: 1.0)
    for _attempt in range(20):
        done = threading.Event()
        old = threading.Thread(target=done.wait, name="old", daemon=True)
        old.start()
        assert "old" in rows(builder)
        done.set()
        old.join()
        go = threading.Event()
        new = threading.Thread(target=go.wait, name="new", daemon=True)
        new.start()
        try:
            names = [row["name"] for row in builder.build()["threads"]]
            assert "old" not in names and names.count("new") == 1, names
            reused = new.ident == old.ident
        finally:
            go.set()
            new.join()
        assert "new" not in rows(builder)
        if reused:
            return
    pytest.skip("the OS did not reuse a thread id in 20 tries")


def test_a_write_while_a_row_is_made_keeps_that_row_from_being_kept(
    registry: Registry, release: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = start("raced", release)
    record = registry.for_thread(thread)
    assert record is not None
    made = _snapshot.creation_lines

    def write_meanwhile(*args: Any) -> list[str]:
        lines = made(*args)
        thread.name = "renamed"
        registry.sample_activity()  # a write after the builder read the name, before it keeps the row
        return lines

    monkeypatch.setattr(_snapshot, "creation_lines", write_meanwhile)
    builder = SnapshotBuilder(registry, lambda: 1.0)
    assert "raced" in rows(builder)
    assert record.row_cache is None, "a row made from fields read before a write was kept"
    monkeypatch.setattr(_snapshot, "creation_lines", made)
    assert "renamed" in rows(builder) and record.row_cache is not None
