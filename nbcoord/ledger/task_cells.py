"""Which cell an asyncio task belongs to: the cell variable, and (Python 3.10-3.11) the task factory that records
a cell's new tasks. Used by the asyncio kind (:mod:`nbcoord.ledger.tasks`), which sets the variable around each
cell and reads it back from each task.

A context variable holds the running cell: set when a cell starts (in the cell's own context, so the cell's code
sees it) and cleared when it ends. A task copies its creator's context when it is created, so a task created by a
cell, or by a task of that cell, or by a callback a cell scheduled, belongs to that cell, whatever runs when it is
created; the kernel's own tasks, created outside any cell, belong to none.

The variable's value is the cell's own recorder: the ``append`` of a bounded queue of that cell's new tasks
(:class:`CellQueue`). On Python 3.12 and later a task tells the context it runs in, and the kind reads the
recorder's cell from there; on 3.10 and 3.11 each watched loop gets the task factory :func:`make_factory` makes,
which calls the recorder when one is set, and does nothing else.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable
from typing import Any

from nbcoord.core.records import CellInfo

#: How many new tasks of one cell wait for the next look at most.
PENDING_MAX = 1 << 16


class CellQueue(deque):  # type: ignore[type-arg]
    """A cell's new tasks, waiting to be registered (Python 3.10-3.11). Bounded, so that a factory nobody drains
    (left in a chain after unload, or in a forked child) cannot grow without end: a burst beyond it between two
    looks loses its oldest tasks."""

    __slots__ = ("cell",)

    def __init__(self, cell: CellInfo) -> None:
        super().__init__(maxlen=PENDING_MAX)
        self.cell = cell


#: The running cell, in the context of the cell's code: the ``append`` of the cell's CellQueue (the task factory
#: calls it as it is, at C speed; ``__self__.cell`` is the cell, whose number can still change while it runs).
CELL: contextvars.ContextVar[Callable[[Any], None] | None] = contextvars.ContextVar("nbcoord_cell", default=None)

Factory = Callable[..., "asyncio.Future[Any]"]

def make_factory(previous: Factory | None) -> Factory:
    """A task factory that creates the task as ``previous`` would (or as the loop does without one), then hands it
    to the recorder of the cell whose context creates it, if any. As cheap as it can be: it runs for every task.

    Its signature is that of the Pythons that use it (3.10-3.11): ``create_task`` passes ``context`` only when it
    was given one (and then the factory passes it on), as it does for any factory."""
    get_recorder = CELL.get
    task_class = asyncio.Task

    if previous is None:

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, context: Any = None) -> asyncio.Future[Any]:
            # The keyword only when given: 3.10's Task takes no context, and a call without it is the fast one.
            task = (
                task_class(coro, loop=loop)
                if context is None
                else task_class(coro, loop=loop, context=context)  # type: ignore[call-arg]
            )
            record = get_recorder()
            if record is not None:
                record(task)
            return task

    else:
        chained = previous

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, context: Any = None) -> asyncio.Future[Any]:
            task = chained(loop, coro) if context is None else chained(loop, coro, context=context)
            record = get_recorder()
            if record is not None:
                record(task)
            return task

    factory.__qualname__ = factory.__name__ = "nbcoord_task_factory"
    return factory

