"""The live panel: a widget whose state is built from snapshots, and whose clicks reach the one stop.

The panel is made of one module per concern:

- :mod:`._panel_state`: the state, shaped from one snapshot (pure functions);
- :mod:`._panel_widget`: the widget (traits are the state; the front end cannot write them);
- :mod:`._panel_sender`: the sender thread, and the diffing of traits;
- :mod:`._panel_commands`: the commands, validated against the ids the kernel issued, acted on once;
- :mod:`._panel_acks`: the acknowledgement of clicks, at once and, in a flood, a few for many;
- :mod:`._panel_actions`: what a stop, a restart or a reclaim does;
- this module: the controller that wires them for one kernel, and the registry of controllers.

Data flows one way. The sender thread (``nbcoord-panel``) builds a snapshot every ``NBCoord.panel_interval``
seconds, turns it into the panel's traits and sets only the traits whose value changed, in one message. Nothing is
sent when nothing changed: figures that move on their own (idle times, ages, how long a run has been blocked) are
computed by the front end from absolute times. History (sparklines) is sent at most every ``HISTORY_EVERY``
intervals. While a cell runs, a small ``beat`` goes out every tick: when the beats stop, the front end says that
the main thread holds the GIL in native code. The sender keeps itself under ``MAX_DUTY`` of one core (with a
thousand threads it ticks less often, and its beat says so).

Commands flow to one place. They arrive by two routes: the fast route of :mod:`nbcoord.kernel.fastcomm` (handled off the
main thread, so a click acts while a cell is busy) and the widget's ordinary message (handled when the main
thread is free); the first to arrive acts, the other is dropped by its ``click_id``. Each click taken is
acknowledged at once (the ``ack`` trait): a click the front end sees no acknowledgement for within a second was not
handled, because the main thread holds the GIL in a C call, and the view says so. Every click acknowledged then gets
an outcome (``last_stop`` or ``outcome`` names it): done, joined to an equal action, or refused with the reason.
Stops and restarts run on their own thread; reclaims on the main thread, joined (:class:`._panel_actions.Reclaims`).
A command that fails its checks is rejected through the rate-limited log (:func:`._panel_commands.reject`); one
that raises anyway (a bug) is logged through a rate limit too, in one line: never a traceback per message.

A panel nobody looks at costs nothing: each view announces itself and renews a lease every ``VIEW_RENEW_S``
(the module does it); when no lease is left the sender parks until one comes back.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import psutil

from nbcoord import report as _report
from nbcoord.core.host import Host
from nbcoord.core.internals import current_frames
from nbcoord.core.log import RateLimited, short
from nbcoord.core.snapshot import creation_lines, format_stack
from nbcoord.core.text import NAME_CHARS, TEXT_CHARS
from nbcoord.kernel import fastcomm as _fastcomm
from nbcoord.ui import actions as _panel_actions
from nbcoord.ui.acks import Acknowledger
from nbcoord.ui.commands import (
    ACTION_TYPES,
    COMMAND_TYPES,
    ClickLedger,
    Command,
    Rejected,
    StopRunner,
    is_click_id,
    parse_command,
    reject,
)
from nbcoord.ui.fields import name_cut
from nbcoord.ui.history import change_points, panel_history
from nbcoord.ui.memory import memory_close, steady_resources
from nbcoord.ui.outcomes import restart_state
from nbcoord.ui.runs import templated
from nbcoord.ui.sender import SENDER_THREAD_NAME, Sender, TraitSender
from nbcoord.ui.state import panel_state
from nbcoord.ui.widget import NBCoordPanel, esm_path

__all__ = [
    "COMMAND_TYPES",
    "SENDER_THREAD_NAME",
    "Command",
    "NBCoordPanel",
    "PanelActions",
    "PanelController",
    "Rejected",
    "_blocked_row",
    "change_points",
    "controller_for",
    "esm_path",
    "parse_command",
    "steady_resources",
]

log = logging.getLogger("nbcoord")

#: A view that has not renewed its lease for this long is taken as gone (the module renews every 20 s).
VIEW_LEASE_S: Final = 60.0
VIEW_RENEW_S: Final = 20.0
#: After the panel is created or displayed, it is taken as watched for this long, until a view says so itself.
PENDING_VIEW_S: Final = 30.0
#: History (sparklines) is sent at most every this many intervals.
HISTORY_EVERY: Final = 5
#: The share of one core the sender may use: a tick that costs more (1000 threads: about 10 ms) waits longer.
MAX_DUTY: Final = 0.005
_MAX_VIEWS: Final = 64
#: The click id a joined command is checked with (its clicks' own ids are checked one by one).
_JOINED_PLACEHOLDER: Final = "joined-0"
# Former names, read here by tests (tests/test_panel_kernel.py): a blocked run's row (.runs.templated) and the
# closeness of memory figures (.memory.memory_close).
_blocked_row = templated
_memory_close = memory_close
#: Commands that raised (a bug, not a rejection): a few lines a minute at most, whatever floods in.
_log_failure = RateLimited(logging.WARNING, burst=3, window=60.0)


@dataclasses.dataclass(frozen=True)
class PanelActions:
    """What the panel reaches besides the :class:`Host`: the resource probe's history ring, a reclaim of memory
    (outputs left alone; None: not offered) and a restart of a TensorFlow session's runners."""

    history: Callable[[], Sequence[Mapping[str, Any]]]
    reclaim: Callable[[], Mapping[str, Any]] | None
    restart: Callable[[str], Mapping[str, Any]]


