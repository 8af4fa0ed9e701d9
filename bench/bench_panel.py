"""The live panel's costs, each against a baseline measured in the same run.

1. **Click to handler while the kernel is busy** (sleep, a C wait, a Python loop), on ipykernel 7 (this
   environment) and 6 (``.venv-ik6``): a Stop-all command is sent the way the panel's module sends it, during a
   cell that stays busy for ``--busy`` seconds; the panel's own report gives the moment its handler got the
   command (``received_at``), and the client notes when the stop's report arrived on iopub. Baseline: the same
   click with the fast route removed (the default path: handled when the cell ends).
2. **Idle bytes per second** on iopub with 100 and 1000 idle threads and a view open, counted on a raw SUB
   socket (every frame of every panel message). Baseline: what sending the whole state every interval would
   cost (the state's size, measured in the same kernel, times the rate). Target: < 1 KB/s at 1000 threads.
3. **Kernel CPU of an open panel**, idle (1000 idle threads) and with 1000 threads churning (each alternates
   between waiting and short bursts of work, and five a second end and are replaced), over ``--window`` seconds
   each, as a share of one core. What the panel costs is measured on its own threads with the kernel's per-thread
   scheduler statistics (``/proc/<pid>/task/<tid>/schedstat``, nanoseconds): the sender thread, plus what the
   IOPub thread spends more with the panel open than with it closed (parked). That resolves far better than
   0.05 % of a core over any window of a second or more; the process's total CPU (open vs closed) is printed
   beside it, with its own resolution (the 10 ms tick of ``/proc/<pid>/stat`` over the window).
   Target: < 1 % of one core idle, < 2 % churning.
4. **Bytes sent for one row change at 1000 threads**: one of 1000 idle threads renamed, with a view open; the
   panel's message that brings the new name, as it crosses iopub (its content frame). Baseline: the whole
   ``threads`` trait update the panel sent before the rows went by difference (issue 26, point 4), encoded the same
   way from the same kernel's rows. Target: <= 5 KB.

Run: ``python bench/bench_panel.py [--busy 1.0] [--reps 2] [--window 20]`` (about 4 minutes). The browser's side
(time to apply one update at 1000 threads) is ``bench/bench_panel_browser.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import zmq
from _kernels import kernel_env, kernel_manager, run_cell, thread_cpu_ns
from _results import result
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]
IK6 = REPO / ".venv-ik6" / "bin" / "python"

SETUP = """
%load_ext nbcoord
import json, threading, time, ipykernel
import nbcoord
from nbcoord.ui import panel as _panel
def workers(n, prefix):
    out = [threading.Thread(target=nbcoord.wait_for_stop, name=f"{prefix}-{i}", daemon=True) for i in range(n)]
    for t in out:
        t.start()
    return out
