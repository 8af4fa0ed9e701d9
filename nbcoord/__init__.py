"""nbcoord: makes a Jupyter kernel accountable for the threads, queues and processes its cells start.

Load it in a notebook::

    %load_ext nbcoord

From then on every thread is registered with the cell that started it, and:

``%nbcoord``
    a report: threads grouped by cell, zombies first (threads whose cell was interrupted or failed, that ignored
    a stop, or whose owner is closed), queues, blocked runs, thread failures, memory.
``%nbcoord threads [--all] [--stacks]``, ``%nbcoord zombies``, ``%nbcoord json``, ``%nbcoord mem``
    parts of the report, or the whole snapshot as JSON.
``%nbcoord stop [--grace S] [--force] [--cell N | --thread ID | --zombies]``
    the one bounded stop: set the stop flag, run the stoppers, join everything in parallel within the grace
    period, optionally raise in threads that ignore it, terminate child processes; prints what would not stop.
``%nbcoord config [name=value ...]``
    show or change settings (also ``c.NBCoord.<name>`` in an IPython profile).
``%nbcoord panel``
    the live panel, with a Stop-all button that works while a cell is busy.
``%nbcoord reclaim [--outputs]``
    give back the memory the kernel keeps by accident (IPython's last exception and its frames; with
    ``--outputs`` the output cache), ask the frameworks to release their caches, and list what is still held.

What a background thread writes after its cell finished appears under that cell (``NBCoord.route_output``), and
every cell's memory is kept in a ledger (``%nbcoord mem``).

From Python: :func:`snapshot`, :func:`stop_all`, :func:`should_stop`, :func:`wait_for_stop`, :func:`on_stop`,
:func:`panel`, :func:`reclaim`. Importing nbcoord does nothing by itself: no patch, no thread, no TensorFlow import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcoord.core.snapshot import Snapshot
from nbcoord.core.stop import StopReport, ThreadStopped
from nbcoord.core.version import __version__ as __version__
from nbcoord.resources.reclaim import ReclaimReport

if TYPE_CHECKING:
    from nbcoord._wiring import Extension

__all__ = [
    "NBCoordWarning",
    "ReclaimReport",
    "Snapshot",
    "StopReport",
    "ThreadStopped",
    "load_ipython_extension",
    "on_stop",
    "panel",
    "reclaim",
    "restart_runners",
    "should_stop",
    "snapshot",
    "stop_all",
    "unload_ipython_extension",
    "wait_for_stop",
]

log = logging.getLogger("nbcoord")

#: The loaded extension, if any. One per process: an IPython kernel has one shell.
_extension: Extension | None = None


class NBCoordWarning(UserWarning):
    """Warnings nbcoord itself raises (the test suite turns them into errors)."""


def _require() -> Extension:
    if _extension is None:
        raise RuntimeError("nbcoord is not loaded; run %load_ext nbcoord first.")
    from nbcoord.core.fork import ensure_owner

    ensure_owner()
    return _extension


def load_ipython_extension(ipython: Any) -> None:
    """Wire nbcoord into the shell: thread hooks, cell events, shutdown routes, integrations, magics."""
    global _extension
    if _extension is not None:
        return  # loading twice is harmless
    from nbcoord._wiring import Extension
    from nbcoord.magics import NBCoordMagics

    extension = Extension(ipython)
    extension.install()
    ipython.register_magics(NBCoordMagics(ipython, extension))
    _extension = extension


def unload_ipython_extension(ipython: Any) -> None:
    """Remove exactly what :func:`load_ipython_extension` added."""
    global _extension
    extension, _extension = _extension, None
    if extension is None:
        return
    extension.uninstall()
    magics = ipython.magics_manager.magics.get("line", {})
    if "nbcoord" in magics:
        del magics["nbcoord"]
    ipython.magics_manager.registry.pop("NBCoordMagics", None)


def snapshot(*, stacks: bool = False, waits: bool = False) -> Snapshot:
    """One typed, JSON-serialisable picture of the kernel: threads, cells, zombies, queues, memory.

    A thread's or a cell's row is shared with later snapshots while nothing in it changes, and read-only (editing
    it raises ``TypeError``): ``copy.deepcopy(row)`` is an editable copy (``dict(row)`` for its top level).

    Parameters
    ----------
    stacks
        Include each thread's current stack (slower with many threads).
    waits
        Fill ``waits``: what each blocked thread waits on (a Lock and its holder, an Event, a Queue, a thread's
        end), what it holds, and the deadlocks among them, each thread with its stack. Else ``waits`` is None.
    """
    from nbcoord.core.checks import flag

    return _require().snapshot(stacks=flag("stacks", stacks), waits=flag("waits", waits))


def stop_all(
    *,
    grace: float | None = None,
    force: bool = False,
    cell: int | None = None,
    thread: str | None = None,
    zombies: bool = False,
) -> StopReport:
    """Stop threads (and child processes) within a bounded time, and report what would not stop.

    Parameters
    ----------
    grace
        Seconds to wait for threads to end (default: ``NBCoord.grace_period``).
    force
        Raise :class:`ThreadStopped` in threads still running Python code late in the grace period.
    cell, thread, zombies
        Narrow the scope to one cell's threads, one thread (its id from the snapshot), or the zombies.

    Only threads that cells started (and the threads those started) are ever stopped; the kernel's own threads
    and nbcoord's never are.

    Raises
    ------
    ValueError
        ``thread`` names no live thread, or one that no cell started; ``cell`` names no cell nbcoord knows; more
        than one of ``cell``, ``thread`` and ``zombies`` is given; ``grace`` is negative, not finite or over a day.
    TypeError
        ``cell`` is not an int, ``thread`` not a str, ``force`` or ``zombies`` not a bool, ``grace`` not a number.
    RuntimeError
        nbcoord is not loaded, or this is a forked child of the process that loaded it.
    """
    from nbcoord.core.checks import stop_scope

    kind, cell, tid = stop_scope(cell=cell, thread=thread, zombies=zombies)
    return _require().stop(kind, grace=grace, force=force, cell=cell, tid=tid)


def should_stop() -> bool:
    """True once a stop was requested for the calling thread. False when nbcoord is not loaded (or in a forked
    child, where nbcoord does nothing)."""
    if _extension is None:
        return False
    from nbcoord.core.fork import in_owner

    return in_owner() and bool(_extension.host.should_stop())


def wait_for_stop(timeout: float | None = None) -> bool:
    """Wait until a stop is requested for the calling thread; True if it was, False on timeout.

    Raises
    ------
    RuntimeError
        No timeout in a thread no stop selects (the main thread, or one no cell started): it would wait forever.
    TypeError, ValueError
        ``timeout`` is not a finite number of seconds >= 0.
    """
    return bool(_require().host.wait_for_stop(timeout))


def on_stop(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` when a stop concerns everything, or the cell that registered it; returns a remover.

    A stop of the zombies runs it too when that cell was interrupted or failed; a stop of one thread never does.

    Raises
    ------
    TypeError
        ``callback`` cannot be called.
    """
    return _require().host.on_stop(callback)


