"""How the ledger waits for what it stops: an item being stopped (:class:`Pending`), the wait for all of them
against the stop's one deadline (:func:`wait_all`), and the stop of something with worker processes
(:class:`WorkerStop`: its library's own API first, then signals), used by the pool, DataLoader and process kinds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psutil

from nbcoord.core.stop import ItemOutcome

log = logging.getLogger("nbcoord")

#: How often the stopper looks at what it waits for.
POLL_S = 0.002


class Pending(Protocol):
    """One item being stopped: the ledger polls it until it is finished or the deadline passes."""

    def poll(self, now: float, started: float, deadline: float) -> bool:
        """Advance (escalate when its time comes); True once there is nothing more to wait for."""

    def outcome(self) -> ItemOutcome:
        """What happened to it, for the stop's report."""


class WorkerStop:
    """Stopping something with worker processes: its library's own API first, in a helper thread (it may block or
    join), then signals to the workers still alive, each through its ``multiprocessing`` object (so that its
    library still learns its exit status: nbcoord never reaps another library's child behind its back).

    SIGTERM goes to the workers still alive once the library's call returned and they had ``SETTLE_S`` to exit,
    or at ``TERM_AT`` of the stop's time, whichever is first; SIGKILL at ``KILL_AT``. ``before_signals`` runs once,
    just before the first signal (PyTorch must forget its workers first, or its SIGCHLD handler raises in the
    main thread).
    """

    SETTLE_S = 0.1
    TERM_AT = 0.4
    KILL_AT = 0.7

    def __init__(
        self,
        item: ItemOutcome,
        api_name: str,
        api: Callable[[], None] | None,
        workers: Sequence[Any],
        before_signals: Callable[[], None] | None = None,
    ) -> None:
        self.item = item
        self.api_name = api_name
        self.workers = list(workers)
        self.before_signals = before_signals
        self.began = time.monotonic()
        self.api_took: float | None = None
        self.api_error: str | None = None
        self.signalled: dict[str, list[int]] = {"SIGTERM": [], "SIGKILL": []}
        self._done = threading.Event()
        self._has_api = api is not None
        if api is None:
            self.api_took = 0.0  # nothing to wait for: signals once the workers had SETTLE_S
            self._done.set()
        else:
            thread = threading.Thread(target=self._call, args=(api,), name=f"nbcoord-stop-{item['id']}", daemon=True)
            thread.start()

    def _call(self, api: Callable[[], None]) -> None:
        try:
            api()
        except Exception as exc:
            log.warning("nbcoord: %s of %s failed", self.api_name, self.item["label"], exc_info=True)
            self.api_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.api_took = time.monotonic() - self.began
            self._done.set()

    def alive(self) -> list[Any]:
        """Workers still running (asked through their objects: an exited one is reaped, its status kept)."""
        return [w for w in self.workers if worker_alive(w)]

    def poll(self, now: float, started: float, deadline: float) -> bool:
        alive = self.alive()
        done = self._done.is_set()
        if done and not alive:
            return True
        window = max(0.0, deadline - started)
        settled = done and self.api_took is not None and now - self.began >= self.api_took + self.SETTLE_S
        if alive and not self.signalled["SIGTERM"] and (settled or now >= started + window * self.TERM_AT):
            self._signal(alive, "SIGTERM")
        elif alive and not self.signalled["SIGKILL"] and now >= started + window * self.KILL_AT:
            self._signal(alive, "SIGKILL")
        return False

    def _signal(self, workers: list[Any], name: str) -> None:
        if self.before_signals is not None:
            before, self.before_signals = self.before_signals, None
            try:
                before()
            except Exception:
                log.warning("nbcoord: preparing to signal the workers of %s failed", self.item["label"], exc_info=True)
        for worker in workers:
            try:
                worker.terminate() if name == "SIGTERM" else worker.kill()
                self.signalled[name].append(int(worker.pid))
            except Exception:  # ended meanwhile, or not ours to signal
                log.debug("nbcoord: could not signal a worker of %s", self.item["label"], exc_info=True)
        for worker in workers:
            join = getattr(worker, "join", None)
            if join is not None:
                try:
                    join(0)  # reaps it through its own object when it has exited
                except Exception:
                    log.debug("nbcoord: could not reap a worker of %s", self.item["label"], exc_info=True)

    def outcome(self) -> ItemOutcome:
        alive = self.alive()
        words: list[str] = []
        if not self._has_api:
            pass
        elif self.api_error is not None:
            words.append(f"{self.api_name} failed: {self.api_error}")
        elif self.api_took is not None:
            words.append(f"{self.api_name} took {self.api_took * 1000:.0f} ms")
        else:
            words.append(f"{self.api_name} had not returned")
        for name, pids in self.signalled.items():
            if pids:
                words.append(f"{len(pids)} worker(s) got {name}")
        if alive:
            listed = ", ".join(str(getattr(w, "pid", "?")) for w in alive)
            words.append(f"still alive: worker(s) {listed}")
        return ItemOutcome(
            id=self.item["id"],
            kind=self.item["kind"],
            label=self.item["label"],
            cell=self.item["cell"],
            stopped=not alive and self._done.is_set(),
            reason="; ".join(words),
        )


def worker_alive(worker: Any) -> bool:
    """Whether a worker (a ``multiprocessing`` process, or a ThreadPool's thread) still runs, asked through its
    own object (which reaps an exited child and keeps its exit status)."""
    try:
        return bool(worker.is_alive())
    except Exception:  # not started, or not a child of this process
        return False


def worker_state(worker: Any) -> str:
    """``"running"``, ``"exited"`` (a process that exited and was not reaped yet) or ``"gone"``, read without reaping
    (a view must not change what the library will find)."""
    if isinstance(worker, threading.Thread):  # a ThreadPool's worker
        return "running" if worker.is_alive() else "gone"
    pid = worker_pid(worker)
    if pid is None:
        return "gone"
    try:
        status = psutil.Process(pid).status()
    except psutil.ZombieProcess:
        return "exited"
    except psutil.Error:
        return "gone"
    return "exited" if status == psutil.STATUS_ZOMBIE else "running"


def worker_pid(worker: Any) -> int | None:
    pid = getattr(worker, "pid", None)
    return pid if isinstance(pid, int) else None


def wait_all(pending: Sequence[Pending], started: float, deadline: float) -> None:
    """Poll every item until each is finished or the deadline passes (one last poll at the deadline)."""
    waiting = list(pending)
    while waiting:
        now = time.monotonic()
        waiting = [item for item in waiting if not _poll(item, now, started, deadline)]
        if not waiting or now >= deadline:
            return
        time.sleep(min(POLL_S, max(0.0, deadline - now)))


def _poll(item: Pending, now: float, started: float, deadline: float) -> bool:
    try:
        return item.poll(now, started, deadline)
    except Exception:
        log.warning("nbcoord: waiting for %r failed", item, exc_info=True)
        return True

