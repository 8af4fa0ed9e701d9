"""What nbcoord reads from, and adds to, a TensorFlow graph.

- At queue creation: four small ops per queue, built once, outside the user's control dependencies and control
  flow, colocated with the queue: its size, whether it is closed, a close that cancels pending enqueues (the
  stop), and a reset (close, then destroy the queue resource; the next step that touches the queue creates it
  afresh, empty). Building them later would inherit whatever context the caller is in, and fail once the graph
  is finalized (MonitoredTrainingSession finalizes it).
- For a session run: which queue operations it contains (dequeue from queue ``x``, enqueue into ``y``), found by
  walking the ops it runs back through their inputs; cached per graph and set of fetched op names.

Everything here is called only once TensorFlow is imported; TensorFlow modules are imported inside functions.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("nbcoord")

#: Ops that create a queue resource (and the V1 ref-typed ones).
QUEUE_OP_TYPES = frozenset(
    {
        "FIFOQueueV2",
        "PaddingFIFOQueueV2",
        "RandomShuffleQueueV2",
        "PriorityQueueV2",
        "FIFOQueue",
        "PaddingFIFOQueue",
        "RandomShuffleQueue",
        "PriorityQueue",
    }
)
DEQUEUE_OP_TYPES = frozenset(
    {
        "QueueDequeueV2",
        "QueueDequeueManyV2",
        "QueueDequeueUpToV2",
        "QueueDequeue",
        "QueueDequeueMany",
        "QueueDequeueUpTo",
    }
)
ENQUEUE_OP_TYPES = frozenset({"QueueEnqueueV2", "QueueEnqueueManyV2", "QueueEnqueue", "QueueEnqueueMany"})
#: Ops a queue handle may pass through between the queue op and its use (identity, while-loop frames).
_HANDLE_PASSTHROUGH = frozenset({"Identity", "RefIdentity", "Enter", "RefEnter", "Switch", "RefSwitch"})
#: The cache of analysed runs is cleared when it grows past this many entries.
MAX_CACHED_RUNS = 512

QueueOpKind = Literal["dequeue", "enqueue"]


@dataclass(frozen=True)
class QueueOps:
    """The ops nbcoord built for one queue (``reset`` only for resource-typed queues)."""

    size: Any
    closed: Any
    close: Any
    reset: Any | None


@dataclass(frozen=True)
class QueueUse:
    """One queue operation inside a run: its kind, its op, the queue op it works on, and its element count."""

    kind: QueueOpKind
    op_name: str
    op_type: str
    queue_op: str
    n: int | None

    def describe(self) -> str:
        """``dequeue``, ``dequeue_many(32)``, ``enqueue``..., as a user wrote it."""
        word = {
            "QueueDequeueManyV2": "dequeue_many",
            "QueueDequeueMany": "dequeue_many",
            "QueueDequeueUpToV2": "dequeue_up_to",
            "QueueDequeueUpTo": "dequeue_up_to",
            "QueueEnqueueManyV2": "enqueue_many",
            "QueueEnqueueMany": "enqueue_many",
        }.get(self.op_type, self.kind)
        if word in ("dequeue_many", "dequeue_up_to"):
            return f"{word}({self.n if self.n is not None else '?'})"
        return word


def graph_of(queue: Any) -> Any | None:
    """The graph of a graph-mode queue, or None (eager queues, queues built inside a function)."""
    ref = getattr(queue, "_queue_ref", None)
    try:
        graph = ref.graph  # type: ignore[union-attr]
        op = ref.op  # type: ignore[union-attr]
    except (AttributeError, RuntimeError):  # an EagerTensor has no graph
        return None
    if getattr(graph, "building_function", False) or op.type not in QUEUE_OP_TYPES:
        return None
    return graph


def build_queue_ops(queue: Any) -> QueueOps | None:
    """Build the size / closed / close / reset ops of a graph-mode queue; None when it cannot be done."""
    from tensorflow.python.framework import dtypes
    from tensorflow.python.ops import gen_resource_variable_ops

    graph = graph_of(queue)
    if graph is None or graph.finalized:
        return None
    ref = queue.queue_ref
    base = ref.op.name.replace("/", "_")
    # No control dependencies and no control-flow context (control_dependencies(None) clears both), a fixed
    # name scope, and colocation with the queue (which also drops any device scope the caller is in).
    with (
        graph.as_default(),
        graph.control_dependencies(None),
        graph.name_scope("nbcoord/"),
        graph.colocate_with(ref.op, ignore_existing=True),
    ):
        size = queue.size(name=f"{base}_size")
        closed = queue.is_closed(name=f"{base}_is_closed")
        close = queue.close(cancel_pending_enqueues=True, name=f"{base}_close")
        reset = None
        if ref.dtype == dtypes.resource:
            with graph.control_dependencies([close]):
                reset = gen_resource_variable_ops.destroy_resource_op(
                    ref, ignore_lookup_error=True, name=f"{base}_reset"
                )
    return QueueOps(size=size, closed=closed, close=close, reset=reset)


def queue_attrs(queue_op: Any) -> tuple[int, int]:
    """Capacity (-1: unbounded) and min_after_dequeue (0 unless a RandomShuffleQueue), from the op's attributes."""
    try:
        capacity = int(queue_op.get_attr("capacity"))
    except Exception:  # an op type without the attribute
        capacity = -1
    try:
        min_after = int(queue_op.get_attr("min_after_dequeue")) if "RandomShuffle" in queue_op.type else 0
    except Exception:
        min_after = 0
    return (capacity if capacity > 0 else -1), min_after


