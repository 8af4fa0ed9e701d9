"""The pre-shutdown hook: every way a kernel ends runs one bounded stop before the process exits.

Routes, each found by experiment with ipykernel 7.4 (and 6.31):

- shutdown and restart requests: the kernel's ``do_shutdown`` is wrapped on the instance (it runs on the control
  thread, before the reply is sent, so the front end's 2.5 s SIGTERM timer has not yet mattered);
- ``exit()``/``quit()`` in a cell: the shell's ``exit_now`` trait is observed (``do_shutdown`` is not called);
- interpreter exit: a hook that runs before the interpreter joins non-daemon threads (plain ``atexit`` runs
  after that join, too late; see :func:`nbcoord.core.internals.register_before_thread_join`). A callback that raises
  there aborts the join, so it never raises;
- SIGTERM: a handler that stops, then hands the signal to the previous handler or lets the default action kill
  the process by its signal. Whichever thread the signal reaches, the handler runs promptly (see below); a second
  SIGTERM while it runs returns at once (the first goes on, and ends the process).

The stop runs once per process, whichever route comes first: a route that arrives while it runs waits for it
(within the budget) and adds no stop of its own, so the whole stays inside jupyter_client's 2.5 s.

After the stop, at interpreter exit, a non-daemon thread that would not stop must not keep the process alive.
Where the interpreter lets it, such a thread is left out of the exit's join (CPython 3.10-3.12); elsewhere
(3.13) the interpreter-exit hook runs the ``atexit`` work, flushes, and ends the process itself
(:func:`nbcoord.core.internals.exit_now`). Either is logged, naming the threads; nothing else is.

SIGTERM on any thread: the handler is a Python-level one, so CPython runs it in the main thread, when that thread
next runs bytecode; the signal itself may reach any thread that does not block it (a process-directed SIGTERM
usually reaches the main thread, ``tgkill`` one chosen thread). An idle kernel's main thread waits in its event
loop's ``epoll_wait`` (ipykernel 7 and 6: tornado's ``AsyncIOMainLoop`` on asyncio, no wakeup fd set) and a cell's
``time.sleep`` waits in the kernel: a signal delivered to another thread wakes neither, and before this the kernel
stayed alive (without nbcoord the default action kills it at once). So, as :class:`_SigtermWaker` says, the signal
wakeup fd is a pipe that nbcoord's monitor thread reads; for SIGTERM it sends the signal on to the main thread, whose
wait then ends (``EINTR``) and which runs the handler. Where that cannot be set up (no ``pthread_kill``, the wakeup
fd refused), SIGTERM to another thread is handled when the main thread next runs Python, and the fallback is
recorded for ``%nbcoord`` (:func:`nbcoord.core.internals.degraded`). The Python-level handler itself stays: unlike the
event loop's ``add_signal_handler`` callback, it runs at once when a cell keeps the main thread busy in Python.

In a forked child every route does what it would do without nbcoord (see :mod:`nbcoord.core.fork`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from nbcoord.core import fork as _fork
from nbcoord.core import internals as _internals
from nbcoord.core.internals import register_before_thread_join

log = logging.getLogger("nbcoord")

#: ``action(route)`` does the bounded stop.
ShutdownAction = Callable[[str], None]
#: Called at interpreter exit, after the stop: ends the process if a thread that would not stop is left.
ExitAction = Callable[[], None]

#: ``watch_fd(fd, on_readable)``: has ``on_readable`` called on a thread of nbcoord whenever ``fd`` is readable
#: (the monitor's :meth:`~nbcoord.core.monitor.Monitor.add_reader`); its remover says whether that thread let go.
FdWatch = Callable[[int, Callable[[], None]], Callable[[], bool]]
#: A SIGTERM handler that began or ended this recently, or runs, is taken to have handled the SIGTERM byte read now
#: (the C handler writes the byte before the main thread runs the Python handler, so the byte may come after it).
_HANDLED_WINDOW_S: Final = 0.5
#: How long the byte that the waker's own ``pthread_kill`` makes the C handler write (its echo) is waited for.
_ECHO_WINDOW_S: Final = 1.0

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
        watch_fd: FdWatch | None = None,
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
        # Read by the waker's thread without a lock (plain attribute reads): whether the handler runs, and when it
        # last began or ended (monotonic; -inf: never).
        self._in_sigterm = False
        self._sigterm_last = float("-inf")
        self._waker = _SigtermWaker(self._sigterm_handled_recently, watch_fd)
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
            why_not = self._waker.install()
            if why_not is not None:
                _internals._fall_back(
                    "a SIGTERM waker (signal.set_wakeup_fd, signal.pthread_kill)",
                    f"a SIGTERM that reaches a thread other than the main one is handled when the main thread next "
                    f"runs Python, so an idle kernel stays alive ({why_not})",
                )

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
        # The waker first: once the wakeup fd is given back, no SIGTERM is sent on to the main thread.
        self._waker.uninstall()
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._sigterm_installed = False

    def forget_in_child(self) -> None:
        """In a forked child: every route behaves as without nbcoord. Takes no lock.

        The SIGTERM handler the child inherited is given back: a Python-level handler only runs when the child's
        main thread returns to Python, so a worker busy in C would not die at once as it does by default. So is the
        wakeup fd (the waker's thread does not exist in the child, and the pipe is the parent's too).
        """
        self._active = False
        self._waker.forget_in_child()
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

    def _sigterm_handled_recently(self) -> bool:
        """For the waker's thread: whether the SIGTERM handler runs, or began or ended a moment ago."""
        return self._in_sigterm or time.monotonic() - self._sigterm_last < _HANDLED_WINDOW_S

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_sigterm:
            # A second SIGTERM while the first is handled (CPython runs Python handlers nested, between bytecodes of
            # this one): the first goes on and ends the process; a nested run would wait for the stop it interrupts.
            return
        self._in_sigterm = True
        self._sigterm_last = time.monotonic()
        try:
            self._handle_sigterm(signum, frame)
        finally:
            self._in_sigterm = False
            self._sigterm_last = time.monotonic()

    def _handle_sigterm(self, signum: int, frame: FrameType | None) -> None:
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


