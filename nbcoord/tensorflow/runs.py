"""Session runs in flight, and the Interrupt that ends a run blocked in TensorFlow's C++.

:class:`RunTracker` makes the hook that replaces ``BaseSession._call_tf_sessionrun``, through which every run
passes (``Session.run`` and the callables that QueueRunner threads use). It stores, per thread, the session, the
fetches and the start time of the run in flight, and counts completed runs: a few attribute stores, about 0.4 us
of the calling thread's CPU time. It also makes the thin wrapper of the public ``BaseSession.run``, which is where
an error reaches the user's code: there TensorFlow's own errors get their one explaining sentence (a note), close
ops that ran are remembered (who closed a queue), and the KeyboardInterrupt of a cancelled run is raised with a
traceback of the cell's frames only (IPython formats each frame of a traceback, twice, with the source of
TensorFlow's files: that was most of the time between Interrupt and the cell's end).

:class:`InterruptWatcher` sees SIGINT while the main thread is blocked in C++: Python's C-level signal handler
writes the signal number to the wakeup fd whatever the main thread is doing. nbcoord puts its own pipe there,
passes every byte on to the fd that was there before (asyncio's, if any), and reads it on a watcher thread,
which asks a callback to cancel the main thread's run. The hook, when that run then fails, raises
``KeyboardInterrupt`` in the cell instead of TensorFlow's error. Any run that fails while a KeyboardInterrupt is
pending surfaces as pybind11's "MISMATCH ... REPLACED BY KeyboardInterrupt" RuntimeError; the hook turns that
back into the KeyboardInterrupt it was.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

from nbcoord.core.internals import current_frames
from nbcoord.tensorflow.tracebacks import is_cancelled, mark_cancelled

log = logging.getLogger("nbcoord")

#: What pybind11 says when a run fails while a KeyboardInterrupt is pending: the interrupt is lost in it.
LOST_INTERRUPT = "REPLACED BY KeyboardInterrupt"
#: Threads whose name starts with this are nbcoord's own: their runs (polls, stops) are not shown.
INTERNAL_PREFIX = "nbcoord-"

#: What the hook does with a failed run's exception (explain it, turn it into a stopped thread's error): gets the
#: run state, the exception, the session, the fetch and target lists; returns what to raise.
FailureHandler = Callable[["RunState", BaseException, Any, Any, Any], BaseException]
#: What the run wrapper does with an error that reaches the caller of ``Session.run``: (session, fetches, error).
RunErrorHandler = Callable[[Any, Any, BaseException], None]
#: What the run wrapper does after a run that succeeded, when it fetched exactly these ops: (session, fetches).
RunDoneHandler = Callable[[Any, Any], None]


class RunState:
    """One thread's run in flight (``run``, None between runs) and its count of completed runs."""

    __slots__ = ("__weakref__", "cancel_message", "cancel_token", "ident", "internal", "run", "runs", "thread_ref")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread_ref = weakref.ref(thread)
        self.ident = thread.ident
        self.internal = thread.name.startswith(INTERNAL_PREFIX)
        #: (session, fetch_list, target_list, started): one store per run, read whole by other threads.
        self.run: tuple[Any, Any, Any, float] | None = None
        self.runs = 0
        #: The start time of a run that nbcoord cancelled on Interrupt; the hook turns its failure into
        #: KeyboardInterrupt. A start time identifies one run without a per-run counter.
        self.cancel_token = -1.0
        self.cancel_message = ""

    @property
    def since(self) -> float:
        """When the run in flight started (monotonic), 0.0 between runs."""
        run = self.run
        return run[3] if run is not None else 0.0

    def current(self) -> RunView | None:
        """The run in flight, or None."""
        run = self.run
        if run is None:
            return None
        return RunView(self, run[0], run[1], run[2], run[3])


@dataclass(frozen=True)
class RunView:
    """A run in flight, as read at one moment."""

    state: RunState
    session: Any
    fetches: Any
    targets: Any
    since: float


def _keep(state: RunState, exc: BaseException, session: Any, fetch_list: Any, target_list: Any) -> BaseException:
    return exc


def _ran(call: Callable[[], Any]) -> bool:
    try:
        call()
    except Exception:
        log.debug("nbcoord: a prepared close failed; the ordinary run follows", exc_info=True)
        return False
    return True


