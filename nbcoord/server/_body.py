"""The body of ``POST /nbcoord/api/kernels/<id>/stop``, and the kernel id in its URL, checked before anything acts.

Every way a request can be wrong ends in :class:`BadRequest`, one sentence that names the field (never a Python
error turned into a 500): a body that is not JSON, too large (over :data:`MAX_BODY_BYTES`) or nested too deeply, a
field that is not one of the four documented ones (``scope``, ``cell``, ``grace``, ``force``: the control channel's
``schema`` and ``action`` are the server's to set, not the requester's), a value of the wrong type, or a number too
large to read. Values and field names are echoed cut to :data:`nbcoord.server._text.ECHO_CHARS` characters, and at
most :data:`nbcoord.server._text.ECHO_NAMES` field names, then their count.
"""

from __future__ import annotations

import json
import re

from nbcoord.core.schema import MAX_GRACE_S, SchemaError, StopRequest, parse_stop
from nbcoord.server._text import echoed, names, shown

#: The largest stop body read (a valid one is under 100 bytes).
MAX_BODY_BYTES = 64 * 1024
#: The most digits a whole number in a body may have; a longer one is "too large" for its field.
MAX_DIGITS = 30
#: The documented fields of a stop body.
STOP_FIELDS = ("scope", "cell", "grace", "force")
EXAMPLE = '{"scope": "zombies"}'

# jupyter_server's own routes take kernel ids of this shape (``\w+-\w+-\w+-\w+-\w+``, a UUID); ASCII only here, so
# that no look-alike or control character in a decoded URL reaches a lookup, a message or a log line.
_KERNEL_ID = re.compile(r"[A-Za-z0-9_]{1,32}(?:-[A-Za-z0-9_]{1,32}){4}", re.ASCII)


class BadRequest(ValueError):
    """A request that cannot be served: an HTTP status (400 or 404) and one sentence for the requester."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _TooLarge:
    """A whole number of more than :data:`MAX_DIGITS` digits in a body: kept as a marker, never converted (Python
    refuses to read more than 4300 digits, and a float comparison of a huge int overflows)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"a number of {self.digits:,} digits"


def _number(text: str) -> int | _TooLarge:
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else _TooLarge(len(text.lstrip("-")))


def check_kernel_id(kernel_id: str) -> str:
    """``kernel_id`` when it has the shape of a kernel id; else :class:`BadRequest` (404, nothing echoed)."""
    if not _KERNEL_ID.fullmatch(kernel_id):
        raise BadRequest("not a kernel id: kernel ids are UUIDs (as in /api/kernels)", status=404)
    return kernel_id


def parse_stop_body(raw: bytes) -> StopRequest:
    """The stop request in a POST body; :class:`BadRequest` (400) with one sentence naming what is wrong."""
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is {len(raw):,} bytes; a stop request is a small JSON object (at most "
                         f"{MAX_BODY_BYTES:,} bytes) such as {EXAMPLE}")  # fmt: skip
    if not raw.strip():
        raise BadRequest(f"the body must be a JSON object such as {EXAMPLE}")
    try:
        body = json.loads(raw, parse_int=_number)
    except RecursionError:
        raise BadRequest("the body must be JSON: it is nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        raise BadRequest(f"the body must be JSON: {shown(error, 120)}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object such as {EXAMPLE}, not {echoed(body)}")
    unknown = [key for key in body if key not in STOP_FIELDS]
    if unknown:
        raise BadRequest(f"unknown field(s): {names(unknown)}; allowed: {', '.join(STOP_FIELDS)}")
    for key in ("cell", "grace"):
        if isinstance(body.get(key), _TooLarge):
            raise BadRequest(f'"{key}" is too large ({body[key]!r}): ' + _RANGES[key])
    grace = body.get("grace")
    if isinstance(grace, int) and not isinstance(grace, bool) and not 0 <= grace <= MAX_GRACE_S:
        # Compared as an int: exact, whatever its size (math.isfinite would overflow on a large one).
        raise BadRequest(f'"grace" must be between 0 and {MAX_GRACE_S:g} seconds, not {echoed(grace)}')
    try:
        return parse_stop(body)
    except SchemaError as error:
        raise BadRequest(shown(error, 300)) from None
    except (ArithmeticError, TypeError, ValueError, RecursionError) as error:  # a check of the schema choked
        raise BadRequest(f"a value in the body could not be read ({type(error).__name__}); "
                         f"fields: {', '.join(STOP_FIELDS)}") from None  # fmt: skip


_RANGES = {
    "cell": "a cell's execution count is a whole number below 2**31",
    "grace": f"a number of seconds between 0 and {MAX_GRACE_S:g}",
}


_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def parse_flag(name: str, values: list[str]) -> bool:
    """A query flag (``?native=1``): absent is false; ``1``/``true``/``0``/``false`` once, or BadRequest."""
    if not values:
        return False
    if len(values) > 1 or values[0].lower() not in _FLAGS:
        raise BadRequest(f'"{name}" must be given once, as 1 or 0 (got {echoed(", ".join(values))})')
    return _FLAGS[values[0].lower()]