class _SigtermWaker:
    """Makes a SIGTERM that reaches any thread reach the main thread, which runs the Python-level handler.

    CPython's C-level handler runs on the thread the signal reached: it marks the signal pending for the main thread
    (which runs the Python handler when it next runs bytecode) and writes the signal number, one byte, to the signal
    wakeup fd. Nothing more wakes a main thread that waits in its event loop or in a cell's ``time.sleep``. So the
    wakeup fd is a pipe of ours, which nbcoord's monitor thread reads (``watch_fd``; no thread of its own); for a
    SIGTERM byte it sends SIGTERM to the main thread (``pthread_kill``), whose wait ends with ``EINTR``; the retry (PEP
    475) first runs the handler. A reader on the main event loop would wake an idle kernel only, not a sleeping cell,
    and would depend on which loop runs.

    - A SIGTERM that the handler is handling, or handled a moment ago, is not sent on: that is the main thread's own
      (its byte can come after the handler began), and a second run of the handler would call a previous handler
      twice. The byte that sending on makes the C handler write again (the echo) is dropped, not sent on again.
    - A wakeup fd set before (asyncio's, when a loop in the main thread has signal handlers) still gets every byte
      but the echoes: the thread writes them on, so that loop's signal handling goes on. It is set back on
      uninstall (with ``warn_on_full_buffer`` at its default: the previous value cannot be read).
    - Everything is undone by :meth:`uninstall` only when the wakeup fd is still the pipe: one set since by someone
      else (asyncio's ``add_signal_handler``) is theirs, and left alone.
    """

    def __init__(self, handled_recently: Callable[[], bool], watch_fd: FdWatch | None) -> None:
        self._handled_recently = handled_recently
        self._watch_fd = watch_fd
        self._read_fd = -1
        self._write_fd = -1
        self._previous_fd = -1
        self._main_ident = 0
        self._unwatch: Callable[[], bool] | None = None
        self._closing = False
        self._echoes = 0
        self._echoes_until = 0.0

    def install(self) -> str | None:
        """In the main thread: set the wakeup fd to the pipe and have it read. Returns None, or why it could not
        (and then changed nothing)."""
        if self._watch_fd is None:
            return "no thread of nbcoord's reads the signal pipe"
        if not hasattr(signal, "pthread_kill"):
            return "no signal.pthread_kill on this platform"
        main_ident = threading.main_thread().ident
        if main_ident is None:
            return "the main thread has no ident"
        try:
            read_fd, write_fd = os.pipe()  # not inherited by subprocesses (close-on-exec)
        except OSError as exc:  # out of file descriptors
            return f"no pipe: {exc}"
        try:
            os.set_blocking(read_fd, False)  # the monitor reads what is there, and never waits in the read
            os.set_blocking(write_fd, False)  # set_wakeup_fd requires it; the C handler must never block
            # No warning when the pipe is full: the byte only wakes the thread, and one unread byte is enough.
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (OSError, ValueError) as exc:
            os.close(read_fd)
            os.close(write_fd)
            return f"the wakeup fd could not be set: {exc}"
        self._read_fd, self._write_fd, self._previous_fd = read_fd, write_fd, previous
        self._main_ident = main_ident
        self._closing = False
        self._echoes = 0
        self._unwatch = self._watch_fd(read_fd, self._read)
        return None

    def uninstall(self) -> None:
        """In the main thread: give the wakeup fd back, stop reading the pipe, close it."""
        if self._write_fd < 0:
            return
        try:
            if not self._give_back_wakeup_fd():
                # Another wakeup fd was set since: the C handler no longer writes to the pipe, so it can close.
                log.debug("nbcoord: the signal wakeup fd was changed since load; left as it is")
        except ValueError:  # not the main thread: the C handler may still write to the pipe, so it must stay open
            log.warning("nbcoord: the signal wakeup fd can only be given back in the main thread; left in place")
            return
        self._closing = True
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None and not unwatch():
            # The monitor still waits on the pipe: closing the fd could hand it another file's data.
            log.warning("nbcoord: the monitor did not let go of the SIGTERM pipe; it stays open")
            self._write_fd = self._read_fd = -1
            return
        self._close_fds()

    def forget_in_child(self) -> None:
        """In a forked child: the wakeup fd it had before nbcoord, the pipe closed (it is the parent's too; the
        monitor thread was not forked). Takes no lock; never touches the event loop, whose epoll set is the
        parent's too."""
        if self._write_fd < 0:
            return
        try:
            self._give_back_wakeup_fd()
        except ValueError:  # a fork that CPython did not see: not this process's main thread
            log.debug("nbcoord: could not give back the wakeup fd in a forked child", exc_info=True)
            return  # the pipe stays: the C handler may still write to it
        self._unwatch = None
        self._close_fds()

    def _give_back_wakeup_fd(self) -> bool:
        """Set the wakeup fd back to the one before install, if it is still the pipe; whether it was. Raises
        ValueError outside the main thread."""
        current = signal.set_wakeup_fd(self._previous_fd)
        if current == self._write_fd:
            return True
        signal.set_wakeup_fd(current)  # someone else's: put it back as it was
        return False

    def _close_fds(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    log.debug("nbcoord: closing the SIGTERM waker's pipe failed", exc_info=True)
        self._read_fd = self._write_fd = -1

    def _read(self) -> None:
        """On the monitor thread, when the pipe is readable: read the signal numbers; send a SIGTERM on to the main
        thread."""
        try:
            data = os.read(self._read_fd, 512)
        except OSError:  # nothing left (EAGAIN), or closed
            return
        if not data or self._closing:
            return
        passed = bytearray()
        for signum in data:
            if signum == signal.SIGTERM:
                now = time.monotonic()
                if self._echoes and now < self._echoes_until:
                    self._echoes -= 1  # the byte of our own pthread_kill: not a SIGTERM of its own
                    continue
                if not self._handled_recently():
                    self._send_on()
                    self._echoes, self._echoes_until = 1, now + _ECHO_WINDOW_S
            passed.append(signum)
        previous = self._previous_fd
        if passed and previous >= 0:
            try:
                os.write(previous, passed)
            except OSError:  # full (the C handler would have dropped the byte too) or closed
                log.debug("nbcoord: could not pass signal bytes on to the previous wakeup fd", exc_info=True)

    def _send_on(self) -> None:
        try:
            signal.pthread_kill(self._main_ident, signal.SIGTERM)
        except (OSError, ValueError):  # the main thread is gone: the process is ending anyway
            log.debug("nbcoord: could not send SIGTERM on to the main thread", exc_info=True)
