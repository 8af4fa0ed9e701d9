"""A closing session (S2): who closes it is remembered, and its runner threads stop first, through the one stop.

The same bounded stop of runner threads serves a restart of a session's queue runners (:mod:`.health`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import CloseRecord, session_is_open
from nbcoord.tensorflow.stopping import RunnerStopping

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")


class SessionCloses:
    """Stops of a session's runner threads: before the session closes, and for a restart."""

    def __init__(
        self, host: Host, objects: TFObjects, stopping: RunnerStopping, current_cell: Callable[[], int | None]
    ) -> None:
        self._host = host
        self._objects = objects
        self._stopping = stopping
        self._current_cell = current_cell
        #: The report of the last stop made for a closing session (merged over its runner threads).
        self.last_report: dict[str, Any] | None = None

    def stop_runner_threads(self, threads: Iterable[threading.Thread], grace: float, why: str) -> dict[str, Any]:
        """Stop these runner threads through the one stop (one stop of scope "threads"), so that it
        yields a report, shows as the last stop and can force.

        Threads the one stop cannot take (not registered, or a stop that cannot run here: a session closed
        from inside a stop) are stopped and joined directly.
        """
        started, wall = time.monotonic(), time.time()
        deadline = started + max(grace, 0.1)
        registry = self._host.registry
        threads = [t for t in threads if t.is_alive()]
        tids = {id(t): r.tid for t in threads if (r := registry.for_thread(t)) is not None and r.user}
        merged: dict[str, Any] = {
            "scope": "threads",
            "why": why,
            "cell": None,
            "grace": grace,
            "force": False,
            "started_at": wall,
            "took_s": 0.0,
            "stopped": [],
            "alive": [],
            "stopper_errors": [],
            "children": {"terminated": [], "killed": [], "alive": []},
        }
        direct = [thread for thread in threads if id(thread) not in tids]
        if tids:
            report = self._host.stopper.stop(
                "threads", tids=tuple(tids.values()), grace=max(0.05, deadline - time.monotonic())
            )
            if any(err["error"].startswith("not run") for err in report["stopper_errors"]):
                direct += [thread for thread in threads if id(thread) in tids]
            else:
                merged["stopped"] += report["stopped"]
                merged["alive"] += report["alive"]
                merged["stopper_errors"] += report["stopper_errors"]
        if direct:
            self._stopping.stop_threads(direct, deadline, scope="session close")
            for thread in direct:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        reported = {row["tid"] for row in merged["stopped"] + merged["alive"]}
        for thread in threads:
            tid = tids.get(id(thread))
            if tid in reported:
                continue
            row = {"tid": tid, "name": thread.name, "cell": None, "reason": None, "stack": None}
            if thread.is_alive():
                row["reason"] = "did not stop in time"
                merged["alive"].append(row)
            else:
                merged["stopped"].append(row)
        merged["took_s"] = time.monotonic() - started
        return merged

    def before_close(self, session: Any, caller: Any = None) -> None:
        """Before a session closes: remember who closes it, and stop its runner threads (S2)."""
        if not session_is_open(session):
            return
        info = self._objects.session_info(session) or self._objects.add_session(session)
        code = getattr(getattr(caller, "f_code", None), "co_name", "")
        thread = threading.current_thread()
        source = "with-block" if code == "__exit__" else "close-call"
        info.closed_by = CloseRecord(source, thread.name, self._current_cell(), time.time())
        info.closing = True
        if info.lock.acquire(timeout=1.0):  # a poll in flight ends first
            info.lock.release()
        threads = self._stopping.session_runners(session)
        if not threads:
            return
        grace = float(self._host.config.grace_period)
        report = self.stop_runner_threads(threads, grace, f"close of session {info.sid}")
        self.last_report = report
        left = [row["name"] for row in report["alive"]]
        if left:
            log.warning("nbcoord: session %s closes with %d runner thread(s) running: %s", info.sid, len(left), left)
