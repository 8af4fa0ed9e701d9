"""The JSON of ``GET /nbcoord/api/kernels``: one view of every kernel of the server (schema version 1).

::

    {
      "schema": 1,
      "taken_at": 1764590000.12,          # server time, seconds since the epoch
      "took_ms": 41.7,                    # how long the view took to make
      "gpu": {"available": false, "reason": "nvidia-ml-py is not installed ...", "devices": []},
      "kernels": [KernelRow, ...]         # what needs attention first (see ``attention``)
    }

A ``KernelRow``:

==================  ==================================================================================================
``id``              the kernel id (as in ``/api/kernels``)
``name``            the kernel spec's name
``path``            the notebook (or console, file) path of the kernel's session; null without a session
``execution_state`` the server's own idea (``idle``, ``busy``, ``starting``, ``dead``...)
``last_activity``   the server's own, ISO 8601
``connections``     front ends connected
``pid``             the kernel's process id, seen from the server; null for a kernel the server cannot see (remote)
``rss``             the kernel process's resident memory, bytes, read by the server
``gpu``             ``[{"index": 0, "bytes": N, "workers_bytes": M}]``: GPU memory of the kernel process and of its
                    descendants on each device where either holds some (NVML by pid: also without nbcoord)
``worker_processes``  descendants of the kernel process, seen from the server
``status``          ``ok`` (nbcoord answered), ``no-nbcoord`` (the kernel answers, nbcoord is not loaded),
                    ``not-answering`` (no answer within the server's ``reply_timeout``: busy in native code holding the
                    GIL, or starting), ``dead`` (the process is not running), ``error`` (nbcoord answered with an
                    error, in ``error``)
``error``           one sentence when ``status`` is not ``ok``, else null
``answer_ms``       how long nbcoord took to answer, milliseconds
``nbcoord``         the kernel's own summary when ``status`` is ``ok`` (:class:`nbcoord.core.schema.KernelSummary`:
                    threads, threads by state, zombies and their reasons, cells with threads, the running cell, tasks,
                    worker processes, blocked runs, queues, failures, the last stop), else null
``attention``       what needs attention, most urgent first: ``zombies``, ``gpu`` (holds GPU memory), ``stuck`` (not
                    answering, or blocked runs), ``dead``; the list is sorted by it
==================  ==================================================================================================

``POST /nbcoord/api/kernels/<id>/stop`` with ``{"scope": "all" | "zombies" | "cell", "cell": N, "grace": S,
"force": bool}`` answers ``{"kernel_id": ..., "report": <nbcoord.StopReport>}``; errors are Jupyter Server's JSON
errors (``{"message": ..., "reason": ...}``): 400 (a malformed body, an unknown cell), 404 (no such kernel on this
server), 409 (nbcoord is not loaded there, or the kernel is not running), 502 (the kernel died during the request),
503 (too many stops waiting in that kernel), 504 (no answer in time; the request stays queued in the kernel).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from nbcoord.core.schema import KernelSummary
from nbcoord.server._gpu import GpuStatus

VIEW_SCHEMA = 1

Status = Literal["ok", "no-nbcoord", "not-answering", "dead", "error"]
Attention = Literal["zombies", "gpu", "stuck", "dead"]


class GpuHeld(TypedDict):
    index: int
    bytes: int
    workers_bytes: int


class KernelRow(TypedDict):
    id: str
    name: str
    path: str | None
    execution_state: str | None
    last_activity: str | None
    connections: int
    pid: int | None
    rss: int | None
    gpu: list[GpuHeld]
    worker_processes: int | None
    status: Status
    error: str | None
    answer_ms: float | None
    nbcoord: KernelSummary | None
    attention: list[Attention]


class FleetView(TypedDict):
    schema: int
    taken_at: float
    took_ms: float
    gpu: GpuStatus
    kernels: list[KernelRow]


def attention(row: KernelRow) -> list[Attention]:
    """What needs attention in this kernel, most urgent first."""
    found: list[Attention] = []
    summary = row["nbcoord"]
    if summary is not None and summary["zombies"] > 0:
        found.append("zombies")
    if any(g["bytes"] or g["workers_bytes"] for g in row["gpu"]):
        found.append("gpu")
    if row["status"] == "not-answering" or (summary is not None and summary["blocked_runs"] > 0):
        found.append("stuck")
    if row["status"] == "dead":
        found.append("dead")
    return found


_WEIGHT: dict[Attention, int] = {"zombies": 8, "gpu": 4, "stuck": 2, "dead": 1}


def sort_key(row: KernelRow) -> tuple[int, int, int, str, str]:
    """Zombies holding GPU memory first, then zombies, GPU held, stuck, dead; then by path."""
    score = sum(_WEIGHT[a] for a in row["attention"])
    zombies = row["nbcoord"]["zombies"] if row["nbcoord"] is not None else 0
    gpu = sum(g["bytes"] + g["workers_bytes"] for g in row["gpu"])
    return (-score, -zombies, -gpu, row["path"] or "\uffff", row["id"])
