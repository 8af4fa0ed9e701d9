"""What the panel's action commands do, on the panel's action thread (never a kernel channel thread, never main).

- **Stop all** (``stop`` with ``scope="all"`` and ``interrupt``): the one stop of everything cells started, then,
  if the cell that was running at the click still runs, an Interrupt of it, through the same path as the
  kernel's Interrupt: SIGINT delivered to the main thread. Python's C-level handler trips the SIGINT handler
  (the running Python code gets ``KeyboardInterrupt``), makes a blocking call in the main thread return
  (``time.sleep``, a lock's wait) and writes the signal wakeup fd, which TensorFlow's integration watches to
  cancel a run blocked in C++ (the session stays usable). ``_thread.interrupt_main()`` does the first and the
  last, but not the second: a cell in ``time.sleep(30)`` would sleep on. It is the fallback where
  ``signal.pthread_kill`` is missing.
- **Stop background work** (``stop`` without ``interrupt``) and the per-cell, per-thread and zombie stops: the
  one stop only; the running cell goes on.
- **Restart** a TensorFlow session's runners: :func:`nbcoord.restart_runners`.
- **Reclaim memory**: ``nbcoord.reclaim(outputs=False)``, on the main thread (:meth:`ActionRunner.on_main_loop`
  runs it there: at once, or when the kernel's event loop is next free). Reclaims are joined as stops
  are (:class:`Reclaims`): clicks that arrive while a reclaim waits or runs join it, and one runs at most every
  ``RECLAIM_SPACING_S``, so that a flood of clicks costs the main thread one or two reclaims, not one per click
  (300 clicks, about 50 ms each, kept the kernel from answering a cell for 13-20 s).

:class:`ActionRunner` does each, over the :class:`Host` (the one stop, with its check of a stop's thread) and
:class:`PanelActions` (what the panel reaches besides it); :mod:`.answers` turns what each did into its outcome.
"""

from __future__ import annotations

import _thread
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from nbcoord.core.host import Host
from nbcoord.ui.commands import Command

log = logging.getLogger("nbcoord")


@dataclasses.dataclass(frozen=True)
class PanelActions:
    """What the panel reaches besides the :class:`Host`: the resource probe's history ring, a reclaim of memory
    (outputs left alone; None: not offered) and a restart of a TensorFlow session's runners."""

    history: Callable[[], Sequence[Mapping[str, Any]]]
    reclaim: Callable[[], Mapping[str, Any]] | None
    restart: Callable[[str], Mapping[str, Any]]


def interrupt_main() -> str | None:
    """Interrupt the main thread as the kernel's Interrupt does; None once sent, else why it was not.

    Only while Python handles SIGINT: between cells ipykernel ignores it (``SIG_IGN``), and a process whose
    handler is the default one would be killed by a real signal.
    """
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        return "SIGINT is not handled by Python here, so the cell cannot be interrupted"
    main = threading.main_thread()
    ident = main.ident
    if ident is None or not main.is_alive():
        return "the main thread is gone"
    try:
        signal.pthread_kill(ident, signal.SIGINT)
    except (AttributeError, OSError, ValueError):
        log.debug("nbcoord: pthread_kill failed; interrupting with _thread.interrupt_main", exc_info=True)
        _thread.interrupt_main()
    return None


def reclaim(run: Callable[[], Mapping[str, Any]] | None) -> dict[str, Any]:
    """Run the kernel's reclaim of memory (outputs left alone); raises ``RuntimeError`` where none is offered."""
    if run is None:
        raise RuntimeError("this version of nbcoord cannot reclaim memory")
    return dict(run())


#: A panel reclaim starts at most this many seconds after the previous one ended; clicks meanwhile join the next.
RECLAIM_SPACING_S: Final = 1.0

#: ``schedule(callback, delay)``: run ``callback`` on the main thread (the kernel's event loop) ``delay`` seconds
#: from now; returns why it cannot (None: scheduled).
Schedule = Callable[[Callable[[], None], float], "str | None"]


