"""Every private name the ledger's kinds touch (asyncio, multiprocessing, concurrent.futures, loky, PyTorch), each
with its fallback.

Each accessor looks its internal up when called, never at import time, and never imports the library: it is
handed the library's object. When the internal is missing (another release), the accessor says what the ledger
does instead; :func:`degraded` lists what fell back, for the report. Tests remove each internal and check the
fallback (tests/test_ledger_units.py, tests/test_ledger_internals.py).

Public API is used wherever the libraries have one: ``loop.set_task_factory`` / ``get_task_factory``,
``asyncio.Task.cancel`` / ``cancelling`` / ``get_coro`` / ``get_loop``, coroutine objects' ``cr_await`` /
``cr_frame``, ``Pool.terminate``, ``Executor.shutdown(cancel_futures=True)``, loky's
``shutdown(kill_workers=True)``, ``multiprocessing.Process.terminate`` / ``kill`` / ``join``,
``multiprocessing.active_children``, ``DataLoader.__iter__``.

- ``asyncio.events._get_event_loop_policy`` (3.14+, where the public getter is deprecated): the policy whose
  ``new_event_loop`` is watched, so that loops cells' threads create are seen. Fallback: the public
  ``asyncio.get_event_loop_policy`` with its deprecation warning silenced.
- ``Task._must_cancel`` and ``Task._fut_waiter``: whether a cancellation has reached the task's coroutine yet (a
  task that is still running after that swallowed it). Fallback: the report says the task is still running after
  the cancellation, without telling whether it swallowed it.
- ``Pool._pool``: a ``multiprocessing`` pool's worker processes. Fallback: its workers are not listed (their
  pids are not in the ledger, and a stop relies on ``terminate()`` alone, then on the stop's signals to the
  cell's child processes).
- ``Pool._state``: whether a pool was closed or terminated. Fallback: a pool counts as running while a worker is.
- ``Pool._worker_handler`` / ``_task_handler`` / ``_result_handler``: a pool's threads, which get the pool as
  their owner. Fallback: those threads are listed without their owner.
- ``ProcessPoolExecutor._processes`` (and loky's): an executor's worker processes. Fallback: as for pools.
- ``ProcessPoolExecutor._shutdown_thread`` (and loky's ``_flags.shutdown``): whether it was shut down. Fallback:
  an executor counts as running while a worker is.
- ``ProcessPoolExecutor._executor_manager_thread`` (and loky's): the executor's manager thread, which gets the
  executor as its owner. Fallback: listed without its owner.
- ``ProcessPoolExecutor._max_workers`` (and loky's): how many workers an executor may start, for its label.
  Fallback: the label names no number of workers.
- ``ProcessPoolExecutor._call_queue`` (and loky's): the queue whose feeder thread gets the executor as its owner.
  Fallback: that thread is listed without its owner.
- loky's ``_ReusablePoolExecutor`` (and joblib's ``MemmappingExecutor``): the reusable executor's class, by name,
  for its label. Fallback (a renamed class): the label names the class as it is called.
- ``multiprocessing.Queue._thread``: a queue's feeder thread. Fallback: listed without its owner.
- PyTorch's ``_MultiProcessingDataLoaderIter`` with ``_workers``, ``_shutdown``, ``_shutdown_workers``,
  ``_pin_memory_thread``, ``_num_workers``, ``_persistent_workers``: a DataLoader iterator's workers, whether it
  was shut down, its own shutdown (workers and pin-memory thread), and its settings. Fallback: an iterator
  without ``_workers`` is not put in the ledger (its workers are still child processes of the cell, which the
  stop signals); without ``_shutdown_workers`` a stop terminates its workers through ``multiprocessing``.
- ``_MultiProcessingDataLoaderIter._index_queues`` and ``_worker_result_queue``: the queues whose feeder threads
  get the iterator as their owner. Fallback: those threads are listed without their owner.
- ``torch.utils.data._utils.signal_handling._remove_worker_pids`` (and the iterator's ``_worker_pids_set``): taking
  an iterator's workers out of PyTorch's SIGCHLD check before nbcoord signals them. Fallback: they are signalled
  anyway (PyTorch's handler may then raise).
- The kernel-wide helpers' singletons (``multiprocessing.resource_tracker._resource_tracker`` with ``_pid``,
  ``_fd``, ``_lock``; ``multiprocessing.forkserver._forkserver`` with ``_forkserver_pid``, ``_stop``; loky's
  resource tracker): their pids, and how to end them at shutdown. Fallback: not told apart from a cell's
  processes; at shutdown killed without their clean-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from typing import Any

from nbcoord.core.fallbacks import RECORD

log = logging.getLogger("nbcoord")

#: What fell back, and to what.
_fallbacks = RECORD  # tests give a module a fresh record of its own


def _fall_back(name: str, fallback: str) -> None:
    _fallbacks.fall_back(name, fallback)


def degraded() -> dict[str, str]:
    """Internals found missing so far, each with what the ledger does instead."""
    return _fallbacks.found()


# ------------------------------------------------------------------------------------------------- asyncio
def event_loop_policy() -> Any:
    """The current asyncio event loop policy, asked without a deprecation warning (the policy system is
    deprecated from Python 3.14 on)."""
    import asyncio

    if sys.version_info >= (3, 14):
        getter = getattr(getattr(asyncio, "events", None), "_get_event_loop_policy", None)
        if getter is not None:
            return getter()
        _fall_back("asyncio.events._get_event_loop_policy", "the public getter is used, its warning silenced")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return asyncio.get_event_loop_policy()


def cancel_delivered(task: Any) -> bool | None:
    """Whether a cancellation requested earlier has been thrown into the task's coroutine (None: cannot tell).

    Not yet while the task still has to throw it (``_must_cancel``), or still waits on the future the
    cancellation cancelled (``_fut_waiter``: it throws it when that future wakes it up)."""
    try:
        must_cancel = task._must_cancel
        waiter = task._fut_waiter
    except AttributeError:
        _fall_back(
            "Task._must_cancel / _fut_waiter", "a task still running after a cancellation is not said to swallow it"
        )
        return None
    return not must_cancel and not (waiter is not None and waiter.cancelled())


# ----------------------------------------------------------------------------------------- multiprocessing
def pool_workers(pool: Any) -> list[Any]:
    """A ``multiprocessing`` pool's worker processes (``Process`` objects; threads for a ``ThreadPool``)."""
    workers = getattr(pool, "_pool", None)
    if isinstance(workers, list):
        return list(workers)
    _fall_back("Pool._pool", "pool workers are not listed; a stop relies on terminate() and the cell's signals")
    return []


