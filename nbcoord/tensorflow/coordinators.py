"""Coordinators (S5): the exceptions worker threads pass to ``request_stop``, kept with traceback, thread and
cell; who first asked a coordinator to stop, and why (for the sentence of a queue its runners closed)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nbcoord.core.registry import Registry
from nbcoord.tensorflow.internals import is_clean_stop
from nbcoord.tensorflow.objects import TFObjects
from nbcoord.tensorflow.records import CloseRecord
from nbcoord.tensorflow.runs import INTERNAL_PREFIX

log = logging.getLogger("nbcoord")


class Coordinators:
    """What ``Coordinator.request_stop`` tells nbcoord.

    ``errors``: TensorFlow's error types by short name, filled at install (the integration's dict, shared);
    ``stop_running``: whether nbcoord's one stop is running now.
    """

    def __init__(
        self,
        objects: TFObjects,
        registry: Registry,
        errors: dict[str, type[BaseException]],
        current_cell: Callable[[], int | None],
        stop_running: Callable[[], bool],
    ) -> None:
        self._objects = objects
        self._registry = registry
        self._errors = errors
        self._current_cell = current_cell
        self._stop_running = stop_running

    def exception(self, coord: Any, ex: Any) -> Any:
        """What ``request_stop(ex)`` passes on to TensorFlow, and the worker's exception kept (S5).

        TensorFlow reads ``sys.exc_info()`` when given an exception instance. Inside an ``except`` block that is
        what it documents, and ``ex`` is passed on unchanged. Outside one it is empty: TensorFlow then raises
        TypeError (formatting its own error message) and never stops; nbcoord passes ``ex``'s own exc_info
        instead, so the stop happens and ``join()`` re-raises ``ex``.

        An exception a background thread reports is kept with its traceback, thread and cell; the main thread's
        is not (it raised it itself, and ``join()`` raises it there again), nor one reported to a coordinator that
        TensorFlow's own code made (MirroredStrategy's replica threads, MonitoredSession's runners): TensorFlow
        re-raises those in the cell that called it.
        """
        exc = ex[1] if isinstance(ex, tuple) and len(ex) == 3 else ex
        if isinstance(ex, BaseException) and sys.exc_info()[1] is None:
            ex = (type(ex), ex, ex.__traceback__)
        try:
            thread = threading.current_thread()
            out_of_range = self._errors["out_of_range"]
            kept = isinstance(exc, BaseException) and not is_clean_stop(coord, exc, out_of_range)
            cinfo = self._objects.coord_info(coord)
            kept = kept and not (cinfo is not None and cinfo.tensorflow_made)
            if kept and thread is not threading.main_thread() and not coord.should_stop() and not coord.joined:
                # Thread.start queues a thread before it runs, so even one failing at once has its cell here.
                self._registry.thread_failed(thread, exc)
        except Exception:
            log.warning("nbcoord: could not record a coordinator's exception", exc_info=True)
        return ex

    def stopping(self, coord: Any, ex: Any) -> None:
        """Remember who first asked a coordinator to stop, and why (for the sentence of a closed queue)."""
        try:
            if coord.should_stop():
                return
            cinfo = self._objects.coord_info(coord) or self._objects.add_coordinator(coord)
            if cinfo.stopped_by is not None:
                return
            thread = threading.current_thread()
            exc = ex[1] if isinstance(ex, tuple) and len(ex) == 3 else ex
            why = f"with {type(exc).__name__}: {str(exc)[:120]}" if isinstance(exc, BaseException) else ""
            if thread.name.startswith(INTERNAL_PREFIX) or self._stop_running():
                who, cell = "nbcoord's stop", self._current_cell()
            else:
                record = self._registry.for_thread(thread)
                who = "the main thread" if thread is threading.main_thread() else f"thread '{thread.name}'"
                cell = self._current_cell() if thread is threading.main_thread() else (
                    record.cell.execution_count if record is not None and record.cell is not None else None
                )
            cinfo.stopped_by = CloseRecord("coordinator", who, cell, time.time(), why)
        except Exception:
            log.debug("nbcoord: could not record a coordinator's stop", exc_info=True)
