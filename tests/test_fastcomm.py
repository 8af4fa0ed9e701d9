"""The fast route for panel commands (nbcoord.kernel.fastcomm).

Two tiers: fake kernels (fast, no subprocess) for validation and undo, and real kernels
through jupyter_client on ipykernel 7 (``.venv``) and ipykernel 6 (``.venv-ik6``) for the
promise itself: a stop message is handled while the main thread sleeps, waits in C or
loops in Python. Every busy cell ends as soon as the handler runs, so a pass is fast and
a failure is a cell that runs to its (long) natural end.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import Kernel, kernel_params, wait_until
from interpreters import IK6, IK6_PYTHON
from jupyter_client.session import Session

from nbcoord.kernel import fastcomm as _fastcomm
from nbcoord.kernel import fastcomm_worker as _fastcomm_worker

REPO = Path(__file__).resolve().parents[1]


def stop_content(comm_id: str, click_id: str = "c1", **data: Any) -> dict[str, Any]:
    inner = {"type": "stop", "click_id": click_id}
    return {"comm_id": comm_id, "data": {"method": "custom", "content": inner, **data}}


def worker_alive() -> bool:
    return any(t.name == _fastcomm.WORKER_THREAD_NAME for t in threading.enumerate())


# -- fake kernels ----------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []

    def __call__(self, comm_id: str, content: dict[str, Any]) -> None:
        self.calls.append((comm_id, content, threading.current_thread().name))


class ChannelThread(threading.Thread):
    """A live thread with an io_loop attribute, like ipykernel's channel threads."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.io_loop = object()
        self.done = threading.Event()

    def run(self) -> None:
        self.done.wait()


@pytest.fixture
def channel_thread() -> Iterator[ChannelThread]:
    thread = ChannelThread()
    thread.start()
    yield thread
    thread.done.set()
    thread.join()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


class FakeShellKernel:
    """The attributes of an ipykernel 7 kernel that the shell-channel route uses."""

    def __init__(self, thread: ChannelThread) -> None:
        self.received: list[list[Any]] = []
        self.shell_channel_thread = thread
        self.session = Session(key=b"secret")
        self.shell_stream = types.SimpleNamespace(io_loop=thread.io_loop, _recv_callback=self.received.append)

    def frames(self, content: dict[str, Any], msg_type: str = "comm_msg") -> list[zmq.Frame]:
        """A message as the stream delivers it with copy=False."""
        wire = self.session.serialize(self.session.msg(msg_type, content), ident=[b"client"])
        return [zmq.Frame(part) for part in wire]

    def deliver(self, frames: list[Any]) -> None:
        self.shell_stream._recv_callback(frames)


def test_no_kernel_gives_route_none(recorder: Recorder) -> None:
    route = _fastcomm.install(None, recorder)
    assert route.kind == "none"
    assert route.reason is not None
    assert "shell-channel" in route.reason
    assert "control" in route.reason
    assert str(route).startswith("fast route unavailable: ")
    assert not worker_alive()
    route.add_comm("x")
    route.uninstall()


