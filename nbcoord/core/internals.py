"""Every private name of CPython and IPython that nbcoord's core touches, feature-detected, each with a fallback.

Nothing here runs at import time: each accessor looks the internal up when it is first called, and says what it
falls back to when the internal is missing (another Python, a newer release). :func:`degraded` lists what fell
back, for the report. Tests remove each internal (monkeypatch) and check the fallback.

- ``threading._active``: a thread's liveness from the interpreter's running table; else ``Thread.is_alive()``.
- ``threading._limbo``: a thread whose ``start()`` returned but which is not yet in that table is alive; else it
  may be taken for ended for that moment.
- ``ThreadPoolExecutor._adjust_thread_count``: naming the executor that starts a thread; else no executor owner.
- ``threading._register_atexit``: the exit stop before threads are joined; else ``atexit`` (after the join).
- ``threading._shutdown_locks`` and ``Thread._tstate_lock`` (3.10-3.12): letting the interpreter exit without
  joining a thread that will not stop; else the process ends itself after the atexit work (:func:`exit_now`).
- ``atexit._run_exitfuncs``: the atexit work before ending at once; else only the streams are flushed.
- ``PyThreadState_SetAsyncExc`` (C API, through ctypes): a forced stop; else such threads are reported unstoppable.
- ``shell.displayhook.exec_result`` (IPython): the cell running while nbcoord loads; else that cell is not known.
- ``ThreadPoolExecutor._thread_name_prefix`` / ``_shutdown``: an executor owner's label and whether it is shut
  down; else a generic label, and never shut down (its threads are not called zombies for it).
- ``sys._getframe`` / ``sys._current_frames``: who starts a thread, and where each thread is (state, stacks,
  activity); else no creation stacks or executor owners, and every thread's state is unknown (no stacks).
- ``ModuleSpec._initializing`` (importlib): whether a module in ``sys.modules`` is still being imported (the
  post-import hook then waits for the end of its import); else a module found there counts as imported.
- ``threading._RLock``, ``Condition._lock`` and the C ``RLock``'s ``repr`` (``owner=<ident>``): naming the lock a
  thread waits on and its owner (:mod:`nbcoord.core.waits`); else the pure-Python RLock is not recognised, a
  Condition's lock is unknown, and an RLock's owner is unknown (a plain Lock's owner still comes from ``with``).
- ``OutStream._original_stdstream_copy`` (ipykernel): the process's standard error as the kernel's parent gave it,
  where ipykernel captures file descriptor 2 into the running cell (7.x); else ``sys.__stderr__``.

Elsewhere, each in one place with its own table: ipykernel's names for the panel's fast route in
:mod:`nbcoord.kernel.fastcomm` (``shell_channel_thread``, ``shell_stream._recv_callback``, ``control_handlers``,
``control_thread``; fallback: the ordinary widget message, handled when the cell ends) and for the server's
requests in :mod:`nbcoord.kernel.control` (fallback: the server shows what it sees from outside); IPython 9's per-cell
stream wrapper (``InteractiveShell._tee``'s ``original_write``) in :mod:`nbcoord.kernel.output` (fallback: background
output is routed only until the loading cell ends, and "Degraded here" says so); TensorFlow's in
:mod:`nbcoord.tensorflow.internals`. ``%nbcoord`` lists what fell back (:func:`degraded`, with the routes).

"""

from __future__ import annotations

import atexit
import ctypes
import inspect
import logging
import os
import re
import sys
import threading
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import CellType, CodeType, FrameType
from typing import Any, TextIO

from nbcoord.core.fallbacks import RECORD

log = logging.getLogger("nbcoord")

#: What fell back, and to what: filled as accessors find an internal missing.
_fallbacks = RECORD  # tests give a module a fresh record of its own


def _fall_back(name: str, fallback: str) -> None:
    _fallbacks.fall_back(name, fallback)


def degraded() -> dict[str, str]:
    """Internals found missing so far, each with what nbcoord does instead."""
    return _fallbacks.found()


# --------------------------------------------------------------------------------------------- threads
def running_threads() -> dict[int, threading.Thread] | None:
    """The interpreter's table of running threads (ident -> Thread); an entry goes when the thread's run() ends.

    Fallback: None, and the caller asks ``Thread.is_alive()`` (on CPython 3.11 a KeyboardInterrupt during
    ``join()`` can mark a live thread as stopped there).
    """
    table = getattr(threading, "_active", None)
    if isinstance(table, dict):
        return table
    _fall_back("threading._active", "thread liveness comes from Thread.is_alive()")
    return None