p = nbcoord.panel()
controller = nbcoord._extension.panel_controller()
print(json.dumps({"comm_id": p.comm.comm_id, "route": controller.route.kind, "ipykernel": ipykernel.__version__}))
"""

BUSY = {
    "sleep": "time.sleep(BUSY)",
    "c-wait": "threading.Event().wait(BUSY)",
    "python-loop": "_end = time.monotonic() + BUSY\nwhile time.monotonic() < _end:\n    pass",
}


class Kernel:
    """A kernel with nbcoord's panel, driven like a front end."""

    def __init__(self, client: BlockingKernelClient, manager: KernelManager) -> None:
        self.client = client
        self.manager = manager
        self.info: dict[str, Any] = json.loads(self.run(SETUP).strip().splitlines()[-1])
        self.pid = int(manager.provisioner.process.pid)  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 120) -> str:
        return run_cell(self.client, code, timeout)

    def value(self, expression: str) -> Any:
        return json.loads(self.run(f"print(json.dumps({expression}))").strip().splitlines()[-1])

    def send(self, command: dict[str, Any]) -> None:
        """As the module sends it: the ordinary message, plus the control channel on that route."""
        content = {"comm_id": self.info["comm_id"], "data": {"method": "custom", "content": command}}
        session = self.client.session
        if self.info["route"] == "control":
            self.client.control_channel.send(session.msg("comm_msg", content))
        self.client.shell_channel.send(session.msg("comm_msg", content))

    def open_view(self) -> str:
        view = f"v{uuid.uuid4().hex[:8]}"
        self.send({"type": "view", "view_id": view, "action": "open", "click_id": f"{view}-0"})
        return view

    def click_while_busy(self, mode: str, busy: float) -> tuple[float, float | None]:
        """(click -> handler, click -> report on iopub) in ms, for one click during one busy cell."""
        self.run("_w = workers(3, 'bench')")
        msg_id = self.client.execute(f"BUSY = {busy}\nprint('busy', flush=True)\n{BUSY[mode]}")
        report_at: float | None = None
        click_id = f"c{uuid.uuid4().hex[:10]}-1"  # <view id>-<n>, as the panel's module numbers clicks
        sent = 0.0
        replied = False
        deadline = time.monotonic() + busy + 60
        while not replied and time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=0.01)
            except Exception:
                msg = None
            if msg is not None:
                parent = msg["parent_header"].get("msg_id")
                if not sent and parent == msg_id and msg["msg_type"] == "stream" and "busy" in msg["content"]["text"]:
                    time.sleep(0.1)  # inside the busy part
                    sent = time.time()
                    self.send({"type": "stop", "scope": "all", "click_id": click_id, "clicked_at": sent * 1000})
                elif msg["msg_type"] == "comm_msg" and report_at is None:
                    state = msg["content"]["data"].get("state", {})
                    if (state.get("last_stop") or {}).get("click_id") == click_id:
                        report_at = time.time()
            try:
                reply = self.client.get_shell_msg(timeout=0)
                replied = reply["parent_header"].get("msg_id") == msg_id
            except Exception:
                pass
        # On the default path the stop runs once the cell ends, on the panel's action thread: wait for its report.
        handled = None
        answer = time.monotonic() + 10
        while handled is None and time.monotonic() < answer:
            handled = self.value(
                "(p.last_stop or {}).get('received_at') if (p.last_stop or {}).get('click_id') == "
                f"{click_id!r} else None"
            )
        self.run("nbcoord.stop_all()")
        to_handler = (handled - sent) * 1000 if handled is not None else float("nan")
        return to_handler, None if report_at is None else (report_at - sent) * 1000