def test_control_route_validates_and_hands_over(channel_thread: ChannelThread, recorder: Recorder) -> None:
    kernel = types.SimpleNamespace(control_handlers={}, control_thread=channel_thread)
    route = _fastcomm.install(kernel, recorder, types={"stop", "stop_thread"})
    assert (route.kind, route.reason) == ("control", None)
    route.add_comm("mine")
    handle = kernel.control_handlers["comm_msg"]
    malformed: list[Any] = [
        None,
        {"content": "not a dict"},
        {"content": stop_content("foreign")},
        {"content": {"data": {"method": "custom", "content": {"type": "stop"}}}},
        {"content": {"comm_id": 7, "data": {"method": "custom", "content": {"type": "stop"}}}},
        {"content": stop_content("mine", method="update")},
        {"content": {"comm_id": "mine", "data": "x"}},
        {"content": {"comm_id": "mine", "data": {"method": "custom", "content": ["stop"]}}},
        {"content": {"comm_id": "mine", "data": {"method": "custom", "content": {"type": "rm"}}}},
        {"content": {"comm_id": "mine", "data": {"method": "custom", "content": {"type": {}}}}},
    ]
    for msg in malformed:
        assert handle(None, [], msg) is None  # never raises into the control thread
    handle(None, [], {"content": stop_content("mine", "ok")})
    thread_msg = {"content": stop_content("mine", "t")}
    thread_msg["content"]["data"]["content"]["type"] = "stop_thread"
    handle(None, [], thread_msg)
    wait_until(lambda: len(recorder.calls) == 2)
    assert [(c[0], c[1]["click_id"], c[2]) for c in recorder.calls] == [
        ("mine", "ok", _fastcomm.WORKER_THREAD_NAME),
        ("mine", "t", _fastcomm.WORKER_THREAD_NAME),
    ]
    route.remove_comm("mine")
    handle(None, [], {"content": stop_content("mine", "late")})
    route.uninstall()
    assert kernel.control_handlers == {}
    assert not worker_alive()
    assert len(recorder.calls) == 2


def test_control_route_chains_and_restores_previous_handler(channel_thread: ChannelThread, recorder: Recorder) -> None:
    seen: list[Any] = []

    def previous(stream: Any, idents: Any, msg: Any) -> str:
        seen.append(msg)
        return "previous result"

    kernel = types.SimpleNamespace(control_handlers={"comm_msg": previous}, control_thread=channel_thread)
    route = _fastcomm.install(kernel, recorder)
    route.add_comm("mine")
    msg = {"content": stop_content("mine")}
    assert kernel.control_handlers["comm_msg"](None, [], msg) == "previous result"
    assert seen == [msg]
    wait_until(lambda: recorder.calls)
    route.uninstall()
    route.uninstall()  # idempotent
    assert kernel.control_handlers == {"comm_msg": previous}


def test_control_route_needs_a_control_thread(recorder: Recorder) -> None:
    kernel = types.SimpleNamespace(control_handlers={}, control_thread=None)
    route = _fastcomm.install(kernel, recorder)
    assert route.kind == "none"
    assert route.reason is not None
    assert "main thread" in route.reason
    assert kernel.control_handlers == {}


def test_shell_route_copies_only_ours_and_passes_everything_on(
    channel_thread: ChannelThread, recorder: Recorder
) -> None:
    kernel = FakeShellKernel(channel_thread)
    original = kernel.shell_stream._recv_callback
    route = _fastcomm.install(kernel, recorder)
    assert (route.kind, route.reason) == ("shell-channel", None)
    route.add_comm("mine")
    forged = Session(key=b"wrong key")
    sent: list[list[Any]] = [
        kernel.frames({"code": "1"}, "execute_request"),
        kernel.frames(stop_content("foreign")),
        kernel.frames(stop_content("mine", method="update")),
        [zmq.Frame(part) for part in forged.serialize(forged.msg("comm_msg", stop_content("mine", "x")))],
        [zmq.Frame(b"no delimiter")],
        [b"<IDS|MSG>", b"", b"{", b"{}", b"{}", b'{"comm_id": "mine"'],
        kernel.frames(stop_content("mine", "ok")),
    ]
    for frames in sent:
        kernel.deliver(frames)
    assert kernel.received == sent  # every message passed on, as it came
    wait_until(lambda: recorder.calls)
    assert [(c[0], c[1], c[2]) for c in recorder.calls] == [
        ("mine", {"type": "stop", "click_id": "ok"}, _fastcomm.WORKER_THREAD_NAME)
    ]
    # The kernel can still deserialize (and record) what we peeked at.
    _, parts = kernel.session.feed_identities(sent[-1], copy=False)
    assert kernel.session.deserialize(parts, content=True, copy=False)["content"] == stop_content("mine", "ok")
    route.uninstall()
    assert kernel.shell_stream._recv_callback is original
    assert not worker_alive()


