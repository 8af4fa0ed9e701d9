"""Eager queues (TensorFlow 2's default mode, S10): registered, polled, their blocked calls seen, stopped.

An eager ``tf.queue.FIFOQueue`` (and the other queue classes) runs each ``enqueue`` / ``dequeue`` as one eager op
that blocks in C++ until it can complete. nbcoord patches the queue methods (class attributes of
``tf.queue.QueueBase``); when the calling thread executes eagerly, the patched method notes the call in flight
(the queue, the kind, the element count, since when) and, once it completes, counts the elements moved and
the thread as the queue's producer or consumer. In graph mode (and inside a ``tf.function``), the methods only
build ops: the patch passes straight through.

- Interrupt: the watcher thread sees SIGINT (see :mod:`._tf_runs`); when the main thread is blocked in an eager
  dequeue from a queue nobody feeds (or an enqueue into a full queue nobody drains), the queue is closed with
  pending enqueues cancelled, the blocked op fails at once, and the patched method raises ``KeyboardInterrupt``
  with one sentence instead. TensorFlow cannot reopen an eager queue: the sentence says it is closed.
- Stop: the queues that the threads in scope use (blocked in now, or used before) are closed with pending
  enqueues cancelled, through the queue's own public ``close``. A blocked producer gets ``CancelledError``, a
  blocked consumer ``OutOfRangeError``: in a thread nbcoord was asked to stop, that error is also a
  :class:`nbcoord.ThreadStopped`, so the thread ends as stopped (not as failed), while ``except
  tf.errors.CancelledError`` in the user's code still catches it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from nbcoord.core.records import Owner
from nbcoord.core.registry import Registry
from nbcoord.core.stop import ThreadStopped
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import EAGER, CloseRecord, QueueInfo
from nbcoord.tensorflow.runs import frames_to, warm_traceback
from nbcoord.tensorflow.tracebacks import mark_cancelled

log = logging.getLogger("nbcoord")

#: A producer (or consumer) whose own queue call has lasted longer than this is stuck, not progressing.
PROGRESS_S = 2.0
#: A main-thread call in flight this long gets its Interrupt prepared by the monitor.
PREPARE_AFTER_S = 0.3
#: Queue methods nbcoord follows, and what they move: +1 enqueues, -1 dequeues, 0 closes.
ENQUEUE_METHODS = ("enqueue", "enqueue_many")
DEQUEUE_METHODS = ("dequeue", "dequeue_many", "dequeue_up_to")


class EagerCall:
    """One thread's eager queue call in flight (``current``) and what it cancelled."""

    __slots__ = ("__weakref__", "cancel_message", "cancel_token", "current", "ident", "thread_ref")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread_ref = weakref.ref(thread)
        self.ident = thread.ident
        #: (queue, method, elements, since): one store per call, read whole by other threads.
        self.current: tuple[QueueInfo, str, int, float] | None = None
        self.cancel_token = -1.0
        self.cancel_message = ""


_stopped_types: dict[type, type] = {}


def as_stopped(exc: BaseException) -> BaseException:
    """The same TensorFlow error, as an instance of a subclass of both its type and :class:`ThreadStopped`: code
    that catches the TensorFlow type still does, and nbcoord counts the thread as stopped, not failed."""
    cls = type(exc)
    stopped = _stopped_types.get(cls)
    if stopped is None:
        stopped = _stopped_types[cls] = type(cls.__name__, (cls, ThreadStopped), {"__module__": cls.__module__})
    try:
        new: BaseException = stopped(exc.node_def, exc.op, exc.message)  # type: ignore[attr-defined]
    except Exception:  # not an OpError after all: keep it as it was
        return exc
    return new


def _leading(value: Any) -> int | None:
    """The size of the first dimension of the first component of a queue element batch, when known."""
    first = value
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    try:
        return int(shape[0]) if shape is not None and len(shape) > 0 and shape[0] is not None else None
    except (TypeError, ValueError):
        return None


