"""The pre-shutdown hook: every way a kernel ends runs one bounded stop before the process exits.

Routes, each found by experiment with ipykernel 7.4 (and 6.31):

- shutdown and restart requests: the kernel's ``do_shutdown`` is wrapped on the instance (it runs on the control
  thread, before the reply is sent, so the front end's 2.5 s SIGTERM timer has not yet mattered);
- ``exit()``/``quit()`` in a cell: the shell's ``exit_now`` trait is observed (``do_shutdown`` is not called);
- interpreter exit: a hook that runs before the interpreter joins non-daemon threads (plain ``atexit`` runs
  after that join, too late; see :func:`nbcoord._internals.register_before_thread_join`). A callback that raises
  there aborts the join, so it never raises;
- SIGTERM: a handler that stops, then hands the signal to the previous handler or lets the default action kill
  the process by its signal.

The stop runs once per process, whichever route comes first: a route that arrives while it runs waits for it
(within the budget) and adds no stop of its own, so the whole stays inside jupyter_client's 2.5 s.

After the stop, at interpreter exit, a non-daemon thread that would not stop must not keep the process alive.
Where the interpreter lets it, such a thread is left out of the exit's join (CPython 3.10-3.12); elsewhere
(3.13) the interpreter-exit hook runs the ``atexit`` work, flushes, and ends the process itself
(:func:`nbcoord._internals.exit_now`). Either is logged, naming the threads; nothing else is.

In a forked child every route does what it would do without nbcoord (see :mod:`nbcoord._fork`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from . import _fork
from ._internals import register_before_thread_join

log = logging.getLogger("nbcoord")

#: ``action(route)`` does the bounded stop.
ShutdownAction = Callable[[str], None]
#: Called at interpreter exit, after the stop: ends the process if a thread that would not stop is left.
ExitAction = Callable[[], None]

#: Whether this process registered its interpreter-exit hook (it cannot be unregistered: one per process, and it
#: calls whatever hooks are active when the interpreter exits).
_exit_hook_registered = False
_active_hooks: list[ShutdownHooks] = []


def _on_interpreter_exit() -> None:
    for hooks in list(_active_hooks):
        hooks.interpreter_exit()


class ShutdownHooks:
    """Installs the shutdown routes around one action, run once per process end."""

    def __init__(
        self,
        action: ShutdownAction,
        *,
        wait_limit: Callable[[], float] = lambda: 2.0,
        at_exit: ExitAction | None = None,
    ) -> None:
        self._action = action
        self._wait_limit = wait_limit
        self._at_exit = at_exit
        self._kernel: Any = None
        self._shell: Any = None
        self._wrapped_shutdown: Callable[..., Any] | None = None
        self._had_instance_shutdown = False
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._active = False
        self._pid = os.getpid()  # the routes act in this process only (never in a forked child of it)
        self._lock = threading.Lock()  # guards _started
        self._started = False
        self._done = threading.Event()

    # ------------------------------------------------------------------------------------------- install
    def install(self, shell: Any) -> None:
        """Install every route that exists in this process."""
        global _exit_hook_registered
        if self._active:
            return
        self._active = True
        self._pid = os.getpid()
        self._shell = shell
        self._kernel = getattr(shell, "kernel", None)
        if self._kernel is not None and hasattr(self._kernel, "do_shutdown"):
            self._wrap_do_shutdown(self._kernel)
        if hasattr(shell, "observe") and shell.has_trait("exit_now"):
            shell.observe(self._on_exit_now, names="exit_now")
        if not _exit_hook_registered:
            register_before_thread_join(_on_interpreter_exit)
            _exit_hook_registered = True
        _active_hooks.append(self)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True

    def uninstall(self) -> None:
        """Remove every route :meth:`install` added."""
        if not self._active:
            return
        self._active = False
        if self in _active_hooks:
            _active_hooks.remove(self)
        kernel = self._kernel
        if kernel is not None and self._wrapped_shutdown is not None:
            if self._had_instance_shutdown:
                kernel.do_shutdown = self._wrapped_shutdown
            else:
                kernel.__dict__.pop("do_shutdown", None)
        self._wrapped_shutdown = None
        shell = self._shell
        if shell is not None and hasattr(shell, "unobserve") and shell.has_trait("exit_now"):
            shell.unobserve(self._on_exit_now, names="exit_now")
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._sigterm_installed = False

    def forget_in_child(self) -> None:
        """In a forked child: every route behaves as without nbcoord. Takes no lock.

        The SIGTERM handler the child inherited is given back: a Python-level handler only runs when the child's
        main thread returns to Python, so a worker busy in C would not die at once as it does by default.
        """
        self._active = False
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            try:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            except (ValueError, OSError, TypeError):  # not allowed here: the handler passes the signal on
                log.debug("nbcoord: could not restore SIGTERM in a forked child", exc_info=True)

    def _wrap_do_shutdown(self, kernel: Any) -> None:
        original = kernel.do_shutdown
        self._had_instance_shutdown = "do_shutdown" in vars(kernel)
        self._wrapped_shutdown = original
        hooks = self

        def do_shutdown(restart: bool) -> Any:
            hooks.run("restart" if restart else "shutdown")
            return original(restart)

        kernel.do_shutdown = do_shutdown

    # -------------------------------------------------------------------------------------------- routes
    @property
    def ran(self) -> bool:
        """Whether the shutdown stop has run (or is running) in this process."""
        return self._started

    def run(self, route: str) -> None:
        """Run the shutdown action, once per process; a later route waits for it. Never raises."""
        if not self._active or _fork.forked or os.getpid() != self._pid:
            return
        with self._lock:
            first, self._started = not self._started, True
        if not first:
            # Another route is stopping (or has stopped) everything: wait for it, bounded, then go on.
            self._done.wait(self._wait_limit())
            return
        try:
            self._action(route)
        except BaseException:  # here even a KeyboardInterrupt must not abort the kernel's own shutdown
            log.error("nbcoord: the pre-shutdown stop failed", exc_info=True)
        finally:
            self._done.set()

    def _on_exit_now(self, change: dict[str, Any]) -> None:
        if change.get("new"):
            self.run("exit")

    def interpreter_exit(self) -> None:
        """The interpreter is about to join non-daemon threads: stop (if no route did), then let nothing that
        would not stop hold the process. Never raises."""
        if not self._active or _fork.forked or os.getpid() != self._pid:
            return
        self.run("interpreter-exit")
        if self._at_exit is not None:
            try:
                self._at_exit()
            except BaseException:
                log.error("nbcoord: the exit's last resort failed", exc_info=True)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.run("sigterm")
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        # Let the default action happen: the process ends by its signal, as the sender expects.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            sys.stdout.flush()
        except Exception:  # a kernel's stream whose IOPub thread is gone: the signal must still arrive
            log.debug("nbcoord: flush before SIGTERM failed", exc_info=True)
        os.kill(os.getpid(), signal.SIGTERM)
