"""asyncio tasks in the ledger (S11): each task a cell creates is listed with its cell, where it waits and its age,
and the one stop cancels it and awaits it within the grace period.

Attribution happens when a task is created, through public API only:

- **Which cell.** A context variable holds the running cell, and a task copies its creator's context (see
  :mod:`nbcoord.ledger.task_cells`); the kernel's own tasks, created outside any cell, belong to none.
- **Which loops.** The kernel's event loop is the loop running the cells (ipykernel 6 and 7 both run the shell's
  handlers on the main thread's asyncio loop, through tornado; 7 wraps each handler in a task of one persistent
  context, 6 runs them in one long dispatch task): it is found at the first cell, as the running loop. Loops that
  cells' threads create (``asyncio.run`` in a thread, or ``asyncio.new_event_loop()`` in a cell) are seen through
  the event loop policy's ``new_event_loop``, watched on the policy instance (its class, and every ``isinstance``
  check, stay as they were); a thread a cell started gets the cell variable set in its own context there, so that
  ``asyncio.run``'s tasks copy it.
- **Finding the tasks.** On Python 3.12 and later a task tells the context it runs in (``Task.get_context()``):
  the tasks of the loops nbcoord knows (``asyncio.all_tasks(loop)``) are read at each look (the monitor's tick,
  a snapshot, a stop), and their cell comes from their context. Nothing runs when a task is created, and no task
  factory is installed (on 3.13.0 any task factory makes ``create_task`` rename its tasks "None").
  On Python 3.10 and 3.11 a task does not tell its context, so each of those loops gets a task factory
  (``loop.set_task_factory``), chained with the one it had; unload puts that one back exactly (a factory someone
  installed over nbcoord's stays, chained to it). The factory calls the cell's recorder when one is set, and does
  nothing else: the registration (an id, a weak reference) is made at the next look, for tasks still running by
  then (most tasks have ended; they cost the append alone).

A task's age counts from that first look (the monitor looks every ``monitor_interval``, 1 s by default).

What a stop does: tasks in scope are cancelled on their own loop, from the loop's thread, and awaited until the
deadline (see :mod:`nbcoord.ledger.task_cancel`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from nbcoord.core.patches import ClassPatches
from nbcoord.core.records import CellInfo
from nbcoord.core.snapshot import LedgerRow, code_location
from nbcoord.core.stop import StopScope
from nbcoord.ledger import internals
from nbcoord.ledger.base import Ledger
from nbcoord.ledger.stopping import Pending
from nbcoord.ledger.task_cancel import Delivery, TaskStop, cancel_requested
from nbcoord.ledger.task_cells import CELL, CellQueue, Factory, make_factory

log = logging.getLogger("nbcoord")

#: Cells whose queues are kept besides those with live tasks (a task of an older cell that creates more tasks is
#: still attributed while its cell has a live task; see TaskLedger._prune_queues).
RECENT_QUEUES = 100
#: Queues made beyond RECENT_QUEUES before a new cell's queue prunes them (amortises the pruning).
QUEUE_SLACK = 20
#: Whether tasks tell their context (Python 3.12+): then no task factory is needed.
READ_CONTEXT = hasattr(asyncio.Task, "get_context")
#: Rows per snapshot at most (the report lists them all).
MAX_ROWS = 1000
#: How deep the chain of awaited coroutines is followed to find where a task waits.
AWAIT_DEPTH = 64
#: Packages whose coroutines are the kernel's own, never a cell's (a task of theirs is never listed or stopped).
KERNEL_PACKAGES = ("ipykernel", "tornado", "zmq", "jupyter_client", "comm", "IPython", "nbcoord")


@dataclass(slots=True)
class _Entry:
    """A task still running when it was registered."""

    ref: weakref.ref[asyncio.Task[Any]]
    cell: CellInfo
    created_at: float
    id: str
    stop_requested_at: float | None = None


@dataclass(slots=True)
class _Attached:
    """A loop whose tasks nbcoord looks at, and (Python 3.10-3.11) the task factory it had before nbcoord's."""

    ref: weakref.ref[asyncio.AbstractEventLoop]
    previous: Factory | None
    factory: Factory | None  # None: no factory needed (Python 3.12+)
    kernel: bool  # the kernel's own loop (the one running the cells)
    thread: str  # the thread it was attached from


def innermost_frames(coro: Any) -> list[FrameType]:
    """The frames of a coroutine and of what it awaits, outermost first (public coroutine attributes only)."""
    frames: list[FrameType] = []
    for _ in range(AWAIT_DEPTH):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
        if coro is None:
            break
    return frames


