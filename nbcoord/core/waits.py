"""What each blocked thread waits on, who holds it, and the deadlocks among them: ``%nbcoord threads`` and the
server's ``waits`` request (:mod:`nbcoord.core.schema`).

:func:`analyse` reads the live frames of the process's threads (``sys._current_frames``, through
:mod:`nbcoord.core.internals`) and says, per thread:

- **what it waits on**, from its innermost frames: ``Event.wait`` ("Event ready"), ``Condition.wait``
  ("Condition cond", with its lock's owner where knowable), ``Queue.get``/``put``/``join`` ("Queue q (empty)"),
  ``Semaphore.acquire``, ``Barrier.wait``, ``Thread.join`` ("thread 'worker' (tid N) to end"), a
  ``SimpleQueue.get``; and a C-level ``Lock``/``RLock`` acquire (``with a:`` or ``a.acquire()``), named from the
  frame's current instruction (:mod:`nbcoord.core.lockexpr`) and reported only when that object is a lock and is
  locked. ``time.sleep`` waits on no other thread: not reported.
- **what it holds**: the locks of the ``with`` statements around each of its frames' current lines, that are
  locked (an RLock only if it names this thread as its owner).
- **the owner** of a lock it waits for: an RLock names its owner; a plain Lock's owner is the one thread whose
  ``with`` holds it (none or two: unknown).

A cycle of threads each waiting for a lock (or the end of a thread) that the next one holds is a **deadlock**, named
with both sides' locks; the caller has each thread's stack in its row.

Cheap where nothing waits: only a thread whose innermost frame is in one of those calls gets the bytecode and AST
work (parsed sources are cached, :data:`nbcoord.core.lockexpr.CACHE_SIZE`). No frame, thread or user object is kept
after the call: the report is plain strings and numbers, bounded by the schema's limits.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from nbcoord.core import lockexpr
from nbcoord.core.internals import condition_lock, lock_types, rlock_owner, running_threads
from nbcoord.core.schema import (
    MAX_DEADLOCKS,
    MAX_HOLDS,
    MAX_STACK_LINES,
    MAX_TEXT,
    MAX_WAIT_TEXT,
    MAX_WAIT_THREADS,
    Deadlock,
    WaitingThread,
    WaitsReport,
)
from nbcoord.core.snapshot import CellOfFile, format_stack
from nbcoord.core.text import bounded

__all__ = ["analyse"]

#: Functions of threading and queue a waiting thread is inside, innermost first (``_wait_for_tstate_lock``: the
#: private one ``Thread.join`` waits in on 3.10-3.12; a name that is gone only stops matching).
_SYNC_NAMES: Final = frozenset({"wait", "wait_for", "acquire", "__enter__", "get", "put", "join", "_wait",
                                "_enter", "_wait_for_tstate_lock"})
_SYNC_FILES: Final = frozenset({threading.__file__, queue.__file__})
#: C calls a thread blocks in, found in its innermost frame's current instruction.
_C_BLOCKING: Final = frozenset({"acquire", "get"})
#: Frames of a stack searched for ``with`` statements.
_HOLD_DEPTH: Final = 64
#: Threads searched for the holder of a plain Lock beyond the waiting ones.
_MAX_SCANNED: Final = 512


@dataclass
class _Wait:
    """What one thread waits on (kept only during the analysis)."""

    kind: str  # Lock, RLock, Condition, Event, Queue, Semaphore, Barrier, SimpleQueue, thread
    name: str | None  # the expression the code waits on, e.g. "self.lock"
    detail: str = ""  # "(empty)", "(full)"
    lock: Any = None  # the lock object whose owner matters
    owner: int | None = None  # the ident of the thread it waits for
    edge: bool = False  # waiting for the owner to let go (a lock, a thread's end): part of a deadlock


@dataclass
class _Thread:
    ident: int
    frame: FrameType
    wait: _Wait | None = None
    entering: lockexpr.Chain | None = None
    holds: list[tuple[str, Any]] | None = None  # (name, lock), found on demand


def _is_lock(obj: object) -> bool:
    return type(obj) in lock_types()


def _locked(lock: object) -> bool:
    if type(lock) is type(threading.Lock()):
        return bool(type(lock).locked(lock))
    return rlock_owner(lock) is not None


def _kind(lock: object) -> str:
    return "Lock" if type(lock) is type(threading.Lock()) else "RLock"


def _name_of(frame: FrameType | None, method: str | None, target: object) -> str | None:
    """The expression in ``frame`` (the caller) that the wait was called on, if it names ``target``."""
    if frame is None:
        return None
    chain = lockexpr.receiver(frame, method)
    if chain is None or lockexpr.resolve(frame, chain) is not target:
        return None
    return lockexpr.chain_text(chain)


#: Waits that have no owner to name, by the class of the object waited on.
_PLAIN_KINDS: Final = ((threading.Event, "Event"), (threading.Semaphore, "Semaphore"), (threading.Barrier, "Barrier"))
_QUEUE_DETAIL: Final = {"get": "(empty)", "put": "(full)", "join": "(unfinished tasks)"}


def _sync_wait(frame: FrameType) -> _Wait | None:
    """The wait of a thread whose innermost frames are threading's or queue's, from the outermost of them."""
    api: FrameType | None = None
    caller: FrameType | None = frame
    while caller is not None and caller.f_code.co_filename in _SYNC_FILES and caller.f_code.co_name in _SYNC_NAMES:
        api = caller
        caller = caller.f_back
    if api is None:
        return None
    name = api.f_code.co_name
    obj = lockexpr.local(api, "self")
    kind = type(obj)
    label = _name_of(caller, None if name == "__enter__" else name, obj)
    wait: _Wait | None = None
    if issubclass(kind, threading.Thread):
        ident = obj.ident
        wait = _Wait("thread", label, owner=ident, edge=ident is not None)
    elif issubclass(kind, queue.Queue):
        wait = _Wait("Queue", label, _QUEUE_DETAIL.get(name, ""))
    elif issubclass(kind, threading.Condition):
        entering = name == "__enter__"
        wait = _Wait("Condition", label, "(its lock)" if entering else "", lock=condition_lock(obj), edge=entering)
    elif _is_lock(obj):  # the pure-Python RLock
        wait = _Wait("RLock", label, lock=obj, edge=True)
    else:
        wait = next((_Wait(word, label) for cls, word in _PLAIN_KINDS if issubclass(kind, cls)), None)
    return wait


def _c_wait(thread: _Thread) -> _Wait | None:
    """The wait of a thread blocked in a C call its innermost (Python) frame makes: a lock's, a SimpleQueue's."""
    found = lockexpr.blocking_call(thread.frame, _C_BLOCKING)
    if found is None:
        return None
    method, chain = found
    obj = lockexpr.resolve(thread.frame, chain)
    label = lockexpr.chain_text(chain)
    if method == "get":
        return _Wait("SimpleQueue", label, "(empty)") if type(obj) is queue.SimpleQueue else None
    if not _is_lock(obj) or not _locked(obj):
        return None
    if method is None:
        thread.entering = chain
    return _Wait(_kind(obj), label, lock=obj, edge=True)


def _holds(thread: _Thread) -> list[tuple[str, Any]]:
    """The locked locks of the ``with`` statements around the thread's frames (found once)."""
    if thread.holds is not None:
        return thread.holds
    held: list[tuple[str, Any]] = []
    waited = thread.wait.lock if thread.wait is not None else None
    frame: FrameType | None = thread.frame
    depth = 0
    while frame is not None and depth < _HOLD_DEPTH:
        if frame.f_code.co_filename not in _SYNC_FILES:
            entering = thread.entering if depth == 0 else None
            for chain in lockexpr.held_chains(frame, entering):
                obj = lockexpr.resolve(frame, chain)
                if issubclass(type(obj), threading.Condition):
                    obj = condition_lock(obj)
                if obj is None or obj is waited or not _is_lock(obj) or not _locked(obj):
                    continue
                owner = rlock_owner(obj)
                if owner is not None and owner != thread.ident:
                    continue
                if not any(lock is obj for _, lock in held):
                    held.append((lockexpr.chain_text(chain), obj))
        frame = frame.f_back
        depth += 1
    thread.holds = held
    return held