def pool_state(pool: Any) -> str | None:
    """``"RUN"``, ``"CLOSE"`` or ``"TERMINATE"``; None where the pool keeps no such state."""
    state = getattr(pool, "_state", None)
    if isinstance(state, str):
        return state
    _fall_back("Pool._state", "a pool counts as running while one of its workers is")
    return None


def pool_threads(pool: Any) -> list[threading.Thread]:
    """The threads a ``multiprocessing`` pool started for itself."""
    names = ("_worker_handler", "_task_handler", "_result_handler")
    threads = [getattr(pool, name, None) for name in names]
    found = [t for t in threads if isinstance(t, threading.Thread)]
    if len(found) != len(names):
        _fall_back("Pool._worker_handler", "a pool's own threads are listed without the pool as their owner")
    return found


# ------------------------------------------------------------------------------------ concurrent.futures
def executor_processes(executor: Any) -> list[Any]:
    """A process pool executor's worker processes (``concurrent.futures``' or loky's)."""
    processes = getattr(executor, "_processes", None)
    if isinstance(processes, dict):
        return list(processes.values())
    if processes is None and hasattr(executor, "_max_workers"):
        return []  # loky sets it to None between a shutdown and the next use
    _fall_back("ProcessPoolExecutor._processes", "executor workers are not listed; a stop relies on shutdown()")
    return []


def executor_shut_down(executor: Any) -> bool | None:
    """Whether a process pool executor was shut down (None: cannot tell here)."""
    if hasattr(executor, "_shutdown_thread"):
        return bool(executor._shutdown_thread)
    flags = getattr(executor, "_flags", None)  # loky
    if flags is not None and hasattr(flags, "shutdown"):
        return bool(flags.shutdown)
    _fall_back("ProcessPoolExecutor._shutdown_thread", "an executor counts as running while one of its workers is")
    return None


def executor_threads(executor: Any) -> list[threading.Thread]:
    """The manager thread a process pool executor started for itself."""
    thread = getattr(executor, "_executor_manager_thread", None)
    if isinstance(thread, threading.Thread):
        return [thread]
    if hasattr(executor, "_executor_manager_thread"):
        return []  # not started yet
    _fall_back(
        "ProcessPoolExecutor._executor_manager_thread",
        "an executor's manager thread is listed without the executor as its owner",
    )
    return []