class TaskLedger:
    """The asyncio kind: task factories, the cell variable, the rows and the stops of tasks."""

    name = "task"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: The queue of each cell seen (by the CellInfo's id), oldest first.
        self._queues: dict[int, CellQueue] = {}
        self._lock = threading.Lock()  # guards _entries and _attached, and serialises draining
        self._entries: dict[int, _Entry] = {}
        self._attached: dict[int, _Attached] = {}
        #: True after unload and in a forked child: new loops are not watched.
        self._inert = False
        #: The event loop policy watched, and its ``new_event_loop`` wrapped on the instance (restored exactly).
        self._policy: Any = None
        self._policy_patch = ClassPatches()
        self._kernel_dirs: tuple[str, ...] = ()

    # ---------------------------------------------------------------------------------- install / undo
    def install(self) -> None:
        files = [getattr(sys.modules.get(name), "__file__", None) for name in KERNEL_PACKAGES]
        self._kernel_dirs = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in files if isinstance(f, str))
        self._watch_policy()
        if threading.current_thread() is threading.main_thread():
            # Loaded by %load_ext in a cell: that cell's code is running in this context, on the kernel's loop.
            current = self.ledger.registry.current_cell()
            if current is not None:
                CELL.set(self.queue_of(current).append)
            self._attach_running_loop()

    def uninstall(self) -> None:
        self._inert = True
        with self._lock:
            attached = list(self._attached.values())
            self._attached.clear()
            self._entries.clear()
        for queue in self._queues.values():
            queue.clear()
        self._queues.clear()
        for item in attached:
            loop = item.ref()
            if loop is None:
                continue
            if item.factory is None:
                continue
            if loop.get_task_factory() is item.factory:
                loop.set_task_factory(item.previous)
            else:
                log.info("nbcoord: a task factory was installed over nbcoord's; nbcoord's stays in its chain")
        self._unwatch_policy()
        if threading.current_thread() is threading.main_thread():
            CELL.set(None)  # unloaded in a cell: the rest of it is nobody's

    def forget_in_child(self) -> None:
        """In a forked child: new loops are not watched (a factory's queue is bounded). Takes no lock."""
        self._inert = True

    def cell_event(self, event: str, cell: CellInfo) -> None:
        """The cell variable follows the running cell; the kernel's loop is found at the first cell."""
        if event == "started":
            CELL.set(self.queue_of(cell).append)
            self._attach_running_loop()
            if self._policy is not None and internals.event_loop_policy() is not self._policy:
                self._unwatch_policy()  # the user installed another policy (uvloop's): watch that one
                self._watch_policy()
        else:
            CELL.set(None)

    def queue_of(self, cell: CellInfo) -> CellQueue:
        """The cell's queue of new tasks, made on first use (one per cell; the dict keeps them in order)."""
        queue = self._queues.get(id(cell))
        if queue is None or queue.cell is not cell:
            if len(self._queues) >= RECENT_QUEUES + QUEUE_SLACK:
                # Pruned here too, not only on the monitor's tick: every look for new tasks walks the queues, and
                # cells run faster than the tick (a failed cell's hooks look, so this bounds their cost).
                with self._lock:
                    in_use = {id(entry.cell) for entry in self._entries.values()}
                self._prune_queues(in_use)
            queue = self._queues[id(cell)] = CellQueue(cell)
        return queue

    # ------------------------------------------------------------------------------------------ loops
    def _attach_running_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop runs the cells (an IPython terminal): only loops made by cells are watched
        attached = self._attached.get(id(loop))
        if (
            attached is not None
            and attached.ref() is loop
            and (attached.factory is None or loop.get_task_factory() is attached.factory)
        ):
            return
        self.attach(loop, kernel=True)

    def attach(self, loop: asyncio.AbstractEventLoop, *, kernel: bool) -> None:
        """Look at ``loop``'s tasks from now on: on Python 3.10-3.11 through a task factory, chained with the one it
        has (chained again if someone replaced nbcoord's)."""
        with self._lock:
            old = self._attached.get(id(loop))
            if old is not None and old.ref() is not loop:
                old = None  # a loop that died and whose id was reused
            if READ_CONTEXT:
                if old is None:
                    self._attached[id(loop)] = _Attached(
                        weakref.ref(loop), None, None, kernel, threading.current_thread().name
                    )
                return
            current = loop.get_task_factory()
            if old is not None and current is old.factory:
                return
            if old is not None:
                log.info("nbcoord: the task factory of an event loop was replaced; chaining nbcoord's again")
            factory = make_factory(current)
            self._attached[id(loop)] = _Attached(
                weakref.ref(loop),
                current,
                factory,
                kernel or (old is not None and old.kernel),
                old.thread if old is not None else threading.current_thread().name,
            )
            loop.set_task_factory(factory)

    def _watch_policy(self) -> None:
        """Watch ``new_event_loop`` on the policy instance (an instance attribute: the class stays as it was)."""
        try:
            policy = internals.event_loop_policy()
            if not callable(policy.new_event_loop):
                raise TypeError(f"{type(policy).__name__}.new_event_loop cannot be called")
        except Exception:
            log.warning("nbcoord: loops made by cells' threads cannot be watched", exc_info=True)
            return
        kind = self

        def wrap(original: Callable[[], asyncio.AbstractEventLoop]) -> Callable[[], asyncio.AbstractEventLoop]:
            def new_event_loop() -> asyncio.AbstractEventLoop:
                loop: asyncio.AbstractEventLoop = original()
                if not kind._inert:
                    try:
                        kind._loop_made(loop)
                    except Exception:
                        log.warning("nbcoord: could not watch a new event loop", exc_info=True)
                return loop

            return new_event_loop

        try:
            self._policy_patch.patch_instance(policy, "new_event_loop", wrap)
        except (AttributeError, TypeError):
            log.info("nbcoord: the event loop policy %r takes no attributes: loops of cells' threads not watched",
                     type(policy).__name__)
            return
        self._policy = policy

    def _unwatch_policy(self) -> None:
        self._policy = None
        self._policy_patch.restore()

    def _loop_made(self, loop: asyncio.AbstractEventLoop) -> None:
        """A loop made while a cell (or a thread a cell started) runs is that cell's to fill with tasks."""
        recorder = CELL.get()
        if recorder is None and threading.current_thread() is not threading.main_thread():
            cell = self.ledger.cell_of_caller()
            if cell is not None:
                # This thread's own context (asyncio.run copies it for its tasks): the thread is that cell's.
                recorder = self.queue_of(cell).append
                CELL.set(recorder)
        if recorder is not None:
            self.attach(loop, kernel=False)

    # ---------------------------------------------------------------------------------------- entries
    def _drain(self) -> None:
        """Register the cells' tasks created since the last look that are still running."""
        if READ_CONTEXT:
            self._scan()
            return
        now = time.time()
        with self._lock:
            for queue in [queue for queue in self._queues.values() if queue]:  # most cells made no task
                while True:
                    try:
                        task = queue.popleft()
                    except IndexError:
                        break
                    known = self._entries.get(id(task))
                    if (known is not None and known.ref() is task) or task.done() or self._kernels_own(task):
                        continue  # (recorded twice: a factory chained over nbcoord's, over another of ours)
                    self._entries[id(task)] = _Entry(weakref.ref(task), queue.cell, now, self.ledger.issue("task"))

    def _scan(self) -> None:
        """Python 3.12+: the tasks of the loops nbcoord knows, each with the cell of the context it runs in."""
        now = time.time()
        with self._lock:
            loops = [loop for item in self._attached.values() if (loop := item.ref()) is not None]
            for loop in loops:
                if loop.is_closed():
                    continue
                for task in asyncio.all_tasks(loop):
                    known = self._entries.get(id(task))
                    if known is not None and known.ref() is task:
                        continue
                    recorder = task.get_context().get(CELL)  # type: ignore[attr-defined]
                    if recorder is None or task.done() or self._kernels_own(task):
                        continue
                    cell = recorder.__self__.cell
                    self._entries[id(task)] = _Entry(weakref.ref(task), cell, now, self.ledger.issue("task"))

    def _kernels_own(self, task: asyncio.Task[Any]) -> bool:
        """A task whose coroutine is the kernel's (a handler a cell's action scheduled) is never a cell's."""
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        return code is not None and code.co_filename.startswith(self._kernel_dirs)

    def _live(self) -> list[tuple[_Entry, asyncio.Task[Any]]]:
        """Entries of tasks still running on a loop that can still run them, oldest first; forgets the rest."""
        self._drain()
        live: list[tuple[_Entry, asyncio.Task[Any]]] = []
        gone: list[int] = []
        with self._lock:
            for key, entry in self._entries.items():
                task = entry.ref()
                if task is None or task.done() or task.get_loop().is_closed():
                    gone.append(key)
                else:
                    live.append((entry, task))
            for key in gone:
                del self._entries[key]
        return live

    def tick(self) -> bool:
        live = self._live()
        self._prune_queues({id(entry.cell) for entry, _task in live})
        return bool(live)

    def _prune_queues(self, in_use: set[int]) -> None:
        """Forget the queues of cells that are neither recent nor have a live task (a long session runs thousands
        of cells). A context that still holds a forgotten cell's recorder appends to a queue nobody reads, bounded."""
        with self._lock:
            keys = list(self._queues)
            for key in keys[: max(0, len(keys) - RECENT_QUEUES)]:
                if key not in in_use and not self._queues[key]:
                    del self._queues[key]

    def cells_in_use(self) -> set[int]:
        with self._lock:
            return {entry.cell.execution_count for entry in self._entries.values()}

    def _loop_words(self, loop: asyncio.AbstractEventLoop) -> str:
        attached = self._attached.get(id(loop))
        if attached is not None and attached.ref() is loop:
            if attached.kernel:
                return "on the kernel's event loop"
            return f"on the event loop of thread {attached.thread!r}"
        return "on an event loop nbcoord did not see made"

    def where(self, task: asyncio.Task[Any]) -> str:
        """Where a task waits: its innermost frame in a cell, else its innermost frame."""
        frames = innermost_frames(task.get_coro())
        if not frames:
            return ""
        cell_of = self.ledger.host.cell_of_file
        chosen = next((f for f in reversed(frames) if cell_of(f.f_code.co_filename) is not None), frames[-1])
        where = code_location(chosen.f_code.co_filename, chosen.f_lineno, chosen.f_code.co_name, cell_of)
        innermost = frames[-1].f_code.co_name
        return where if chosen is frames[-1] else f"{where} (in {innermost})"

    # ------------------------------------------------------------------------------------------- rows
    def rows(self) -> list[LedgerRow]:
        rows: list[LedgerRow] = []
        now = time.time()
        for entry, task in self._live()[:MAX_ROWS]:
            reasons = self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at)
            coro = task.get_coro()
            name = task.get_name()
            qualname = getattr(coro, "__qualname__", type(coro).__name__)
            cancelling = entry.stop_requested_at is not None or cancel_requested(task)
            state = "cancelling" if cancelling else ("running" if getattr(coro, "cr_running", False) else "waiting")
            detail = [f"waits at {w}" if (w := self.where(task)) else "", self._loop_words(task.get_loop())]
            if entry.stop_requested_at is not None:
                detail.append(f"cancelled {now - entry.stop_requested_at:.0f} s ago")
            rows.append(
                LedgerRow(
                    id=entry.id,
                    kind="task",
                    label=f"asyncio task {name}: {qualname}()",
                    cell=entry.cell.execution_count,
                    state=state,
                    started_at=entry.created_at,
                    zombie=reasons[0]["reason"] if reasons else None,
                    zombie_reasons=reasons,
                    detail="; ".join(part for part in detail if part),
                    pids=[],
                )
            )
        return rows

    # ------------------------------------------------------------------------------------------- stop
    def begin_stop(self, scope: StopScope) -> list[Pending]:
        by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[tuple[_Entry, asyncio.Task[Any]]]]] = {}
        for entry, task in self._live():
            zombie = bool(self.ledger.zombie_reasons(entry.cell, stop_requested_at=entry.stop_requested_at))
            if self.ledger.selects(scope, entry.cell, zombie):
                loop = task.get_loop()
                by_loop.setdefault(id(loop), (loop, []))[1].append((entry, task))
        pending: list[Pending] = []
        now = time.time()
        for loop, items in by_loop.values():
            for entry, _task in items:
                if entry.stop_requested_at is None:
                    entry.stop_requested_at = now
            delivery = Delivery(loop, [task for _entry, task in items])
            pending += [TaskStop(entry.id, entry.cell, task, delivery, self.where) for entry, task in items]
        return pending



def watch(ledger: Ledger) -> Callable[[], None]:
    """Install the asyncio kind now: the kernel has imported asyncio already (it runs on it)."""
    kind = TaskLedger(ledger)
    kind.install()
    remove_kind = ledger.add_kind(kind)
    ledger.cell_listeners.append(kind.cell_event)
    ledger.child_actions.append(kind.forget_in_child)

    def undo() -> None:
        remove_kind()
        if kind.cell_event in ledger.cell_listeners:
            ledger.cell_listeners.remove(kind.cell_event)
        if kind.forget_in_child in ledger.child_actions:
            ledger.child_actions.remove(kind.forget_in_child)
        kind.uninstall()

    return undo