def _claims(lock: object, thread: _Thread, others: list[_Thread]) -> list[int]:
    return [other.ident for other in others if other is not thread and any(held is lock for _, held in _holds(other))]


def _find_owners(threads: dict[int, _Thread]) -> None:
    """Fill each lock wait's owner: an RLock's from the lock, a plain Lock's from the one thread whose ``with``
    holds it: looked for among the waiting threads first (their holds are reported anyway), then, only if none
    claims it, among the others (at most :data:`_MAX_SCANNED` of them, once each)."""
    waiting = [t for t in threads.values() if t.wait is not None]
    others = [t for t in threads.values() if t.wait is None][:_MAX_SCANNED]
    for thread in waiting:
        wait = thread.wait
        if wait is None or wait.lock is None:
            continue
        wait.owner = rlock_owner(wait.lock)
        if wait.owner is not None:
            continue
        claims = _claims(wait.lock, thread, waiting) or _claims(wait.lock, thread, others)
        wait.owner = claims[0] if len(claims) == 1 else None


def _cycles(threads: dict[int, _Thread]) -> list[list[int]]:
    """Cycles of waits-for edges (each thread waits for at most one other: walk each path once)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    found: list[list[int]] = []
    for start in sorted(threads):
        path: list[int] = []
        ident: int | None = start
        while ident is not None and ident in threads and ident not in state:
            state[ident] = 1
            path.append(ident)
            wait = threads[ident].wait
            ident = wait.owner if wait is not None and wait.edge else None
        if ident is not None and state.get(ident) == 1:
            found.append(path[path.index(ident):])
        for member in path:
            state[member] = 2
    return found


class _Names:
    """Thread idents as a report names them: the native id and the name (read once each)."""

    def __init__(self, table: Mapping[int, threading.Thread]) -> None:
        self._table = table

    def tid(self, ident: int) -> int:
        thread = self._table.get(ident)
        native = thread.native_id if thread is not None else None
        return native if isinstance(native, int) else ident

    def name(self, ident: int) -> str:
        thread = self._table.get(ident)
        return bounded(thread.name if thread is not None else f"thread {ident}", MAX_TEXT)

    def who(self, ident: int) -> str:
        return f"thread {self.name(ident)!r} (tid {self.tid(ident)})"


def _waits_text(wait: _Wait, names: _Names) -> str:
    if wait.kind == "thread":
        return f"{names.who(wait.owner)} to end" if wait.owner is not None else "a thread to end"
    article = "an" if wait.kind[0] in "AEIOU" else "a"
    text = f"{wait.kind} {wait.name}" if wait.name else f"{article} {wait.kind}"
    if wait.detail:
        text += f" {wait.detail}"
    if wait.lock is not None:
        holder = "its lock held by" if wait.kind == "Condition" else "held by"
        text += f", {holder} {names.who(wait.owner)}" if wait.owner is not None else ""
        if wait.owner is None and wait.edge:
            text += ", owner unknown"
    return text


def _short(wait: _Wait, names: _Names) -> str:
    """What a deadlock's sentence says a thread waits for: ``b``, ``a Lock``, ``thread 'x' (tid 5) to end``."""
    if wait.kind == "thread":
        return _waits_text(wait, names)
    return wait.name or f"a {wait.kind}"