class RunTracker:
    """Per-thread run states, and the hook that keeps them."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _states
        self._states: dict[int, RunState] = {}
        #: Set by the integration: explanations and stopped-thread errors, on the failure path only.
        self.on_failure: FailureHandler = _keep
        self.on_run_error: RunErrorHandler = lambda _session, _fetches, _exc: None
        self.on_run_done: RunDoneHandler = lambda _session, _fetches: None
        #: A prepared callable that runs exactly this one watched op in this session, if any (see the wrapper).
        self.prepared_run: Callable[[Any, Any], Callable[[], Any] | None] = lambda _session, _op: None
        #: ids of the Operations whose successful run the wrapper reports (queue close ops); read without a lock.
        self.watched_ops: frozenset[int] = frozenset()

    @contextlib.contextmanager
    def own_runs(self) -> Iterator[None]:
        """Runs made on this thread meanwhile are nbcoord's (a stop's closes, on the thread that asked for the
        stop): not reported as a user's close ops, nor explained."""
        before = getattr(self._local, "own", False)
        self._local.own = True
        try:
            yield
        finally:
            self._local.own = before

    def _new_state(self) -> RunState:
        state = RunState(threading.current_thread())
        self._local.state = state
        with self._lock:
            if state.ident is not None:
                self._states[state.ident] = state
        return state

    def make_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The replacement of ``BaseSession._call_tf_sessionrun`` (hot path: keep it short)."""
        local = self._local
        new_state = self._new_state
        monotonic = time.monotonic
        tracker = self

        def _call_tf_sessionrun(  # noqa: PLR0917 (TensorFlow calls it with six positional arguments)
            self: Any, options: Any, feed_dict: Any, fetch_list: Any, target_list: Any, run_metadata: Any
        ) -> Any:
            try:
                state = local.state
            except AttributeError:
                state = new_state()
            since = monotonic()
            state.run = (self, fetch_list, target_list, since)
            try:
                result = original(self, options, feed_dict, fetch_list, target_list, run_metadata)
            except BaseException as exc:
                state.run = None
                if state.cancel_token == since:
                    raise mark_cancelled(KeyboardInterrupt(state.cancel_message)) from None
                if isinstance(exc, RuntimeError) and LOST_INTERRUPT in str(exc):
                    raise KeyboardInterrupt from exc  # the Interrupt that pybind11 swallowed
                replacement = tracker.on_failure(state, exc, self, fetch_list, target_list)
                if replacement is exc:
                    raise
                raise replacement from None
            state.run = None
            state.runs += 1
            return result

        return _call_tf_sessionrun

    def make_run_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The replacement of the public ``BaseSession.run``: passes through; on the way out, a cancelled run's
        KeyboardInterrupt loses TensorFlow's frames, an error gets its sentence, a close op run is reported. A
        run of one QueueRunner's cancel op alone goes through the callable prepared for it (the same op, without
        building an executor on the stop's time)."""
        tracker = self
        local = self._local

        def run(self: Any, fetches: Any, *args: Any, **kwargs: Any) -> Any:
            watched = tracker.watched_ops
            lone = bool(watched) and id(fetches) in watched
            if lone and not args and not kwargs and not getattr(local, "own", False):
                # One close op alone (a QueueRunner's cancel op, as its close-on-stop thread runs it when its
                # coordinator stops): the same op through the executor prepared for it, if there is one. On
                # failure the ordinary run below runs it again and raises TensorFlow's own error.
                prepared = tracker.prepared_run(self, fetches)
                if prepared is not None and _ran(prepared):
                    tracker.on_run_done(self, fetches)
                    return None  # what Session.run returns for an Operation
            try:
                result = original(self, fetches, *args, **kwargs)
            except KeyboardInterrupt as exc:
                if is_cancelled(exc):
                    raise exc.with_traceback(None) from None
                raise
            except Exception as exc:
                if not getattr(local, "own", False):
                    tracker.on_run_error(self, fetches, exc)
                raise
            if (
                watched
                and (lone or (type(fetches) in (list, tuple) and any(id(fetch) in watched for fetch in fetches)))
                and not getattr(local, "own", False)
            ):
                tracker.on_run_done(self, fetches)
            return result

        return run

    def states(self) -> list[RunState]:
        """Run states of live threads (dead threads' states are dropped)."""
        with self._lock:
            for ident, state in list(self._states.items()):
                thread = state.thread_ref()
                if thread is None or not thread.is_alive():
                    del self._states[ident]
            return list(self._states.values())

    def state_of(self, thread: threading.Thread) -> RunState | None:
        """The run state of a thread, if it ever ran anything."""
        if thread.ident is None:
            return None
        with self._lock:
            state = self._states.get(thread.ident)
        if state is None or state.thread_ref() is not thread:
            return None
        return state

    def in_flight(self) -> list[RunView]:
        """Runs in flight now, in threads that are not nbcoord's."""
        views = (state.current() for state in self.states() if not state.internal)
        return [view for view in views if view is not None]


