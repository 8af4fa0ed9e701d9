"""What nbcoord reads from, and adds to, a TensorFlow graph.

- At queue creation: four small ops per queue, built once, outside the user's control dependencies and control
  flow, colocated with the queue: its size, whether it is closed, a close that cancels pending enqueues (the
  stop), and a reset (close, then destroy the queue resource; the next step that touches the queue creates it
  afresh, empty). Building them later would inherit whatever context the caller is in, and fail once the graph
  is finalized (MonitoredTrainingSession finalizes it).
- Those ops are the session's, not the user's: :class:`HiddenOps` keeps them out of ``Graph.get_operations()``
  and out of every export (``as_graph_def``, meta graphs, ``write_graph``, summaries, SavedModels), which all
  pass through one Graph method. TensorFlow cannot run an op that is not in the session's graph, nor remove one,
  so hiding is the only way to poll a queue without the user's graph showing it.
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

from nbcoord.tensorflow.internals import op_name_function, queue_ref

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
CLOSE_OP_TYPES = frozenset({"QueueCloseV2", "QueueClose"})
#: Ops a queue handle may pass through between the queue op and its use (identity, while-loop frames).
_HANDLE_PASSTHROUGH = frozenset({"Identity", "RefIdentity", "Enter", "RefEnter", "Switch", "RefSwitch"})
#: The cache of analysed runs is cleared when it grows past this many entries.
MAX_CACHED_RUNS = 512

QueueOpKind = Literal["dequeue", "enqueue", "close"]
#: The name scope of nbcoord's ops in a user's graph.
SCOPE = "nbcoord/"


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
    ref = queue_ref(queue)
    try:
        graph = ref.graph  # type: ignore[union-attr]
        op = ref.op  # type: ignore[union-attr]
    except (AttributeError, RuntimeError):  # an EagerTensor has no graph
        return None
    if getattr(graph, "building_function", False) or op.type not in QUEUE_OP_TYPES:
        return None
    return graph


def build_queue_ops(queue: Any, hidden: HiddenOps | None = None) -> QueueOps | None:
    """Build the size / closed / close / reset ops of a graph-mode queue, hidden from the user's graph (when
    ``hidden`` is given); None when it cannot be done."""
    import tensorflow as tf

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
        graph.name_scope(SCOPE),
        graph.colocate_with(ref.op, ignore_existing=True),
    ):
        size = queue.size(name=f"{base}_size")
        closed = queue.is_closed(name=f"{base}_is_closed")
        close = queue.close(cancel_pending_enqueues=True, name=f"{base}_close")
        reset = None
        if ref.dtype == tf.resource:
            with graph.control_dependencies([close]):
                reset = tf.raw_ops.DestroyResourceOp(resource=ref, ignore_lookup_error=True, name=f"{base}_reset")
    ops = QueueOps(size=size, closed=closed, close=close, reset=reset)
    if hidden is not None:
        hidden.hide(graph, [size.op, closed.op, close, *([reset] if reset is not None else [])])
    return ops


class HiddenOps:
    """nbcoord's ops, by graph: left out of ``get_operations()`` and of every exported GraphDef."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _names
        self._names: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()

    def hide(self, graph: Any, ops: Iterable[Any]) -> None:
        with self._lock:
            self._names[graph] = self._names.get(graph, frozenset()) | {str(op.name) for op in ops}

    def names(self, graph: Any) -> frozenset[str]:
        """The hidden op names of a graph (empty for a graph nbcoord added nothing to)."""
        try:
            return self._names.get(graph, frozenset())
        except TypeError:  # not weak-referenceable: not a graph of ours
            return frozenset()

    def is_hidden(self, op: Any) -> bool:
        """Whether ``op`` is one of nbcoord's."""
        return str(getattr(op, "name", "")) in self.names(getattr(op, "graph", None))

    def filter_operations(self, graph: Any, ops: list[Any]) -> list[Any]:
        """``get_operations()`` without nbcoord's ops."""
        names = self.names(graph)
        return [op for op in ops if op.name not in names] if names else ops

    def filter_graph_def(self, graph: Any, graph_def: Any) -> Any:
        """A GraphDef without nbcoord's nodes (changed in place; no user node ever depends on them)."""
        names = self.names(graph)
        if names and any(node.name in names for node in graph_def.node):
            kept = [node for node in graph_def.node if node.name not in names]
            del graph_def.node[:]
            graph_def.node.extend(kept)
        return graph_def


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
    """The names of the ops a ``_call_tf_sessionrun`` call fetches or targets (pybind TF_Output/TF_Operation);
    empty where TensorFlow gives no way to name them."""
    name_of = op_name_function()
    if name_of is None:
        return ()
    names = [name_of(handle) for handle in (*(fetch_list or ()), *(target_list or ()))]
    return tuple(sorted(set(names)))


def as_operation(op_or_tensor: Any) -> Any | None:
    """The op behind a QueueRunner's enqueue "op": an Operation, or a Tensor's op (``var.count_up_to(n)``, as
    TensorFlow's input helpers pass), or None for anything else TensorFlow accepts there (a name-only stand-in)."""
    if hasattr(op_or_tensor, "type") and hasattr(op_or_tensor, "inputs"):
        return op_or_tensor
    op = getattr(op_or_tensor, "op", None)
    return op if op is not None and hasattr(op, "type") and hasattr(op, "inputs") else None


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
    import tensorflow as tf

    if op.type in ("QueueDequeueV2", "QueueDequeue", "QueueEnqueueV2", "QueueEnqueue"):
        return 1
    if op.type in CLOSE_OP_TYPES:
        return 0
    try:
        if op.type in ENQUEUE_OP_TYPES:
            dim = op.inputs[1].shape[0]
            return int(dim) if dim is not None else None
        value = tf.get_static_value(op.inputs[1])
        return int(value) if value is not None else None
    except Exception:  # unknown rank or a non-constant count
        return None


def queue_use(op_or_tensor: Any) -> QueueUse | None:
    """The queue operation ``op_or_tensor`` (an op, or a tensor it outputs) performs, if it is one."""
    op = as_operation(op_or_tensor)
    if op is None:
        return None
    if op.type in DEQUEUE_OP_TYPES:
        kind: QueueOpKind = "dequeue"
    elif op.type in ENQUEUE_OP_TYPES:
        kind = "enqueue"
    elif op.type in CLOSE_OP_TYPES:
        kind = "close"
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
        """Queue ops that these enqueue ops (or tensors) read from (through dequeues among their inputs)."""
        ops = [op for op in map(as_operation, enqueue_ops) if op is not None]
        names = tuple(sorted(str(op.name) for op in ops))
        return {use.queue_op for use in self.queue_uses(graph, names) if use.kind == "dequeue"}
