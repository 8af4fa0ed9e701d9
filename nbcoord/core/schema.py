"""The control-channel request/reply between a Jupyter server and a kernel with nbcoord: the one module both share.

The server extension (:mod:`nbcoord.server`) asks each kernel over its control channel, which ipykernel serves on a
thread of its own, so a kernel answers while its main thread runs a cell. The kernel side is
:mod:`nbcoord.kernel.control`. Neither imports the other: both import this module, and nothing else of each other's.

Messages (Jupyter messaging, on the control channel, signed with the kernel's key like every message there):

``nbcoord_request``, content one of::

    {"schema": 1, "action": "summary"}
    {"schema": 1, "action": "waits"}
    {"schema": 1, "action": "stop", "scope": "all" | "zombies" | "cell", "cell": N, "grace": S, "force": bool}

(``cell`` only, and always, with scope ``"cell"``; ``grace`` (0 to :data:`MAX_GRACE_S` seconds) and ``force`` are
optional.)

``nbcoord_reply``, content one of::

    {"status": "ok", "schema": 1, "action": "summary", "summary": KernelSummary}
    {"status": "ok", "schema": 1, "action": "waits", "waits": WaitsReport}
    {"status": "ok", "schema": 1, "action": "stop", "report": <nbcoord.StopReport>}
    {"status": "error", "schema": 1, "code": "invalid" | "failed" | "unavailable", "error": "one sentence"}

A **waits** request asks what each blocked thread waits on (:mod:`nbcoord.core.waits`), answered on the control
thread, so it answers while the main thread is stuck on a lock (a thread blocked on a lock lets the control thread
run)::

    WaitsReport = {"threads": [{"tid": <native thread id>, "name": str, "waits": str | null,
                                "owner_tid": <native id> | null, "holds": [str], "stack": [str]}],
                   "deadlocks": [{"tids": [<native id>, ...], "text": str}]}

``threads``: the threads that wait on something, and the holders of what they wait on (``waits`` null when that
holder waits on nothing), deadlocked ones first, at most :data:`MAX_WAIT_THREADS`; ``waits``: "Lock b, held by
thread 'one' (tid 4242)", "Event ready", "Queue q (empty)", "thread 'w' (tid 7) to end"; ``holds``: the expressions
of the locks its ``with`` statements hold (``self.lock``); ``stack``: innermost last, a cell's frames as
"cell [3], line 2 in f". ``tid`` is the thread's native id (the Python ident for a thread ``threading`` does not
know). ``deadlocks[].text``: "deadlock: thread 'one' holds a and waits for b; thread 'two' holds b and waits for a".

A kernel without nbcoord does not answer ``nbcoord_request`` at all (ipykernel logs the unknown type); the server
tells it from a kernel that is busy by asking ``kernel_info_request`` on the same channel right after (answered in
order). The server lists both message types among the kernel manager's ``untracked_message_types``, so that its
requests neither count as user activity (idle culling) nor flip the kernel's busy/idle state.

Everything here is plain JSON, bounded in size: names are cut to :data:`MAX_TEXT` characters and lists to a few
rows, so that a kernel with a thousand threads answers in a small message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Literal, TypedDict

from nbcoord.core.text import bounded

SCHEMA: Final = 1
REQUEST: Final = "nbcoord_request"
REPLY: Final = "nbcoord_reply"

Action = Literal["summary", "waits", "stop"]
StopScope = Literal["all", "zombies", "cell"]
ErrorCode = Literal["invalid", "failed", "unavailable"]

STOP_SCOPES: Final = frozenset({"all", "zombies", "cell"})
#: The longest grace period a request from outside may ask for (a stop holds no lock the control channel needs,
#: but the server waits for its report).
MAX_GRACE_S: Final = 30.0
#: Longest text in a summary (thread names, blocked-run sentences, queue names).
MAX_TEXT: Final = 200
MAX_CELLS: Final = 10
MAX_QUEUES: Final = 16
MAX_BLOCKED: Final = 5
MAX_NAMES: Final = 5
#: Thread states a summary counts (nbcoord.core.snapshot.thread_state); always all present, zero where none.
THREAD_STATES: Final = ("running", "waiting", "stopping")
#: A waits report's bounds: threads listed, locks named as held per thread, stack lines per thread, deadlocks, and
#: the longest wait sentence, deadlock sentence or stack line.
MAX_WAIT_THREADS: Final = 64
MAX_HOLDS: Final = 8
MAX_STACK_LINES: Final = 30
MAX_DEADLOCKS: Final = 8
MAX_WAIT_TEXT: Final = 1000


class SchemaError(ValueError):
    """A request that is not one of this schema's; the message is one sentence for the requester."""


# -------------------------------------------------------------------------------------------------- requests
class StopRequest(TypedDict):
    """A validated stop request."""

    scope: StopScope
    cell: int | None
    grace: float | None
    force: bool


class Request(TypedDict):
    """A validated request: ``stop`` is set when ``action == "stop"``."""

    action: Action
    stop: StopRequest | None


