"""The panel's sections, registered in one place: every trait the widget syncs, how it is shaped and sent.

A new panel section is one Python section and one draw function, registered in one place:

1. here, one shaping function ``shape_<name>(s: Shaping) -> value`` (pure: the same snapshot gives the same JSON;
   :class:`nbcoord.ui.source.Shaping` holds the snapshot and the selections sections share) and one entry in
   ``SECTIONS``. The widget's synced trait (:class:`nbcoord.ui.widget.NBCoordPanel`), ``STATE_TRAITS`` and the
   state :func:`nbcoord.ui.state.panel_state` builds all follow from that entry, and so does the sender's pacing;
2. in the front end, one draw module under ``js/src/panel/sections/`` and one line in
   ``js/src/panel/sections.js`` naming the traits it draws (``tests/test_panel_js.py`` checks that the two
   registries name the same traits).

Entries without a shaping function are set by the controller, not shaped from the snapshot: the history (every few
intervals), the outcome of a restart or reclaim, the one-off answers to a view (a stack, the clock), the beat
while a cell runs, and the acknowledgement of clicks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final, Literal

from nbcoord.ui.memory import shape_cell_memory, shape_resources
from nbcoord.ui.outcomes import shape_failures, shape_last_stop
from nbcoord.ui.rows import shape_cells, shape_groups, shape_header, shape_ledger, shape_threads
from nbcoord.ui.runs import shape_blocked, shape_queues, shape_sessions
from nbcoord.ui.source import Shaping

#: The trait's type: a list, a dict, or a dict that may be None (and is until first set).
Kind = Literal["list", "dict", "optional"]
#: How the sender sends it:
#: ``paced``: when it changed; a big one at most every ``size / BYTES_PER_INTERVAL`` intervals;
#: ``rows``: not a synced trait: sent with the other ``rows`` sections in one custom message, by difference
#: (:mod:`nbcoord.ui.rowsync`), so that a view never shows a group's count with another moment's rows, and one
#: changed row out of 1000 costs that row, not the list;
#: ``answer``: a one-off answer to a view (set through the controller's pending traits), sent with the next tick
#: whatever it is;
#: ``at once``: sent at once from the command thread, whatever the sender thread is doing.
Pacing = Literal["paced", "rows", "answer", "at once"]


@dataclasses.dataclass(frozen=True)
class Section:
    """One synced trait of the panel: its name, its type, how it is sent, and how it is shaped from a snapshot."""

    trait: str
    kind: Kind
    pacing: Pacing = "paced"
    #: The trait's value from one snapshot; None: set by the controller (see the module docstring).
    shape: Callable[[Shaping], Any] | None = None
    doc: str = ""
    #: ``rows`` sections only: the field that keys each row, so that a change sends the rows that changed (and
    #: the keys removed); None: the whole list, when it changed (a few dozen groups or cells).
    key: str | None = None


SECTIONS: Final = (
    Section("header", "dict", shape=shape_header),
    Section("threads", "list", "rows", shape_threads, key="tid"),
    Section("ledger", "list", "rows", shape_ledger, key="id"),
    Section("groups", "list", "rows", shape_groups),
    Section("cells", "list", "rows", shape_cells),
    Section("cell_memory", "list", shape=shape_cell_memory),
    Section("sessions", "list", shape=shape_sessions),
    Section("queues", "list", shape=shape_queues),
    Section("blocked", "list", shape=shape_blocked),
    Section("resources", "optional", shape=shape_resources),
    Section("failures", "list", shape=shape_failures),
    Section("history", "dict", doc="Sparklines, sent at most every few intervals."),
    Section("last_stop", "optional", shape=shape_last_stop),
    Section("outcome", "optional", doc="The last restart or reclaim: its kind, the clicks it answered, its text."),
    Section("stack", "optional", "answer", doc="A thread's stack, as a view asked for it."),
    Section("clock", "optional", "answer", doc="The kernel's time when a view opened (the view's clock skew)."),
    Section("beat", "optional", doc="While a cell runs, one every interval: their absence means the GIL is held."),
    Section(
        "ack",
        "optional",
        "at once",
        doc="The clicks the kernel has taken (sent at once, before the action runs): a click without one within a "
        "second was not handled, and the view says why.",
    ),
)

#: Every section's trait (``_esm`` and ``_fast_route`` aside): what the front end draws from. All are synced but
#: the ``rows`` sections, which travel in the rows message.
STATE_TRAITS: Final = tuple(section.trait for section in SECTIONS)
#: The sections sent together, by difference, in one custom message: the rows and what counts them.
ROWS: Final = tuple(section for section in SECTIONS if section.pacing == "rows")
#: The sections shaped from a snapshot, in the registry's order.
SHAPED: Final = tuple(section for section in SECTIONS if section.shape is not None)