def restart_runners(session: Any, *, grace: float | None = None) -> dict[str, Any]:
    """Restart a TensorFlow session's queue runners: stop them through the one stop, reset the queues that stop
    closed, and start them again with ``create_threads`` and a fresh Coordinator. Returns what restarted.

    Parameters
    ----------
    session
        The Session, or its id from ``snapshot()["sessions"]`` (``%nbcoord`` names it when runners are stuck).
    grace
        Seconds the stop may take (default: ``NBCoord.grace_period``).

    Raises
    ------
    ValueError
        No open session is known by that id, or it has no queue runners started; ``grace`` is not a finite number.
    RuntimeError
        nbcoord is not loaded, or TensorFlow is not imported.
    """
    return _require().restart_runners(session, grace=grace)


def panel() -> Any:
    """The live panel widget (display it, or let a cell's last expression show it)."""
    return _require().panel()


def reclaim(*, outputs: bool = False) -> ReclaimReport:
    """Give back the memory the kernel keeps by accident, and say what was done (``report["text"]``).

    Drops IPython's last exception (the local variables of its traceback's frames go with it) and, with
    ``outputs``, the output cache (``Out``, ``_``, ``__``, ``___``, ``_N``); runs the garbage collector; asks the
    frameworks you imported to release their caches (PyTorch's ``torch.cuda.empty_cache()``, CuPy's pools) and says
    where one keeps memory until the process ends (TensorFlow's GPU allocator); reports host and per-GPU memory
    before and after, and the largest arrays and tensors your names still hold.

    Parameters
    ----------
    outputs
        Also drop IPython's output cache.

    Raises
    ------
    TypeError
        ``outputs`` is not a bool.
    RuntimeError
        nbcoord is not loaded, this is a forked child, or the call is not on the kernel's main thread.
    """
    return _require().reclaim(outputs=outputs)
