"""What the kernel's shutdown does with the one stop: nbcoord's own threads first, then the user's within the
budget, and non-daemon threads that would not stop are left out of the interpreter's exit join (or, where it
cannot be told, the exit ends the process once the rest of its work is done)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nbcoord.core.host import Host
from nbcoord.core.internals import abandon_thread, exit_now

log = logging.getLogger("nbcoord")

#: At shutdown, how long daemon threads are waited for: the interpreter itself would not wait for them at all,
#: so only those about to finish (a record being written) get this long.
SHUTDOWN_DAEMON_GRACE_S = 0.1


class ShutdownStop:
    """The shutdown routes' action (:class:`nbcoord.kernel.shutdown.ShutdownHooks` calls :meth:`stop`) and the
    interpreter exit's last word (:meth:`leave_unstoppable`)."""

    def __init__(self, host: Host, pause_monitor: Callable[[], None]) -> None:
        self._host = host
        self._pause_monitor = pause_monitor
        #: Non-daemon threads that would not stop at shutdown and that the interpreter could not be told to leave.
        self._unjoinable: list[threading.Thread] = []

    def stop(self, route: str) -> None:
        """Stop nbcoord's own threads, then the user's, within the budget."""
        host = self._host
        started = time.monotonic()
        budget = host.config.shutdown_budget
        for stop_own in [*host.own_stoppers(), self._pause_monitor]:
            try:
                stop_own()
            except Exception:
                log.warning("nbcoord: stopping an nbcoord thread failed", exc_info=True)
        report = host.stopper.stop(
            "all",
            grace=max(0.0, budget - (time.monotonic() - started)),
            force=host.config.force_on_shutdown,
            force_after=host.config.shutdown_force_after,
            daemon_grace=SHUTDOWN_DAEMON_GRACE_S,
        )
        abandoned: list[str] = []
        for row in report["alive"]:
            record = host.registry.get(row["tid"])
            thread = record.thread if record is not None else None
            if thread is None or thread.daemon or not thread.is_alive():
                continue  # the interpreter does not wait for daemon threads
            if abandon_thread(thread):
                abandoned.append(thread.name)
            else:
                self._unjoinable.append(thread)
        if abandoned:
            log.warning("nbcoord: %s: the exit will not wait for %d thread(s) that would not stop: %s",
                        route, len(abandoned), abandoned)
        log.info(
            "nbcoord: %s: stopped %d thread(s) in %.3f s; %d still running",
            route,
            len(report["stopped"]),
            time.monotonic() - started,
            len(report["alive"]),
        )

    def leave_unstoppable(self) -> None:
        """At interpreter exit, after the stop: if a non-daemon thread that would not stop is still running and
        the interpreter would wait for it, run the exit's remaining work and end the process."""
        left = [thread for thread in self._unjoinable if thread.is_alive()]
        if not left:
            return
        log.warning(
            "nbcoord: ending the process without waiting for %d thread(s) that would not stop: %s",
            len(left),
            [thread.name for thread in left],
        )
        exit_now(0)
