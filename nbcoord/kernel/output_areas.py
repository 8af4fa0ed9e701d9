"""The output areas: the routed background output of one notebook cell, kept and rendered (see
:mod:`nbcoord.kernel.output` for the routing itself)."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from nbcoord.core.records import CellInfo, ThreadRecord
from nbcoord.core.snapshot import OutputRow, OutputThreadRow

#: A line longer than this is cut (one line of a 100 MB write must not become one 100 MB update).
MAX_LINE_CHARS = 2000
#: The last lines of each area given to the views (the panel's preview, the report).
PREVIEW_LINES = 3


def join_line(line: str, over: int, piece: str) -> tuple[str, int]:
    """A line so far (``over``: characters cut from it) plus a piece of it, as a terminal would show it: a carriage
    return starts the line again (progress bars), a trailing one is a line ending's; at most MAX_LINE_CHARS kept."""
    piece = piece.rstrip("\r")
    restart = piece.rfind("\r")
    if restart >= 0:
        line, over, piece = "", 0, piece[restart + 1 :]
    line += piece
    if len(line) > MAX_LINE_CHARS:
        over += len(line) - MAX_LINE_CHARS
        line = line[:MAX_LINE_CHARS]
    return line, over


def shown_line(line: str, over: int) -> str:
    return f"{line}... [{over:,} more characters not shown]" if over else line


@dataclass
class Run:
    """One run of a cell, and the request header that places output under it."""

    cell: CellInfo
    header: dict[str, Any] | None


@dataclass
class Writer:
    """A thread whose home is a cell, as the write path needs it (kept in a thread-local)."""

    key: str
    home: CellInfo
    record: ThreadRecord
    #: The kernel routes this thread's text itself (ipykernel 6's own thread routing, or the thread set its parent
    #: with ``set_parent``/``set_thread_parent``, even if it reset it since): nbcoord leaves it alone from then on.
    kernel_routes: bool = False


@dataclass
class ThreadCount:
    record: ThreadRecord
    home: CellInfo
    lines: int = 0
    failed: bool = False


@dataclass
class Area:
    """The routed output of one notebook cell: the lines kept, and the display they are shown in."""

    key: str
    run: Run
    keep: int
    #: Guards every field below except ``sent_at`` and the display state, which only the holder of ``send_lock``
    #: writes. ``send_lock``: one sender at a time, so that a display is created before it is updated.
    lock: threading.Lock = field(default_factory=threading.Lock)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    lines: deque[str] = field(default_factory=deque)
    hidden: int = 0
    total: int = 0
    partial: dict[str, tuple[str, int]] = field(default_factory=dict)  # tid -> its unfinished line, chars cut
    threads: dict[str, ThreadCount] = field(default_factory=dict)
    version: int = 0
    sent_version: int = 0
    display_id: str | None = None
    sent_at: float = -1e9  # monotonic
    updated_at: float | None = None  # time.time()

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.keep)

    def write(self, writer: Writer, text: str, *, failed: bool = False) -> None:
        """Add ``text`` (any piece of a write) from ``writer``'s thread."""
        tid = writer.record.tid
        with self.lock:
            count = self.threads.get(tid)
            if count is None:
                count = self.threads[tid] = ThreadCount(writer.record, writer.home)
            count.failed = count.failed or failed
            line, over = self.partial.pop(tid, ("", 0))
            pieces = text.split("\n")
            line, over = join_line(line, over, pieces[0])
            for piece in pieces[1:]:
                self._add(shown_line(line, over), count)
                line, over = join_line("", 0, piece)
            if line or over:
                self.partial[tid] = (line, over)
            self.version += 1

    def _add(self, line: str, count: ThreadCount) -> None:
        lines = self.lines
        if len(lines) == lines.maxlen:
            self.hidden += 1
        lines.append(line)
        self.total += 1
        count.lines += 1

    def resize(self, keep: int) -> None:
        with self.lock:
            if keep == self.keep:
                return
            old = self.lines
            self.keep = keep
            self.lines = deque(old, maxlen=keep)
            self.hidden += len(old) - len(self.lines)
            self.version += 1

    def move_to(self, run: Run) -> None:
        """The cell ran again: its old output is gone; the next text goes into a new display in the new run."""
        with self.lock:
            self.run = run
            self.display_id = None
            self.lines.clear()
            self.hidden = self.total = 0
            self.threads.clear()
            self.version += 1

    def title(self) -> str:
        """The area's first line: whose output this is (under the lock)."""
        run_cell = self.run.cell
        writers = list(self.threads.values())
        names = ", ".join(repr(c.record.name) for c in writers[:3]) + (" ..." if len(writers) > 3 else "")
        what = f"thread {names}" if len(writers) == 1 else f"{len(writers)} threads ({names})"
        earlier = sorted({c.home.execution_count for c in writers if c.home is not run_cell})
        if earlier:
            runs = ", ".join(f"[{n}]" for n in earlier)
            return f"nbcoord: output of {what} started by an earlier run of this cell ({runs}):"
        return f"nbcoord: output of {what} started by this cell, written after it finished:"

    def render(self) -> str | None:
        """The area's text, or None when there is nothing to show (under the lock)."""
        partial = [shown_line(line, over) for line, over in self.partial.values() if line or over]
        if not self.lines and not partial:
            return None
        parts = [self.title()]
        if self.hidden:
            parts.append(
                f"... {self.hidden:,} earlier line(s) not shown (nbcoord keeps the last {self.keep} lines per "
                "cell: NBCoord.output_lines)"
            )
        parts.extend(self.lines)
        parts.extend(partial)
        return "\n".join(parts)

    def row(self) -> OutputRow:
        with self.lock:
            tail = list(itertools.islice(reversed(self.lines), PREVIEW_LINES))[::-1]
            return OutputRow(
                cell=self.run.cell.execution_count,
                cell_id=self.run.cell.cell_id,
                display_id=self.display_id,
                lines=self.total,
                shown=len(self.lines),
                hidden=self.hidden,
                threads=[
                    OutputThreadRow(
                        tid=c.record.tid,
                        name=c.record.name,
                        cell=c.home.execution_count,
                        lines=c.lines,
                        failed=c.failed,
                    )
                    for c in self.threads.values()
                ],
                last_lines=tail,
                updated_at=self.updated_at,
            )