def test_shell_route_ignores_a_replayed_message(channel_thread: ChannelThread, recorder: Recorder) -> None:
    kernel = FakeShellKernel(channel_thread)
    route = _fastcomm.install(kernel, recorder)
    route.add_comm("mine")
    frames = kernel.frames(stop_content("mine", "once"))
    kernel.deliver(frames)
    wait_until(lambda: recorder.calls)
    _, parts = kernel.session.feed_identities(frames, copy=False)
    kernel.session.deserialize(parts, content=True, copy=False)  # the kernel records its signature
    kernel.deliver(frames)  # the same message again: the kernel would refuse it, and so does the route
    kernel.deliver(kernel.frames(stop_content("mine", "next")))
    wait_until(lambda: len(recorder.calls) == 2)
    assert [c[1]["click_id"] for c in recorder.calls] == ["once", "next"]
    route.uninstall()


def test_a_message_answered_in_a_flood_cannot_be_replayed(channel_thread: ChannelThread, recorder: Recorder) -> None:
    """In a flood the route answers the clicks it took, and the kernel never reads them: their signatures are
    recorded as the kernel's reading would, so that a replay is refused by the kernel and by the route."""
    kernel = FakeShellKernel(channel_thread)
    route = _fastcomm.install(kernel, recorder)
    route.add_comm("mine")
    sent = [kernel.frames(stop_content("mine", f"c{i}")) for i in range(_fastcomm.FLOOD_PER_S + 10)]
    for frames in sent:
        kernel.deliver(frames)
    wait_until(lambda: len(recorder.calls) == len(sent), 10, what="the route to take every click")
    passed_on = {f[2].bytes for f in kernel.received}  # [identity, delimiter, signature, ...]
    swallowed = [f for f in sent if f[2].bytes not in passed_on]
    assert swallowed, "no click was answered by the route alone: not a flood"
    replay = swallowed[-1]
    _, parts = kernel.session.feed_identities(replay, copy=False)
    with pytest.raises(ValueError, match="Duplicate Signature"):
        kernel.session.deserialize(parts, content=True, copy=False)
    calls = len(recorder.calls)
    kernel.deliver(replay)
    kernel.deliver(kernel.frames(stop_content("mine", "after")))
    wait_until(lambda: recorder.calls[-1][1]["click_id"] == "after", 10, what="the next click")
    taken = [c[1]["click_id"] for c in recorder.calls[calls:]]
    assert taken == ["after"], taken
    route.uninstall()


def test_shell_route_rewrapped_later_stays_inert(channel_thread: ChannelThread, recorder: Recorder) -> None:
    kernel = FakeShellKernel(channel_thread)
    route = _fastcomm.install(kernel, recorder)
    route.add_comm("mine")
    ours = kernel.shell_stream._recv_callback
    later: list[Any] = []

    def wrapper(frames: list[Any]) -> None:
        later.append(frames)
        ours(frames)

    kernel.shell_stream._recv_callback = wrapper
    route.uninstall()
    assert kernel.shell_stream._recv_callback is wrapper
    frames = kernel.frames(stop_content("mine"))
    kernel.deliver(frames)
    assert kernel.received == [frames]
    assert later == [frames]
    assert recorder.calls == []


def test_shell_route_falls_back_to_control(channel_thread: ChannelThread, recorder: Recorder) -> None:
    # A stream read on another loop than the channel thread's: the shell route would be
    # no faster than the main thread, so the control route is used.
    kernel = FakeShellKernel(channel_thread)
    kernel.shell_stream.io_loop = object()
    kernel.control_handlers = {}  # type: ignore[attr-defined]
    kernel.control_thread = channel_thread  # type: ignore[attr-defined]
    route = _fastcomm.install(kernel, recorder)
    assert route.kind == "control"
    route.uninstall()
    assert kernel.control_handlers == {}  # type: ignore[attr-defined]


