"""The live panel: a widget whose state is built from snapshots, and whose clicks reach the one stop.

The panel is made of one module per concern:

- :mod:`.sections`: the registry of sections (one synced trait each: its kind, its pacing, its shaping);
- :mod:`.state`: the state, shaped from one snapshot (pure functions in :mod:`.rows`, :mod:`.runs`,
  :mod:`.memory`, :mod:`.outcomes`, :mod:`.history`, over :mod:`.source` and :mod:`.fields`);
- :mod:`.widget`: the widget (traits are the state; the front end cannot write them);
- :mod:`.sender`: the sender (the panel's ticks, a job of nbcoord's monitor thread), and the diffing of traits;
- :mod:`.commands`: the commands, validated against the ids the kernel issued, acted on once;
- :mod:`.handling`: the commands taken from both routes, acknowledged and handed to where they run;
- :mod:`.acks`: the acknowledgement of clicks, at once and, in a flood, a few for many;
- :mod:`.actions`: what a stop, a restart or a reclaim does; :mod:`.answers`: the outcome each click gets;
- this module: the controller that wires them for one kernel, and the registry of controllers.

Data flows one way. The sender, on nbcoord's monitor thread, builds a snapshot every ``NBCoord.panel_interval`` seconds
while anything is live (and at the monitor's quiet pace while nothing is), turns it into the panel's traits and sets
only the traits whose value changed, in one message. Nothing is sent when nothing changed: figures that move on their
own (idle times, ages, how long a run has been blocked) are computed by the front end from absolute times. History
(sparklines) is sent at most every ``HISTORY_EVERY`` intervals. While a cell runs, a small ``beat`` goes out every tick:
when the beats stop, the front end says that the main thread holds the GIL in native code. The sender keeps itself under
``MAX_DUTY`` of one core (with a thousand threads it ticks less often, and its beat says so).

Commands flow to one place (:mod:`.handling`). Each click taken is acknowledged at once (the ``ack`` trait): a
click the front end sees no acknowledgement for within a second was not handled, because the main thread holds the
GIL in a C call, and the view says so. Every click acknowledged then gets an outcome (``last_stop`` or ``outcome``
names it): done, joined to an equal action, or refused with the reason.

A panel nobody looks at costs nothing: each view announces itself and renews a lease every ``VIEW_RENEW_S``
(the module does it); when no lease is left the sender parks until one comes back.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Final

import psutil

from nbcoord import report as _report
from nbcoord.core.host import Host
from nbcoord.kernel import fastcomm as _fastcomm
from nbcoord.ui import actions as _panel_actions
from nbcoord.ui.acks import Acknowledger
from nbcoord.ui.actions import ActionRunner, PanelActions
from nbcoord.ui.answers import Answers
from nbcoord.ui.commands import COMMAND_TYPES, ClickLedger, Command, StopRunner
from nbcoord.ui.handling import CommandDesk
from nbcoord.ui.history import panel_history, resource_history
from nbcoord.ui.memory import steady_resources
from nbcoord.ui.rows import stack_state
from nbcoord.ui.sender import Sender, TraitSender
from nbcoord.ui.state import panel_state
from nbcoord.ui.widget import NBCoordPanel

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


class PanelController:
    """Owns one kernel's panel: the widget, its sender thread, its fast route, its views and its commands."""

    def __init__(self, host: Host, actions: PanelActions) -> None:
        self.host = host
        self.actions = actions
        self.closed = False
        # guards _views, _had_view, _pending, _pending_until, _restartable
        self._lock = threading.Lock()
        self._views: dict[str, float] = {}  # view id -> lease end (monotonic)
        self._answers = Answers(self._wake, lambda: host.snapshots.last_restart)
        self._runner = ActionRunner(host, actions)
        self._stops = StopRunner(self._run_action, self._answers.done, self._answers.failed)
        self._reclaims = _panel_actions.Reclaims(
            self._runner.reclaim_report, self._answers.done, self._answers.failed, self._runner.on_main_loop
        )
        self._pending: dict[str, Any] = {}  # one-off traits (stack, clock) for the next tick
        self._pending_until = time.monotonic() + PENDING_VIEW_S
        self._restartable: frozenset[str] = frozenset()  # session ids of the last state that can restart
        self._process = psutil.Process()
        self._cost = 0.0  # CPU seconds per tick, averaged
        self._multiplier = 1  # of panel_interval, while ticks are expensive
        self._history_at = 0.0
        self.ticks = 0  # state builds so far (tests and the benchmark read it)
        self.tick_cpu_s = 0.0  # the sender's CPU time in ticks, in all (the benchmark reads it)
        self._had_view = False
        self._acks = Acknowledger(lambda ack, now: self._traits.send_now("ack", ack, now))
        self._desk = CommandDesk(
            host,
            acks=self._acks,
            stops=self._stops,
            reclaims=self._reclaims,
            answers=self._answers,
            restartable=self._restartable_sessions,
            view=self._view,
            stack=self._stack,
        )
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
        self._sender = Sender(host.monitor, self._tick, self._wait, self._watched, self._traits)
        self._sender.start()
        self._remove_own_stopper = host.add_own_stopper(self.stop_threads)
        host.add_undo(self.close)
        # A cell starting or ending changes the header at once (and the front end's expectation of beats).
        self._events = getattr(host.shell, "events", None)
        if self._events is not None:
            self._events.register("pre_run_cell", self._cell_started)
            self._events.register("post_run_cell", self._cell_finished)

    @property
    def clicks_answered(self) -> int:
        """Clicks answered with an outcome (done, failed or refused): equal to ``clicks_acknowledged`` once no
        action waits or runs (tests and the benchmark read them)."""
        return self._answers.answered

    @property
    def duplicates(self) -> collections.deque[str]:
        """Click ids dropped as already seen (the other route's copies)."""
        return self._desk.duplicates

    @property
    def _clicks(self) -> ClickLedger:
        return self._desk.clicks

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
        """The OS id of the thread the panel's ticks run on, the monitor's (the benchmark reads its CPU time)."""
        return self._sender.native_id

    def stop_sender(self) -> None:
        """Stop the sender's ticks (tests drive ticks themselves then)."""
        self._sender.stop()

    def stop_threads(self) -> None:
        """Stop the panel's work: the sender's ticks, and the action runner after its running action (the shutdown
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

    def _wake(self) -> None:
        """Tick now (the sender is made after the answers that ask for it)."""
        self._sender.wake()

    def _cell_started(self, *args: Any) -> None:
        self._sender.wake()

    def _cell_finished(self, result: Any = None) -> None:
        """After a cell: say in one line, in its output, that the panel's Stop all interrupted it."""
        line = self._runner.interrupted_line(getattr(result, "execution_count", None))
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
        extra = self._answers.stop_extra()
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
        state["outcome"] = self._answers.outcome()
        return state

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
            state["history"] = panel_history(snapshot, resource_history(self.actions.history), now=time.time())
        state.update(pending)
        last_stop = state.get("last_stop")
        if last_stop is not None and "clicks" not in last_stop and self._stops.in_flight:
            # The panel's own stop has stored its report and not yet its clicks: the report waits for them (their
            # answer wakes a tick), so that no view shows it as a stop nobody clicked.
            state.pop("last_stop")
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
        route = _fastcomm.install(
            getattr(self.host.shell, "kernel", None),
            self._from_fast_route,
            types=COMMAND_TYPES,
            joined=self._joined_on_fast_route,
        )
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
        """Validate and run one command from the front end; never raises (see :meth:`.handling.CommandDesk.handle`)."""
        self._desk.handle(content, route=route, joined=joined)

    def _restartable_sessions(self) -> frozenset[str]:
        with self._lock:
            return self._restartable

    def _run_action(self, command: Command) -> dict[str, Any]:
        """The action runner's work (on its own thread): a stop, or a restart of a session's runners."""
        return self._runner.run(command)

    def _view(self, command: Command) -> None:
        assert command.view_id is not None
        now = time.monotonic()
        with self._lock:
            # A renewal of a lease still running changes nothing the view shows: no tick of its own (an idle panel
            # would tick every VIEW_RENEW_S for it). One that comes back after its lease ran out unparks the sender.
            renewal = command.action == "alive" and self._views.get(command.view_id, -math.inf) >= now
            if command.action == "close":
                self._views.pop(command.view_id, None)
            else:
                self._had_view = True
                self._views[command.view_id] = now + VIEW_LEASE_S
                while len(self._views) > _MAX_VIEWS:
                    self._views.pop(next(iter(self._views)))
            if command.action == "open" and command.client_time is not None:
                self._pending["clock"] = {
                    "view_id": command.view_id,
                    "client_time": command.client_time,
                    "kernel_time": time.time(),
                }
        if command.action in ("open", "rows"):
            self._traits.want_rows()  # a view that opens, or missed a rows message, gets every row once
        if not renewal:
            self._sender.wake()

    def _stack(self, command: Command) -> None:
        record = self.host.registry.get(command.tid) if command.tid is not None else None
        if record is None:
            return
        stack = stack_state(record, command.click_id, self.host.cell_of_file)
        with self._lock:
            self._pending["stack"] = stack
        self._sender.wake()


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