def executor_max_workers(executor: Any) -> int | None:
    """How many workers a process pool executor may start (``concurrent.futures``' or loky's); None: not known."""
    if not hasattr(executor, "_max_workers"):
        _fall_back("ProcessPoolExecutor._max_workers", "an executor's label names no number of workers")
        return None
    workers = executor._max_workers
    return workers if isinstance(workers, int) else None


def executor_feeder_threads(executor: Any) -> list[threading.Thread]:
    """The feeder thread of a process pool executor's call queue (none before its first submit, or after its
    shutdown). Fallback: listed without the executor as its owner."""
    if not hasattr(executor, "_call_queue"):
        _fall_back("ProcessPoolExecutor._call_queue", "an executor's queue feeder thread is listed without its owner")
        return []
    return queue_feeder_threads(executor, ("_call_queue",))


def loky_reusable(cls: type) -> bool:
    """Whether ``cls`` is loky's reusable executor or joblib's executor built on it (by the class's name: nbcoord
    imports neither). A renamed class is not recognised: its label then names it as it is called."""
    return cls.__name__ in ("_ReusablePoolExecutor", "MemmappingExecutor")


def queue_feeder_threads(owner: Any, names: tuple[str, ...]) -> list[threading.Thread]:
    """The feeder threads of the ``multiprocessing`` queues an object holds under ``names`` (a queue, or a list of
    them): they get the object as their owner. Fallback: listed without it."""
    found: list[threading.Thread] = []
    for name in names:
        held = getattr(owner, name, None)
        for queue in held if isinstance(held, list) else [held]:
            if queue is None:
                continue
            if not hasattr(queue, "_thread"):
                _fall_back("multiprocessing.Queue._thread", "a queue's feeder thread is listed without its owner")
                continue
            thread = queue._thread
            if isinstance(thread, threading.Thread):
                found.append(thread)
    return found


# ---------------------------------------------------------------------------------------------- PyTorch
def loader_iterator_class(dataloader_module: Any) -> type | None:
    """PyTorch's iterator class for DataLoaders with worker processes."""
    cls = getattr(dataloader_module, "_MultiProcessingDataLoaderIter", None)
    if isinstance(cls, type):
        return cls
    _fall_back(
        "torch.utils.data.dataloader._MultiProcessingDataLoaderIter",
        "DataLoader workers are not in the ledger (the stop still signals them as the cell's child processes)",
    )
    return None


def loader_workers(iterator: Any) -> list[Any]:
    """A DataLoader iterator's worker processes."""
    workers = getattr(iterator, "_workers", None)
    if isinstance(workers, list):
        return list(workers)
    _fall_back(
        "_MultiProcessingDataLoaderIter._workers",
        "DataLoader workers are not listed (the stop still signals them as the cell's child processes)",
    )
    return []


def loader_shut_down(iterator: Any) -> bool:
    """Whether a DataLoader iterator has shut its workers down."""
    shutdown = getattr(iterator, "_shutdown", None)
    if isinstance(shutdown, bool):
        return shutdown
    _fall_back("_MultiProcessingDataLoaderIter._shutdown", "an iterator counts as running while a worker is")
    return False


def loader_shutdown_method(iterator: Any) -> Any:
    """PyTorch's own shutdown of an iterator's workers and pin-memory thread, or None."""
    method = getattr(iterator, "_shutdown_workers", None)
    if callable(method):
        return method
    _fall_back(
        "_MultiProcessingDataLoaderIter._shutdown_workers",
        "a stop terminates DataLoader workers through multiprocessing instead of PyTorch's own shutdown",
    )
    return None


def loader_feeder_threads(iterator: Any) -> list[threading.Thread]:
    """The feeder threads of a DataLoader iterator's index queues and result queue. Fallback: listed without the
    iterator as their owner."""
    names = ("_index_queues", "_worker_result_queue")
    if not all(hasattr(iterator, name) for name in names):
        _fall_back(
            "_MultiProcessingDataLoaderIter._index_queues / _worker_result_queue",
            "a DataLoader's queue feeder threads are listed without the iterator as their owner",
        )
    return queue_feeder_threads(iterator, names)


