"""Runs in flight that wait on a queue: found, described in one sentence, and, on Interrupt, cancelled.

A run waits on a queue when its graph (walked back from what it fetches) holds a dequeue from a queue with
fewer elements than it takes, or an enqueue into a full one, according to the last poll. The sentence names
the thread, how long, the operation and the queue, its fill level, and who could unblock it:
"MainThread blocked 42 s in dequeue of queue `input` (0 of 100 elements, no live producer)".

Interrupt resets the queues such a main-thread run waits on. What that needs is prepared when the monitor first
sees the run blocking (the analysis of the run, a prepared step that runs the resets, with its executor built),
so that the Interrupt itself only runs it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbcoord.core.registry import Registry
from nbcoord.tensorflow.graph import QueueUse, RunAnalyzer, run_op_names
from nbcoord.tensorflow.internals import prepare_callable
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import QueueInfo, QueueState, session_is_open
from nbcoord.tensorflow.runs import RunState, RunTracker, RunView, frames_to, warm_traceback

log = logging.getLogger("nbcoord")

#: A run in flight this long, waiting on a queue, is reported as blocked.
BLOCKED_AFTER_S = 1.0
#: A run in flight this long, not waiting on any known queue, is reported as a long run.
LONG_RUN_S = 10.0
#: A producer (or consumer) whose run has lasted longer than this is stuck, not progressing.
PROGRESS_S = 2.0
#: A main-thread run in flight this long gets its Interrupt prepared by the monitor.
PREPARE_AFTER_S = 0.3


@dataclass(eq=False)
class _PreparedReset:
    """The reset of the queues one main-thread run waits on, ready to run."""

    since: float
    session_ref: weakref.ref[Any]
    queue_ids: tuple[str, ...]
    fn: Callable[[], Any] | None


@dataclass(frozen=True)
class Blocking:
    """A queue operation that keeps a run waiting, with what was known when it was found."""

    use: QueueUse
    queue: QueueInfo
    state: QueueState | None


def seconds(value: float) -> str:
    """A duration for a sentence: one decimal under ten seconds."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def plural(count: int, word: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class BlockedRuns:
    """Finds and explains the runs in flight that wait on a queue."""

    def __init__(self, objects: TFObjects, tracker: RunTracker, analyzer: RunAnalyzer, registry: Registry) -> None:
        self.objects = objects
        self.tracker = tracker
        self.analyzer = analyzer
        self.registry = registry
        self._prepared: _PreparedReset | None = None
        #: The files whose frames end up in the traceback of a cancelled run (the cell's, nbcoord's wrapper).
        self.traceback_file: Callable[[str], bool] = lambda _filename: False

    def blocking(self, view: RunView, *, fresh: bool) -> list[Blocking]:
        """The queue operations that keep this run waiting now (``fresh``: poll the session first)."""
        session = view.session
        sinfo = self.objects.session_info(session)
        if sinfo is None:
            return []
        if fresh:
            self.objects.poll(sinfo)
        graph = session.graph
        uses = self.analyzer.queue_uses(graph, run_op_names(view.fetches, view.targets))
        found: list[Blocking] = []
        for use in uses:
            if use.kind == "close":
                continue
            queue = self.objects.queue_by_op(graph, use.queue_op)
            if queue is None:
                continue
            state = queue.states.get(sinfo.sid)
            if state is None or state.size is None or state.closed:
                continue
            count = use.n or 1
            if use.kind == "dequeue":
                # A RandomShuffleQueue also keeps min_after_dequeue elements back until it is closed.
                waiting = state.size - count < queue.min_after_dequeue
            else:
                waiting = queue.capacity > 0 and state.size + count > queue.capacity
            if waiting:
                found.append(Blocking(use, queue, state))
        return found

    def partners(self, blocking: Blocking, session: Any, me: RunState | None) -> tuple[int, int]:
        """(live, progressing) producers of a blocked dequeue, or consumers of a blocked enqueue."""
        now = time.monotonic()
        if blocking.use.kind == "dequeue":
            live = 0
            progressing = 0
            for runner in self.objects.producers(blocking.queue, session):
                live += 1
                thread = runner.thread_ref()
                state = self.tracker.state_of(thread) if thread is not None else None
                since = state.since if state is not None else 0.0
                if since == 0.0 or now - since < PROGRESS_S:
                    progressing += 1
            return live, progressing
        live = progressing = 0
        for view in self.tracker.in_flight():
            if view.state is me or view.session is not session:
                continue
            uses = self.analyzer.queue_uses(session.graph, run_op_names(view.fetches, view.targets))
            if any(u.kind == "dequeue" and u.queue_op == blocking.queue.name for u in uses):
                live += 1
                progressing += int(now - view.since < PROGRESS_S)
        return live, progressing

    def describe(self, name: str, age: float, blocking: Blocking, session: Any, me: RunState | None) -> str:
        """The sentence of a blocked run."""
        queue, state = blocking.queue, blocking.state
        size = "?" if state is None or state.size is None else str(state.size)
        held = f"{size} of {queue.capacity} elements" if queue.capacity > 0 else f"{size} elements, unbounded"
        live, progressing = self.partners(blocking, session, me)
        if blocking.use.kind == "dequeue":
            partners = "no live producer" if live == 0 else plural(live, "live producer")
        else:
            partners = "no thread dequeuing" if live == 0 else plural(live, "thread") + " dequeuing"
        if live and not progressing:
            partners += ", all stuck"
        where = f"{blocking.use.describe()} of queue `{queue.name}`"
        return f"{name} blocked {seconds(age)} s in {where} ({held}, {partners})"

    def rows(self) -> list[dict[str, Any]]:
        """One row per run in flight that waits on a queue (or runs unusually long)."""
        rows: list[dict[str, Any]] = []
        now, wall = time.monotonic(), time.time()
        for view in self.tracker.in_flight():
            age = now - view.since
            if age < BLOCKED_AFTER_S:
                continue
            thread = view.state.thread_ref()
            if thread is None:
                continue
            record = self.registry.for_thread(thread)
            sinfo = self.objects.session_info(view.session)
            try:
                found = self.blocking(view, fresh=False)
            except Exception:
                log.debug("nbcoord: could not analyse a run in flight", exc_info=True)
                found = []
            row: dict[str, Any] = {
                "thread": thread.name,
                "tid": record.tid if record is not None else None,
                "since": round(wall - age, 2),
                "seconds": round(age, 1),
                "session": sinfo.sid if sinfo is not None else None,
            }
            if found:
                first = found[0]
                row.update(
                    queue=first.queue.qid,
                    queue_name=first.queue.name,
                    op=first.use.describe(),
                    text=self.describe(thread.name, age, first, view.session, view.state),
                )
            elif age >= LONG_RUN_S:
                names = ", ".join(run_op_names(view.fetches, view.targets)[:3])
                row.update(
                    queue=None,
                    queue_name=None,
                    op="run",
                    text=f"{thread.name} in a session run for {seconds(age)} s, not waiting on a known queue "
                    f"(running {names})",
                )
            else:
                continue
            rows.append(row)
        return rows

    def _resets(self, view: RunView, state: RunState) -> list[Blocking]:
        """The queues a main-thread run waits on that nobody serves, and that nbcoord can reset."""
        found = self.blocking(view, fresh=True)
        resets = [b for b in found if b.queue.ops is not None and b.queue.ops.reset is not None]
        return [b for b in resets if self.partners(b, view.session, state)[1] == 0]

    def prepare_main(self) -> None:
        """The monitor's part of the Interrupt: once the main thread's run has been in flight a moment, analyse it
        and prepare the step that resets the queues it waits on (a first run of those ops builds an executor)."""
        state = self.tracker.state_of(threading.main_thread())
        view = state.current() if state is not None else None
        if state is None or view is None or time.monotonic() - view.since < PREPARE_AFTER_S:
            return
        prepared = self._prepared
        if prepared is not None and prepared.since == view.since:
            return
        if not session_is_open(view.session):
            return
        resets = self._resets(view, state)
        ids = tuple(b.queue.qid for b in resets)
        fn = None
        if resets:
            ops = [b.queue.ops.reset for b in resets if b.queue.ops is not None and b.queue.ops.reset is not None]
            try:
                fn = prepare_callable(view.session, [op.name for op in ops])
            except Exception:
                log.debug("nbcoord: could not prepare the reset of a blocked run's queues", exc_info=True)
        self._prepared = _PreparedReset(view.since, weakref.ref(view.session), ids, fn)
        if resets:
            warm_traceback(frames_to(threading.main_thread(), self.traceback_file))

    def cancel_main_run(self, run_options: Any) -> bool:
        """On Interrupt: cancel the main thread's run if it is stuck on a queue nobody serves; True if done.

        The stuck queue is reset (closed with pending enqueues cancelled, then its resource destroyed), so that
        the blocked operation fails at once; the hook then raises ``KeyboardInterrupt`` in the cell. The next
        step that touches the queue creates it again, empty: a queue that blocked a dequeue held (almost)
        nothing, and the session and every other queue are untouched.
        """
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False  # someone else's handler decides what SIGINT means
        state = self.tracker.state_of(threading.main_thread())
        view = state.current() if state is not None else None
        if state is None or view is None or not session_is_open(view.session):
            return False
        session = view.session
        resets = self._resets(view, state)
        if not resets:
            log.info("nbcoord: Interrupt during a session run that is not stuck on a queue; it ends with the run")
            return False
        age = time.monotonic() - view.since
        first = resets[0]
        dropped = sum(b.state.size or 0 for b in resets if b.state is not None)
        sentence = self.describe("the main thread", age, first, session, state)
        reset_words = f"reset ({plural(dropped, 'element')} dropped)" if dropped else "reset"
        if any(b.use.op_type.startswith("QueueDequeue") and (b.use.n or 1) > 1 for b in resets):
            # A dequeue_many takes elements as they come; they are dropped with the queue.
            reset_words += ", with the elements the blocked dequeue had already taken"
        state.cancel_message = (
            f"nbcoord cancelled the session run: {sentence}. "
            f"Queue `{first.queue.name}` was {reset_words}; the session and its queues remain usable."
        )
        state.cancel_token = view.since
        if state.since != view.since:
            return False  # the run ended by itself meanwhile
        if not self._run_resets(view, resets, run_options):
            return False
        sinfo = self.objects.session_info(session)
        if sinfo is not None:
            self.objects.poll(sinfo)  # the next step creates the queue afresh: do it now, off the user's time
        return True

    def _run_resets(self, view: RunView, resets: list[Blocking], run_options: Any) -> bool:
        """Run the resets: the step prepared for this run when it is the one, else a plain run."""
        prepared = self._prepared
        ids = tuple(b.queue.qid for b in resets)
        try:
            if (
                prepared is not None
                and prepared.fn is not None
                and prepared.since == view.since
                and prepared.session_ref() is view.session
                and prepared.queue_ids == ids
            ):
                prepared.fn()
            else:
                ops = [b.queue.ops.reset for b in resets if b.queue.ops is not None]
                view.session.run(ops, options=run_options(timeout_in_ms=2000))
        except Exception:
            log.warning("nbcoord: could not reset the queue blocking the main thread", exc_info=True)
            return False
        return True
