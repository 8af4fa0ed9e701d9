"""The panel's one registry of sections, and the one check of a stop's thread (pure: no kernel, no IPython)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
import traitlets

from nbcoord.core.config import NBCoord
from nbcoord.core.host import Host
from nbcoord.ui import rowsync, sections, sender, widget
from nbcoord.ui.commands import Rejected, parse_command, thread_check
from nbcoord.ui.state import panel_state


def _snapshot() -> dict[str, Any]:
    return {
        "schema": 1, "taken_at": 100.0, "pid": 1, "threads": [], "cells": [], "failures": [], "zombie_count": 0,
        "queues": [], "blocked_runs": [], "sessions": [], "ledger": [], "cell_memory": [], "outputs": [],
        "resources": None, "last_stop": None,
    }  # fmt: skip


def test_the_widget_syncs_one_trait_per_registered_section_of_its_kind() -> None:
    traits = widget.NBCoordPanel.class_traits()
    synced = widget.NBCoordPanel.class_traits(sync=True)
    for section in sections.SECTIONS:
        trait = traits[section.trait]
        expected = traitlets.List if section.kind == "list" else traitlets.Dict
        assert isinstance(trait, expected), section.trait
        assert trait.allow_none == (section.kind == "optional"), section.trait
        # The rows travel by difference in the rows message: their traits are the kernel's copy, never synced.
        assert (section.trait in synced) == (section.pacing != "rows"), section.trait
    assert tuple(section.trait for section in sections.SECTIONS) == widget.STATE_TRAITS
    assert len(set(widget.STATE_TRAITS)) == len(widget.STATE_TRAITS)
    panel = widget.NBCoordPanel(lambda: "", lambda: None)
    assert panel.outcome is None and panel.threads == [] and panel.header == {}


def test_panel_state_is_every_shaped_section_in_the_registrys_order() -> None:
    state = panel_state(_snapshot())  # type: ignore[arg-type]
    assert list(state) == [section.trait for section in sections.SECTIONS if section.shape is not None]
    assert set(state) < set(widget.STATE_TRAITS)


def test_the_senders_pacing_comes_from_the_registry() -> None:
    rows = {section.trait for section in sections.SECTIONS if section.pacing == "rows"}
    assert tuple(section.trait for section in sections.ROWS) == rowsync.TRAITS  # one message, so they go together
    assert set(rowsync.TRAITS) == rows == {"threads", "ledger", "groups", "cells"}
    assert rowsync.KEYS == {"threads": "tid", "ledger": "id"}
    assert all(section.key is None for section in sections.SECTIONS if section.pacing != "rows")


def _rows(*names: str) -> list[dict[str, Any]]:
    return [{"tid": f"t{i}", "name": n, "cell": 3, "zombie": None, "started_at": 1.0} for i, n in enumerate(names)]


class _Widget:
    """What the rows sender needs of a widget: a comm, ``send`` and ``hold_sync``."""

    comm = object()

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def hold_sync(self) -> Any:
        return contextlib.nullcontext()


def test_rows_go_by_difference_keyed_and_a_full_copy_when_a_view_asks() -> None:
    state = {"threads": _rows(*(f"w{i}" for i in range(1000))), "ledger": [], "groups": [{"key": "c3"}], "cells": []}
    w = _Widget()
    traits = sender.TraitSender(w, state)
    traits.send(state, 0.0, 1.0, frozenset())
    (first,) = w.messages
    assert first["full"] and first["seq"] == 1 and len(first["threads"]["upsert"]) == 1000
    renamed = [dict(row) for row in state["threads"][:-1]]
    renamed[7]["name"] = "renamed"
    traits.send({**state, "threads": renamed}, 10.0, 1.0, frozenset())
    diff = w.messages[-1]
    assert diff == {
        "type": "rows", "seq": 2, "base": 1, "full": False,
        "threads": {"upsert": [renamed[7]], "remove": ["t999"]},
    }  # fmt: skip
    assert len(sender.to_json(diff)) < 300 < 50_000 < len(sender.to_json(first))
    assert w.threads == renamed  # type: ignore[attr-defined]  # the kernel's copy: what the views have
    traits.send({**state, "threads": renamed}, 11.0, 1.0, frozenset())
    assert len(w.messages) == 2  # nothing changed, nothing sent
    # A view asks: the next message is a full copy; a flood of requests is paced by the full copy's size.
    traits.want_rows()
    traits.send({**state, "threads": renamed}, 12.0, 1.0, frozenset())
    assert w.messages[-1]["full"] and w.messages[-1]["seq"] == 3
    traits.want_rows()
    traits.send({**state, "threads": renamed}, 12.1, 1.0, frozenset())
    assert len(w.messages) == 3
    due = traits.held_due()
    assert due is not None and due > 12.1
    traits.send_held(due)
    assert len(w.messages) == 4 and w.messages[-1]["full"] and w.messages[-1]["seq"] == 4


@pytest.fixture
def host() -> Host:
    host = Host(None, NBCoord())
    host.registry.adopt_existing()  # the threads that exist now are the kernel's (here: the test's)
    return host


def test_a_panel_stop_checks_its_thread_with_the_stops_own_check(host: Host) -> None:
    main = host.registry.for_thread(threading.main_thread())
    assert main is not None and not main.user
    exists = thread_check(host.check_stoppable)
    for tid in ("t999999", main.tid):
        content = {"type": "stop", "scope": "thread", "tid": tid, "click_id": "v1-1"}
        with pytest.raises(Rejected, match="no live thread started by a cell"):
            parse_command(content, thread_exists=exists, cell_exists=lambda n: False)
        with pytest.raises(ValueError, match=r"No live thread|is the kernel's"):
            host.stop("thread", tid=tid)


def test_the_panels_thread_check_is_the_hosts(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the Host's check accepts, the panel accepts: there is no second rule.
    seen: list[str] = []
    monkeypatch.setattr(host, "check_stoppable", seen.append)
    content = {"type": "stack", "tid": "t424242", "click_id": "v1-2"}
    command = parse_command(content, thread_exists=thread_check(host.check_stoppable), cell_exists=lambda n: False)
    assert command.tid == "t424242" and seen == ["t424242"]
