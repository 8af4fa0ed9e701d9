"""The pre-shutdown hook: every way a kernel ends runs one bounded stop before the process exits.

Routes, each found by experiment with ipykernel 7.4 (and 6.29):

- shutdown and restart requests: the kernel's ``do_shutdown`` is wrapped on the instance (it runs on the control
  thread, before the reply is sent, so the front end's 2.5 s SIGTERM timer has not yet mattered);
- ``exit()``/``quit()`` in a cell: the shell's ``exit_now`` trait is observed (``do_shutdown`` is not called);
- interpreter exit: ``threading._register_atexit``, which runs before the interpreter joins non-daemon threads
  (plain ``atexit`` runs after that join, too late). A callback that raises there aborts the join, so it never
  raises;
- SIGTERM: a handler that stops, then hands the signal to the previous handler or lets the default action kill
  the process by its signal.

A thread that will not stop is abandoned: removed from the set the interpreter joins at exit, with one log line
naming it, so that the process always exits.
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

log = logging.getLogger("nbcoord")

ShutdownAction = Callable[[str], None]


def abandon_thread(thread: threading.Thread) -> bool:
    """Let the interpreter exit without joining ``thread`` (CPython 3.10-3.12 keep a set of locks to join)."""
    lock = getattr(thread, "_tstate_lock", None)
    locks = getattr(threading, "_shutdown_locks", None)
    guard = getattr(threading, "_shutdown_locks_lock", None)
    if lock is None or locks is None or guard is None:
        return False
    with guard:
        locks.discard(lock)
    return True


class ShutdownHooks:
    """Installs the shutdown routes around one action: ``action(route)`` does the bounded stop."""

    def __init__(self, action: ShutdownAction) -> None:
        self._action = action
        self._kernel: Any = None
        self._shell: Any = None
        self._wrapped_shutdown: Callable[..., Any] | None = None
        self._had_instance_shutdown = False
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._active = False
        self._done = threading.Event()

    # ------------------------------------------------------------------------------------------- install
    def install(self, shell: Any) -> None:
        """Install every route that exists in this process."""
        if self._active:
            return
        self._active = True
        self._shell = shell
        self._kernel = getattr(shell, "kernel", None)
        if self._kernel is not None and hasattr(self._kernel, "do_shutdown"):
            self._wrap_do_shutdown(self._kernel)
        if hasattr(shell, "observe") and shell.has_trait("exit_now"):
            shell.observe(self._on_exit_now, names="exit_now")
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(self._on_interpreter_exit)
            except RuntimeError:  # the interpreter is already shutting down
                log.debug("nbcoord: interpreter exit hook not registered", exc_info=True)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True

    def uninstall(self) -> None:
        """Remove every route :meth:`install` added (the interpreter exit hook only turns itself off)."""
        if not self._active:
            return
        self._active = False
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
        # threading has no way to unregister an atexit callback; _on_interpreter_exit checks _active.

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
    def run(self, route: str) -> None:
        """Run the shutdown action once per process end; never raises."""
        if not self._active or self._done.is_set():
            return
        self._done.set()
        try:
            self._action(route)
        except BaseException:  # here even a KeyboardInterrupt must not abort the kernel's own shutdown
            log.error("nbcoord: the pre-shutdown stop failed", exc_info=True)

    def reset(self) -> None:
        """Allow the action to run again (after a restart request answered in the same process, for tests)."""
        self._done.clear()

    def _on_exit_now(self, change: dict[str, Any]) -> None:
        if change.get("new"):
            self.run("exit")

    def _on_interpreter_exit(self) -> None:
        self.run("interpreter-exit")

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
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)
