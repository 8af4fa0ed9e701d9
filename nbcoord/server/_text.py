"""Values from outside in what the server extension writes for people: error messages, log lines, metric labels.

A request (a kernel id in a URL, a POST body) and a kernel (its summary, its stop report, its notebook path) are
outside nbcoord's control. Where one of their values is written for a person to read, it is cut to a stated length
and every character Python would not print (controls, CR/LF, ESC, NUL, bidi overrides such as U+202E, other format
characters) is written as its escape (:func:`nbcoord.core.text.printable`, the kernel side's rule): a value can neither
forge a log line, nor recolour a terminal, nor reorder what a reader sees.

The JSON API carries values as data (a notebook path as it is, so that a program can open it), cut to the lengths
below; its bytes are ASCII (``json.dumps`` escapes every non-ASCII character). Its readers escape for display
(``js/fleet.js``'s ``safe``).

Stated lengths:

================  ====  =========================================================================================
``ECHO_CHARS``      40  a field name or value of a request echoed in an error message
``ECHO_NAMES``       5  field names listed in one error message, then "and N more"
``NAME_CHARS``     200  a name from a kernel (thread, queue, reason) in the view, a stop report or a metric label
``TEXT_CHARS``     500  any other text from a kernel (an error sentence, a report's message), a notebook path in a
                        metric label or a log line
================  ====  =========================================================================================
"""

from __future__ import annotations

import logging
import traceback

from nbcoord.core.text import NAME_CHARS, TEXT_CHARS, bounded, printable

# The two lengths are the kernel side's (one definition): re-exported for the server's modules.
__all__ = [
    "ECHO_CHARS", "ECHO_NAMES", "LOG_CHARS", "NAME_CHARS", "TEXT_CHARS", "echoed", "install_log_filter", "names",
    "shown",
]

ECHO_CHARS = 40
ECHO_NAMES = 5
#: The longest log line nbcoord's server part writes (its values are cut before; this bounds the sum).
LOG_CHARS = 4000

log = logging.getLogger("nbcoord.server")


def shown(value: object, limit: int = NAME_CHARS) -> str:
    """A value from outside as one safe line for people: cut to ``limit`` characters (as the kernel's summary cuts,
    :func:`nbcoord.core.text.bounded`), then escaped."""
    return printable(bounded(value, limit))


def echoed(value: object) -> str:
    """A request's value quoted in an error message: cut to :data:`ECHO_CHARS`, escaped, in Python's repr style for
    strings (``'many'``) and as is for other JSON values."""
    if isinstance(value, str):
        return repr(shown(value, ECHO_CHARS))
    return shown(_json_like(value), ECHO_CHARS)


def _json_like(value: object) -> str:
    # Containers are described, never rendered: a nested value can be large and deep.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return f"an object of {len(value):,} field(s)"
    if isinstance(value, list):
        return f"a list of {len(value):,} item(s)"
    if isinstance(value, int) and abs(value) >= 10**30:
        return "a number of more than 30 digits"  # str() of a huge int is slow, and refused past 4300 digits
    return str(value)


def names(keys: list[str]) -> str:
    """Field names for an error message: the first :data:`ECHO_NAMES`, each cut and escaped, and how many more."""
    listed = ", ".join(shown(key, ECHO_CHARS) for key in keys[:ECHO_NAMES])
    more = len(keys) - ECHO_NAMES
    return f"{listed} and {more:,} more" if more > 0 else listed


class _EscapingFilter(logging.Filter):
    """Every record of the ``nbcoord.server`` logger as one escaped line (a traceback keeps its own newlines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string is logging's own error to report
            return True
        record.msg, record.args = printable(bounded(message, LOG_CHARS)), ()
        if record.exc_info and not record.exc_text:
            formatted = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text = printable(formatted, keep="\n")
        return True


def install_log_filter() -> None:
    """Escape every record of the ``nbcoord.server`` logger (once, however often the extension is loaded); the
    extension's settings step calls it, never an import."""
    if not any(isinstance(f, _EscapingFilter) for f in log.filters):
        log.addFilter(_EscapingFilter())
