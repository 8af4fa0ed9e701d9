"""TensorFlow's own errors, explained in one sentence added to the error (a note, shown with its traceback).

The errors users meet with queues, runners and sessions say what failed, not why. nbcoord knows the why:

- ``Attempted to use a closed Session`` (or a run cancelled by the close) in a thread: which runner or thread,
  started in which cell, and that the session was closed by a ``with`` block or ``close()`` in cell [N] while it
  ran;
- ``OutOfRangeError`` / ``CancelledError`` on a closed queue: who closed the queue, when, and from where (a
  coordinator's ``request_stop``, nbcoord's stop, a QueueRunner at the end of its input, a close op run in cell
  [N]);
- ``DeadlineExceededError`` on a dequeue: the queue's fill level and whether any runner feeds it.

The sentence is a note on the exception (``BaseException.add_note``): it travels with the error, is printed
under the traceback of the cell that sees it, and costs nothing when the code catches the error (the end of an
input, caught as ``OutOfRangeError``, is the normal way a queue-fed loop ends). Notes are only computed on the
failure path, never on a successful run.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from nbcoord.core.internals import calling_frame
from nbcoord.core.registry import Registry
from nbcoord.tensorflow.blocked import plural, seconds
from nbcoord.tensorflow.graph import QueueUse, RunAnalyzer, queue_use, run_op_names
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import EAGER, CloseRecord, QueueInfo, QueueState, SessionInfo, session_is_open
from nbcoord.tensorflow.runs import RunTracker

log = logging.getLogger("nbcoord")

#: Where TensorFlow names the failing node in an error message.
_NODE = re.compile(r"\{\{node ([^}\s]+)\}\}")
#: Every note nbcoord adds starts with this (and one is never added twice).
PREFIX = "nbcoord: "
#: A closed session's errors: raised by ``Session.run`` itself, or by the C++ side of a prepared step.
_CLOSED_SESSION = ("closed Session", "Session has been closed", "Run call was cancelled")


def add_note(exc: BaseException, sentence: str) -> None:
    """Add ``sentence`` to ``exc`` once (Python 3.10 has no ``add_note``; its notes list is set directly)."""
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list) and any(isinstance(n, str) and n.startswith(PREFIX) for n in notes):
        return
    text = PREFIX + sentence
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(text)
    else:
        exc.__notes__ = [*(notes or []), text]  # type: ignore[attr-defined]


def ago(at: float | None) -> str:
    """``3 s ago``, ``2 min ago``."""
    if at is None:
        return ""
    age = max(0.0, time.time() - at)
    if age < 1:
        return "just now"
    return f"{seconds(age)} s ago" if age < 120 else f"{age / 60:.0f} min ago"


def in_cell(cell: int | None) -> str:
    return f" in cell [{cell}]" if cell is not None else ""


class Explainer:
    """Computes the sentence for an error, from what the integration recorded."""

    def __init__(
        self,
        objects: TFObjects,
        tracker: RunTracker,
        analyzer: RunAnalyzer,
        registry: Registry,
        errors: dict[str, type[BaseException]],
    ) -> None:
        self.objects = objects
        self.tracker = tracker
        self.analyzer = analyzer
        self.registry = registry
        self._errors = errors

    def _is(self, exc: BaseException, *names: str) -> bool:
        return any((kind := self._errors.get(name)) is not None and isinstance(exc, kind) for name in names)

    # ------------------------------------------------------------------------------------------- entry
    def explain_run(self, exc: BaseException, session: Any, op_names: Iterable[str]) -> None:
        """Add the sentence for an error of a session run (``op_names``: what the run fetched), if one applies."""
        try:
            sentence = self._run_sentence(exc, session, tuple(op_names))
        except Exception:
            log.debug("nbcoord: could not explain a TensorFlow error", exc_info=True)
            return
        if sentence:
            add_note(exc, sentence)

    def explain_eager(self, exc: BaseException, queue: QueueInfo | None) -> None:
        """Add the sentence for an error of an eager queue call on ``queue``."""
        if queue is None:
            return
        try:
            self.objects.poll_eager(only=queue)
            state = queue.states.get(EAGER)
            sentence = self._closed_sentence(queue, state) if self._is(exc, "cancelled", "out_of_range") else ""
        except Exception:
            log.debug("nbcoord: could not explain an eager queue error", exc_info=True)
            return
        if sentence:
            add_note(exc, sentence)

    def _run_sentence(self, exc: BaseException, session: Any, op_names: tuple[str, ...]) -> str:
        sinfo = self.objects.session_info(session)
        message = str(getattr(exc, "message", "") or exc)
        closed = sinfo is not None and sinfo.closed_by is not None and not session_is_open(session)
        if sinfo is not None and closed and (self._is(exc, "op_error") or any(m in message for m in _CLOSED_SESSION)):
            return self._session_sentence(sinfo, threading.current_thread())
        if self._is(exc, "deadline_exceeded"):
            return self._deadline_sentence(exc, session, sinfo, op_names)
        if self._is(exc, "out_of_range", "cancelled") and sinfo is not None:
            queue = self._failed_queue(exc, session, op_names)
            if queue is not None:
                self.objects.poll(sinfo)
                return self._closed_sentence(queue, queue.states.get(sinfo.sid), session)
        return ""

    # ------------------------------------------------------------------------------------------ queues
    def _failed_queue(self, exc: BaseException, session: Any, op_names: tuple[str, ...]) -> QueueInfo | None:
        """The queue whose closing made a run fail: the failing op's, else the one queue the run uses."""
        graph = session.graph
        op = getattr(exc, "op", None)
        if op is None:
            match = _NODE.search(str(getattr(exc, "message", "") or exc))
            if match is not None:
                try:
                    op = graph.get_operation_by_name(match.group(1))
                except (KeyError, ValueError):
                    op = None
        use = queue_use(op) if op is not None else None
        if use is None:
            uses = {u.queue_op for u in self.analyzer.queue_uses(graph, op_names) if u.kind != "close"}
            if len(uses) != 1:
                return None
            return self.objects.queue_by_op(graph, next(iter(uses)))
        return self.objects.queue_by_op(graph, use.queue_op)

    def _closed_sentence(self, queue: QueueInfo, state: QueueState | None, session: Any = None) -> str:
        kind = "eager queue" if queue.mode == "eager" else "queue"
        if state is not None and state.closed is False:
            return ""  # open again (reset): the error was about the closing, which nbcoord no longer knows
        record = state.closed_by if state is not None else None
        if record is None and session is not None:
            record = self._closed_by_runner(queue, session)
        if record is None:
            seen = f" (first seen closed {ago(state.closed_seen_at)})" if state and state.closed_seen_at else ""
            return f"{kind} `{queue.name}` is closed{seen}; nbcoord did not see what closed it."
        return f"{kind} `{queue.name}` was closed {ago(record.at)} by {self.closer(record)}."

    def closer(self, record: CloseRecord) -> str:
        """Who closed, in words."""
        if record.source == "nbcoord-stop":
            return f"nbcoord's stop ({record.detail}{', run' + in_cell(record.cell) if record.cell else ''})"
        if record.source == "nbcoord-interrupt":
            return f"nbcoord, when Interrupt ended the blocked call{in_cell(record.cell)}"
        if record.source == "coordinator":
            return record.detail
        if record.source == "runner-end":
            return f"{record.detail} when its input ran out"
        where = in_cell(record.cell) if record.thread in ("MainThread", "the main thread") else (
            f" by thread '{record.thread}'" + (f" (started{in_cell(record.cell)})" if record.cell is not None else "")
        )
        return f"`close()`{where}" if record.source == "eager-close" else f"a close op run{where}"

    def _closed_by_runner(self, queue: QueueInfo, session: Any) -> CloseRecord | None:
        """A queue's runners close it when their coordinator is asked to stop: say so, with who asked."""
        runners = [r for r in self.objects.runners(alive_only=False) if r.queue is queue and r.session_ref() is session]
        for runner in runners:
            coord = runner.coord_ref() if runner.coord_ref is not None else None
            cinfo = self.objects.coord_info(coord) if coord is not None else None
            if cinfo is not None and cinfo.stopped_by is not None:
                return self.coordinator_record(runner, cinfo.cid, cinfo.stopped_by)
        return None

    def coordinator_record(self, runner: Any, cid: str, stopped: CloseRecord) -> CloseRecord:
        """The record of a close by a runner's close-on-stop thread, after its coordinator's stop."""
        qr = runner.runner_ref() if hasattr(runner, "runner_ref") else runner
        name = getattr(qr, "name", "?")
        why = f" ({stopped.detail})" if stopped.detail else ""
        detail = (
            f"QueueRunner `{name}` when Coordinator {cid} was asked to stop by {stopped.thread}"
            f"{in_cell(stopped.cell)}{why}"
        )
        return CloseRecord("coordinator", stopped.thread, stopped.cell, stopped.at, detail)

    def _deadline_sentence(
        self, exc: BaseException, session: Any, sinfo: SessionInfo | None, op_names: tuple[str, ...]
    ) -> str:
        if sinfo is None:
            return ""
        uses = [u for u in self.analyzer.queue_uses(session.graph, op_names) if u.kind == "dequeue"]
        if not uses:
            return ""
        self.objects.poll(sinfo)
        sentences = [self._fill_sentence(use, session, sinfo) for use in uses[:2]]
        return " ".join(s for s in sentences if s)

    def _fill_sentence(self, use: QueueUse, session: Any, sinfo: SessionInfo) -> str:
        queue = self.objects.queue_by_op(session.graph, use.queue_op)
        if queue is None:
            return ""
        state = queue.states.get(sinfo.sid)
        size = "?" if state is None or state.size is None else str(state.size)
        held = f"{size} of {queue.capacity} elements" if queue.capacity > 0 else f"{size} elements"
        feeders = self.objects.producers(queue, session)
        if not feeders:
            feed = "no QueueRunner feeds it (an enqueue op alone is not a runner; start_queue_runners starts those "
            feed += "added with add_queue_runner)"
        else:
            now = time.monotonic()
            states = [self.tracker.state_of(t) for r in feeders if (t := r.thread_ref()) is not None]
            stuck = sum(1 for s in states if s is not None and s.since and now - s.since > 2.0)
            feed = plural(len(feeders), "runner thread") + " feed" + ("s" if len(feeders) == 1 else "") + " it"
            if stuck:
                feed += f" ({stuck} stuck in their own run: see %nbcoord)"
        closed = " and is closed" if state is not None and state.closed else ""
        return f"{use.describe()} of queue `{queue.name}` timed out: it held {held}{closed}, and {feed}."

    # ----------------------------------------------------------------------------------------- sessions
    def _session_sentence(self, sinfo: SessionInfo, thread: threading.Thread) -> str:
        record = sinfo.closed_by
        if record is None:
            return ""
        how = "the `with` block" if record.source == "with-block" else "`close()`"
        closed = f"{how}{in_cell(record.cell)}"
        runner = self.objects.runner(thread)
        trecord = self.registry.for_thread(thread)
        cell = runner.cell if runner is not None and runner.cell is not None else (
            trecord.cell.execution_count if trecord is not None and trecord.cell is not None else None
        )
        started = f", started{in_cell(cell)}" if cell is not None else ""
        if runner is not None and (qr := runner.runner_ref()) is not None:
            who = f"QueueRunner `{qr.name}` (thread '{thread.name}'{started})"
        elif thread is threading.main_thread():
            return f"Session {sinfo.sid} was closed by {closed} {ago(record.at)}."
        else:
            who = f"thread '{thread.name}'" + (f" (started{in_cell(cell)})" if cell is not None else "")
        return f"{who} used Session {sinfo.sid} after {closed} closed it, while it ran."


def fetched_names(fetches: Any) -> tuple[str, ...]:
    """The op names of what ``Session.run`` was asked to fetch (ops, tensors, nested lists and dicts)."""
    found: list[str] = []
    stack = [fetches]
    while stack and len(found) < 64:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        else:
            op = getattr(item, "op", item)
            name = getattr(op, "name", None)
            if isinstance(name, str):
                found.append(name)
    return tuple(sorted(set(found)))


def run_names(fetch_list: Any, target_list: Any) -> tuple[str, ...]:
    """The op names of a run as the run hook sees it."""
    return run_op_names(fetch_list, target_list)


def called_from(code: Callable[..., Any] | None, depth: int = 16) -> bool:
    """Whether the calling stack (within ``depth`` frames) runs ``code`` (a function)."""

    target = getattr(code, "__code__", None)
    if target is None:
        return False
    frame: Any = calling_frame(1)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code is target:
            return True
        frame = frame.f_back
    return False
