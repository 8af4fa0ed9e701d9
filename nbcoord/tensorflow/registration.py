"""TensorFlow objects registered as they are made, or found when TensorFlow was imported before nbcoord loaded;
queue-runner threads given their owners in the registry (queue, QueueRunner, session, coordinator)."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

from nbcoord.core.records import Owner
from nbcoord.core.registry import Registry
from nbcoord.tensorflow.graph import graph_of
from nbcoord.tensorflow.internals import QueueArgs, queue_constructor_args, runner_thread_functions, thread_call
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import QueueInfo, RunnerInfo, session_is_open

log = logging.getLogger("nbcoord")


class Registration:
    """Gives TensorFlow's objects to :class:`TFObjects`, and runner threads their owners in the registry.

    ``tf``: TensorFlow's classes by name, filled at install (the integration's dict, shared).
    """

    def __init__(self, objects: TFObjects, registry: Registry, tf: dict[str, Any]) -> None:
        self._objects = objects
        self._registry = registry
        self._tf = tf

    def queue_created(self, queue: Any, constructor: Any) -> QueueInfo | None:
        """Register a new queue: a graph-mode one (with its hidden polling ops), or an eager one."""
        if graph_of(queue) is None and callable(getattr(queue.queue_ref, "numpy", None)):
            return self._objects.add_queue(queue, eager_args=queue_constructor_args(constructor))
        return self._objects.add_queue(queue)

    def runner_threads_created(self, runner: Any, session: Any, coord: Any, threads: list[Any]) -> None:
        """Register what ``create_threads`` returned: one thread per enqueue op, then the close-on-stop one."""
        enqueue_ops = list(runner.enqueue_ops)
        for index, thread in enumerate(threads):
            op = enqueue_ops[index] if index < len(enqueue_ops) else None
            self._objects.add_runner_thread(thread, runner, session, coord, op)
        self.attach_pending()

    def scan_existing(self) -> None:
        """Find the sessions, queues, coordinators and runner threads that existed before the install."""
        tf = self._tf
        kinds = (tf["BaseSession"], tf["QueueBase"], tf["Coordinator"])
        started = time.monotonic()
        found = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
        for obj in found:
            try:
                if isinstance(obj, tf["BaseSession"]):
                    self._objects.add_session(obj, preexisting=True)
                elif isinstance(obj, tf["QueueBase"]):
                    self._add_existing_queue(obj)
                else:
                    self._objects.add_coordinator(obj, preexisting=True)
            except Exception:
                log.warning("nbcoord: could not register an existing %s", type(obj).__name__, exc_info=True)
        self._scan_runner_threads()
        log.debug("nbcoord: TensorFlow scan found %d objects in %.3f s", len(found), time.monotonic() - started)

    def _add_existing_queue(self, queue: Any) -> None:
        if graph_of(queue) is None and callable(getattr(queue.queue_ref, "numpy", None)):
            self._objects.add_queue(queue, preexisting=True, eager_args=QueueArgs(None, -1, 0))
        else:
            self._objects.add_queue(queue, preexisting=True)

    def _scan_runner_threads(self) -> None:
        functions = runner_thread_functions(self._tf["QueueRunner"])
        if functions is None:
            return
        run_fn, close_fn = functions
        for thread in threading.enumerate():
            target, args, _kwargs = thread_call(thread)
            func = getattr(target, "__func__", None)
            if func not in (run_fn, close_fn) or self._objects.runner(thread) is not None:
                continue
            runner = getattr(target, "__self__", None)
            if func is run_fn and len(args) >= 2:
                coord = args[2] if len(args) > 2 else None
                self._objects.add_runner_thread(thread, runner, args[0], coord, args[1])
            elif func is close_fn and len(args) == 3:
                self._objects.add_runner_thread(thread, runner, args[0], args[2], None)
        self.attach_pending()

    def attach_pending(self) -> None:
        """Give started runner threads their owners (a thread created with start=False is registered later)."""
        for runner in self._objects.runners(alive_only=False):
            if runner.attached:
                continue
            thread = runner.thread_ref()
            if thread is None or thread.ident is None:
                continue
            if self._registry.for_thread(thread) is None:
                continue
            runner.attached = True
            for owner in self._owners(runner):
                self._registry.add_owner(thread, owner, claim=True)  # a runner thread is always user work

    def _owners(self, runner: RunnerInfo) -> list[Owner]:
        owners: list[Owner] = []
        session = runner.session_ref()
        sinfo = self._objects.session_info(session) if session is not None else None
        queue = runner.queue
        qr = runner.runner_ref()
        if queue is not None and (queue_obj := queue.ref()) is not None:
            sid = sinfo.sid if sinfo is not None else ""

            def queue_closed(_queue: object, queue: QueueInfo = queue, sid: str = sid) -> bool:
                state = queue.states.get(sid)
                return bool(state is not None and state.closed)

            owners.append(Owner("queue", f"queue `{queue.name}`", weakref.ref(queue_obj), queue_closed))
        if qr is not None:
            owners.append(Owner("queue-runner", f"QueueRunner `{qr.name}`", weakref.ref(qr)))
        if session is not None and sinfo is not None:
            owners.append(
                Owner("session", f"Session {sinfo.sid}", weakref.ref(session), lambda s: not session_is_open(s))
            )
        coord = runner.coord_ref() if runner.coord_ref is not None else None
        if coord is not None:
            cinfo = self._objects.coord_info(coord) or self._objects.add_coordinator(coord)
            owners.append(
                Owner(
                    "coordinator",
                    f"Coordinator {cinfo.cid}",
                    weakref.ref(coord),
                    lambda c: bool(getattr(c, "joined", False)),
                )
            )
        return owners