def warm_traceback(frames: Iterable[FrameType]) -> int:
    """Prepare, off the main thread, what IPython's traceback formatting will need when an exception ends the
    cell through these frames: the parsed source, tokens and pieces of each file (stack_data caches them per
    file) and inspect's index of modules by file (brought up to date with the modules imported since
    :func:`prepare_tracebacks`). The first Interrupt then formats as fast as the later ones. Returns the files
    prepared.

    Fallback: where stack_data (IPython's traceback library) is not there, nothing is prepared.
    """
    try:
        from stack_data.core import Source
    except ImportError:
        return 0
    warm_lexer()
    seen: set[str] = set()
    for frame in frames:
        filename = frame.f_code.co_filename
        if filename in seen:
            continue
        seen.add(filename)
        try:
            inspect.getmodule(frame)
            _prepare_source(Source, filename, frame.f_globals)
        except Exception:  # a file that cannot be read or parsed: its frame formats as it would have
            log.debug("nbcoord: could not prepare the source of %s", filename, exc_info=True)
    return len(seen)


def prepare_tracebacks(modules: Iterable[ModuleType], stop: threading.Event | None = None) -> int:
    """Prepare, once per process and on a thread of its own, what the traceback of any cancelled run needs,
    whatever the run: pygments' Python lexer, inspect's index of every module by file, and the source of the
    modules whose frame ends that traceback (nbcoord's run wrapper, its eager queue methods). Returns the
    modules prepared.

    Why not when the run is first seen blocking (:func:`warm_traceback` still does the rest then): with
    TensorFlow loaded this is 0.3-0.5 s of CPU (asttokens' first file alone 0.2 s, the module index 0.15 s),
    and the monitor sees a run blocking up to a second after it starts: a press 1.5 s into the block found the
    work unfinished, and the main thread formatting the traceback shared the interpreter with it (first presses
    of 230-730 ms). Repeated (a second load), every step finds its cache filled and returns in about a
    millisecond. ``stop``, once set (an unload), ends it between two steps (each at most about 0.2 s).
    """
    try:
        from stack_data.core import Source
    except ImportError:
        return 0
    warm_lexer()
    if stop is not None and stop.is_set():
        return 0
    try:
        # A miss in inspect's index (a file no module has, as a cell's) indexes every module not yet indexed:
        # the first traceback through a cell would do it on the main thread.
        inspect.getmodule(compile("", "<nbcoord: index the modules>", "exec"))
    except Exception:
        log.debug("nbcoord: could not index the modules for tracebacks", exc_info=True)
    done = 0
    for module in modules:
        filename = getattr(module, "__file__", None)
        if stop is not None and stop.is_set():
            break
        if not filename:
            continue
        try:
            _prepare_source(Source, filename, vars(module))
        except Exception:
            log.debug("nbcoord: could not prepare the source of %s", filename, exc_info=True)
            continue
        done += 1
    return done


def _prepare_source(source_type: Any, filename: str, module_globals: dict[str, Any]) -> None:
    """Parse a file and compute, in stack_data's cache, what formatting a frame of it reads."""
    source = source_type.for_filename(filename, module_globals)
    if source.tree is not None:
        source.asttokens()
        _ = source.pieces  # a cached property: computing it now is the point