def test_failing_handler_is_logged_and_the_worker_goes_on(
    channel_thread: ChannelThread, caplog: pytest.LogCaptureFixture
) -> None:
    done = threading.Event()

    def handler(comm_id: str, content: dict[str, Any]) -> None:
        if content["click_id"] == "boom":
            raise RuntimeError("boom")
        done.set()

    kernel = types.SimpleNamespace(control_handlers={}, control_thread=channel_thread)
    route = _fastcomm.install(kernel, handler)
    route.add_comm("mine")
    failed = _fastcomm_worker._log_failed.calls
    kernel.control_handlers["comm_msg"](None, [], {"content": stop_content("mine", "boom")})
    kernel.control_handlers["comm_msg"](None, [], {"content": stop_content("mine", "ok")})
    assert done.wait(10)
    route.uninstall()
    assert _fastcomm_worker._log_failed.calls == failed + 1
    # One line, rate-limited (the commands come from an untrusted front end): no traceback per message.
    logged = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert all(not r.exc_info for r in logged)
    assert not logged or "boom" in logged[-1].getMessage()


class HeldWorker:
    """A control-route install whose handler holds the worker on its first command until released."""

    def __init__(self, channel_thread: ChannelThread) -> None:
        self.release = threading.Event()
        self.holding = threading.Event()
        self.handled: list[str] = []
        self.joined: list[tuple[str, list[str]]] = []
        self.idle_calls: list[float] = []
        self.kernel = types.SimpleNamespace(control_handlers={}, control_thread=channel_thread)
        self.route = _fastcomm.install(self.kernel, self.handler, joined=self.join)
        self.route.add_comm("mine")

    def handler(self, comm_id: str, content: dict[str, Any]) -> None:
        if not self.holding.is_set():
            self.holding.set()
            assert self.release.wait(10)
        self.handled.append(content["click_id"])

    def join(self, comm_id: str, content: dict[str, Any], click_ids: list[str]) -> None:
        self.joined.append((content["click_id"], list(click_ids)))

    def send(self, click_id: str, **values: Any) -> None:
        msg = {"content": stop_content("mine", click_id)}
        msg["content"]["data"]["content"].update(values)
        self.kernel.control_handlers["comm_msg"](None, [], msg)


def test_equal_commands_queued_behind_a_busy_worker_join_the_last_one(channel_thread: ChannelThread) -> None:
    held = HeldWorker(channel_thread)
    held.send("v-0")
    assert held.holding.wait(10)
    for n in range(1, 6):  # equal but for click_id and clicked_at: one queued command
        held.send(f"v-{n}", scope="all", clicked_at=float(n))
    held.send("v-6", scope="cell")  # another command: queued on its own, and the next join the last one only
    held.send("v-7", scope="all")
    held.send("v-8", scope="all", force=1)  # 1 is not True: never joins a command that parses differently
    held.send("v-9", scope="all", force=True)
    held.send("v-10", scope="all", force=True)
    held.send("v-11", scope="all", nested={"a": 1})  # nothing nested is compared: queued on its own
    held.send("v-12", scope="all", nested={"a": 1})
    held.release.set()
    wait_until(lambda: len(held.handled) == 8)
    assert held.handled == ["v-0", "v-1", "v-6", "v-7", "v-8", "v-9", "v-11", "v-12"]
    wait_until(lambda: len(held.joined) == 2)
    assert held.joined == [("v-1", ["v-2", "v-3", "v-4", "v-5"]), ("v-9", ["v-10"])]
    held.route.uninstall()
    assert not worker_alive()


def test_without_a_joined_handler_every_command_is_queued_on_its_own(
    channel_thread: ChannelThread, recorder: Recorder
) -> None:
    kernel = types.SimpleNamespace(control_handlers={}, control_thread=channel_thread)
    route = _fastcomm.install(kernel, recorder)
    route.add_comm("mine")
    for n in range(20):
        kernel.control_handlers["comm_msg"](None, [], {"content": stop_content("mine", f"v-{n}")})
    wait_until(lambda: len(recorder.calls) == 20)
    assert [c[1]["click_id"] for c in recorder.calls] == [f"v-{n}" for n in range(20)]
    route.uninstall()