def starting_threads() -> dict[threading.Thread, threading.Thread] | None:
    """The interpreter's table of threads being started (``threading._limbo``): ``Thread.start()`` returns once the
    new thread has signalled that it started, a moment before it puts itself in the running table.

    Fallback: None, and such a thread reads as ended for that moment (a read of the registry then may drop it).
    """
    table = getattr(threading, "_limbo", None)
    if isinstance(table, dict):
        return table
    _fall_back("threading._limbo", "a thread that is just starting may be taken for ended")
    return None


def executor_spawn_code() -> CodeType | None:
    """The code of the ``ThreadPoolExecutor`` method that starts its worker threads, to recognise it as caller.

    Fallback: None (executor threads are registered like any other, without their executor as owner).
    """
    method = getattr(ThreadPoolExecutor, "_adjust_thread_count", None)
    code = getattr(method, "__code__", None)
    if isinstance(code, CodeType):
        return code
    _fall_back("ThreadPoolExecutor._adjust_thread_count", "executor threads have no executor owner")
    return None


def register_before_thread_join(callback: Callable[[], None]) -> str:
    """Run ``callback`` at interpreter exit *before* the interpreter joins non-daemon threads.

    Returns the mechanism used. Fallback: ``atexit``, which runs only after that join (a leaked non-daemon thread
    then keeps the process alive until it is killed: the SIGTERM route still works).
    """
    register = getattr(threading, "_register_atexit", None)
    if callable(register):
        try:
            register(callback)
            return "threading._register_atexit"
        except RuntimeError:  # the interpreter is already shutting down
            log.debug("nbcoord: interpreter exit hook not registered", exc_info=True)
            return "none"
    _fall_back("threading._register_atexit", "the exit stop runs from atexit, after threads are joined")
    atexit.register(callback)
    return "atexit"


def abandon_thread(thread: threading.Thread) -> bool:
    """Let the interpreter exit without joining ``thread``; False where this Python offers no way.

    CPython 3.10-3.12 join the locks in ``threading._shutdown_locks`` at exit; 3.13 joins thread handles in C
    and has no such set, so there (and wherever this fails) the caller uses :func:`exit_now` instead.
    """
    lock = getattr(thread, "_tstate_lock", None)
    locks = getattr(threading, "_shutdown_locks", None)
    guard = getattr(threading, "_shutdown_locks_lock", None)
    if lock is None or not isinstance(locks, set) or guard is None:
        _fall_back("threading._shutdown_locks", "a thread that will not stop is left by ending the process")
        return False
    with guard:
        locks.discard(lock)
    return True


def exit_now(code: int = 0) -> None:
    """End the process without joining threads, after the work a normal exit would still do.

    Runs the ``atexit`` callbacks (IPython saves its history there), flushes logging and the process's own
    standard streams (not ``sys.stdout``: in a kernel that is a stream to the front end whose flush can wait
    for a thread that is gone), then ``os._exit``.
    """
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if callable(run_exitfuncs):
        try:
            run_exitfuncs()
        except BaseException:  # the process ends next, whatever a callback did
            log.warning("nbcoord: an atexit callback failed", exc_info=True)
    else:
        _fall_back("atexit._run_exitfuncs", "atexit callbacks do not run when a thread forces the exit")
    logging.shutdown()
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed stream: nothing left to write
    os._exit(code)


def raise_in_thread(ident: int, exc_type: type[BaseException]) -> bool:
    """Ask the interpreter to raise ``exc_type`` in another thread at its next Python instruction.

    Fallback (no ``ctypes.pythonapi``, as on PyPy): False, so the thread is reported as unstoppable.
    """
    api = getattr(ctypes, "pythonapi", None)
    set_async_exc = getattr(api, "PyThreadState_SetAsyncExc", None)
    if set_async_exc is None:
        _fall_back("PyThreadState_SetAsyncExc", "threads that ignore a stop cannot be forced")
        return False
    done = set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))
    if done > 1:  # more than one thread state touched: undo, as CPython's docs require
        set_async_exc(ctypes.c_ulong(ident), None)
        return False
    return bool(done == 1)


# --------------------------------------------------------------------------------------------- IPython
def running_cell(shell: Any) -> tuple[int, str | None, str] | None:
    """The cell IPython is executing now, as (execution count, cell id, source); None between cells.

    IPython gives its displayhook the cell's ExecutionResult while the cell's code runs. Fallback: None (a
    thread started in the cell that loads nbcoord counts as not started by a cell).
    """
    displayhook = getattr(shell, "displayhook", None)
    if displayhook is None or not hasattr(displayhook, "exec_result"):
        _fall_back("IPython displayhook.exec_result", "the cell that loads nbcoord is not known to it")
        return None
    result = displayhook.exec_result
    count = getattr(result, "execution_count", None)
    if result is None or not isinstance(count, int):
        return None
    info = getattr(result, "info", None)
    cell_id = getattr(info, "cell_id", None)
    source = getattr(info, "raw_cell", "")
    return count, cell_id if isinstance(cell_id, str) else None, source if isinstance(source, str) else ""