_REQUEST_KEYS: Final = {"summary": frozenset({"schema", "action"}), "waits": frozenset({"schema", "action"}),
                        "stop": frozenset({"schema", "action", "scope", "cell", "grace", "force"})}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_stop(body: object) -> StopRequest:
    """Validate a stop request's fields (the server's POST body, or the request content); raise SchemaError."""
    if not isinstance(body, Mapping):
        raise SchemaError("the body must be a JSON object")
    unknown = sorted(str(key)[:40] for key in body if key not in _REQUEST_KEYS["stop"])
    if unknown:
        raise SchemaError(f"unknown field(s): {', '.join(unknown)}; allowed: scope, cell, grace, force")
    scope = body.get("scope")
    if not isinstance(scope, str) or scope not in STOP_SCOPES:
        raise SchemaError('"scope" must be one of "all", "zombies", "cell"')
    cell = body.get("cell")
    if scope == "cell":
        if not isinstance(cell, int) or isinstance(cell, bool) or not 0 <= cell < 2**31:
            raise SchemaError('"cell" must be a cell\'s execution count (a whole number) with scope "cell"')
    elif cell is not None:
        raise SchemaError('"cell" is only allowed with scope "cell"')
    grace = body.get("grace")
    if grace is not None:
        if not isinstance(grace, (int, float)) or isinstance(grace, bool):
            raise SchemaError('"grace" must be a number of seconds')
        # An int is compared as it is (math.isfinite(10**400) would overflow); a float must be finite.
        if isinstance(grace, float) and not math.isfinite(grace):
            raise SchemaError('"grace" must be a number of seconds')
        if not 0 <= grace <= MAX_GRACE_S:
            raise SchemaError(f'"grace" must be between 0 and {MAX_GRACE_S:g} seconds')
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise SchemaError('"force" must be true or false')
    return StopRequest(
        scope=scope,  # type: ignore[typeddict-item]  # checked against STOP_SCOPES above
        cell=cell if scope == "cell" else None,
        grace=None if grace is None else float(grace),
        force=force,
    )


def parse_request(content: object) -> Request:
    """Validate an ``nbcoord_request``'s content; raise SchemaError."""
    if not isinstance(content, Mapping):
        raise SchemaError("the request content must be an object")
    schema = content.get("schema", SCHEMA)
    if not _is_int(schema) or schema != SCHEMA:
        raise SchemaError(f"unsupported schema {str(schema)[:20]!r}; this nbcoord speaks schema {SCHEMA}")
    action = content.get("action")
    if action in ("summary", "waits"):
        unknown = sorted(str(key)[:40] for key in content if key not in _REQUEST_KEYS[action])
        if unknown:
            raise SchemaError(f"unknown field(s) for a {action} request: {', '.join(unknown)}")
        return Request(action=action, stop=None)
    if action == "stop":
        fields = {key: value for key, value in content.items() if key not in ("schema", "action")}
        return Request(action="stop", stop=parse_stop(fields))
    raise SchemaError('"action" must be "summary", "waits" or "stop"')


def summary_request() -> dict[str, Any]:
    """The content of a summary request."""
    return {"schema": SCHEMA, "action": "summary"}


def waits_request() -> dict[str, Any]:
    """The content of a waits request."""
    return {"schema": SCHEMA, "action": "waits"}


def stop_request(stop: StopRequest) -> dict[str, Any]:
    """The content of a stop request (``None`` fields left out)."""
    content: dict[str, Any] = {"schema": SCHEMA, "action": "stop", "scope": stop["scope"], "force": stop["force"]}
    if stop["cell"] is not None:
        content["cell"] = stop["cell"]
    if stop["grace"] is not None:
        content["grace"] = stop["grace"]
    return content


# ---------------------------------------------------------------------------------------------------- replies
class CellThreads(TypedDict):
    """A cell that has live threads: how many, and how many of them are zombies."""

    cell: int
    threads: int
    zombies: int


class QueueFill(TypedDict):
    name: str
    size: int | None
    capacity: int  # -1: unbounded
    fill: float | None  # size / capacity; None when unbounded or unknown


class BlockedRun(TypedDict):
    thread: str
    seconds: float
    text: str | None


class GpuUse(TypedDict):
    """This kernel's memory on one device, as the kernel's own probe reads it (None: not visible)."""

    index: int
    process_used: int | None


class LastStop(TypedDict):
    scope: str
    cell: int | None
    started_at: float
    took_s: float
    stopped: int
    alive: int
    alive_names: list[str]
    errors: int


class KernelSummary(TypedDict):
    """What a kernel with nbcoord says about itself: counts, never per-thread rows (bounded in size)."""

    pid: int
    taken_at: float
    nbcoord_version: str
    threads: int  # live threads the user's cells started
    threads_by_state: dict[str, int]  # of those: each of THREAD_STATES
    kernel_threads: int  # the kernel's own and nbcoord's, never stopped
    zombies: int
    zombie_reasons: dict[str, int]
    cells: list[CellThreads]  # cells with live threads, zombies first; at most MAX_CELLS
    running_cell: int | None  # the cell running now, if any
    running_since: float | None
    tasks: int | None  # None: this nbcoord does not track tasks
    worker_processes: int | None  # child processes (descendants) of the kernel, as the kernel sees them
    blocked_runs: int
    blocked_seconds: float  # the longest blocked run now, 0 when none
    blocked: list[BlockedRun]
    queues: list[QueueFill]  # at most MAX_QUEUES, fullest first
    queues_total: int
    failures: int
    rss: int | None
    gpu: list[GpuUse]
    last_stop: LastStop | None


class WaitingThread(TypedDict):
    """A thread that waits, or holds what another waits for (see the module docstring)."""

    tid: int
    name: str
    waits: str | None
    owner_tid: int | None
    holds: list[str]
    stack: list[str]


class Deadlock(TypedDict):
    tids: list[int]
    text: str


class WaitsReport(TypedDict):
    threads: list[WaitingThread]
    deadlocks: list[Deadlock]


def ok_reply(action: Action, key: str, value: object) -> dict[str, Any]:
    """The content of a successful reply."""
    return {"status": "ok", "schema": SCHEMA, "action": action, key: value}


def error_reply(code: ErrorCode, error: str) -> dict[str, Any]:
    """The content of an error reply."""
    return {"status": "error", "schema": SCHEMA, "code": code, "error": bounded(error, 500)}