def test_a_flood_is_bounded_by_the_queue_and_the_joined_clicks(channel_thread: ChannelThread) -> None:
    held = HeldWorker(channel_thread)
    held.send("v-0")
    assert held.holding.wait(10)
    room = _fastcomm_worker.QUEUE_SIZE * (1 + _fastcomm_worker.MAX_JOINED)
    taken = [held.route._worker.submit("mine", {"type": "stop", "click_id": f"v-{n}"}) for n in range(1, room + 101)]
    assert taken == [True] * room + [False] * 100  # the rest is left to the ordinary route
    with held.route._worker._lock:
        pending = list(held.route._worker._pending)
    assert len(pending) == _fastcomm_worker.QUEUE_SIZE
    assert all(len(item.joined) == _fastcomm_worker.MAX_JOINED for item in pending)
    held.release.set()
    wait_until(lambda: len(held.joined) == _fastcomm_worker.QUEUE_SIZE)
    clicks = held.handled[1:] + [click for _, ids in held.joined for click in ids]
    assert sorted(clicks) == sorted(f"v-{n}" for n in range(1, room + 1))  # each taken click once, none lost
    held.route.uninstall()


def test_the_worker_calls_idle_again_after_the_delay_it_asks_for(channel_thread: ChannelThread) -> None:
    calls: list[float] = []

    def idle() -> float | None:
        calls.append(time.monotonic())
        return 0.05 if len(calls) < 3 else None

    kernel = types.SimpleNamespace(control_handlers={}, control_thread=channel_thread)
    route = _fastcomm.install(kernel, lambda comm_id, content: None)
    route.on_idle = idle
    route.add_comm("mine")
    kernel.control_handlers["comm_msg"](None, [], {"content": stop_content("mine", "v-1")})
    wait_until(lambda: len(calls) == 3)
    time.sleep(0.2)
    assert len(calls) == 3, "None: not called again before the next command"
    assert calls[2] - calls[1] >= 0.04 and calls[1] - calls[0] >= 0.04
    route.uninstall()


# -- real kernels ----------------------------------------------------------------------


@dataclass
class FastKernel:
    """Conftest's kernel (the probe's class defined, nbcoord not loaded), its ipykernel line, and the fast route
    kind it offers."""

    kernel: Kernel
    name: str
    kind: str = ""

    @property
    def client(self) -> Any:
        return self.kernel.kc

    def run(self, code: str, timeout: float = 60) -> str:
        """Run a cell; return what it printed; fail on an error."""
        return self.kernel.run(textwrap.dedent(code), timeout).text

    def value(self, expr: str) -> Any:
        return self.kernel.evaluate(expr)

    def start_cell(self, code: str) -> str:
        """Start a cell and return when it printed 'busy' (it is then inside its wait)."""
        return self.kernel.submit_until_printed(textwrap.dedent(code), "busy", timeout=60)

    def finish_cell(self, msg_id: str, timeout: float = 60) -> None:
        """Wait for the cell's execute_reply (its output is read later, from state)."""
        result = self.kernel.collect(msg_id, timeout)
        assert result.status == "ok", result.reply["content"]

    def send_comm_msg(self, content: dict[str, Any]) -> None:
        """Send as the panel does: also on the control channel when that is the route."""
        session = self.client.session
        if self.kind == "control":
            self.client.control_channel.send(session.msg("comm_msg", content))
        self.client.shell_channel.send(session.msg("comm_msg", content))

    def send_raw(self, parts: list[bytes]) -> None:
        channel = self.client.control_channel if self.kind == "control" else self.client.shell_channel
        assert channel.socket is not None
        channel.socket.send_multipart(parts)