def _deadlock(cycle: list[int], threads: dict[int, _Thread], names: _Names) -> Deadlock:
    start = min(range(len(cycle)), key=lambda i: names.tid(cycle[i]))
    cycle = cycle[start:] + cycle[:start]
    clauses = []
    for index, ident in enumerate(cycle):
        wait = threads[ident].wait
        before = threads[cycle[index - 1]].wait
        assert wait is not None and before is not None
        holds = f" holds {_short(before, names)} and" if before.kind != "thread" else ""
        clauses.append(f"thread {names.name(ident)!r}{holds} waits for {_short(wait, names)}")
    return Deadlock(tids=[names.tid(i) for i in cycle[:16]],
                    text=bounded("deadlock: " + "; ".join(clauses), MAX_WAIT_TEXT))


def analyse(
    frames: Mapping[int, FrameType],
    *,
    threads: Mapping[int, threading.Thread] | None = None,
    cell_of: CellOfFile | None = None,
) -> WaitsReport:
    """What each thread in ``frames`` (ident -> its current frame) waits on, and the deadlocks among them.

    ``threads``: ident -> Thread, for names and native ids (default: the interpreter's table); ``cell_of``: names a
    cell's file, so that stacks read "cell [3], line 2 in f". Never raises for a thread it cannot read: that thread
    is left out.
    """
    table = dict(threads) if threads is not None else dict(running_threads() or {})
    if threads is None and not table:
        table = {t.ident: t for t in threading.enumerate() if t.ident is not None}
    names = _Names(table)
    found: dict[int, _Thread] = {}
    try:
        for ident, frame in frames.items():
            thread = _Thread(ident, frame)
            found[ident] = thread
            try:
                thread.wait = _sync_wait(frame) or _c_wait(thread)
            except Exception:  # a frame changing under us, an object we cannot read: that thread says nothing
                thread.wait = None
        _find_owners(found)
        return _report(found, names, cell_of)
    finally:
        for thread in found.values():  # frames and locks go with this call
            thread.holds = None
            thread.wait = None
        found.clear()


def _report(found: dict[int, _Thread], names: _Names, cell_of: CellOfFile | None) -> WaitsReport:
    cycles = _cycles(found)
    in_cycles = [ident for cycle in cycles for ident in cycle]
    waiting = [t.ident for t in found.values() if t.wait is not None]
    owners = [t.wait.owner for t in found.values() if t.wait is not None and t.wait.owner is not None]
    listed: list[int] = []
    for ident in [*in_cycles, *sorted(waiting, key=names.name), *owners]:
        if ident in found and ident not in listed:
            listed.append(ident)
    rows = [_row(found[ident], names, cell_of) for ident in listed[:MAX_WAIT_THREADS]]
    return WaitsReport(threads=rows, deadlocks=[_deadlock(c, found, names) for c in cycles[:MAX_DEADLOCKS]])


def _row(thread: _Thread, names: _Names, cell_of: CellOfFile | None) -> WaitingThread:
    wait = thread.wait
    try:
        holds = [bounded(name, MAX_TEXT) for name, _ in _holds(thread)[:MAX_HOLDS]]
    except Exception:
        holds = []
    stack = format_stack(thread.frame, limit=MAX_STACK_LINES, cell_of=cell_of)
    return WaitingThread(
        tid=names.tid(thread.ident),
        name=names.name(thread.ident),
        waits=bounded(_waits_text(wait, names), MAX_WAIT_TEXT) if wait is not None else None,
        owner_tid=names.tid(wait.owner) if wait is not None and wait.owner is not None else None,
        holds=holds,
        stack=[bounded(line, MAX_WAIT_TEXT) for line in stack],
    )

