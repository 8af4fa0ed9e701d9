"""What a kernel says, checked against the schema before the server uses it: the summary, and a stop's report.

A kernel is another process, and its nbcoord may be another version (or patched): a summary whose ``zombies`` is
``"many"`` must not break the view, the sorting or the metrics of every other kernel. :func:`check_summary` returns
a clean copy of a summary that has every field of :class:`nbcoord.core.schema.KernelSummary` with the right type, or
raises :class:`OffSchema` with one sentence naming the first field that is not (its value cut to
:data:`nbcoord.server._text.ECHO_CHARS` characters). Fields it does not know are dropped (a newer nbcoord may add
some); lists are cut to the schema's lengths and names to :data:`nbcoord.server._text.NAME_CHARS` characters.

A stop's report (:class:`nbcoord.StopReport`) goes back to the requester as data: :func:`bounded_report` copies it
with every string cut (``name`` fields to ``NAME_CHARS``, other strings to ``TEXT_CHARS``), numbers that JSON cannot
carry (NaN, infinities) as null, and nesting past a few levels left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from nbcoord.core.schema import MAX_BLOCKED, MAX_CELLS, MAX_NAMES, MAX_QUEUES, KernelSummary
from nbcoord.core.text import bounded
from nbcoord.server._text import NAME_CHARS, TEXT_CHARS, echoed, shown

#: The most devices, reasons or thread states a summary lists (more are cut).
MAX_ENTRIES = 64
#: The most threads and deadlocks kept of a kernel's waits reply.
MAX_WAIT_ROWS = 300
MAX_STACK_LINES = 40
_COUNT_MAX = 2**63
_NUMBER_MAX = 1e18

Check = Callable[[object, str], Any]


class OffSchema(ValueError):
    """A kernel's answer that is not the schema's; the message is one sentence naming the field."""


def _fail(path: str, wanted: str, value: object) -> OffSchema:
    return OffSchema(f'"{path}" must be {wanted}, not {echoed(value)}')


def _count(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _COUNT_MAX:
        raise _fail(path, "a whole number >= 0", value)
    return value


def _integer(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -_COUNT_MAX < value < _COUNT_MAX:
        raise _fail(path, "a whole number", value)
    return value


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, "a number", value)
    # An int is compared as an int (exact, never an overflow); a float must be finite.
    if (isinstance(value, float) and not math.isfinite(value)) or not -_NUMBER_MAX <= value <= _NUMBER_MAX:
        raise _fail(path, "a finite number", value)
    return float(value)


def _name(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, "a string", value)
    return bounded(value, NAME_CHARS)


def _optional(check: Check) -> Check:
    def optional(value: object, path: str) -> Any:
        return None if value is None else check(value, path)

    return optional


def _list(check: Check, limit: int) -> Check:
    def checked(value: object, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise _fail(path, "a list", value)
        return [check(item, f"{path}[{index}]") for index, item in enumerate(value[:limit])]

    return checked


def _counts(value: object, path: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise _fail(path, "an object of counts", value)
    return {
        bounded(str(key), NAME_CHARS): _count(count, f"{path}.{bounded(str(key), 40)}")
        for key, count in list(value.items())[:MAX_ENTRIES]
    }


def _object(fields: dict[str, Check]) -> Check:
    def checked(value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _fail(path or "summary", "an object", value)
        result: dict[str, Any] = {}
        for key, check in fields.items():
            where = f"{path}.{key}" if path else key
            if key not in value:
                raise OffSchema(f'"{where}" is missing')
            result[key] = check(value[key], where)
        return result

    return checked


_CELL = _object({"cell": _count, "threads": _count, "zombies": _count})
_BLOCKED = _object({"thread": _name, "seconds": _number, "text": _optional(_name)})
_QUEUE = _object({"name": _name, "size": _optional(_count), "capacity": _integer, "fill": _optional(_number)})
_GPU = _object({"index": _count, "process_used": _optional(_count)})
_LAST_STOP = _object({
    "scope": _name, "cell": _optional(_count), "started_at": _number, "took_s": _number, "stopped": _count,
    "alive": _count, "alive_names": _list(_name, MAX_NAMES), "errors": _count,
})  # fmt: skip
_SUMMARY = _object({
    "pid": _count,
    "taken_at": _number,
    "nbcoord_version": _name,
    "threads": _count,
    "threads_by_state": _counts,
    "kernel_threads": _count,
    "zombies": _count,
    "zombie_reasons": _counts,
    "cells": _list(_CELL, MAX_CELLS),
    "running_cell": _optional(_count),
    "running_since": _optional(_number),
    "tasks": _optional(_count),
    "worker_processes": _optional(_count),
    "blocked_runs": _count,
    "blocked_seconds": _number,
    "blocked": _list(_BLOCKED, MAX_BLOCKED),
    "queues": _list(_QUEUE, MAX_QUEUES),
    "queues_total": _count,
    "failures": _count,
    "rss": _optional(_count),
    "gpu": _list(_GPU, MAX_ENTRIES),
    "last_stop": _optional(_LAST_STOP),
})


def check_summary(value: object) -> KernelSummary:
    """A clean copy of a kernel's summary; :class:`OffSchema` naming the first field that is not the schema's."""
    summary: KernelSummary = _SUMMARY(value, "")
    return summary


# ------------------------------------------------------------------------------------------------ stop reports
#: Nesting deeper than this in a report is left out (a report is four levels deep).
MAX_DEPTH = 8


def bounded_report(value: object, key: str = "", depth: int = 0) -> Any:
    """A copy of a kernel's stop report fit to send on: strings cut, non-finite numbers null, bounded depth."""
    if isinstance(value, str):
        return bounded(value, NAME_CHARS if key == "name" else TEXT_CHARS)
    if value is None or isinstance(value, (bool, int, float)):
        return None if isinstance(value, float) and not math.isfinite(value) else value
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {bounded(str(k), NAME_CHARS): bounded_report(v, str(k), depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded_report(item, key, depth + 1) for item in value]
    return bounded(str(value), TEXT_CHARS)


def checked_waits(waits: object) -> dict[str, Any] | None:
    """A kernel's ``waits`` reply, kept to its schema's fields and cut (the kernel's texts are the user's names)."""
    if not isinstance(waits, dict):
        return None
    threads = []
    for row in waits.get("threads", [])[:MAX_WAIT_ROWS] if isinstance(waits.get("threads"), list) else []:
        if isinstance(row, dict) and _whole(row.get("tid")):
            text, stack = row.get("waits"), row.get("stack")
            stack = stack if isinstance(stack, list) else []
            lines = [shown(line, TEXT_CHARS) for line in stack[-MAX_STACK_LINES:] if isinstance(line, str)]
            threads.append({"tid": row["tid"], "waits": shown(text, TEXT_CHARS) if isinstance(text, str) else None,
                            "stack": lines})  # fmt: skip
    deadlocks = []
    for row in waits.get("deadlocks", [])[:MAX_WAIT_ROWS] if isinstance(waits.get("deadlocks"), list) else []:
        tids = row.get("tids") if isinstance(row, dict) else None
        if isinstance(tids, list) and all(_whole(tid) for tid in tids) and isinstance(row.get("text"), str):
            deadlocks.append({"tids": tids[:MAX_WAIT_ROWS], "text": shown(row["text"], TEXT_CHARS * 2)})
    return {"threads": threads, "deadlocks": deadlocks}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