class EagerQueues:
    """The eager side of the integration: the queue-method patches, the calls in flight, Interrupt and stops."""

    def __init__(
        self,
        objects: TFObjects,
        registry: Registry,
        current_cell: Callable[[], int | None],
        errors: dict[str, type[BaseException]],
    ) -> None:
        self.objects = objects
        self.registry = registry
        self._current_cell = current_cell
        #: TensorFlow error types by name (cancelled, out_of_range), filled at install.
        self._errors = errors
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _calls
        self._calls: dict[int, EagerCall] = {}
        self.active = False
        self.executing_eagerly: Callable[[], bool] = lambda: False
        #: Adds a sentence to a TensorFlow error a queue call raised (the explanations part), set at install.
        self.explain: Callable[[BaseException, QueueInfo | None], None] = lambda _exc, _queue: None
        #: The files whose frames end up in the traceback of a cancelled call (the cell's, nbcoord's wrapper).
        self.traceback_file: Callable[[str], bool] = lambda _filename: False
        self._warmed_for = -1.0

    # --------------------------------------------------------------------------------------- the patches
    def _call(self) -> EagerCall:
        try:
            call: EagerCall = self._local.call
        except AttributeError:
            call = EagerCall(threading.current_thread())
            self._local.call = call
            with self._lock:
                if call.ident is not None:
                    self._calls[call.ident] = call
        return call

    def make_wrapper(self, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The patch maker for one queue method (``enqueue``, ``dequeue_many``, ``close``...)."""
        eager = self
        moves = 1 if method in ENQUEUE_METHODS else -1 if method in DEQUEUE_METHODS else 0

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(queue: Any, *args: Any, **kwargs: Any) -> Any:
                if not eager.active or not eager.executing_eagerly():
                    return original(queue, *args, **kwargs)
                info = eager.objects.queue_info(queue)
                if info is None or info.mode != "eager":
                    return original(queue, *args, **kwargs)
                if moves == 0:
                    record = eager.note_close(info, threading.current_thread())
                    try:
                        return original(queue, *args, **kwargs)
                    finally:
                        eager.settle_close(info, record)
                count = eager._count(method, args, kwargs)
                call = eager._call()
                since = time.monotonic()
                call.current = (info, method, count, since)
                try:
                    result = original(queue, *args, **kwargs)
                except BaseException as exc:
                    call.current = None
                    replacement = eager._failed(call, info, since, exc)
                    if replacement is exc:
                        raise
                    raise replacement.with_traceback(None) from None
                call.current = None
                eager._done(info, moves, count if method != "dequeue_up_to" else (_leading(result) or 0))
                return result

            return wrapper

        return make

    @staticmethod
    def _count(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """Elements one call moves: 1, the ``n`` of a dequeue_many, the batch of an enqueue_many."""
        if method in ("enqueue", "dequeue"):
            return 1
        if method == "enqueue_many":
            return _leading(args[0] if args else kwargs.get("vals")) or 1
        n = args[0] if args else kwargs.get("n", 1)
        try:
            return max(1, int(n))
        except (TypeError, ValueError):
            return 1

    def _done(self, info: QueueInfo, moves: int, count: int) -> None:
        thread = threading.current_thread()
        table = self.objects.eager_producers if moves > 0 else self.objects.eager_consumers
        main = thread is threading.main_thread()
        with self.objects.lock:
            counts = self.objects.eager_counts.setdefault(info.qid, [0, 0])
            counts[0 if moves > 0 else 1] += count
            # The main thread runs the user's cells, not a pipeline: it is nobody's producer or consumer.
            users = table.setdefault(info.qid, {})
            first = not main and (thread.ident not in users or users[thread.ident]() is not thread)
            if first and thread.ident is not None:
                users[thread.ident] = weakref.ref(thread)
        if first:
            self._own(thread, info)

    def _own(self, thread: threading.Thread, info: QueueInfo) -> None:
        """A thread that uses an eager queue gets the queue as its owner (it is a zombie once the queue closes)."""
        queue = info.ref()
        if queue is None:
            return

        def closed(_queue: object, info: QueueInfo = info) -> bool:
            state = info.states.get(EAGER)
            return bool(state is not None and state.closed)

        self.registry.add_owner(thread, Owner("queue", f"queue `{info.name}`", weakref.ref(queue), closed))

    def note_close(self, info: QueueInfo, thread: threading.Thread, record: CloseRecord | None = None) -> CloseRecord:
        """Remember who closes an eager queue (for the sentence of the errors that follow), before the close
        runs; ``settle_close`` once it has."""
        record = record or CloseRecord("eager-close", thread.name, self._current_cell(), time.time())
        with self.objects.lock:
            info.state(EAGER).note_close(record, in_flight=True)
        return record

    def settle_close(self, info: QueueInfo, record: CloseRecord) -> None:
        with self.objects.lock:
            info.state(EAGER).settle_close(record)

    def _failed(self, call: EagerCall, info: QueueInfo, since: float, exc: BaseException) -> BaseException:
        """What a failed queue call raises: KeyboardInterrupt after nbcoord's Interrupt, a stopped-thread error
        after nbcoord's stop, else TensorFlow's error with a sentence added."""
        if call.cancel_token == since:
            return mark_cancelled(KeyboardInterrupt(call.cancel_message))
        errors = (self._errors.get("cancelled"), self._errors.get("out_of_range"))
        is_closed = any(kind is not None and isinstance(exc, kind) for kind in errors)
        if not is_closed:
            return exc
        try:
            self.explain(exc, info)
            thread = threading.current_thread()
            record = self.registry.for_thread(thread) if thread is not threading.main_thread() else None
            if record is not None and record.stop_requested_at is not None:
                return as_stopped(exc)
        except Exception:
            log.debug("nbcoord: could not explain an eager queue error", exc_info=True)
        return exc

    # ----------------------------------------------------------------------------------------- in flight
    def calls(self) -> list[EagerCall]:
        """The call states of live threads."""
        with self._lock:
            for ident, call in list(self._calls.items()):
                thread = call.thread_ref()
                if thread is None or not thread.is_alive():
                    del self._calls[ident]
            return list(self._calls.values())

    def call_of(self, thread: threading.Thread) -> EagerCall | None:
        with self._lock:
            call = self._calls.get(thread.ident) if thread.ident is not None else None
        return call if call is not None and call.thread_ref() is thread else None

    def waiting(self, info: QueueInfo, method: str, count: int) -> bool:
        """Whether a call of ``method`` moving ``count`` elements waits on the queue, by the last poll."""
        state = info.states.get(EAGER)
        if state is None or state.size is None or state.closed:
            return False
        if method in DEQUEUE_METHODS:
            return state.size - count < info.min_after_dequeue
        return info.capacity > 0 and state.size + count > info.capacity

    def partners(self, info: QueueInfo, method: str, me: threading.Thread) -> tuple[int, int]:
        """(live, progressing) producers of a waiting dequeue, or consumers of a waiting enqueue."""
        threads = self.objects.eager_threads(info, producers=method in DEQUEUE_METHODS)
        now = time.monotonic()
        live = progressing = 0
        for thread in threads:
            if thread is me:
                continue
            live += 1
            call = self.call_of(thread)
            current = call.current if call is not None else None
            if current is None or now - current[3] < PROGRESS_S:
                progressing += 1
        return live, progressing

    def sentence(self, name: str, current: tuple[QueueInfo, str, int, float], me: threading.Thread) -> str:
        """``MainThread blocked 3.2 s in dequeue of eager queue `input` (0 of 10 elements, no live producer)``."""
        from nbcoord.tensorflow.blocked import plural, seconds

        info, method, count, since = current
        age = time.monotonic() - since
        state = info.states.get(EAGER)
        size = "?" if state is None or state.size is None else str(state.size)
        held = f"{size} of {info.capacity} elements" if info.capacity > 0 else f"{size} elements"
        live, progressing = self.partners(info, method, me)
        if method in DEQUEUE_METHODS:
            partners = "no live producer" if live == 0 else plural(live, "live producer")
        else:
            partners = "no thread dequeuing" if live == 0 else plural(live, "thread") + " dequeuing"
        if live and not progressing:
            partners += ", all stuck"
        what = method if count == 1 or method in ("enqueue_many",) else f"{method}({count})"
        return f"{name} blocked {seconds(age)} s in {what} of eager queue `{info.name}` ({held}, {partners})"

    def blocked_rows(self, after: float) -> list[dict[str, Any]]:
        """One row per thread blocked (at least ``after`` seconds) in an eager queue call that waits."""
        rows: list[dict[str, Any]] = []
        now, wall = time.monotonic(), time.time()
        polled: set[str] = set()
        for call in self.calls():
            current = call.current
            thread = call.thread_ref()
            if current is None or thread is None:
                continue
            info, method, count, since = current
            age = now - since
            if age < after:
                continue
            if info.qid not in polled:
                self.objects.poll_eager(only=info)
                polled.add(info.qid)
            if not self.waiting(info, method, count):
                continue
            record = self.registry.for_thread(thread)
            rows.append(
                {
                    "thread": thread.name,
                    "tid": record.tid if record is not None else None,
                    "since": round(wall - age, 2),
                    "seconds": round(age, 1),
                    "session": None,
                    "queue": info.qid,
                    "queue_name": info.name,
                    "op": method,
                    "text": self.sentence(thread.name, current, thread),
                }
            )
        return rows

    # ----------------------------------------------------------------------------------------- interrupt
    def prepare_main(self) -> None:
        """The monitor's part of the Interrupt: once the main thread has waited a moment in an eager queue call,
        prepare the traceback its KeyboardInterrupt will have (the first one would format slowly)."""
        call = self.call_of(threading.main_thread())
        current = call.current if call is not None else None
        if current is None or current[3] == self._warmed_for or time.monotonic() - current[3] < PREPARE_AFTER_S:
            return
        self._warmed_for = current[3]
        warm_traceback(frames_to(threading.main_thread(), self.traceback_file))

    def cancel_main(self) -> bool:
        """On Interrupt: end the main thread's eager queue call if it waits on a queue nobody serves."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False  # someone else's handler decides what SIGINT means
        main = threading.main_thread()
        call = self.call_of(main)
        current = call.current if call is not None else None
        if call is None or current is None or not self._stuck(current, main):
            return False
        info, method, _count, since = current
        call.cancel_message = (
            f"nbcoord cancelled the {method}: {self.sentence('the main thread', current, main)}. Eager queue "
            f"`{info.name}` is now closed (TensorFlow cannot reopen an eager queue): create it again to go on."
        )
        call.cancel_token = since
        if call.current is not current:
            return False  # the call ended by itself meanwhile
        record = CloseRecord("nbcoord-interrupt", "the main thread", self._current_cell(), time.time())
        return self._close(info, record, main)

    def _stuck(self, current: tuple[QueueInfo, str, int, float], me: threading.Thread) -> bool:
        info, method, count, _since = current
        self.objects.poll_eager(only=info)
        if not self.waiting(info, method, count) or self.partners(info, method, me)[1]:
            log.info("nbcoord: Interrupt during an eager queue call that is not stuck; it ends with the call")
            return False
        return True

    def _close(self, info: QueueInfo, record: CloseRecord, thread: threading.Thread) -> bool:
        """Close an eager queue with pending enqueues cancelled, remembering who did."""
        queue = info.ref()
        if queue is None:
            return False
        self.note_close(info, thread, record)
        try:
            queue.close(cancel_pending_enqueues=True)
        except Exception:
            log.warning("nbcoord: could not close eager queue %s", info.name, exc_info=True)
            return False
        finally:
            self.settle_close(info, record)
        return True

    # --------------------------------------------------------------------------------------------- stops
    def queues_of(self, threads: list[threading.Thread]) -> list[QueueInfo]:
        """The eager queues these threads are blocked in, or have used."""
        wanted = {t.ident for t in threads if t.ident is not None}
        found: dict[str, QueueInfo] = {}
        for thread in threads:
            call = self.call_of(thread)
            current = call.current if call is not None else None
            if current is not None:
                found[current[0].qid] = current[0]
        by_id = {q.qid: q for q in self.objects.queues() if q.mode == "eager"}
        with self.objects.lock:
            tables = [self.objects.eager_producers, self.objects.eager_consumers]
            for table in tables:
                for qid, users in table.items():
                    if qid in by_id and wanted.intersection(users):
                        found[qid] = by_id[qid]
        return list(found.values())

    def close_for_stop(self, threads: list[threading.Thread], scope: str, cell: int | None) -> list[str]:
        """Close, pending enqueues cancelled, the eager queues the threads in a stop use; returns their names."""
        if not self.active or not self.executing_eagerly():
            return []
        detail = f"the stop of {scope}" + (f" [{cell}]" if scope == "cell" and cell is not None else "")
        record = CloseRecord("nbcoord-stop", "nbcoord", self._current_cell(), time.time(), detail)
        me = threading.current_thread()
        return [info.name for info in self.queues_of(threads) if self._close(info, record, me)]
