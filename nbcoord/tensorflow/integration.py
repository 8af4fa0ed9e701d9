"""TensorFlow: sessions, queues (graph mode and TF2's eager mode), queue runners and coordinators, accounted for.

nbcoord never imports TensorFlow. :func:`watch` installs this integration at once when TensorFlow is already
imported (objects that exist then are found by one garbage-collector scan), or right after the user imports it
(a post-import hook, so ``import tensorflow`` and the first Session may share a cell). Unload restores every
patched class attribute. TensorFlow's private names it touches are in :mod:`.internals`, each with its
fallback. Tested with tensorflow-cpu 2.21 and 2.15.

This module wires the parts, each a module of this package: the class patches (:mod:`.patching`), the objects
(:mod:`.objects`, :mod:`.records`, :mod:`.rows`) and their registration (:mod:`.registration`), runs in flight and
the Interrupt (:mod:`.runs`, :mod:`.blocked`, :mod:`.eager`), stops (:mod:`.stopping`, :mod:`.sessions`),
coordinators (:mod:`.coordinators`), who closed a queue (:mod:`.closes`), explanations (:mod:`.explain`), health
and restarts (:mod:`.health`).

What it does, with the scenario it serves (S1-S10: the demo notebooks under notebooks/ are named by them):

- Patches class attributes: ``BaseSession.__init__`` / ``close`` / ``run`` / ``_call_tf_sessionrun``,
  ``QueueBase.__init__`` and its ``enqueue`` / ``dequeue`` / ``close`` methods, ``QueueRunner.create_threads``,
  ``Coordinator.__init__`` / ``request_stop``, ``Graph.get_operations`` and the Graph's export funnel. Runner
  threads get their queue, runner, session and coordinator as owners in the registry.
- Queues, live (S6, S10): capacity, size, closed, enqueue/dequeue rates and a short history, polled about once a
  second: one prepared callable per session for graph queues, the queue's own ``size()`` for eager ones. The
  ops nbcoord adds to a graph to poll it are hidden from the user's graph: not in ``get_operations()``, not in any
  export.
- Blocked runs and calls, explained (S1, S10): "MainThread blocked 42 s in dequeue of queue `input` (0 of 100
  elements, no live producer)".
- Interrupt that works (S1, S10): SIGINT while the main thread is blocked on a queue nobody is feeding (or
  draining) resets that graph queue (the session and the queue stay usable) or closes that eager queue; the
  cell ends with ``KeyboardInterrupt`` and one sentence, at once: what that needs is prepared on a thread of its
  own right after TensorFlow's import (what formatting the traceback needs) and when the run is first seen
  blocking (the resets), and the traceback holds only the cell's frames and nbcoord's one.
- Stopping (S3, S4, S6, S8, S10): a stopper requests stop on every coordinator in scope, then closes the queues
  of the runners in scope with ``cancel_pending_enqueues=True``, the queues their enqueue ops read from, and the
  eager queues that threads in scope use.
- Closing a session first stops the runner threads bound to it through the one stop (S2).
- Stuck pipelines, found and restarted (S8): per runner thread its last progress and whether it is stuck (no
  enqueue for ``stuck_after`` seconds while its queue had room), with the op it waits on; a session's runners
  restart through the one stop, ``create_threads`` and a fresh Coordinator (:meth:`restart_runners`).
- TensorFlow's own errors explained (S7): one sentence added (as a note) to "Attempted to use a closed Session",
  a closed queue's ``OutOfRangeError`` / ``CancelledError`` and a dequeue's ``DeadlineExceededError``.
- Coordinators (S5): exceptions that worker threads pass to ``request_stop`` are kept with traceback, thread and
  cell (the main thread's own are not: it sees them itself). ``request_stop(exc)`` outside an ``except`` block,
  where TensorFlow itself raises ``TypeError`` and never stops, is passed on as that exception's ``exc_info``:
  the stop happens and ``join()`` re-raises ``exc``. Inside an ``except`` block it is passed on unchanged.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nbcoord.core.fork import on_fork_child
from nbcoord.core.patches import ClassPatches
from nbcoord.tensorflow import eager as _tf_eager
from nbcoord.tensorflow import rows, tracebacks
from nbcoord.tensorflow import runs as _tf_runs
from nbcoord.tensorflow.blocked import BLOCKED_AFTER_S, BlockedRuns
from nbcoord.tensorflow.closes import CloseOps
from nbcoord.tensorflow.coordinators import Coordinators
from nbcoord.tensorflow.eager import EagerQueues, as_stopped
from nbcoord.tensorflow.explain import Explainer, called_from, fetched_names, run_names
from nbcoord.tensorflow.graph import HiddenOps, RunAnalyzer
from nbcoord.tensorflow.health import DEFAULT_STUCK_AFTER_S, Health, RestartReport
from nbcoord.tensorflow.internals import TFClasses, tf_classes
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.patching import patch_all
from nbcoord.tensorflow.registration import Registration
from nbcoord.tensorflow.runs import INTERNAL_PREFIX, InterruptWatcher, RunState, RunTracker, prepare_tracebacks
from nbcoord.tensorflow.sessions import SessionCloses
from nbcoord.tensorflow.stopping import RunnerStopping

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

#: nbcoord's folder: frames of its files are nbcoord's wrappers (the class patches among them).
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # nbcoord/

#: The thread that prepares, at install, what the traceback of a cancelled run needs, and how long it waits first.
PREPARE_THREAD = f"{INTERNAL_PREFIX}tf-prepare"
PREPARE_AFTER_S = 0.5

#: The integration of the loaded extension (one per process), for tests, the bench and debugging.
_current: TensorFlowIntegration | None = None


def start(host: Host, *, scan: bool) -> Callable[[], None]:
    """Install the integration now (TensorFlow is imported: :mod:`nbcoord.tensorflow.watch` calls this from its
    post-import hook); ``scan``: look for objects made before (TensorFlow was imported before nbcoord was loaded).
    Returns the undo."""
    global _current
    integration = TensorFlowIntegration(host)
    _current = integration
    try:
        integration.install(scan=scan)
    except BaseException:
        integration.uninstall()
        _current = None
        raise

    def undo() -> None:
        global _current
        integration.uninstall()
        if _current is integration:
            _current = None

    return undo


def current() -> TensorFlowIntegration | None:
    """The TensorFlow integration of the loaded extension, if TensorFlow is imported."""
    return _current


class TensorFlowIntegration:
    """Patches, sources, stopper and monitor task of the TensorFlow integration, for one loaded nbcoord."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.registry = registry = host.registry
        self.tracker = RunTracker()
        self.analyzer = RunAnalyzer()
        self.hidden = HiddenOps()
        self.objects = TFObjects(self.tracker, self._current_cell, self.hidden)
        self.patches = ClassPatches()
        self.watcher = InterruptWatcher(self._on_sigint)
        self._undo: list[Callable[[], None]] = []
        #: TensorFlow classes by name, filled at install (the same dict is shared with the stopping part).
        self._tf: dict[str, Any] = {}
        #: TensorFlow error types by short name, filled at install (shared with the eager and explaining parts).
        self._errors: dict[str, type[BaseException]] = {}
        self.classes: TFClasses | None = None
        #: TensorFlow's package folder: code there is TensorFlow's own.
        self.tf_dir = "\0"
        self.blocked = BlockedRuns(self.objects, self.tracker, self.analyzer, registry)
        self.stopping = RunnerStopping(self.objects, self.tracker, self.analyzer, self.blocked, self._tf)
        self.eager = EagerQueues(self.objects, registry, self._current_cell, self._errors)
        self.explainer = Explainer(self.objects, self.tracker, self.analyzer, registry, self._errors)
        self.health = Health(self.objects, self.tracker, self.blocked, registry)
        self.registration = Registration(self.objects, registry, self._tf)
        self.closes = CloseOps(self.objects, self.tracker, registry, self.explainer, self._current_cell)
        self.coordinators = Coordinators(
            self.objects, registry, self._errors, self._current_cell, lambda: host.stopper.running() is not None
        )
        self.sessions = SessionCloses(host, self.objects, self.stopping, self._current_cell)
        #: Seconds without an enqueue (while the queue has room) after which a runner thread is stuck; None: the
        #: ``stuck_after`` setting where there is one, else DEFAULT_STUCK_AFTER_S.
        self.stuck_after_s: float | None = None
        #: The patched public ``BaseSession.run`` (set by the patches): a failure seen there is explained there.
        self.run_wrapper: Callable[..., Any] | None = None
        self.active = False
        #: When the watcher last saw SIGINT (monotonic), for tests and the bench.
        self.last_sigint_at = 0.0

    @property
    def last_close_report(self) -> dict[str, Any] | None:
        """The report of the last stop made for a closing session (merged over its runner threads)."""
        return self.sessions.last_report

    # ------------------------------------------------------------------------------------- install / undo
    def install(self, *, scan: bool = True) -> None:
        """Patch TensorFlow's classes, find existing objects (``scan``), register source, stopper, monitor task."""
        if self.active:
            return
        try:
            self._install(scan)
        except Exception:
            log.warning("nbcoord: the TensorFlow integration could not be installed", exc_info=True)
            self.uninstall()

    def _install(self, scan: bool) -> None:
        tf = sys.modules["tensorflow"]
        classes = self.classes = tf_classes(tf)
        # TensorFlow's package folder, from the file of a class of its own (``tensorflow/python/...``).
        self.tf_dir = os.path.dirname(os.path.abspath(inspect.getfile(classes.coordinator)))
        self.tf_dir = self.tf_dir.rsplit(os.sep + "python" + os.sep, 1)[0] + os.sep
        self._tf.update(
            {
                "BaseSession": classes.base_session,
                "QueueBase": classes.queue_base,
                "QueueRunner": classes.queue_runner,
                "Coordinator": classes.coordinator,
                "CancelledError": classes.cancelled,
                "RunOptions": classes.run_options,
            }
        )
        self._errors.update(
            {
                "cancelled": classes.cancelled,
                "out_of_range": classes.out_of_range,
                "deadline_exceeded": classes.deadline_exceeded,
                "op_error": classes.op_error,
            }
        )
        executing_eagerly = tf.executing_eagerly
        self.objects.executing_eagerly = executing_eagerly
        self.eager.executing_eagerly = executing_eagerly
        self.eager.explain = self.explainer.explain_eager
        self.stopping.close_eager = self.eager.close_for_stop
        self.blocked.traceback_file = self.eager.traceback_file = self._traceback_file
        self.stopping.current_cell = self._current_cell
        self.tracker.on_failure = self._on_run_failure
        self.tracker.on_run_error = self._on_run_error
        self.tracker.on_run_done = self._on_close_run
        self.tracker.prepared_run = self.stopping.prepared_run
        self.active = self.eager.active = True
        patch_all(self, classes)
        if scan:
            self.registration.scan_existing()
        host = self.host
        self._undo.append(host.snapshots.add_source("tensorflow", self._source))
        self._undo.append(host.stopper.add_stopper("tensorflow", self._stop))
        self._undo.append(host.monitor.add_task("tensorflow", self.tick))
        self._undo.append(on_fork_child(self._forget_in_child))
        untake = tracebacks.install(host.shell, [_tf_runs.__file__, _tf_eager.__file__])
        if untake is not None:
            self._undo.append(untake)
        if self.watcher.install():
            self._undo.append(self.watcher.uninstall)
            self._undo.append(on_fork_child(self.watcher.forget_in_child))
            self._start_preparing()

    def _start_preparing(self) -> None:
        """Prepare, off the user's time and once, what the first Interrupt's traceback needs (see
        :func:`prepare_tracebacks`): on a thread that only fills caches and ends by itself; an unload meanwhile
        stops it between two steps and joins it, so that no thread of nbcoord's outlives the unload, and a
        shutdown stops it between two steps (a process that exits right after importing TensorFlow would
        otherwise share the interpreter with it while it exits)."""
        stop = threading.Event()

        def prepare() -> None:
            # After a pause: the cell that imported TensorFlow usually goes on in Python (building a model), and
            # a script may exit at once; either would share the interpreter with this work.
            if not stop.wait(PREPARE_AFTER_S):
                prepare_tracebacks([_tf_runs, _tf_eager], stop)

        thread = threading.Thread(target=prepare, name=PREPARE_THREAD, daemon=True)
        self._undo.append(self.host.add_own_stopper(stop.set))
        thread.start()

        def undo() -> None:
            stop.set()
            thread.join(timeout=2.0)

        self._undo.append(undo)

    def _forget_in_child(self) -> None:
        """In a forked child: every patch passes straight through (no lock taken, nothing stopped)."""
        self.active = self.eager.active = False

    def uninstall(self) -> None:
        """Undo :meth:`install`: every patched attribute restored, every registration removed."""
        self.active = self.eager.active = False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: a TensorFlow unload step failed", exc_info=True)
        self.patches.restore()
        self.stopping.clear()
        self.tracker.watched_ops = frozenset()

    def _current_cell(self) -> int | None:
        cell = self.registry.current_cell()
        return cell.execution_count if cell is not None else None

    def _traceback_file(self, filename: str) -> bool:
        """Whether a frame of this file is in the traceback of a run nbcoord cancels: nbcoord's wrappers, cells."""
        return filename.startswith(_HERE) or self.host.cell_of_file(filename) is not None

    # --------------------------------------------------------------------------------- the run hook's calls
    def _on_run_failure(
        self, state: RunState, exc: BaseException, session: Any, fetch_list: Any, target_list: Any
    ) -> BaseException:
        """The run hook's failure path: a sentence for errors of prepared steps (``Session.run``'s get theirs in
        the run wrapper), and a stopped thread's error where nbcoord's stop caused it."""
        if not self.active or state.internal:
            return exc
        thread = threading.current_thread()
        runner = self.objects.runner(thread)
        queue_closed = isinstance(exc, (self._errors["cancelled"], self._errors["out_of_range"]))
        if not called_from(self.run_wrapper) and (runner is None or not queue_closed):
            # A runner ends quietly on a closed queue: explaining each would only slow a stop down.
            self.explainer.explain_run(exc, session, run_names(fetch_list, target_list))
        if queue_closed and runner is None and thread is not threading.main_thread():
            record = self.registry.for_thread(thread)
            if record is not None and record.stop_requested_at is not None:
                return as_stopped(exc)
        return exc

    def _on_run_error(self, session: Any, fetches: Any, exc: BaseException) -> None:
        """An error that reaches the caller of ``Session.run``: its sentence."""
        if self.active and not threading.current_thread().name.startswith(INTERNAL_PREFIX):
            self.explainer.explain_run(exc, session, fetched_names(fetches))

    def _on_close_run(self, session: Any, fetches: Any) -> None:
        """A run of a user's (or a QueueRunner's) close op completed: remember who closed the queue."""
        if self.active:
            self.closes.close_run(session, fetches)

    # -------------------------------------------------------------------------------------------- stops
    def _stop(self, scope: Any) -> None:
        """The stopper: coordinators first, then close the queues, so that the threads end in the join."""
        self.registration.attach_pending()
        threads = [record.thread for record in scope.records if record.thread is not None]
        self.stopping.stop_threads(threads, scope.deadline, scope.kind, scope.cell)

    def stop_runner_threads(self, threads: Iterable[threading.Thread], grace: float, why: str) -> dict[str, Any]:
        """Stop these runner threads through the one stop (see :meth:`.sessions.SessionCloses.stop_runner_threads`)."""
        return self.sessions.stop_runner_threads(threads, grace, why)

    # ---------------------------------------------------------------------------------- stuck and restart
    def stuck_after(self) -> float:
        """Seconds without an enqueue (while its queue has room) after which a runner thread is stuck."""
        if self.stuck_after_s is not None:
            return float(self.stuck_after_s)
        configured = getattr(self.host.config, "stuck_after", None)
        return float(configured) if isinstance(configured, (int, float)) else DEFAULT_STUCK_AFTER_S

    def restart_runners(self, session: Any, *, grace: float | None = None) -> RestartReport:
        """Restart a session's queue runners: stop them through the one stop, reset the queues that closed,
        start them again with ``create_threads`` and a fresh Coordinator. ``session``: the Session or its id.

        Raises
        ------
        ValueError
            No open session is known by that id, or it has no queue runners started.
        RuntimeError
            TensorFlow is not imported (or the integration is not installed).
        """
        if not self.active:
            raise RuntimeError("TensorFlow is not imported: there is no session to restart.")
        if not isinstance(session, str):
            info = self.objects.session_info(session)
            if info is None:
                raise ValueError("That session is not known to nbcoord.")
            session = info.sid
        self.registration.attach_pending()
        return self.health.restart(
            session,
            grace=float(self.host.config.grace_period if grace is None else grace),
            stop_threads=self.sessions.stop_runner_threads,
            coordinator_cls=self._tf["Coordinator"],
            current_cell=self._current_cell(),
        )

    def coordinator(self, cid: str) -> Any | None:
        """A live Coordinator by its id (a restart's report names the fresh one)."""
        return self.objects.coordinator_by_id(cid)

    # ------------------------------------------------------------------------------------------ interrupt
    def _on_sigint(self) -> None:
        """On the watcher thread: cancel the main thread's run (or eager queue call) if it waits on a queue nobody
        serves."""
        self.last_sigint_at = time.monotonic()
        if self.active and not self.blocked.cancel_main_run(self._tf["RunOptions"]):
            self.eager.cancel_main()

    # ------------------------------------------------------------------------------------ source and tick
    def _source(self) -> dict[str, Any]:
        self.registration.attach_pending()
        self.objects.poll_all(record=False, wait=0.1)
        after = self.stuck_after()
        return {
            "queues": rows.queue_rows(self.objects, lambda queue, sid: self.health.queue_extra(queue, sid, after)),
            "blocked_runs": self.blocked.rows() + self.eager.blocked_rows(BLOCKED_AFTER_S),
            "sessions": rows.session_rows(self.objects, lambda info: self.health.session_extra(info, after)),
        }

    def tick(self) -> bool:
        """The monitor task (about once a second): owners, polls, progress, prepared closes and resets. Tests and
        the bench call it. Whether a session or queue is live (the monitor keeps its base interval then)."""
        self.registration.attach_pending()
        self.objects.poll_all(record=True, wait=0.0)
        self.health.sample()
        self.blocked.prepare_main()
        self.eager.prepare_main()
        self.stopping.prepare_closes()
        self.stopping.restore_closed_types()
        return bool(self.objects.sessions() or self.objects.queues())

