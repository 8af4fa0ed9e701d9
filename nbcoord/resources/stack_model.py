"""The JSON of a kernel's stacks read from outside (schema ``nbcoord.stacks/1``): what
:mod:`nbcoord.resources.stacks` answers and the server serves at ``GET /nbcoord/api/kernels/<id>/stacks``.

Frames are innermost last. ``main`` is the main thread's one line (``doing``) and its place; ``since`` is when the
running cell began (epoch seconds), from nbcoord's mark on the main thread's stack, exact where there is one.
"""

from __future__ import annotations

from typing import TypedDict


class Frame(TypedDict):
    where: str
    function: str
    file: str
    line: int
    cell: int | None


class NativeFrame(TypedDict):
    symbol: str
    library: str


class ThreadStack(TypedDict):
    tid: int
    name: str
    main: bool
    holds_gil: bool
    state: str
    frames: list[Frame]
    native: list[NativeFrame]
    waits: str | None


class MainThread(TypedDict):
    tid: int
    holds_gil: bool
    in_c: bool | None
    doing: str
    cell: int | None
    line: int | None
    function: str | None
    since: float | None
    since_exact: bool


class Deadlock(TypedDict):
    tids: list[int]
    text: str


class StacksRead(TypedDict):
    schema: str
    pid: int | None
    available: bool
    reason: str | None
    read_at: float
    read_ms: float
    paused_ms: float
    native: bool
    main: MainThread | None
    threads: list[ThreadStack]
    deadlocks: list[Deadlock]