def executor_name(executor: object) -> str:
    """The thread-name prefix a ``ThreadPoolExecutor`` was given, for its owner label. Fallback: its class name."""
    if not hasattr(executor, "_thread_name_prefix"):
        _fall_back("ThreadPoolExecutor._thread_name_prefix", "executor owners get a generic label")
    return str(getattr(executor, "_thread_name_prefix", "") or type(executor).__name__)


def executor_shut_down(executor: object) -> bool:
    """Whether a ``ThreadPoolExecutor`` was shut down. Fallback: False (never called closed)."""
    if not hasattr(executor, "_shutdown"):
        _fall_back("ThreadPoolExecutor._shutdown", "an executor's threads are not called zombies when it shuts down")
        return False
    return bool(executor._shutdown)


def frame_getter() -> Callable[[int], FrameType] | None:
    """``sys._getframe`` (the frame ``depth`` calls up), looked up once by the Thread.start patch at install.
    Fallback: None (threads are registered without a creation stack or an executor owner)."""
    getframe: Callable[[int], FrameType] | None = getattr(sys, "_getframe", None)
    if getframe is None:
        _fall_back("sys._getframe", "threads are registered without where they were started")
    return getframe


def calling_frame(depth: int = 1) -> FrameType | None:
    """The frame ``depth`` calls above the caller (1: the caller's caller). Fallback: None."""
    getframe = frame_getter()
    return getframe(depth + 1) if getframe is not None else None


def current_frames() -> dict[int, FrameType]:
    """Each running thread's current frame, by ident, except the calling thread's (whose frame is the caller's
    business: ``sys._getframe``). Fallback: {} (states unknown, no stacks).

    Why not the caller's own: its entry would be this function's frame, which then outlives the call (the dict
    refers to it) and links its callers' frames (CPython 3.11+ materialises ``f_back`` when a frame outlives its
    run); a caller holding the dict in a local then closes a cycle, and every thread's frame in the dict, with all
    that those frames hold, waits for the cycle collector instead of being freed when its thread ends (PyTorch's
    DataLoader workers then wait 5 s each for shutdown messages held up that way).
    """
    frames = getattr(sys, "_current_frames", None)
    if frames is None:
        _fall_back("sys._current_frames", "thread states, stacks and activity are unknown")
        return {}
    result: dict[int, FrameType] = frames()
    result.pop(threading.get_ident(), None)
    return result


def log_stream() -> TextIO | None:
    """A stream of nbcoord's own onto the process's standard error as the kernel's parent gave it (the Jupyter
    server's log), never the running cell; None: write nowhere. The caller closes it.

    ipykernel 7 points file descriptor 2 at a pipe whose text it sends to the running cell (``sys.__stderr__``
    writes there too) and keeps the original descriptor as ``_original_stdstream_copy`` on its stream. A
    duplicate of it is ours to close: ipykernel closes its own at shutdown, and a number it closed could be reused
    by another file. Fallback, where ipykernel captures nothing or the name is missing: ``sys.__stderr__``
    (recorded as a fallback only where fd 2 is captured, i.e. not a terminal or file of the parent's).
    """
    original = getattr(sys.stderr, "_original_stdstream_copy", None)
    if isinstance(original, int):
        try:
            return open(os.dup(original), "w", encoding="utf-8", errors="backslashreplace", buffering=1)
        except OSError:
            log.debug("nbcoord: could not open the kernel's original standard error", exc_info=True)
    if getattr(sys.stderr, "_should_watch", False):
        _fall_back("OutStream._original_stdstream_copy", "nbcoord's log may reach the running cell")
    stream = sys.__stderr__
    if stream is None:
        return None
    try:
        return open(os.dup(stream.fileno()), "w", encoding="utf-8", errors="backslashreplace", buffering=1)
    except (OSError, ValueError):  # a stream without a descriptor (an embedding, a test runner's capture)
        return None


def is_initializing(module: object) -> bool:
    """Whether a module found in ``sys.modules`` is still being imported. Fallback: False (taken as imported)."""
    spec = getattr(module, "__spec__", None)
    if spec is not None and not hasattr(spec, "_initializing"):
        return False  # importlib sets it only during an import: its absence means done
    return bool(getattr(spec, "_initializing", False))


#: IPython 9 wraps each stream's ``write`` for the length of every cell (``InteractiveShell._tee``, to keep the
#: cell's output in its history) and, at the cell's end, sets back the ``write`` it found at the start.
_IPYTHON_TEE_QUALNAME = "InteractiveShell._tee.<locals>.write"


