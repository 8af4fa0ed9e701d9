"""nbcoord's one background thread: the monitor, which samples while something is live and sleeps while nothing is.

A diagnostics extension is loaded into every kernel of a server, so what it costs while the user does nothing is
paid hundreds of times over. The monitor therefore does all of nbcoord's periodic work on one thread, and does it
only while it has something to watch:

- **tasks** are the samples taken together on each tick (threads' activity and CPU, the resource probe, the
  ledgers, routed output). A task returns a true value while it watches something live (a thread a cell started,
  a running cell, a ledger item, a child process, output not yet sent): the next tick then comes after the base
  interval (``monitor_interval``), as it always did, so every promise that rests on ticks (stuck detection, zombie
  notices, the memory ledger's peaks) is kept. When no task does, the monitor is *quiet*: the next tick comes
  after :data:`QUIET_INTERVAL_S` (keeping the resource history going), or at once when :meth:`Monitor.wake` says
  something happened (a thread started, a cell began or ended). Quiet is decided under the lock that ``wake``
  takes, so a wake that races with the decision is never lost.
- **jobs** have their own schedule (the panel's sender): ``due()`` says when a job next wants to run (None: not
  now) and is asked again after every wake-up, so a job that wants to run earlier calls :meth:`Monitor.poke`.
- **readers** are file descriptors the monitor reads when they become readable (the SIGTERM waker's signal pipe),
  served also while the monitor is paused for the kernel's shutdown.

The thread waits in a selector on its own wake-up pipe and the readers' descriptors: no polling, no cost while
nothing is due.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import threading
import time
from collections.abc import Callable, Collection
from typing import Final, NamedTuple

from nbcoord.core.callbacks import Callbacks
from nbcoord.core.records import INTERNAL_PREFIX

__all__ = ["MONITOR_THREAD_NAME", "QUIET_INTERVAL_S", "Monitor"]

log = logging.getLogger("nbcoord")

MONITOR_THREAD_NAME: Final = f"{INTERNAL_PREFIX}monitor"
#: Seconds between ticks while no task watches anything live (one resource sample a minute for the history).
QUIET_INTERVAL_S: Final = 60.0
#: How long a remover waits for the monitor to let go of what it removes (a tick or job in progress, a descriptor).
_LET_GO_S: Final = 1.0


class _Job(NamedTuple):
    due: Callable[[], float | None]
    run: Callable[[float], None]


class Monitor:
    """The monitor thread: tasks on a tick that backs off while nothing is live, jobs, readers (see the module)."""

    def __init__(self, interval: Callable[[], float]) -> None:
        self._interval = interval
        self._tasks: Callbacks[Callable[[], object]] = Callbacks()
        self._lock = threading.Lock()  # guards the fields below but _work
        self._looped = threading.Condition(self._lock)  # notified at the top of every turn of the loop
        self._readers: dict[int, Callable[[], None]] = {}
        self._jobs: dict[str, _Job] = {}
        self._selecting: frozenset[int] = frozenset()  # the readers of the selector the thread waits on
        self._stopping = False
        self._paused = False
        self._thread: threading.Thread | None = None
        self._wake_read = self._wake_write = -1
        self._poked = False
        self._last_tick = -math.inf
        self._next_tick = math.inf
        #: Events :meth:`wake` has seen (compared across a tick: one that came meanwhile keeps the base interval).
        self._events = 0
        #: When the monitor became quiet (no task watched anything live at a tick, and nothing happened since);
        #: infinity while it is not.
        self.quiet_since = math.inf
        # Held while tasks or a job run: pause() and the removers wait on it for the work in progress to finish.
        self._work = threading.RLock()

    # --------------------------------------------------------------------------------------- registration
    def add_task(self, name: str, task: Callable[[], object]) -> Callable[[], None]:
        """Run ``task`` on every tick; it returns a true value while it watches something live. Returns the
        remover."""
        return self._tasks.add(name, task)

    def add_job(self, name: str, due: Callable[[], float | None], run: Callable[[float], None]) -> Callable[[], None]:
        """Run ``run(now)`` whenever ``due()`` (a ``time.monotonic`` moment, or None) has come. The remover returns
        once a run in progress has finished (bounded), unless called from that run."""
        job = _Job(due, run)
        with self._lock:
            self._jobs[name] = job
        self.poke()

        def remove_job() -> None:
            with self._lock:
                if self._jobs.get(name) is job:
                    del self._jobs[name]
            self._let_go_of_work()

        return remove_job

    def add_reader(self, fd: int, on_readable: Callable[[], None]) -> Callable[[], bool]:
        """Call ``on_readable()`` on the monitor thread whenever ``fd`` is readable (it must read, or it is called
        again at once). The remover returns whether the thread has let go of ``fd``, so that it may be closed."""
        with self._lock:
            self._readers[fd] = on_readable
        self.poke()

        def remove() -> bool:
            with self._lock:
                self._readers.pop(fd, None)
            self.poke()
            return self._let_go_of_fd(fd)

        return remove

    # --------------------------------------------------------------------------------------------- events
    def wake(self) -> None:
        """Something happened (a thread started, a cell began or ended): tick at the base interval again, at once
        if the last tick is older than that. Cheap when the monitor is not quiet (a counter and a flag)."""
        self._events += 1  # a lost increment under a race still changes the count
        if self.quiet_since == math.inf:
            return
        with self._lock:
            if self.quiet_since == math.inf:
                return
            self.quiet_since = math.inf
            self._next_tick = min(self._next_tick, self._last_tick + self._interval())
        self.poke()

    def poke(self) -> None:
        """Make the thread look again at what is due (a job's ``due()`` changed, a reader came or went)."""
        with self._lock:
            if self._poked or self._wake_write < 0:
                return
            self._poked = True
            fd = self._wake_write
        with contextlib.suppress(OSError):  # full: the thread wakes anyway; closed: it has stopped
            os.write(fd, b"\0")

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the monitor thread (a daemon: it must never hold the kernel open). The first tick comes after
        the base interval."""
        if self._thread is not None:
            return
        read_fd, write_fd = os.pipe()  # close-on-exec: no subprocess inherits it
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        with self._lock:
            self._wake_read, self._wake_write = read_fd, write_fd
            self._stopping = self._paused = self._poked = False
            self._last_tick = time.monotonic()
            self._next_tick = self._last_tick + self._interval()
            self.quiet_since = math.inf
        thread = threading.Thread(target=self._run, name=MONITOR_THREAD_NAME, daemon=True)
        try:
            thread.start()
        except BaseException:
            self._close_pipe()
            raise
        self._thread = thread

    def pause(self, timeout: float = 0.2) -> None:
        """No more tasks or jobs (the kernel's shutdown: nothing samples what the stop changes); readers are still
        served. Waits up to ``timeout`` for the work in progress."""
        with self._lock:
            self._paused = True
        self.poke()
        if self._work.acquire(timeout=timeout):
            self._work.release()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop and join the monitor thread; its pipe is closed once it has ended."""
        with self._lock:
            self._stopping = True
        self.poke()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("nbcoord: the monitor thread did not end within %.1f s; its pipe stays open", timeout)
                return
        self._close_pipe()

    def forget_in_child(self) -> None:
        """In a forked child: the thread was not forked; close the pipe. Takes no lock (another thread of the
        parent may have held it at the fork) and gives the child fresh ones, so that a late wake() or poke() there
        returns at once instead of waiting for a lock nobody will release."""
        self._lock = threading.Lock()
        self._looped = threading.Condition(self._lock)
        self._work = threading.RLock()
        self._thread = None
        self._stopping = True
        self.quiet_since = math.inf
        self._close_pipe()

    @property
    def native_id(self) -> int | None:
        """The monitor thread's OS id (the benchmark reads its CPU time)."""
        thread = self._thread
        return thread.native_id if thread is not None else None

    @property
    def quiet(self) -> bool:
        """Whether nothing live is watched (ticks come every :data:`QUIET_INTERVAL_S`, or on an event)."""
        return self.quiet_since != math.inf

    # ----------------------------------------------------------------------------------------------- work
    def tick(self) -> bool:
        """Run every task once; whether one watches something live (the monitor thread calls this; tests may too)."""
        live = False
        with self._work:
            for name, task in self._tasks.items():
                try:
                    live = bool(task()) or live
                except Exception:
                    live = True  # a task that fails has not said that nothing is live
                    log.warning("nbcoord: monitor task %r failed", name, exc_info=True)
        return live

    def _scheduled_tick(self) -> None:
        with self._lock:
            events = self._events
        live = self.tick()
        now = time.monotonic()
        with self._lock:
            self._last_tick = now
            # Quiet only if nothing happened while the tasks ran (wake() reads `quiet_since` after counting).
            if live or self._events != events:
                self.quiet_since = math.inf
            elif self.quiet_since == math.inf:
                self.quiet_since = now
            self._next_tick = now + (self._interval() if self.quiet_since == math.inf else QUIET_INTERVAL_S)

    def _run_due_jobs(self, now: float) -> float:
        """Run the jobs whose time has come (the loop holds ``_work``); the earliest moment one is due next."""
        earliest = math.inf
        with self._lock:
            jobs = list(self._jobs.items())
        for name, job in jobs:
            try:
                due = job.due()
                if due is not None and due <= now:
                    job.run(now)
                    due = job.due()
            except Exception:
                log.warning("nbcoord: monitor job %r failed", name, exc_info=True)
                continue
            if due is not None:
                earliest = min(earliest, due)
        return earliest

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        wake_read = self._wake_read
        selector.register(wake_read, selectors.EVENT_READ)
        registered: set[int] = set()
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    readers, paused, next_tick = dict(self._readers), self._paused, self._next_tick
                    self._selecting = frozenset(readers)
                    self._looped.notify_all()
                registered = self._register(selector, registered, readers)
                now = time.monotonic()
                next_job = math.inf
                if not paused:
                    with self._work:
                        paused = self._paused  # pause() waits for _work: once it returns, nothing more runs
                        if not paused and now >= next_tick:
                            self._scheduled_tick()
                            with self._lock:
                                next_tick = self._next_tick
                        if not paused:
                            next_job = self._run_due_jobs(time.monotonic())
                due = math.inf if paused else min(next_tick, next_job)
                timeout = None if math.isinf(due) else max(0.0, due - time.monotonic())
                for key, _ in selector.select(timeout):
                    if key.fd == wake_read:
                        self._drain_wake_pipe()
                    elif key.fd in readers:
                        try:
                            readers[key.fd]()
                        except Exception:
                            log.warning("nbcoord: a monitor reader failed", exc_info=True)
        finally:
            with self._lock:
                self._selecting = frozenset()
                self._looped.notify_all()
            selector.close()

    @staticmethod
    def _register(selector: selectors.BaseSelector, registered: set[int], readers: Collection[int]) -> set[int]:
        """Bring the selector's descriptors in line with ``readers``; the ones it now holds."""
        for fd in registered - set(readers):
            try:
                selector.unregister(fd)
            except (KeyError, ValueError, OSError):
                log.debug("nbcoord: monitor could not unregister fd %d", fd, exc_info=True)
        held = registered & set(readers)
        for fd in set(readers) - registered:
            try:
                selector.register(fd, selectors.EVENT_READ)
                held.add(fd)
            except (KeyError, ValueError, OSError):  # closed by its owner before it was removed
                log.warning("nbcoord: the monitor cannot watch fd %d", fd, exc_info=True)
        return held

    def _drain_wake_pipe(self) -> None:
        """Empty the pipe, then let the next poke write again. In this order: a poke that came before the flag is
        cleared is seen by the look at what is due that follows; cleared first, a poke's byte could be read here
        and the flag left set, and every later poke dropped."""
        with contextlib.suppress(OSError):  # empty (EAGAIN)
            while os.read(self._wake_read, 512):
                pass
        with self._lock:
            self._poked = False

    def _let_go_of_fd(self, fd: int) -> bool:
        """Wait until the thread's selector no longer holds ``fd`` (bounded); whether it let go."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return True
        deadline = time.monotonic() + _LET_GO_S
        with self._lock:
            while fd in self._selecting:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._looped.wait(remaining):
                    return fd not in self._selecting
        return True

    def _let_go_of_work(self) -> None:
        """Wait (bounded) for the tick or job in progress, unless this is the monitor thread."""
        if self._thread is threading.current_thread():
            return
        if self._work.acquire(timeout=_LET_GO_S):
            self._work.release()

    def _close_pipe(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    log.debug("nbcoord: closing the monitor's pipe failed", exc_info=True)
        self._wake_read = self._wake_write = -1
