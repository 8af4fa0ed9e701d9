"""Who closed a queue with a close op: the close ops of the users' queues (graph mode) are remembered as they are
built, and a run of one, by any thread but nbcoord's, is recorded on the queue's state in that session."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from nbcoord.core.registry import Registry
from nbcoord.tensorflow.explain import Explainer
from nbcoord.tensorflow.graph import SCOPE
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import CloseRecord, QueueInfo
from nbcoord.tensorflow.runs import INTERNAL_PREFIX, RunTracker


class CloseOps:
    """The close ops of the users' queues, and the record of who ran one."""

    def __init__(
        self,
        objects: TFObjects,
        tracker: RunTracker,
        registry: Registry,
        explainer: Explainer,
        current_cell: Callable[[], int | None],
    ) -> None:
        self._objects = objects
        self._tracker = tracker
        self._registry = registry
        self._explainer = explainer
        self._current_cell = current_cell
        #: Close ops of the users' queues (graph mode), by id: the op and its queue (guarded by the objects' lock).
        self._ops: dict[int, tuple[weakref.ref[Any], QueueInfo]] = {}

    def close_op_built(self, queue: Any, op: Any) -> None:
        """Remember a graph-mode close op of a user's queue (or of a QueueRunner), to know who ran it."""
        name = str(getattr(op, "name", ""))
        if name.startswith(SCOPE):
            return  # nbcoord's own: its runs are recorded where nbcoord makes them
        info = self._objects.queue_info(queue)
        if info is None:
            return
        with self._objects.lock:
            self._ops = {k: v for k, v in self._ops.items() if v[0]() is not None}
            self._ops[id(op)] = (weakref.ref(op), info)
            self._tracker.watched_ops = frozenset(self._ops)

    def close_run(self, session: Any, fetches: Any) -> None:
        """A run of a user's (or a QueueRunner's) close op completed: remember who closed the queue."""
        sinfo = self._objects.session_info(session)
        thread = threading.current_thread()
        if sinfo is None or thread.name.startswith(INTERNAL_PREFIX):
            return
        items = fetches if isinstance(fetches, (list, tuple)) else [fetches]
        record = self._close_record(thread)
        with self._objects.lock:
            for op in items:
                entry = self._ops.get(id(op))
                if entry is None or entry[0]() is not op:
                    continue
                state = entry[1].state(sinfo.sid)
                state.note_close(record, in_flight=False)
                state.closed = True

    def _close_record(self, thread: threading.Thread) -> CloseRecord:
        runner = self._objects.runner(thread)
        now = time.time()
        if runner is not None:
            qr = runner.runner_ref()
            name = f"QueueRunner `{getattr(qr, 'name', '?')}`"
            coord = runner.coord_ref() if runner.coord_ref is not None else None
            cinfo = self._objects.coord_info(coord) if coord is not None else None
            if runner.role == "close_on_stop" and cinfo is not None and cinfo.stopped_by is not None:
                return self._explainer.coordinator_record(runner, cinfo.cid, cinfo.stopped_by)
            return CloseRecord("runner-end", thread.name, runner.cell, now, name)
        if thread is threading.main_thread():
            return CloseRecord("close-op", "MainThread", self._current_cell(), now)
        record = self._registry.for_thread(thread)
        cell = record.cell.execution_count if record is not None and record.cell is not None else None
        return CloseRecord("close-op", thread.name, cell, now)
