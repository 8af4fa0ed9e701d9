"""Text that came from outside nbcoord (thread names, cell sources, exception messages, paths), made safe to show.

A thread's name is the user's (or a library's) to choose: in a report that Jupyter renders as a terminal would, an
ESC recolours what follows, a CR rewrites the line ("worker\\r    t99  all clear"), a newline forges a line, and a
bidi override (U+202E) reorders it ("...gnp.exe" read as "...exe.png"). Such characters are shown as their escapes,
as Python's ``repr`` does, and a value is cut to a stated length, with the count of what was left out.
"""

from __future__ import annotations

#: Characters of one name (a thread's, an owner's, a queue's) shown in a report, a log line, the panel's state or
#: the server's view (the schema's MAX_TEXT, which the kernel's summary for the server cuts names to, is the same).
NAME_CHARS = 200
#: Characters of a longer text (an exception message, a cell's first line, a command line).
TEXT_CHARS = 500


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every character Python would not print (controls, bidi and other format characters, line
    and paragraph separators) written as its escape (``\\x1b``, ``\\u202e``); ``keep``: characters left as they
    are (the newlines between a report's lines)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char in keep else _escape(char) for char in text)


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit:,} more characters]"


def bounded(text: object, limit: int) -> str:
    """``text`` as a string of at most ``limit`` characters (a wire bound: the schema's fields), its end marked
    with "…" when cut. :func:`cut` is the display form, which says how much was left out."""
    value = text if isinstance(text, str) else str(text)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def shown(value: object, limit: int = NAME_CHARS) -> str:
    """A value from outside as one safe line: cut, then escaped (a newline in it shows as ``\\x0a``)."""
    return printable(cut(str(value), limit))
