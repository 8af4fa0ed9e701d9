"""How the one stop cancels asyncio tasks: on their own loop, from the loop's thread (:class:`Delivery`), then
each task awaited within its share of the stop's time and reported with why it is still running, if it is
(:class:`TaskStop`).

Tasks in scope are cancelled (``task.cancel(msg=...)``) on their own loop, from the loop's thread
(``call_soon_threadsafe``), and awaited until the deadline; a task still running then swallowed the
``CancelledError`` or is still cleaning up, and is reported with the line it waits on. A stop that runs on the
loop's own thread (``%nbcoord stop`` in a cell runs on the kernel's loop) can only request the cancellation: the
task receives it once the cell hands the loop back, which the report says.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from nbcoord.core.records import CellInfo
from nbcoord.core.stop import ItemOutcome
from nbcoord.ledger import internals

#: The message of nbcoord's cancellations (``CancelledError.args``), so that the task's code can tell.
CANCEL_MESSAGE = "nbcoord: stopped"


def cancel_requested(task: asyncio.Task[Any]) -> bool:
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    if cancelling is not None:
        return bool(cancelling())
    return internals.cancel_delivered(task) is False


class Delivery:
    """The cancellation of a loop's tasks in scope, from the loop's own thread where it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[Any]]) -> None:
        self.loop = loop
        #: Set by the loop's thread once it ran the cancellation.
        self.ran = threading.Event()
        self.how = "scheduled"
        try:
            asyncio.get_running_loop()
            same_thread = asyncio.get_running_loop() is loop
        except RuntimeError:
            same_thread = False
        if same_thread:
            self.how = "same-thread"  # the caller runs on this loop: it cannot wait for it
            self._cancel(tasks)
        elif loop.is_running():
            try:
                loop.call_soon_threadsafe(self._cancel, tasks)
            except RuntimeError:  # closed meanwhile
                self.how = "closed"
        else:
            self.how = "not-running"  # nobody runs it now, so cancelling from here races with no one
            self._cancel(tasks)

    def _cancel(self, tasks: list[asyncio.Task[Any]]) -> None:
        for task in tasks:
            if not task.done():
                task.cancel(msg=CANCEL_MESSAGE)
        self.ran.set()


class TaskStop:
    """One task being stopped.

    It is waited for at most ``WAIT_SHARE`` of the stop's time (a task that swallows the cancellation must not
    take the time other kinds and the threads' join need; at shutdown it ends with the process anyway), and not
    at all once its loop has shown it is busy (it did not run the cancellation within ``BUSY_AFTER_S``: a cell
    holds it, and the cancellation happens when that cell returns).
    """

    WAIT_SHARE = 0.5
    BUSY_AFTER_S = 0.1

    def __init__(
        self,
        item_id: str,
        cell: CellInfo,
        task: asyncio.Task[Any],
        delivery: Delivery,
        where: Callable[[asyncio.Task[Any]], str],
    ) -> None:
        self.id, self.cell, self.task, self.delivery, self.where = item_id, cell, task, delivery, where

    def poll(self, now: float, started: float, deadline: float) -> bool:
        if self.task.done() or self.delivery.how != "scheduled":
            return True
        window = max(0.0, deadline - started)
        if not self.delivery.ran.is_set() and now - started >= min(self.BUSY_AFTER_S, window * self.WAIT_SHARE):
            return True  # its loop is busy: waiting longer would only take the other kinds' time
        return now >= started + window * self.WAIT_SHARE

    def outcome(self) -> ItemOutcome:
        task = self.task
        label = f"asyncio task {task.get_name()}"
        if task.done():
            reason = "cancelled" if task.cancelled() else "ended while being cancelled"
            return self._outcome(label, True, reason)
        where = self.where(task)
        at = f"; it waits at {where}" if where else ""
        how = self.delivery.how
        if how == "same-thread":
            reason = (
                "cancel requested: it ends once this cell returns, when the event loop runs again (the stop ran "
                "in a cell on that loop, which cannot run tasks meanwhile)"
            )
        elif how == "not-running":
            reason = f"cancelled, but its event loop is not running: it ends if the loop runs again{at}"
        elif how == "closed":
            reason = "its event loop closed while being stopped"
        elif not self.delivery.ran.is_set():
            reason = (
                "cancel requested: its event loop is busy (a cell is running, or a call blocks it); the task ends "
                f"when the loop runs again{at}"
            )
        else:
            delivered = internals.cancel_delivered(task)
            if delivered:
                reason = f"swallowed the CancelledError (or is still cleaning up){at}"
            elif delivered is None:
                reason = f"still running after the cancellation{at}"
            else:
                reason = f"cancelled, but it has not run since (its event loop is busy){at}"
        return self._outcome(label, False, reason)

    def _outcome(self, label: str, stopped: bool, reason: str) -> ItemOutcome:
        return ItemOutcome(
            id=self.id,
            kind="task",
            label=label,
            cell=self.cell.execution_count,
            stopped=stopped,
            reason=reason,
        )