class Reclaims:
    """The panel's reclaims: one waits or runs at a time, on the main thread, and every click joins it.

    ``run()`` performs one reclaim (on the main thread) and returns its result; ``done(commands, result)`` and
    ``failed(commands, error)`` answer every click it took: each click gets exactly one of the two.
    """

    def __init__(
        self,
        run: Callable[[], dict[str, Any]],
        done: Callable[[list[Command], dict[str, Any]], None],
        failed: Callable[[list[Command], Exception], None],
        schedule: Schedule,
        *,
        spacing: float = RECLAIM_SPACING_S,
    ) -> None:
        self._run = run
        self._done = done
        self._failed = failed
        self._schedule = schedule
        self._spacing = spacing
        self._lock = threading.Lock()  # guards _waiting, _running, _ended_at
        self._waiting: list[Command] | None = None
        self._running: list[Command] | None = None
        self._ended_at = -spacing
        #: Reclaims run so far (tests read it).
        self.runs = 0

    def submit(self, commands: list[Command]) -> None:
        """Join the reclaim that waits or runs, or schedule one (at once on the main thread when it may run now);
        never blocks on the main thread's work."""
        if not commands:
            return
        with self._lock:
            joined = self._waiting if self._waiting is not None else self._running
            if joined is not None:
                joined.extend(commands)
                return
            self._waiting = list(commands)
            delay = max(0.0, self._ended_at + self._spacing - time.monotonic())
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and delay == 0:
            self._run_waiting()
            return
        why = self._schedule(self._run_waiting, delay)
        if why is None:
            return
        if on_main:  # no event loop to wait on (an in-process shell): run now rather than never
            self._run_waiting()
            return
        with self._lock:
            refused, self._waiting = self._waiting or [], None
        self._failed(refused, RuntimeError(why))

    def _run_waiting(self) -> None:
        """Run the waiting reclaim (on the main thread), then answer every click that joined it."""
        with self._lock:
            commands, self._waiting = self._waiting, None
            if not commands:
                return
            self._running = commands
        result: dict[str, Any] | None = None
        failure: Exception | None = None
        try:
            result = self._run()
            self.runs += 1
        except Exception as error:
            log.warning("nbcoord: the panel's reclaim failed", exc_info=True)
            failure = error
        with self._lock:
            answered, self._running = self._running or commands, None
            self._ended_at = time.monotonic()
        if result is not None:
            self._done(answered, result)
        else:
            self._failed(answered, failure or RuntimeError("the reclaim gave no report"))


class ActionRunner:
    """What the panel's actions do: a stop or a restart (on the action thread, :class:`.commands.StopRunner`), a
    reclaim (on the main thread, :class:`Reclaims`); and the line a cell that Stop all interrupted prints at its
    end."""

    def __init__(self, host: Host, actions: PanelActions) -> None:
        self.host = host
        self.actions = actions
        self._lock = threading.Lock()  # guards _interrupted
        self._interrupted: dict[int, str] = {}  # cell -> the line its end prints (a Stop all interrupted it)

    def run(self, command: Command) -> dict[str, Any]:
        """The action runner's work (on its own thread): a stop, or a restart of a session's runners."""
        if command.type == "restart":
            assert command.session is not None
            return {"kind": "restart", "report": dict(self.actions.restart(command.session))}
        registry = self.host.registry
        running = registry.current_cell() if command.interrupt else None
        report = self.host.stop(command.scope, force=command.force, cell=command.cell, tid=command.tid)
        interrupt: dict[str, Any] | None = None
        if command.interrupt:
            interrupt = self._interrupt(running, report)
        return {"kind": "stop", "report": report, "interrupt": interrupt}

    def reclaim_report(self) -> dict[str, Any]:
        """One reclaim (on the main thread, the only one it may run on), as an action's result."""
        return {"kind": "reclaim", "report": reclaim(self.actions.reclaim)}

    def on_main_loop(self, callback: Callable[[], None], delay: float) -> str | None:
        """Run ``callback`` on the main thread once the kernel's event loop is free (after the running cell), and
        ``delay`` seconds from now at the earliest; returns why it cannot."""
        loop = getattr(getattr(self.host.shell, "kernel", None), "io_loop", None)
        add_callback = getattr(loop, "add_callback", None)
        if not callable(add_callback):
            return "the kernel's main thread cannot be reached from here"
        call_later = getattr(loop, "call_later", None)
        if delay <= 0 or not callable(call_later):
            add_callback(callback)
        else:
            # add_callback is the loop's one thread-safe entry; call_later is then called on the loop's thread.
            add_callback(lambda: call_later(delay, callback))
        return None

    def interrupted_line(self, execution_count: object) -> str | None:
        """After a cell: the line to print if the panel's Stop all interrupted it (and forget every other)."""
        with self._lock:
            line = self._interrupted.pop(execution_count, None) if isinstance(execution_count, int) else None
            self._interrupted.clear()  # a signal that came too late found the cell ended: nothing to say
        return line

    def _interrupt(self, running: Any, report: Mapping[str, Any]) -> dict[str, Any]:
        """Stop all's second half: interrupt the cell that was running at the click, if it still runs."""
        if running is None:
            return {"cell": None, "sent": False, "why": "no cell was running"}
        cell = running.execution_count
        if self.host.registry.current_cell() is not running:
            return {"cell": cell, "sent": False, "why": f"cell [{cell}] ended by itself"}
        stopped = len(report["stopped"])
        also = f", and stopped {stopped} thread{'' if stopped == 1 else 's'} the cells had started" if stopped else ""
        line = f"nbcoord: the panel's Stop all interrupted cell [{cell}]{also}."
        with self._lock:
            self._interrupted[cell] = line
        why = interrupt_main()
        if why is not None:
            with self._lock:
                self._interrupted.pop(cell, None)
            log.warning("nbcoord: Stop all could not interrupt cell [%d]: %s", cell, why)
        return {"cell": cell, "sent": why is None, "why": why}
