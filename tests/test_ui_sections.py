"""The panel's one registry of sections, and the one check of a stop's thread (pure: no kernel, no IPython)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import traitlets

from nbcoord.core.config import NBCoord
from nbcoord.core.host import Host
from nbcoord.ui import sections, sender, widget
from nbcoord.ui.commands import Rejected, parse_command, thread_check
from nbcoord.ui.state import panel_state


def _snapshot() -> dict[str, Any]:
    return {
        "schema": 1, "taken_at": 100.0, "pid": 1, "threads": [], "cells": [], "failures": [], "zombie_count": 0,
        "queues": [], "blocked_runs": [], "sessions": [], "ledger": [], "cell_memory": [], "outputs": [],
        "resources": None, "last_stop": None,
    }  # fmt: skip


def test_the_widget_syncs_one_trait_per_registered_section_of_its_kind() -> None:
    synced = widget.NBCoordPanel.class_traits(sync=True)
    for section in sections.SECTIONS:
        trait = synced[section.trait]
        expected = traitlets.List if section.kind == "list" else traitlets.Dict
        assert isinstance(trait, expected), section.trait
        assert trait.allow_none == (section.kind == "optional"), section.trait
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
    assert (frozenset(rows),) == sender.TOGETHER
    assert rows == {"threads", "ledger", "groups", "cells"}


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