@contextmanager
def kernel(python: str) -> Iterator[Kernel]:
    with tempfile.TemporaryDirectory() as tmp:
        manager = kernel_manager(tmp, python)
        manager.start_kernel(
            env=kernel_env(IPYTHONDIR=tmp),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            yield Kernel(client, manager)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


def bench_latency(python: str, busy: float, reps: int) -> None:
    with kernel(python) as k:
        k.open_view()
        rows: dict[str, list[tuple[float, float | None]]] = {}
        for mode in BUSY:
            rows[mode] = [k.click_while_busy(mode, busy) for _ in range(reps)]
        k.run("controller.route.uninstall()")  # the baseline: the default path only
        base = {mode: [k.click_while_busy(mode, busy) for _ in range(max(1, reps // 2))] for mode in BUSY}
        for mode in BUSY:
            fast = statistics.median(r[0] for r in rows[mode])
            shown = [r[1] for r in rows[mode] if r[1] is not None]
            dflt = statistics.median(r[0] for r in base[mode])
            print(
                f"{k.info['ipykernel']:>9} {k.info['route']:>13} {mode:>12} {fast:9.1f} "
                f"{statistics.median(shown) if shown else float('nan'):10.1f} {dflt:9.1f} {dflt / fast:8.0f}x",
                flush=True,
            )
            result(
                f"panel stop click to handler while busy: {mode}, ipykernel {k.info['ipykernel']}",
                fast,
                dflt,
                "ms",
                "<= 200 ms",
                fast <= 200,
                vs="the default path (handled when the cell ends)",
                note=f"route {k.info['route']}",
            )


class IopubCounter:
    """Counts the bytes of every iopub message of one comm, on its own SUB socket."""

    def __init__(self, manager: KernelManager, comm_id: str) -> None:
        info = manager.get_connection_info()
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(f"{info['transport']}://{info['ip']}:{info['iopub_port']}")
        self.comm_id = comm_id.encode()

    def count(self, seconds: float) -> tuple[int, int]:
        """(bytes, messages) of the panel's comm over ``seconds``."""
        total = messages = 0
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                continue
            frames = self.socket.recv_multipart()
            if any(self.comm_id in frame for frame in frames[-4:]):
                total += sum(len(frame) for frame in frames)
                messages += 1
        return total, messages

    def drain(self) -> None:
        while self.socket.poll(0):
            self.socket.recv_multipart()

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


#: The scheduler's nanosecond counters; without them (not Linux) the tick-based totals stand alone.
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

CHURN = """
import random
_churn_stop = threading.Event()
def _churner(seed):
    rnd = random.Random(seed)
    mine = threading.Event()
    _churn_own[threading.get_ident()] = mine
    while not (_churn_stop.is_set() or mine.is_set() or nbcoord.should_stop()):
        if mine.wait(rnd.uniform(0.5, 4.0)):
            break
        end = time.perf_counter() + 0.002  # a burst of work: the thread turns active, then idle again
        while time.perf_counter() < end:
            pass
_churn_own = {}
_churners = [threading.Thread(target=_churner, args=(i,), name=f"churn-{i}", daemon=True) for i in range(1000)]
for t in _churners:
    t.start()
def _replace():
    n = 1000
    while not _churn_stop.wait(0.2):  # five threads a second end, and new ones take their place
        old = _churners.pop(0)
        event = _churn_own.pop(old.ident, None)
        if event is not None:
            event.set()
        t = threading.Thread(target=_churner, args=(n,), name=f"churn-{n}", daemon=True)
        n += 1
        t.start()
        _churners.append(t)
_replacer = threading.Thread(target=_replace, name="churn-replacer", daemon=True)
_replacer.start()
"""


def process_cpu_s(pid: int) -> float:
    """CPU seconds of the whole process (every thread it ever had), in clock ticks."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@dataclass
class CpuWindow:
    """What one window measured: the sender's and IOPub's CPU (ns counters), the process's (ticks)."""

    seconds: float
    sender_s: float | None
    iopub_s: float | None
    process_s: float
    ticks: int

    def share(self, value: float | None) -> float | None:
        return None if value is None else value / self.seconds


def measure_cpu(k: Kernel, sender: int | None, iopub: int | None, window: float) -> CpuWindow:
    """CPU of the sender thread, the IOPub thread and the process over ``window`` seconds (the bench waits)."""
    ticks = k.value("controller.ticks")
    start = time.monotonic()
    sender0 = thread_cpu_ns(k.pid, sender) if sender else None
    iopub0 = thread_cpu_ns(k.pid, iopub) if iopub else None
    process0 = process_cpu_s(k.pid)
    time.sleep(window)  # the window itself: the kernel works, this process only reads counters around it
    sender1 = thread_cpu_ns(k.pid, sender) if sender else None
    iopub1 = thread_cpu_ns(k.pid, iopub) if iopub else None
    process1 = process_cpu_s(k.pid)
    seconds = time.monotonic() - start
    return CpuWindow(
        seconds=seconds,
        sender_s=(sender1 - sender0) / 1e9 if sender0 is not None and sender1 is not None else None,
        iopub_s=(iopub1 - iopub0) / 1e9 if iopub0 is not None and iopub1 is not None else None,
        process_s=process1 - process0,
        ticks=k.value("controller.ticks") - ticks,
    )


def close_view(k: Kernel, view: str) -> None:
    """Close the view and let the sender park."""
    k.send({"type": "view", "view_id": view, "action": "close", "click_id": f"{view}-999999"})
    k.run("controller._pending_until = 0")
    deadline = time.monotonic() + 10
    while k.value("controller.watched()") and time.monotonic() < deadline:
        time.sleep(0.1)


def settle(counter: IopubCounter, quiet: float = 3.0, limit: float = 30.0) -> None:
    """Wait until a ``quiet``-second window of the panel's comm is silent (new threads settle), at most ``limit``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and counter.count(quiet)[1]:
        pass


def bench_idle(k: Kernel, threads: int, window: float) -> None:
    """Part 2 in kernel ``k``, which has ``threads`` idle threads once this returns."""
    counter = IopubCounter(k.manager, k.info["comm_id"])
    try:
        have = k.value("len(_idle)")
        k.run(f"_idle += workers({threads - have}, 'idle{threads}')")
        interval = k.value("nbcoord._extension.config.panel_interval")
        view = k.open_view()
        settle(counter)
        # Quiet for longer than a tick apart (with 1000 threads ticks are seconds apart, and rows held back for
        # their size go out between ticks): a shorter silence may fall between the startup's last two messages.
        settle(counter, quiet=max(3.0, 1.5 * k.value("controller._wait()")), limit=90.0)
        ticks = k.value("controller.ticks")
        # The traits, and the rows (sent by difference, not as traits) as a whole copy would send them.
        state_bytes = k.value(f"sum(controller._sent_size.values()) + len({TO_JSON}(controller._traits.rows.rows))")
        counter.drain()
        sent, messages = counter.count(window)
        ticks = k.value("controller.ticks") - ticks
        close_view(k, view)
    finally:
        counter.close()
    naive = state_bytes / interval
    print(
        f"{threads:>7} {sent / window:10.1f} {messages:>5} {ticks:>5} {naive:12.0f}"
        f" {naive / max(sent / window, 1):9.0f}x",
        flush=True,
    )
    result(
        f"idle panel traffic, {threads} threads",
        sent / window,
        naive,
        "B/s",
        "< 1 KB/s",
        sent / window < 1024,
        vs="the whole state sent every interval",
    )


#: The panel's JSON encoder, in the kernel (for sizes).
TO_JSON = "__import__('nbcoord.ui.sender', fromlist=['to_json']).to_json"
#: The most one row change may cost at 1000 threads (issue 26, point 4).
ONE_ROW_TARGET = 5 * 1024


def _content(frames: list[bytes]) -> bytes | None:
    """The content frame of one iopub message (after the delimiter: signature, header, parent, metadata, content)."""
    try:
        return frames[frames.index(b"<IDS|MSG>") + 5]
    except (ValueError, IndexError):
        return None


def _renames(content: bytes, name: str) -> bool:
    """Whether a panel message's content brings a thread row named ``name`` (a rows message's upsert, or a whole
    threads trait): not the cells section, whose first lines may quote the name."""
    data = json.loads(content).get("data", {})
    rows = (data.get("state") or {}).get("threads") or ((data.get("content") or {}).get("threads") or {})
    rows = rows.get("upsert", []) if isinstance(rows, dict) else rows
    return any(isinstance(row, dict) and row.get("name") == name for row in rows)


def bench_one_row(k: Kernel) -> None:
    """Part 4 in kernel ``k``, which has 1000 idle threads in ``_idle``: rename one, weigh the message that says so."""
    counter = IopubCounter(k.manager, k.info["comm_id"])
    try:
        view = k.open_view()
        settle(counter, quiet=max(3.0, 1.5 * k.value("controller._wait()")), limit=90.0)
        # Before: the whole list as one trait update, encoded as the kernel's session encodes a message's content.
        before = k.value(
            "len(json.dumps({'comm_id': p.comm.comm_id, 'data': {'method': 'update', 'state': "
            "{'threads': p.threads}, 'buffer_paths': []}}, ensure_ascii=False).encode())"
        )
        threads = k.value("len(p.threads)")
        counter.drain()
        k.run("_idle[500].name = 'renamed-' + str(500)")  # the name is not in the cell's line (the cells section)
        after: int | None = None
        deadline = time.monotonic() + 30
        while after is None and time.monotonic() < deadline:
            if not counter.socket.poll(500):
                continue
            content = _content(counter.socket.recv_multipart())
            if content is not None and counter.comm_id in content and _renames(content, "renamed-500"):
                after = len(content)
        close_view(k, view)
    finally:
        counter.close()
    ratio = None if after is None else after / before
    print(f"{threads:>7} {before:>12} {after if after is not None else 'n/a':>10} {ratio or float('nan'):>10.4f}")
    result(
        "panel bytes for one row change, 1000 threads",
        after,
        before,
        "B",
        "<= 5 KB",
        after is not None and after <= ONE_ROW_TARGET,
        vs="the whole threads trait (before rows went by difference)",
        note=f"{threads} rows; the content frame of the message that carries the renamed row",
    )


def bench_cpu(k: Kernel, label: str, window: float, target: float) -> None:
    """Part 3, one line: the panel's CPU with a view open vs the same kernel with it closed."""
    sender = k.value("controller.sender_native_id")
    iopub = k.value("next((t.native_id for t in threading.enumerate() if 'IOPub' in t.name), None)")
    counter = IopubCounter(k.manager, k.info["comm_id"])
    try:
        view = k.open_view()
        settle(counter, limit=10.0 if label == "churning" else 30.0)
    finally:
        counter.close()
    opened = measure_cpu(k, sender, iopub, window)
    close_view(k, view)
    closed = measure_cpu(k, sender, iopub, window)
    sender_share = opened.share(opened.sender_s)
    extra_iopub = (
        None
        if opened.iopub_s is None or closed.iopub_s is None
        else opened.iopub_s / opened.seconds - closed.iopub_s / closed.seconds
    )
    panel = None if sender_share is None else sender_share + max(0.0, extra_iopub or 0.0)
    total_open, total_closed = opened.process_s / opened.seconds, closed.process_s / closed.seconds
    resolution = CLOCK_TICK_S / window
    print(
        f"{label:>9} {window:6.0f} {opened.ticks:>5} "
        f"{_pct(sender_share)} {_pct(extra_iopub)} {_pct(panel)}   | process open {total_open * 100:6.3f} % "
        f"closed {total_closed * 100:6.3f} % (resolution {resolution * 100:.3f} %)",
        flush=True,
    )
    result(
        f"kernel CPU of an open panel, 1000 threads {label}",
        None if panel is None else panel * 100,
        None,
        "% of one core",
        f"< {target:g} %",
        panel is not None and panel * 100 < target,
        vs="the sender thread, plus the IOPub thread's CPU open minus closed",
        note=(
            f"{window:.0f} s windows, per-thread ns counters; process open {total_open * 100:.3f} %, closed "
            f"{total_closed * 100:.3f} % (tick resolution {resolution * 100:.3f} %); {opened.ticks} ticks"
        ),
    )


def _pct(value: float | None) -> str:
    return f"{'n/a':>9}" if value is None else f"{value * 100:8.3f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--busy", type=float, default=1.0, help="seconds each busy cell lasts")
    parser.add_argument("--reps", type=int, default=2, help="clicks per busy mode")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each traffic and CPU measurement")
    args = parser.parse_args()
    pythons = [sys.executable] + ([str(IK6)] if IK6.exists() else [])
    print(f"1. Stop click while a cell is busy for {args.busy} s: median ms (fast route vs default path)")
    print(f"{'ipykernel':>9} {'route':>13} {'busy':>12} {'->handler':>9} {'->report':>10} {'default':>9} {'ratio':>9}")
    for python in pythons:
        bench_latency(python, args.busy, args.reps)
    print(
        f"\n2. Idle panel with a view open, over {args.window} s"
        " (panel_interval 1 s; naive: the whole state every interval)"
    )
    print(f"{'threads':>7} {'bytes/s':>10} {'msgs':>5} {'ticks':>5} {'naive B/s':>12} {'saving':>10}")
    with kernel(sys.executable) as k:
        k.run("_idle = []")
        for threads in (100, 1000):
            bench_idle(k, threads, args.window)
        print("\n4. Bytes for one row change at 1000 threads (one thread renamed): the whole list vs the difference")
        print(f"{'threads':>7} {'before B':>12} {'after B':>10} {'ratio':>10}")
        bench_one_row(k)
        print(f"\n3. Kernel CPU of an open panel (share of one core), {args.window} s windows, open then closed")
        print(f"{'threads':>9} {'window':>6} {'ticks':>5} {'sender':>9} {'+IOPub':>9} {'panel':>9}")
        bench_cpu(k, "idle", args.window, 1.0)
        k.run("nbcoord.stop_all(); _idle = []")
        k.run(CHURN)
        bench_cpu(k, "churning", args.window, 2.0)
        k.run("_churn_stop.set(); nbcoord.stop_all()")


if __name__ == "__main__":
    main()