KERNEL_SETUP = """
import json, signal, threading, time, comm
from nbcoord.kernel import fastcomm as _fastcomm
from nbcoord.kernel import fastcomm_worker as _fastcomm_worker

class FastCommProbe:
    def __init__(self):
        self.event = threading.Event()
        self.records = []
        self.ordinary = []
        self.wake = None
        self.route = _fastcomm.install(get_ipython().kernel, self.handle)
        self.comm = comm.create_comm(target_name="nbcoord-test")
        self.comm.on_msg(lambda msg: self.ordinary.append(msg["content"]["data"]))
        self.route.add_comm(self.comm.comm_id)

    def handle(self, comm_id, content):
        self.records.append({"comm_id": comm_id, "click_id": content.get("click_id"),
                             "thread": threading.current_thread().name})
        if self.wake is not None:
            self.wake()
        self.event.set()

    def close(self):
        self.route.uninstall()
        self.comm.close()
"""


#: ipykernel 7 (this environment) and 6: one kernel each for the module (conftest's ``kernel``), nbcoord not loaded.
IPYKERNEL7 = pytest.param(sys.executable, id="ipykernel7")
KERNEL_OPTIONS = kernel_params(
    [IPYKERNEL7, IK6], nbcoord="off", env={"PYTHONPATH": str(REPO)}, after=KERNEL_SETUP
)


@pytest.fixture(scope="module")
def fast(kernel: Kernel) -> FastKernel:
    return FastKernel(kernel, "ipykernel6" if kernel.python == str(IK6_PYTHON) else "ipykernel7")


@pytest.fixture
def probe(fast: FastKernel) -> Iterator[str]:
    kernel = fast
    """A fresh route and comm in the kernel; returns the comm id."""
    kernel.run("probe = FastCommProbe()")
    kernel.kind = kernel.value("probe.route.kind")
    expected = "control" if kernel.name == "ipykernel6" else "shell-channel"
    assert kernel.kind == expected, kernel.value("probe.route.reason")
    yield kernel.value("probe.comm.comm_id")
    kernel.run("probe.close()")


# Each busy cell prints 'busy', waits for up to 30 s, and records whether the wait ended
# because the handler ran (woken), which is only possible if it ran during the wait.
BUSY_CELLS = {
    "sleep": """
        class Woken(Exception): pass
        def _raise(signum, frame): raise Woken
        previous = signal.signal(signal.SIGUSR1, _raise)
        main_id = threading.main_thread().ident
        probe.wake = lambda: signal.pthread_kill(main_id, signal.SIGUSR1)
        woken = False
        try:
            print("busy", flush=True)
            time.sleep(30)
        except Woken:
            woken = True
        finally:
            signal.signal(signal.SIGUSR1, previous)
            probe.wake = None
    """,
    "c-wait": """
        print("busy", flush=True)
        woken = probe.event.wait(30)
    """,
    "python-loop": """
        print("busy", flush=True)
        deadline, n = time.monotonic() + 30, 0
        while not probe.event.is_set() and time.monotonic() < deadline:
            n += 1
        woken = probe.event.is_set()
    """,
}


@pytest.mark.kernel
@pytest.mark.parametrize("mode", list(BUSY_CELLS))
def test_stop_is_handled_while_the_main_thread_is_busy(fast: FastKernel, probe: str, mode: str) -> None:
    kernel = fast
    msg_id = kernel.start_cell(BUSY_CELLS[mode])
    kernel.send_comm_msg(stop_content(probe, "click-1"))
    kernel.finish_cell(msg_id)
    assert kernel.value("woken") is True
    assert kernel.value("probe.records") == [
        {"comm_id": probe, "click_id": "click-1", "thread": _fastcomm.WORKER_THREAD_NAME}
    ]
    # The ordinary message still reached the widget's own handler, once the cell ended.
    assert kernel.value("[d['content']['click_id'] for d in probe.ordinary]") == ["click-1"]