def warm_lexer() -> bool:
    """Load and compile pygments' Python lexer; True if it is ready.

    The frame of nbcoord's wrapper is the last of a cancelled run's traceback; unlike the cell's (whose file
    IPython does not read), it is highlighted by stack_data, with a fresh subclass of this lexer per frame. The
    first one imports the lexer's module and compiles its hundred-odd regular expressions: about 40 ms with
    TensorFlow loaded, on the main thread, between Interrupt and the cell's reply. Later subclasses find those
    expressions in ``re``'s cache.
    """
    try:
        from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]  # no stubs installed

        get_lexer_by_name("python3")  # the name stack_data asks for
    except Exception:  # no pygments, or a lexer that fails: the traceback formats as it would have
        log.debug("nbcoord: could not prepare the Python lexer", exc_info=True)
        return False
    return True


def frames_to(thread: threading.Thread, keep: Callable[[str], bool]) -> list[FrameType]:
    """The frames of a thread's current stack whose file ``keep`` accepts, outermost first."""
    frame: FrameType | None = current_frames().get(thread.ident or -1)
    frames: list[FrameType] = []
    while frame is not None:
        if keep(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    return frames


SigintAction = Callable[[], None]


class InterruptWatcher:
    """Chains the signal wakeup fd and calls ``on_sigint`` on a watcher thread when SIGINT arrives."""

    def __init__(self, on_sigint: SigintAction) -> None:
        self._on_sigint = on_sigint
        self._read_fd = -1
        self._write_fd = -1
        self._previous_fd = -1
        self._thread: threading.Thread | None = None
        self.installed = False

    def install(self) -> bool:
        """Take over the wakeup fd (main thread only); False when that is not possible here."""
        if self.installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            log.info("nbcoord: TensorFlow was set up off the main thread; Interrupt cannot end blocked runs")
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C signal handler must never block
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            log.warning("nbcoord: could not set the signal wakeup fd", exc_info=True)
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._read_fd, self._write_fd = read_fd, write_fd
        self._thread = threading.Thread(target=self._run, name=f"{INTERNAL_PREFIX}tf-interrupt", daemon=True)
        self._thread.start()
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Give the wakeup fd back (if it is still ours), end the watcher thread, close the pipe."""
        if not self.installed:
            return
        self.installed = False
        if threading.current_thread() is not threading.main_thread():
            # Only the main thread may set the wakeup fd. Keep the pipe open and the watcher forwarding, so
            # that the signal handler never writes to a closed (or reused) fd; only the action is off.
            log.warning("nbcoord: unloaded off the main thread; the signal wakeup fd stays nbcoord's pipe")
            self._on_sigint = lambda: None
            return
        current = signal.set_wakeup_fd(self._previous_fd)
        if current != self._write_fd:
            # Someone replaced ours since: keep theirs. Our pipe is closed below either way.
            signal.set_wakeup_fd(current)
            log.warning("nbcoord: the signal wakeup fd was replaced after nbcoord set it; leaving it")
        os.close(self._write_fd)  # the watcher's read() then returns b"" and it ends
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=1.0)
        os.close(self._read_fd)
        self._read_fd = self._write_fd = -1

    def forget_in_child(self) -> None:
        """In a forked child: give the wakeup fd back, so that a signal the child gets is not written into the
        parent's pipe (where the parent's watcher would take it for its own Interrupt). Takes no lock."""
        if not self.installed:
            return
        self.installed = False
        self._on_sigint = lambda: None
        try:
            current = signal.set_wakeup_fd(self._previous_fd)
            if current != self._write_fd:  # someone replaced ours since: theirs stays
                signal.set_wakeup_fd(current)
            os.close(self._write_fd)
            os.close(self._read_fd)
        except (ValueError, OSError):
            log.debug("nbcoord: could not give the wakeup fd back in a forked child", exc_info=True)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except OSError:
                return
            if not data:
                return
            self._forward(data)
            if signal.SIGINT in data:
                try:
                    self._on_sigint()
                except Exception:
                    log.warning("nbcoord: handling Interrupt during a session run failed", exc_info=True)

    def _forward(self, data: bytes) -> None:
        if self._previous_fd < 0:
            return
        try:
            os.write(self._previous_fd, data)
        except OSError:  # full or closed: the previous owner copes with missed wakeups as it did before
            log.debug("nbcoord: could not pass a signal wakeup on", exc_info=True)
