"""The snapshot's rows of TensorFlow objects: one per queue and session (the eager queues included), from what
:class:`~nbcoord.tensorflow.objects.TFObjects` knows and last polled; nothing here polls or registers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcoord.tensorflow.records import EAGER, QueueInfo, QueueState, SessionInfo, session_is_open

if TYPE_CHECKING:
    from nbcoord.tensorflow.objects import TFObjects


def queue_rows(
    objects: TFObjects, extra: Callable[[QueueInfo, str | None], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Queue rows: one per queue and open session (one for a queue not yet in any session, one per eager
    queue); ``extra`` adds fields to a row (the health part's stuck counts)."""
    open_sessions = {info.sid: info for info in objects.sessions() if info.live_session() is not None}
    rows: list[dict[str, Any]] = []
    for queue in objects.queues():
        if queue.mode == "eager":
            runners = len(objects.eager_threads(queue, producers=True))
            rows.append(_queue_row(queue, None, queue.states.get(EAGER), runners))
            continue
        graph = queue.graph_ref() if queue.graph_ref is not None else None
        shown = False
        for sid, sinfo in open_sessions.items():
            session = sinfo.ref()
            if session is None or graph is None or session.graph is not graph:
                continue
            state = queue.states.get(sid)
            if state is None and queue.states:
                continue
            rows.append(_queue_row(queue, sid, state, len(objects.producers(queue, session))))
            shown = True
        if not shown and not queue.states:
            rows.append(_queue_row(queue, None, None, 0))
    if extra is not None:
        for row, known in zip(rows, _row_queues(objects, rows), strict=True):
            if known is not None:
                row.update(extra(known, row["session"]))
    return rows


def _row_queues(objects: TFObjects, rows: list[dict[str, Any]]) -> list[QueueInfo | None]:
    by_id = {q.qid: q for q in objects.queues()}
    return [by_id.get(row["id"]) for row in rows]


def _queue_row(queue: QueueInfo, sid: str | None, state: QueueState | None, runners: int) -> dict[str, Any]:
    enqueue_rate, dequeue_rate = state.rates() if state is not None else (None, None)
    if queue.mode == "eager" and state is not None and len(state.window) >= 2:
        enqueue_rate, dequeue_rate = _eager_rates(queue, state)
    return {
        "id": queue.qid,
        "name": queue.name,
        "type": queue.op_type,
        "mode": queue.mode,
        "capacity": queue.capacity,
        "size": state.size if state is not None else None,
        "closed": state.closed if state is not None else None,
        "enqueue_rate": round(enqueue_rate, 2) if enqueue_rate is not None else None,
        "dequeue_rate": round(dequeue_rate, 2) if dequeue_rate is not None else None,
        "history": [list(point) for point in state.history] if state is not None else [],
        "session": sid,
        "runners": runners,
        "cell": queue.cell,
        "preexisting": queue.preexisting,
        "polled": queue.ops is not None or queue.mode == "eager",
    }


def _eager_rates(queue: QueueInfo, state: QueueState) -> tuple[float | None, float | None]:
    """Rates of an eager queue from its counted enqueues and dequeues (both are seen there)."""
    (t0, size0, enq0), (t1, size1, enq1) = state.window[0], state.window[-1]
    dt = t1 - t0
    if dt <= 0:
        return None, None
    enqueue_rate = (enq1 - enq0) / dt
    return enqueue_rate, max(0.0, enqueue_rate - (size1 - size0) / dt)


def session_rows(
    objects: TFObjects, extra: Callable[[SessionInfo], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Session rows: id, target, closed, live runner threads, cell (and what ``extra`` adds)."""
    runners = objects.runners()
    rows: list[dict[str, Any]] = []
    for info in objects.sessions():
        session = info.ref()
        if session is None:
            continue
        row = {
            "id": info.sid,
            "target": info.target,
            "closed": not session_is_open(session),
            "runner_threads": sum(1 for r in runners if r.session_ref() is session),
            "cell": info.cell,
            "preexisting": info.preexisting,
        }
        if extra is not None:
            row.update(extra(info))
        rows.append(row)
    return rows