@pytest.mark.kernel
# ipykernel 6 only (the control route): ipykernel 7 takes the click off the shell channel and publishes no status.
@pytest.mark.parametrize("kernel", KERNEL_OPTIONS[1:], indirect=True)
def test_a_control_click_leaves_the_kernel_status_busy_while_a_cell_runs(fast: FastKernel, probe: str) -> None:
    kernel = fast
    # ipykernel 6 publishes busy and idle around each control message; a front end takes a tracked "idle" for the
    # kernel's status. While a cell runs, the route makes that idle's parent untracked (same msg_id); between cells
    # the idle is left as it is (it is true then).
    assert kernel.kind == "control"
    kernel.run("cell_running = threading.Event(); probe.route.cell_running = cell_running.is_set")

    def statuses_of(content: dict[str, Any]) -> list[tuple[str, str]]:
        sent = kernel.client.session.msg("comm_msg", content)
        kernel.client.control_channel.send(sent)

        def seen() -> list[tuple[str, str]]:
            return [
                (msg["content"]["execution_state"], msg["parent_header"]["msg_type"])
                for msg in kernel.kernel.messages
                if msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == sent["header"]["msg_id"]
            ]

        def idle_seen() -> bool:
            kernel.kernel.pump()
            return any(state == "idle" for state, _ in seen())

        wait_until(idle_seen, 30, what="the control message's idle status")
        return seen()

    msg_id = kernel.start_cell("""
        cell_running.set()
        print("busy", flush=True)
        probe.event.clear()
        probe.event.wait(30)
        cell_running.clear()
    """)
    foreign = statuses_of(stop_content("not-a-registered-comm", "status-0"))  # another widget's: not ours
    during = statuses_of(stop_content(probe, "status-1"))
    kernel.finish_cell(msg_id)
    assert foreign == [("busy", "comm_msg"), ("idle", "comm_msg")]
    assert during == [("busy", "comm_msg"), ("idle", _fastcomm.UNTRACKED_PARENT)]
    between = statuses_of(stop_content(probe, "status-2"))
    assert between == [("busy", "comm_msg"), ("idle", "comm_msg")]


@pytest.mark.kernel
@pytest.mark.tensorflow
def test_stop_unblocks_sess_run_on_an_empty_queue(fast: FastKernel, probe: str) -> None:
    kernel = fast
    if not kernel.value("__import__('importlib.util').util.find_spec('tensorflow') is not None"):
        pytest.skip(f"no tensorflow in the {kernel.name} environment")
    kernel.run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        graph = tf.Graph()
        with graph.as_default():
            queue = tf.compat.v1.FIFOQueue(4, tf.float32)
            dequeue, close = queue.dequeue(), queue.close(cancel_pending_enqueues=True)
        sess = tf.compat.v1.Session(graph=graph)
        probe.wake = lambda: sess.run(close)
        """,
        timeout=120,
    )
    msg_id = kernel.start_cell(
        """
        print("busy", flush=True)
        try:
            sess.run(dequeue, options=tf.compat.v1.RunOptions(timeout_in_ms=30000))
            woken = "dequeued"
        except tf.errors.OutOfRangeError:
            woken = True
        finally:
            probe.wake = None
            sess.close()
        """
    )
    kernel.send_comm_msg(stop_content(probe, "tf"))
    kernel.finish_cell(msg_id)
    assert kernel.value("woken") is True
    assert kernel.value("[r['click_id'] for r in probe.records]") == ["tf"]


@pytest.mark.kernel
def test_malformed_and_foreign_messages_are_not_handled(fast: FastKernel, probe: str) -> None:
    kernel = fast
    kernel.run(
        """
        foreign_got = []
        other = comm.create_comm(target_name="other")
        other.on_msg(lambda msg: foreign_got.append(msg["content"]["data"]))
        """
    )
    foreign = kernel.value("other.comm_id")
    msg_id = kernel.start_cell(BUSY_CELLS["c-wait"])
    bad_inner = [["stop"], {"type": "unknown"}, {"type": {"a": 1}}, {"type": None}]
    for content in [
        stop_content(foreign, "foreign"),
        stop_content(probe, "update", method="update"),
        {"comm_id": probe, "data": "stop"},
        {"data": {"method": "custom", "content": {"type": "stop"}}},
        {"comm_id": 12, "data": {"method": "custom", "content": {"type": "stop"}}},
        *({"comm_id": probe, "data": {"method": "custom", "content": inner}} for inner in bad_inner),
    ]:
        kernel.send_comm_msg(content)
    # Signed with another key, then not a message at all.
    forged = Session(key=b"not the kernel's key")
    kernel.send_raw(forged.serialize(forged.msg("comm_msg", stop_content(probe, "forged"))))
    kernel.send_raw([b"<IDS|MSG>", b"", b"{not json", b"", b"", b""])
    kernel.send_comm_msg(stop_content(probe, "valid"))
    kernel.finish_cell(msg_id)
    # Messages are handled in order, so the valid click ending the wait means every
    # earlier message was looked at and refused.
    assert kernel.value("woken") is True
    assert kernel.value("[r['click_id'] for r in probe.records]") == ["valid"]
    assert kernel.value("[d['content']['click_id'] for d in foreign_got]") == ["foreign"]
    kernel.run("other.close()")
    assert kernel.value("1 + 1") == 2  # the kernel still answers


CALLBACK_STATE = """
    k = get_ipython().kernel
    state = lambda: (k.shell_stream._recv_callback, "comm_msg" in k.control_handlers,
                     k.control_handlers.get("comm_msg"))