def run_op_names(fetch_list: Sequence[Any] | None, target_list: Sequence[Any] | None) -> tuple[str, ...]:
    """The names of the ops a ``_call_tf_sessionrun`` call fetches or targets (pybind TF_Output/TF_Operation)."""
    from tensorflow.python.client import pywrap_tf_session

    names: list[str] = []
    for output in fetch_list or ():
        names.append(pywrap_tf_session.TF_OperationName(output.oper))
    for target in target_list or ():
        names.append(pywrap_tf_session.TF_OperationName(target))
    return tuple(sorted(set(names)))


def _walk(ops: Iterable[Any]) -> Iterator[Any]:
    """Every op the given ops depend on (themselves included), through data and control inputs."""
    stack = list(ops)
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        yield op
        stack.extend(tensor.op for tensor in op.inputs)
        stack.extend(op.control_inputs)


def queue_op_of(op: Any) -> str | None:
    """The name of the queue op whose handle ``op`` (a dequeue or enqueue) takes as first input."""
    try:
        handle = op.inputs[0].op
        for _ in range(8):
            if handle.type in QUEUE_OP_TYPES:
                return str(handle.name)
            if handle.type not in _HANDLE_PASSTHROUGH:
                return None
            handle = handle.inputs[0].op
    except (IndexError, AttributeError):
        return None
    return None


def _static_count(op: Any) -> int | None:
    """How many elements one run of a queue op moves, when the graph says so statically."""
    from tensorflow.python.framework import tensor_util

    if op.type in ("QueueDequeueV2", "QueueDequeue", "QueueEnqueueV2", "QueueEnqueue"):
        return 1
    try:
        if op.type in ENQUEUE_OP_TYPES:
            dim = op.inputs[1].shape[0]
            return int(dim) if dim is not None else None
        value = tensor_util.constant_value(op.inputs[1])
        return int(value) if value is not None else None
    except Exception:  # unknown rank or a non-constant count
        return None


def queue_use(op: Any) -> QueueUse | None:
    """The queue operation ``op`` performs, if it is one."""
    if op.type in DEQUEUE_OP_TYPES:
        kind: QueueOpKind = "dequeue"
    elif op.type in ENQUEUE_OP_TYPES:
        kind = "enqueue"
    else:
        return None
    queue_op = queue_op_of(op)
    if queue_op is None:
        return None
    return QueueUse(kind, str(op.name), str(op.type), queue_op, _static_count(op))


class RunAnalyzer:
    """Finds the queue operations of runs; results cached per graph and set of op names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _cache
        self._cache: dict[tuple[int, tuple[str, ...]], tuple[weakref.ref[Any], tuple[QueueUse, ...]]] = {}

    def queue_uses(self, graph: Any, op_names: tuple[str, ...]) -> tuple[QueueUse, ...]:
        """Every queue operation the run of these ops may perform (fed tensors are not excluded)."""
        key = (id(graph), op_names)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0]() is graph:
            return hit[1]
        roots = []
        for name in op_names:
            try:
                roots.append(graph.get_operation_by_name(name))
            except (KeyError, ValueError):
                continue
        uses = tuple(use for op in _walk(roots) if (use := queue_use(op)) is not None)
        with self._lock:
            if len(self._cache) >= MAX_CACHED_RUNS:
                self._cache.clear()
            self._cache[key] = (weakref.ref(graph), uses)
        return uses

    def upstream_queues(self, graph: Any, enqueue_ops: Sequence[Any]) -> set[str]:
        """Queue ops that these enqueue ops read from (through dequeues among their inputs)."""
        names = tuple(sorted(str(op.name) for op in enqueue_ops))
        return {use.queue_op for use in self.queue_uses(graph, names) if use.kind == "dequeue"}