def loader_pin_memory_thread(iterator: Any) -> threading.Thread | None:
    """The iterator's pin-memory thread, if it has one."""
    thread = getattr(iterator, "_pin_memory_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def loader_settings(iterator: Any) -> tuple[int | None, bool]:
    """(number of workers, persistent workers) of a DataLoader iterator, as far as known."""
    count = getattr(iterator, "_num_workers", None)
    persistent = getattr(iterator, "_persistent_workers", False)
    return (count if isinstance(count, int) else None), bool(persistent)


def loader_forget_worker_pids(iterator: Any) -> None:
    """Take an iterator's workers out of PyTorch's SIGCHLD check before nbcoord signals them: PyTorch's handler
    raises ``RuntimeError`` in the main thread (between cells: in the kernel's event loop) when a registered worker
    dies by a signal. Fallback: the workers are signalled anyway (PyTorch may then raise that error)."""
    module = sys.modules.get("torch.utils.data._utils.signal_handling")
    remove = getattr(module, "_remove_worker_pids", None)
    registered = getattr(iterator, "_worker_pids_set", None)
    if remove is None or not isinstance(registered, bool):
        _fall_back(
            "torch.utils.data._utils.signal_handling._remove_worker_pids",
            "DataLoader workers are signalled while PyTorch still watches them (its SIGCHLD handler may raise)",
        )
        return
    if registered:
        iterator._worker_pids_set = False  # PyTorch's own shutdown then does not remove them a second time
        with contextlib.suppress(ValueError, RuntimeError):  # PyTorch's shutdown removed them meanwhile
            remove(id(iterator))


# ---------------------------------------------------------------------------------------- helper processes
#: Modules whose module-level singleton names a helper process: (module, singleton, pid attribute, what it is).
_HELPERS = (
    ("multiprocessing.resource_tracker", "_resource_tracker", "_pid", "multiprocessing's resource tracker"),
    ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid", "multiprocessing's fork server"),
    ("joblib.externals.loky.backend.resource_tracker", "_resource_tracker", "_pid", "loky's resource tracker"),
    ("loky.backend.resource_tracker", "_resource_tracker", "_pid", "loky's resource tracker"),
)


def helper_stops() -> list[tuple[int, str, Any]]:
    """(pid, what it is, how to end it at the kernel's shutdown) of each kernel-wide helper running.

    A resource tracker exits, after unlinking what the kernel leaked, once the kernel's end of its pipe
    (``_fd``) closes. That end is replaced by ``/dev/null`` rather than closed (under the tracker's ``_lock``), so
    that what the rest of the shutdown unregisters (queues and locks collected late) goes nowhere instead of
    launching a new tracker, which would keep ipykernel's own shutdown waiting for it; the tracker is then reaped
    (``_pid``). A fork server is ended by its own ``_stop``. Fallback: None (the helper is killed, without its
    clean-up)."""
    found: list[tuple[int, str, Any]] = []
    for module_name, singleton, attribute, what in _HELPERS:
        holder = getattr(sys.modules.get(module_name), singleton, None)
        pid = getattr(holder, attribute, None)
        if not isinstance(pid, int) or pid <= 0:
            continue
        stop: Any = None
        if "resource tracker" in what:
            if all(hasattr(holder, name) for name in ("_lock", "_fd", "_pid")):
                stop = _retire_tracker(holder)
        elif callable(own_stop := getattr(holder, "_stop", None)):
            stop = own_stop
        if stop is None:
            _fall_back(f"{module_name}.{singleton}", f"at shutdown {what} is killed, without its clean-up")
        found.append((pid, what, stop))
    return found


def _retire_tracker(tracker: Any) -> Any:
    def retire() -> None:
        with tracker._lock:
            fd, pid = tracker._fd, tracker._pid
            if fd is None or pid is None:
                return
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)  # the pipe's end closes: the tracker sees the kernel leave
            finally:
                os.close(null)
            tracker._pid = None  # nobody waits for it a second time
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    return retire


def helper_processes() -> dict[int, str]:
    """pid -> what it is, for the process-wide helpers that ``multiprocessing`` and loky start once for the whole
    kernel (a resource tracker, a fork server): started during some cell, but no cell's work, and they exit by
    themselves when the kernel does (after cleaning up what leaked). Fallback: they are not named (they count as
    the child processes of the cell that was running when they started)."""
    found: dict[int, str] = {}
    for module_name, singleton, attribute, what in _HELPERS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        holder = getattr(module, singleton, None)
        if holder is None or not hasattr(holder, attribute):
            _fall_back(f"{module_name}.{singleton}.{attribute}", f"{what} is not told apart from a cell's processes")
            continue
        pid = getattr(holder, attribute)
        if isinstance(pid, int) and pid > 0:
            found[pid] = what
    return found