def ipython_tee_cell(write: Any, wanted: Callable[[Any], bool]) -> CellType | None:
    """The closure cell in which IPython's per-cell wrapper of a stream's ``write`` keeps the ``write`` it wraps and
    will set back (following nested wrappers inward), if its content is ``wanted``; None outside a cell, or on an
    IPython without that wrapper.

    nbcoord loads (and unloads) inside a cell: a ``write`` set on the stream then would be undone by IPython at the
    cell's end. Swapping the content of that cell instead makes IPython set back nbcoord's ``write`` (or, at unload,
    the kernel's own). Fallback where the wrapper is not recognised: the stream's ``write`` attribute itself.
    """
    found: CellType | None = None
    for _ in range(16):  # nested run_cell calls nest wrappers; never loop on a cycle
        if getattr(write, "__qualname__", None) != _IPYTHON_TEE_QUALNAME:
            break
        cells = dict(zip(write.__code__.co_freevars, write.__closure__ or (), strict=False))
        cell = cells.get("original_write")
        if cell is None:
            break
        found = cell
        write = cell.cell_contents
    return found if found is not None and wanted(found.cell_contents) else None


#: Functions a thread waits in (innermost frame's ``co_name``): public ones and CPython's private
#: ``Thread._wait_for_tstate_lock`` (what ``join()`` waits in). A name that is gone only stops matching.
WAITING_FUNCTIONS = frozenset({"wait", "_wait_for_tstate_lock", "get", "acquire", "sleep", "select", "poll", "recv"})


# ----------------------------------------------------------------------------------------------- locks
_RLOCK_OWNER = re.compile(r"\bowner=(\d+)")


def lock_types() -> tuple[type, ...]:
    """The lock classes a thread can wait on and hold: ``_thread.lock``, the C ``RLock`` and CPython's pure-Python
    ``threading._RLock`` (used where the C one is missing). Fallback: without the Python one."""
    kinds: list[type] = [type(threading.Lock()), type(threading.RLock())]
    python_rlock = getattr(threading, "_RLock", None)
    if isinstance(python_rlock, type):
        kinds.append(python_rlock)
    else:
        _fall_back("threading._RLock", "a pure-Python RLock is not recognised as a lock")
    return tuple(kinds)


def rlock_owner(lock: object) -> int | None:
    """The ident of the thread that holds an RLock, or None (free, a plain Lock, or not knowable).

    The C RLock says it only in its ``repr`` (``<locked _thread.RLock object owner=140... count=1 at 0x...>``); the
    Python one keeps it in ``_owner``. Both are read without calling user code. Fallback: None.
    """
    if type(lock) is type(threading.RLock()):
        text = type(lock).__repr__(lock)  # C code: no user code runs
        match = _RLOCK_OWNER.search(text)
        if match is None:
            if "owner=" not in text and not text.startswith("<unlocked"):
                _fall_back("RLock repr owner=", "the thread holding an RLock is not known")
            return None
        owner = int(match.group(1))
        return owner or None
    if type(lock).__name__ == "_RLock":
        owner = static_attribute(lock, "_owner")
        return owner if isinstance(owner, int) and owner else None
    return None


def condition_lock(condition: object) -> object | None:
    """The lock a ``threading.Condition`` (or a Semaphore's, an Event's, a Queue's condition) wraps. Fallback: None."""
    lock: object | None = static_attribute(condition, "_lock")
    if lock is None:
        _fall_back("Condition._lock", "the lock of a Condition a thread waits on is not known")
    return lock


def static_attribute(obj: object, name: str) -> Any:
    """``obj.name`` read without running user code (no property, no ``__getattr__``): an instance's own value, a
    slot's, a class's plain attribute, a module's global; None where it is anything else or missing."""
    try:
        value = inspect.getattr_static(obj, name)
    except Exception:  # missing (AttributeError), or an object whose __dict__ or __mro__ misbehaves
        return None
    kind = type(value)  # type(), not isinstance(): a user object's __class__ may be a property
    if issubclass(kind, (types.MemberDescriptorType, types.GetSetDescriptorType)):  # a slot: C code reads it
        try:
            return None if issubclass(type(obj), type) else value.__get__(obj, type(obj))
        except Exception:  # an empty slot
            return None
    return None if issubclass(kind, (property, types.FunctionType, classmethod, staticmethod)) else value


def zmq_recv_callback(stream: Any) -> Any:
    """The callback pyzmq's ``ZMQStream`` calls with each message it reads (its private ``_recv_callback``, which
    ``on_recv`` sets); None where a stream has none (the fast route then falls back to the control route)."""
    return getattr(stream, "_recv_callback", None)


def set_zmq_recv_callback(stream: Any, callback: Any) -> None:
    """Replace a ``ZMQStream``'s message callback in place: one attribute store, atomic under the GIL, so the next
    message read uses it (``on_recv`` would also re-register the socket with the loop, from the wrong thread)."""
    stream._recv_callback = callback