"""


@pytest.mark.kernel
def test_uninstall_restores_the_kernel(fast: FastKernel) -> None:
    kernel = fast
    kernel.run(CALLBACK_STATE)
    kernel.run("before = state()")
    kernel.run("probe = FastCommProbe()")
    kernel.kind = kernel.value("probe.route.kind")
    comm_id = kernel.value("probe.comm.comm_id")
    assert kernel.value("state() != before") is True
    assert kernel.value(f"any(t.name == {_fastcomm.WORKER_THREAD_NAME!r} for t in threading.enumerate())")
    kernel.run("probe.route.uninstall()")
    assert kernel.value("all(a is b for a, b in zip(state(), before))") is True
    assert kernel.value(f"[t.name for t in threading.enumerate() if t.name == {_fastcomm.WORKER_THREAD_NAME!r}]") == []
    # Clicks now take the ordinary path only.
    kernel.send_comm_msg(stop_content(comm_id, "after"))
    assert kernel.value("[d['content']['click_id'] for d in probe.ordinary]") == ["after"]
    assert kernel.value("probe.records") == []
    kernel.run("probe.comm.close()")


@pytest.mark.kernel
# The shell-channel route exists on ipykernel 7 only: this test runs there, and is not made for ipykernel 6.
@pytest.mark.parametrize("kernel", KERNEL_OPTIONS[:1], indirect=True)
def test_shell_route_chains_to_a_callback_installed_before_it(fast: FastKernel) -> None:
    kernel = fast
    kernel.run(CALLBACK_STATE)
    kernel.run(
        """
        seen = []
        kernel_callback = k.shell_stream._recv_callback
        def counting(frames):
            seen.append(len(frames))
            return kernel_callback(frames)
        k.shell_stream._recv_callback = counting
        probe = FastCommProbe()
        """
    )
    kernel.kind = "shell-channel"
    comm_id = kernel.value("probe.comm.comm_id")
    msg_id = kernel.start_cell(BUSY_CELLS["c-wait"])
    kernel.send_comm_msg(stop_content(comm_id, "chained"))
    kernel.finish_cell(msg_id)
    assert kernel.value("woken") is True
    assert kernel.value("len(seen) >= 2") is True  # the busy cell and the click, at least
    kernel.run("probe.close()")
    assert kernel.value("k.shell_stream._recv_callback is counting") is True
    kernel.run("k.shell_stream._recv_callback = kernel_callback")