class PanelController:
    """Owns one kernel's panel: the widget, its sender thread, its fast route, its views and its commands."""

    def __init__(self, host: Host, actions: PanelActions) -> None:
        self.host = host
        self.actions = actions
        self.closed = False
        # guards _views, _had_view, _pending, _pending_until, _stop_extra, _outcome, _interrupted, _restartable
        self._lock = threading.Lock()
        self._views: dict[str, float] = {}  # view id -> lease end (monotonic)
        self._clicks = ClickLedger()
        self._stops = StopRunner(self._run_action, self._action_done, self._action_failed)
        self._reclaims = _panel_actions.Reclaims(
            self._reclaim_report, self._action_done, self._action_failed, self._on_main_loop
        )
        #: Clicks acknowledged, and clicks answered with an outcome (done, failed or refused): equal once no action
        #: waits or runs (tests and the benchmark read them).
        self.clicks_answered = 0
        self._pending: dict[str, Any] = {}  # one-off traits (stack, clock) for the next tick
        self._pending_until = time.monotonic() + PENDING_VIEW_S
        self._stop_extra: dict[str, Any] | None = None
        self._outcome: dict[str, Any] | None = None  # the last restart or reclaim
        self._restart_seen: float | None = None  # started_at of the last restart shown
        self._interrupted: dict[int, str] = {}  # cell -> the line its end prints (a Stop all interrupted it)
        self._restartable: frozenset[str] = frozenset()  # session ids of the last state that can restart
        self._process = psutil.Process()
        self._cost = 0.0  # CPU seconds per tick, averaged
        self._multiplier = 1  # of panel_interval, while ticks are expensive
        self._history_at = 0.0
        self.ticks = 0  # state builds so far (tests and the benchmark read it)
        self.tick_cpu_s = 0.0  # the sender's CPU time in ticks, in all (the benchmark reads it)
        self.duplicates: collections.deque[str] = collections.deque(maxlen=64)  # click ids dropped as seen
        self._had_view = False
        self._acks = Acknowledger(lambda ack, now: self._traits.send_now("ack", ack, now))
        self.route = self._install_route()
        try:
            if self.route.reason is not None:
                why = f"{self.route.reason}; Stop acts when the cell ends"
                host.degraded_routes["the panel's fast route"] = why
            initial = self._state()
            self._resources: dict[str, Any] | None = initial["resources"]
            self.widget = NBCoordPanel(self._text_form, self._displayed, **initial)
            self._traits = TraitSender(self.widget, initial)
            self.widget.on_msg(self._from_widget)
            comm_id = getattr(getattr(self.widget, "comm", None), "comm_id", None)
            if isinstance(comm_id, str):
                self.route.add_comm(comm_id)
            self.widget._fast_route = {"kind": self.route.kind, "comm_id": comm_id}
        except BaseException:
            self.route.uninstall()  # a panel that could not be made leaves the kernel's shell stream as it was
            raise
        self._sender = Sender(self._tick, self._wait, self._watched, self._traits)
        self._sender.start()
        self._remove_own_stopper = host.add_own_stopper(self.stop_threads)
        host.add_undo(self.close)
        # A cell starting or ending changes the header at once (and the front end's expectation of beats).
        self._events = getattr(host.shell, "events", None)
        if self._events is not None:
            self._events.register("pre_run_cell", self._cell_started)
            self._events.register("post_run_cell", self._cell_finished)

    # ----------------------------------------------------------------------------------------- lifecycle
    @property
    def clicks_acknowledged(self) -> int:
        """Clicks acknowledged so far (see ``clicks_answered``)."""
        return self._acks.acknowledged

    @property
    def _sent(self) -> dict[str, Any]:
        return self._traits.sent

    @property
    def _sent_size(self) -> dict[str, int]:
        return self._traits.sizes

    @property
    def _sent_at(self) -> dict[str, float]:
        return self._traits.sent_at

    @property
    def sender_native_id(self) -> int | None:
        """The sender thread's OS id (the benchmark reads its CPU time)."""
        return self._sender.native_id

    def stop_sender(self) -> None:
        """Stop the sender thread (tests drive ticks themselves then)."""
        self._sender.stop()

    def stop_threads(self) -> None:
        """Stop the panel's threads: the sender, and the action runner after its running action (the shutdown
        runs this before it stops anything else)."""
        self._sender.stop()
        self._stops.close(timeout=0.2)

    def close(self) -> None:
        """Stop the sender, remove the fast route, close the widget (its views disappear). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._events is not None:
            for event, callback in (("pre_run_cell", self._cell_started), ("post_run_cell", self._cell_finished)):
                try:
                    self._events.unregister(event, callback)
                except ValueError:
                    log.debug("nbcoord: panel's %s callback was already gone", event)
        self._sender.stop()
        self._stops.close()
        self._remove_own_stopper()
        self.route.uninstall()
        try:
            self.widget.close()
        except Exception:
            log.warning("nbcoord: closing the panel widget failed", exc_info=True)

    def _cell_started(self, *args: Any) -> None:
        self._sender.wake()

    def _cell_finished(self, result: Any = None) -> None:
        """After a cell: say in one line, in its output, that the panel's Stop all interrupted it."""
        count = getattr(result, "execution_count", None)
        with self._lock:
            line = self._interrupted.pop(count, None) if isinstance(count, int) else None
            self._interrupted.clear()  # a signal that came too late found the cell ended: nothing to say
        error = getattr(result, "error_in_exec", None)
        if line is not None and isinstance(error, KeyboardInterrupt):
            print(line, file=sys.stderr)
        self._sender.wake()

    def _displayed(self) -> None:
        with self._lock:
            self._pending_until = time.monotonic() + PENDING_VIEW_S
        self._sender.wake()

    def _text_form(self) -> str:
        snapshot = self.host.snapshot()
        return _report.report(snapshot, limit=self.host.config.max_report_threads)

    # ------------------------------------------------------------------------------------------- views
    def _watched(self) -> bool:
        """Whether any view is there to see an update."""
        if self.closed or getattr(self.widget, "comm", None) is None:
            return False
        now = time.monotonic()
        with self._lock:
            for view, until in list(self._views.items()):
                if until < now:
                    del self._views[view]
            if self._views or self._pending_until > now:
                return True
            had_view = self._had_view
        # Without a fast route a view's renewals wait for the running cell to end: keep sending meanwhile.
        return self.route.kind == "none" and had_view and self.host.registry.current_cell() is not None

    def watched(self) -> bool:
        """Public for tests and the benchmark: whether the sender is sending (True) or parked."""
        return self._watched()

    # ------------------------------------------------------------------------------------------- state
    def _wait(self) -> float:
        """Seconds to the next tick: the configured interval, or a multiple of it (see :meth:`_adapt`)."""
        return float(self.host.config.panel_interval) * self._multiplier

    def _adapt(self, cost: float) -> None:
        """Keep the sender under MAX_DUTY of one core: double the interval while a tick costs more, halve it
        once the cost is well below (a third), so that the interval the front end is told rarely changes."""
        # A moving average: one slow tick (a garbage collection) does not double the interval.
        self._cost = 0.8 * self._cost + 0.2 * cost if self._cost else cost
        needed = self._cost / MAX_DUTY
        interval = float(self.host.config.panel_interval)
        while needed > interval * self._multiplier and self._multiplier < 64:
            self._multiplier *= 2
        while self._multiplier > 1 and needed < interval * self._multiplier / 3:
            self._multiplier //= 2

    def _native_count(self) -> int | None:
        """The process's OS threads now (one read of /proc/self/stat): the probe's list is refreshed only every
        few seconds with many threads, and the count must be fresh within one refresh."""
        try:
            return int(self._process.num_threads())
        except (psutil.Error, OSError):
            return None

    def _state(self, snapshot: Any = None) -> dict[str, Any]:
        with self._lock:
            extra = self._stop_extra
        if snapshot is None:
            snapshot = self.host.snapshot()
        state = panel_state(
            snapshot,
            route=self.route.kind,
            interval=float(self.host.config.panel_interval),
            stop_extra=extra,
            native_threads=self._native_count(),
        )
        restartable = frozenset(s["id"] for s in state["sessions"] if s["restartable"] and isinstance(s["id"], str))
        with self._lock:
            self._restartable = restartable
        state["header"]["reclaim"] = self.actions.reclaim is not None
        state["outcome"] = self._current_outcome()
        return state

    def _current_outcome(self) -> dict[str, Any] | None:
        """The last restart or reclaim: the panel's own, or a restart made from a cell (``restart_runners``)."""
        restart = self.host.snapshots.last_restart
        with self._lock:
            if isinstance(restart, Mapping) and restart.get("started_at") != self._restart_seen:
                self._restart_seen = restart.get("started_at")
                own = self._outcome is not None and self._outcome.get("started_at") == restart.get("started_at")
                if not own:
                    self._outcome = {"kind": "restart", "click_ids": [], "ok": True, **(restart_state(restart) or {})}
            return self._outcome

    def _tick(self) -> None:
        """Build the state, and send the traits that changed, in one message (sender thread)."""
        started = time.thread_time()
        self.ticks += 1
        now = time.monotonic()
        interval = self._wait()
        with self._lock:
            # Before the snapshot: a stop's click data is set after its report, so a snapshot taken after
            # reading it holds that report and the threads as the stop left them.
            pending, self._pending = self._pending, {}
        snapshot = self.host.snapshot()
        state = self._state(snapshot)
        state["resources"] = self._resources = steady_resources(state["resources"], self._resources)
        if now - self._history_at >= HISTORY_EVERY * interval:
            self._history_at = now
            state["history"] = panel_history(snapshot, _resource_history(self.actions), now=time.time())
        state.update(pending)
        if state["header"]["running_cell"] is not None:
            # While a cell runs the front end expects a beat every interval; its absence means the main
            # thread holds the GIL in native code (and a stop will act when it returns).
            # The beat says how often to expect it: more than panel_interval while ticks are expensive.
            state["beat"] = {"at": round(snapshot["taken_at"], 2), "every": interval}
        # Big traits are paced by the configured interval (bytes per second), not by the slowed-down tick.
        self._traits.send(state, now, float(self.host.config.panel_interval), force=set(pending))
        cost = time.thread_time() - started
        self.tick_cpu_s += cost
        self._adapt(cost)

    # ---------------------------------------------------------------------------------------- commands
    def _install_route(self) -> _fastcomm.FastRoute:
        """The fast route for clicks, told when a cell runs (ipykernel 6's status) and when a burst is handled."""
        route = _fastcomm.install(getattr(self.host.shell, "kernel", None), self._from_fast_route,
                                  types=COMMAND_TYPES, joined=self._joined_on_fast_route)
        registry = self.host.registry
        route.cell_running = lambda: registry.current_cell() is not None
        route.on_idle = self._acks.send_due
        self._acks.wake = route.wake
        return route

    def _from_fast_route(self, comm_id: str, content: dict[str, Any]) -> None:
        self.handle(content, route=self.route.kind)

    def _joined_on_fast_route(self, comm_id: str, content: dict[str, Any], click_ids: list[str]) -> None:
        self.handle(content, route=self.route.kind, joined=click_ids)

    def _from_widget(self, widget: Any, content: Any, buffers: Any) -> None:
        self.handle(content, route="ordinary")

    def handle(self, content: object, *, route: str, joined: Sequence[str] = ()) -> None:
        """Validate and run one command from the front end; never raises.

        ``joined``: instead of ``content``'s own click, the clicks of equal commands (but for their click id) that
        the fast route joined to it; each is checked and acted on once, as if it had come on its own.
        """
        try:
            self._handle(content, route, joined)
        except Exception as error:
            # Every field is checked before use, so this is a bug; a front end that finds it must not be able to
            # write a traceback per message: one line, rate-limited, with where it raised and the content cut short.
            tb = error.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
            _log_failure(
                "nbcoord: a panel command raised %s at %s: %s",
                name_cut(f"{type(error).__name__}: {error}", NAME_CHARS),
                name_cut(where, NAME_CHARS),
                name_cut(short(content), NAME_CHARS),
            )

    def _handle(self, content: object, route: str, joined: Sequence[str]) -> None:
        received = time.time()
        registry = self.host.registry
        with self._lock:
            restartable = self._restartable
        if joined and isinstance(content, Mapping):
            # The clicks' common command is checked as any command is; each click id on its own, below.
            content = {**content, "click_id": _JOINED_PLACEHOLDER}
        try:
            command = parse_command(
                content,
                thread_exists=lambda tid: (r := registry.get(tid)) is not None and r.user and r.is_alive(),
                cell_exists=lambda n: registry.cell(n) is not None,
                session_exists=lambda sid: sid in restartable,
            )
        except Rejected as why:
            reject(why, content)
            return
        command = dataclasses.replace(command, route=route, received_at=received)
        commands = [command] if not joined else self._joined_commands(command, joined)
        commands = [c for c in commands if self._first_time(c)]
        if not commands:
            return
        if command.type == "view":
            self._view(commands[-1])
            return
        if command.type in ACTION_TYPES:
            self._acks.acknowledge(commands[0], received, route, [c.click_id for c in commands[1:]])
        if command.type == "stack":
            self._stack(commands[-1])
        elif command.type == "reclaim":
            self._reclaims.submit(commands)
        else:
            refusal = self._stops.submit_all(commands)
            if refusal is not None:
                self._action_failed(commands, Rejected(refusal), refused=True)

    @staticmethod
    def _joined_commands(command: Command, click_ids: Sequence[str]) -> list[Command]:
        """``command`` once per click id that joined it on the fast route; ids of another form are rejected."""
        commands = []
        for click_id in click_ids:
            if is_click_id(click_id):
                commands.append(dataclasses.replace(command, click_id=click_id, clicked_at=None))
            else:
                reject(Rejected("click_id must be <view id>-<number>"), {"type": command.type, "click_id": click_id})
        return commands

    def _first_time(self, command: Command) -> bool:
        if self._clicks.first_time(command.click_id):
            return True
        self.duplicates.append(command.click_id)  # the other route's copy: already handled
        return False

    def _view(self, command: Command) -> None:
        assert command.view_id is not None
        with self._lock:
            if command.action == "close":
                self._views.pop(command.view_id, None)
            else:
                self._had_view = True
                self._views[command.view_id] = time.monotonic() + VIEW_LEASE_S
                while len(self._views) > _MAX_VIEWS:
                    self._views.pop(next(iter(self._views)))
            if command.action == "open" and command.client_time is not None:
                self._pending["clock"] = {
                    "view_id": command.view_id,
                    "client_time": command.client_time,
                    "kernel_time": time.time(),
                }
        self._sender.wake()

    def _stack(self, command: Command) -> None:
        record = self.host.registry.get(command.tid) if command.tid is not None else None
        if record is None:
            return
        frame = current_frames().get(record.ident) if record.ident is not None else None
        lines = format_stack(frame, cell_of=self.host.cell_of_file) if frame is not None else []
        stack = {
            "tid": record.tid,
            "name": name_cut(record.name),
            "click_id": command.click_id,
            "stack": [name_cut(line, TEXT_CHARS) for line in lines],
            "creation": [name_cut(line, TEXT_CHARS) for line in creation_lines(record, self.host.cell_of_file)],
            "at": round(time.time(), 3),
        }
        with self._lock:
            self._pending["stack"] = stack
        self._sender.wake()

    # ----------------------------------------------------------------------------------------- actions
    def _on_main_loop(self, callback: Callable[[], None], delay: float) -> str | None:
        """Run ``callback`` on the main thread once the kernel's event loop is free (after the running cell), and
        ``delay`` seconds from now at the earliest; returns why it cannot."""
        loop = getattr(getattr(self.host.shell, "kernel", None), "io_loop", None)
        add_callback = getattr(loop, "add_callback", None)
        if not callable(add_callback):
            return "the kernel's main thread cannot be reached from here"
        call_later = getattr(loop, "call_later", None)
        if delay <= 0 or not callable(call_later):
            add_callback(callback)
        else:
            # add_callback is the loop's one thread-safe entry; call_later is then called on the loop's thread.
            add_callback(lambda: call_later(delay, callback))
        return None

    def _reclaim_report(self) -> dict[str, Any]:
        """One reclaim (on the main thread, the only one it may run on), as an action's result."""
        return {"kind": "reclaim", "report": _panel_actions.reclaim(self.actions.reclaim)}

    def _run_action(self, command: Command) -> dict[str, Any]:
        """The action runner's work (on its own thread): a stop, or a restart of a session's runners."""
        if command.type == "restart":
            assert command.session is not None
            return {"kind": "restart", "report": dict(self.actions.restart(command.session))}
        registry = self.host.registry
        running = registry.current_cell() if command.interrupt else None
        report = self.host.stop(command.scope, force=command.force, cell=command.cell, tid=command.tid)
        interrupt: dict[str, Any] | None = None
        if command.interrupt:
            interrupt = self._interrupt(running, report)
        return {"kind": "stop", "report": report, "interrupt": interrupt}

    def _interrupt(self, running: Any, report: Mapping[str, Any]) -> dict[str, Any]:
        """Stop all's second half: interrupt the cell that was running at the click, if it still runs."""
        if running is None:
            return {"cell": None, "sent": False, "why": "no cell was running"}
        cell = running.execution_count
        if self.host.registry.current_cell() is not running:
            return {"cell": cell, "sent": False, "why": f"cell [{cell}] ended by itself"}
        stopped = len(report["stopped"])
        also = f", and stopped {stopped} thread{'' if stopped == 1 else 's'} the cells had started" if stopped else ""
        line = f"nbcoord: the panel's Stop all interrupted cell [{cell}]{also}."
        with self._lock:
            self._interrupted[cell] = line
        why = _panel_actions.interrupt_main()
        if why is not None:
            with self._lock:
                self._interrupted.pop(cell, None)
            log.warning("nbcoord: Stop all could not interrupt cell [%d]: %s", cell, why)
        return {"cell": cell, "sent": why is None, "why": why}

    def _action_done(self, commands: list[Command], result: dict[str, Any]) -> None:
        """Tell the views which clicks an action answered (the first, and up to 64 that joined it)."""
        with self._lock:
            self.clicks_answered += len(commands)
        first = commands[0]
        clicks = {
            "click_id": first.click_id,
            "click_ids": [command.click_id for command in commands[-64:]],
            "clicks": len(commands),
            "route": first.route,
            "received_at": round(first.received_at or time.time(), 4),
            "clicked_at": first.clicked_at,
        }
        report = result["report"]
        if result["kind"] != "stop":
            text = str(report.get("text") or "") if isinstance(report, Mapping) else str(report)
            outcome = {"kind": result["kind"], "ok": True, "text": text[:4000], **clicks}
            if result["kind"] == "restart" and isinstance(report, Mapping):
                outcome.update(restart_state(report) or {})
                outcome["started_at"] = report.get("started_at")
            else:
                outcome["started_at"] = round(time.time(), 3)
            with self._lock:
                self._outcome = outcome
            self._sender.wake()
            return
        extra = {"started_at": report["started_at"], "interrupt": result.get("interrupt"), **clicks}
        with self._lock:
            self._stop_extra = extra
        log.info(
            "nbcoord: panel stop %s (%s%s, %d click(s)) by the %s route: %d stopped, %d still alive",
            first.click_id,
            first.scope,
            ", interrupt" if first.interrupt else "",
            len(commands),
            first.route,
            len(report["stopped"]),
            len(report["alive"]),
        )
        self._sender.wake()

    def _action_failed(self, commands: list[Command], error: Exception, *, refused: bool = False) -> None:
        """An action that raised (a restart of a session that closed meanwhile), or clicks that were refused (too
        many different stops wait): the views say why."""
        with self._lock:
            self.clicks_answered += len(commands)
        first = commands[0]
        text = f"Refused: {error}" if refused else f"{type(error).__name__}: {error}"
        outcome = {
            "kind": first.type,
            "ok": False,
            "refused": refused,
            "text": text[:1000],
            "click_id": first.click_id,
            "click_ids": [command.click_id for command in commands[-64:]],
            "started_at": round(time.time(), 3),
        }
        with self._lock:
            self._outcome = outcome
        self._sender.wake()


def _resource_history(actions: PanelActions) -> Sequence[Mapping[str, Any]]:
    """The resource probe's history ring."""
    try:
        points = actions.history()
    except Exception:
        log.warning("nbcoord: panel could not read the resource history", exc_info=True)
        return []
    return points if isinstance(points, list) else []


_controllers: weakref.WeakKeyDictionary[Any, PanelController] = weakref.WeakKeyDictionary()
_controllers_lock = threading.Lock()  # guards _controllers


def controller_for(host: Host, actions: PanelActions) -> PanelController:
    """The kernel's panel controller, created on first use (or again after the panel was closed)."""
    with _controllers_lock:
        controller = _controllers.get(host)
        if controller is None or controller.closed or getattr(controller.widget, "comm", None) is None:
            if controller is not None:
                controller.close()
            controller = PanelController(host, actions)
            _controllers[host] = controller
        return controller
