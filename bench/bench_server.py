"""The server extension's costs, with many kernels, each against a baseline measured in the same run.

A real Jupyter server (``python -m jupyter_server``, isolated in a temporary folder, nbcoord's extension enabled by its
config file) with ``--kernels`` kernels started through the sessions API: two without nbcoord, one killed (dead;
the server runs with ``KernelManager.autorestart=False`` so that it stays dead), three busy in a C call that holds the
GIL (``ctypes.PyDLL(None).sleep``: nothing in them can answer), two busy in ``time.sleep``, two with a zombie thread,
the rest idle with nbcoord and a few threads.

0. **The view while every kernel answers** (before any kernel is made to hold the GIL or die): the work itself.
1. **The view and the metrics**: ``GET /nbcoord/api/kernels`` and ``GET /nbcoord/metrics``, ``--requests`` each, one
   after the other; median and 95th percentile. Baseline: the server's own ``GET /api/kernels`` (no kernel asked).
   Target: within 250 ms, the kernels that hold the GIL shown as not answering (the deadline per kernel is the
   server's ``reply_timeout``, 150 ms).
2. **A kernel's reply while its main thread is busy** (``time.sleep``, a Python loop; ipykernel 7 and 6): an
   ``nbcoord_request`` summary on the control channel, ``--samples`` times. Baseline: ``kernel_info_request`` on
   the same channel in the same state (ipykernel's own cheapest control reply). Target: within 50 ms (median).
3. **Server CPU at a 15 s scrape interval**: the server process's CPU time over ``--scrapes`` scrapes of
   ``/nbcoord/metrics``, less its idle CPU over the same wall time (measured just before), per scrape, as a share of
   one core at one scrape per 15 s. Baseline: the idle server's own CPU share. Target: < 1 %. The kernels' CPU
   per scrape (their summaries) is printed too.

Run: ``python bench/bench_server.py [--kernels 20] [--requests 30] [--samples 30] [--scrapes 20]`` (about 2 minutes
on 2 cores; most of it starting the kernels).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from _kernels import kernel_env, kernel_manager
from _results import result
from jupyter_client import BlockingKernelClient

REPO = Path(__file__).resolve().parents[1]
IK6 = REPO / ".venv-ik6" / "bin" / "python"
CONFIG = REPO / "jupyter-config" / "jupyter_server_config.d" / "nbcoord.json"

THREADS = """\
import threading, nbcoord
for _i in range(3):
    threading.Thread(target=nbcoord.wait_for_stop, name=f"worker-{_i}", daemon=True).start()
"""
ZOMBIE = """\
import threading, nbcoord
threading.Thread(target=nbcoord.wait_for_stop, name="zombie", daemon=True).start()
raise RuntimeError("left a thread running")
"""
HOLD_GIL = "import ctypes\nctypes.PyDLL(None).sleep(3600)"
SLEEP = "import time\ntime.sleep(3600)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A Jupyter server with nbcoord's extension, isolated in ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        env = dict(kernel_env())
        for key in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
            (base / key.lower()).mkdir()
            env[key] = str(base / key.lower())
        (base / "jupyter_config_dir" / "jupyter_server_config.d").mkdir()
        shutil.copy(CONFIG, base / "jupyter_config_dir" / "jupyter_server_config.d" / CONFIG.name)
        for name, python in (("python3", sys.executable), ("ik6", str(IK6))):
            spec = base / "jupyter_data_dir" / "kernels" / name
            spec.mkdir(parents=True)
            argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
            (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python",
                                                          "env": {"PYTHONPATH": env["PYTHONPATH"]}}))  # fmt: skip
        (base / "root").mkdir()
        self.runtime = base / "jupyter_runtime_dir"
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1",
            f"--port={self.url.rsplit(':', 1)[1]}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={base / 'root'}", "--allow-root",
            "--KernelManager.autorestart=False",
        ]  # fmt: skip
        self.log = (base / "server.log").open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not self.ready():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the server did not start: {(base / 'server.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def ready(self) -> bool:
        try:
            return self.get("/api/status")[0] == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def get(self, path: str, method: str = "GET", body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.token}"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def start_kernel(self, index: int, spec: str = "python3") -> str:
        status, raw = self.get("/api/sessions", "POST", {"path": f"nb-{index:02d}.ipynb", "type": "notebook",
                                                          "name": f"nb-{index:02d}", "kernel": {"name": spec}})
        assert status == 201, raw
        return str(json.loads(raw)["kernel"]["id"])

    def client(self, kernel_id: str) -> BlockingKernelClient:
        connection = self.runtime / f"kernel-{kernel_id}.json"
        deadline = time.monotonic() + 60
        while not connection.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no connection file for {kernel_id}")
            time.sleep(0.05)
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        # No heartbeat: a client made from a connection file alone judges the kernel by it, and calls the kernel
        # dead when the first ping waits over a second (20 kernels starting on 2 cores: "Kernel died before
        # replying to kernel_info" in run_all, after the TensorFlow benchmarks). wait_for_ready's deadline bounds.
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=120)
        return client

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.get("/api/shutdown", "POST")
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def run(client: BlockingKernelClient, code: str, wait: bool = True) -> dict[str, Any] | None:
    msg_id = client.execute(code)
    if not wait:
        return None
    while True:
        reply = client.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply)


def timed(server: Server, path: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        status, _body = server.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert status == 200, (path, status)
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


@contextlib.contextmanager
def fleet(kernels: int) -> Iterator[tuple[Server, dict[str, list[str]], dict[str, BlockingKernelClient]]]:
    """The server and its kernels, by role."""
    with tempfile.TemporaryDirectory(prefix="nbcoord-bench-server-") as tmp:
        server = Server(Path(tmp))
        clients: list[BlockingKernelClient] = []
        try:
            specs = ["ik6" if i == 3 and IK6.exists() else "python3" for i in range(kernels)]
            with ThreadPoolExecutor(4) as pool:
                ids = list(pool.map(server.start_kernel, range(kernels), specs))
                clients = list(pool.map(server.client, ids))
            roles: dict[str, list[str]] = {"plain": ids[0:2], "dead": ids[2:3], "gil": ids[4:7], "sleep": ids[7:9],
                                           "zombie": ids[9:11], "idle": [ids[3], *ids[11:]]}  # fmt: skip
            for kernel_id, client in zip(ids, clients, strict=True):
                if kernel_id not in roles["plain"]:
                    run(client, "%load_ext nbcoord\n" + THREADS)
                if kernel_id in roles["zombie"]:
                    run(client, ZOMBIE)
            yield server, roles, dict(zip(ids, clients, strict=True))
        except BaseException:
            # The server's log goes with the temporary folder: its end says why a kernel died (run_all shows it).
            server.log.flush()
            print((Path(tmp) / "server.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    client.stop_channels()
            server.stop()


def make_trouble(roles: dict[str, list[str]], clients: dict[str, BlockingKernelClient]) -> None:
    """Kernels that hold the GIL, sleep, and die."""
    for kernel_id in roles["gil"]:
        run(clients[kernel_id], HOLD_GIL, wait=False)
    for kernel_id in roles["sleep"]:
        run(clients[kernel_id], SLEEP, wait=False)
    for kernel_id in roles["dead"]:
        os.kill(json.loads(run_value(clients[kernel_id], "__import__('os').getpid()")), signal.SIGKILL)
    time.sleep(0.5)  # the GIL-holding cells start (the measurement is about kernels already stuck)


def bench_quiet_view(server: Server, requests: int) -> None:
    """The view while every kernel with nbcoord answers (the work, not the deadline)."""
    times = timed(server, "/nbcoord/api/kernels", requests)
    baseline = timed(server, "/api/kernels", requests)
    median = statistics.median(times)
    print(f"  /nbcoord/api/kernels, every kernel answering: median {median:.1f} ms")
    result("GET /nbcoord/api/kernels, every kernel answering (median)", median, statistics.median(baseline), "ms",
           vs="the server's own GET /api/kernels (median)", note=f"p95 {percentile(times, 0.95):.1f} ms")  # fmt: skip


def run_value(client: BlockingKernelClient, expression: str) -> str:
    msg_id = client.execute("", user_expressions={"v": f"__import__('json').dumps({expression})"})
    while True:
        reply = client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return str(ast.literal_eval(reply["content"]["user_expressions"]["v"]["data"]["text/plain"]))


def bench_views(server: Server, roles: dict[str, list[str]], requests: int) -> None:
    view = json.loads(server.get("/nbcoord/api/kernels")[1])
    statuses = {row["id"]: row["status"] for row in view["kernels"]}
    shown = {role: sorted({statuses[k] for k in ids}) for role, ids in roles.items()}
    print(f"  statuses by role: {shown}")
    assert all(statuses[k] == "not-answering" for k in roles["gil"]), shown
    assert all(statuses[k] == "dead" for k in roles["dead"]), shown
    baseline = timed(server, "/api/kernels", requests)
    note = (f"{len(statuses)} kernels: {len(roles['gil'])} holding the GIL, 1 dead, {len(roles['plain'])} without "
            "nbcoord")  # fmt: skip
    for path in ("/nbcoord/api/kernels", "/nbcoord/metrics"):
        times = timed(server, path, requests)
        median, p95 = statistics.median(times), percentile(times, 0.95)
        print(f"  {path}: median {median:.1f} ms, p95 {p95:.1f} ms; /api/kernels median "
              f"{statistics.median(baseline):.1f} ms")  # fmt: skip
        result(f"GET {path}, {len(statuses)} kernels (p95)", p95, percentile(baseline, 0.95), "ms",
               "<= 250 ms", p95 <= 250, vs="the server's own GET /api/kernels (p95)",
               note=f"{note}; median {median:.1f} ms")  # fmt: skip


def bench_cpu(server: Server, scrapes: int) -> None:
    process = psutil.Process(server.process.pid)
    kernel_processes = process.children(recursive=True)

    def cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return 0.0

    window = 5.0
    idle_start, idle_wall = cpu(process), time.perf_counter()
    time.sleep(window)  # the idle server's own CPU over a window: what the scrapes are compared to
    idle_rate = (cpu(process) - idle_start) / (time.perf_counter() - idle_wall)
    kernels_before = sum(cpu(p) for p in kernel_processes)
    start, wall = cpu(process), time.perf_counter()
    timed(server, "/nbcoord/metrics", scrapes)
    elapsed = time.perf_counter() - wall
    per_scrape = max(0.0, (cpu(process) - start - idle_rate * elapsed) / scrapes)
    kernels_per_scrape = (sum(cpu(p) for p in kernel_processes) - kernels_before) / scrapes
    share = per_scrape / 15.0 * 100
    print(f"  server CPU per scrape {per_scrape * 1000:.1f} ms (idle rate {idle_rate * 100:.2f} % of a core); "
          f"all kernels together {kernels_per_scrape * 1000:.1f} ms per scrape")  # fmt: skip
    result("server CPU added at a 15 s scrape interval", share, idle_rate * 100, "% of a core", "< 1 %", share < 1,
           vs="the idle server's own CPU", note=f"{per_scrape * 1000:.1f} ms of server CPU per scrape; kernels "
           f"{kernels_per_scrape * 1000:.1f} ms per scrape, all together")  # fmt: skip


def ask(client: BlockingKernelClient, msg_type: str, content: dict[str, Any]) -> float:
    message = client.session.msg(msg_type, content)
    started = time.perf_counter()
    client.control_channel.send(message)
    while True:
        try:
            reply = client.control_channel.get_msg(timeout=10)
        except queue.Empty as error:
            raise RuntimeError(f"no reply to {msg_type}") from error
        if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
            return (time.perf_counter() - started) * 1000


def bench_reply(samples: int) -> None:
    pythons = [("ipykernel 7", sys.executable)] + ([("ipykernel 6", str(IK6))] if IK6.exists() else [])
    busy = {"time.sleep": "import time\ntime.sleep(600)",
            "a Python loop": "import time\n_t = time.time()\nwhile time.time() - _t < 600:\n    pass"}  # fmt: skip
    for label, python in pythons:
        with tempfile.TemporaryDirectory(prefix="nbcoord-bench-reply-") as tmp:
            km = kernel_manager(tmp, python)
            km.start_kernel(env=kernel_env(), cwd=tmp)
            client = km.client()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=60)
                run(client, "%load_ext nbcoord\n" + THREADS)
                for mode, code in busy.items():
                    run(client, code, wait=False)
                    time.sleep(0.5)  # let the cell start (the figure is about a busy main thread)
                    ours = [ask(client, "nbcoord_request", {"schema": 1, "action": "summary"}) for _ in range(samples)]
                    base = [ask(client, "kernel_info_request", {}) for _ in range(samples)]
                    km.interrupt_kernel()
                    median, p95 = statistics.median(ours), percentile(ours, 0.95)
                    print(f"  {label}, main thread in {mode}: summary median {median:.2f} ms (p95 {p95:.1f}); "
                          f"kernel_info median {statistics.median(base):.2f} ms")  # fmt: skip
                    result(f"kernel reply while busy in {mode}, {label}", median, statistics.median(base), "ms",
                           "<= 50 ms", median <= 50, vs="kernel_info_request on the control channel",
                           note=f"p95 {p95:.1f} ms")  # fmt: skip
                    time.sleep(0.3)
            finally:
                client.stop_channels()
                km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="fewer requests, samples and scrapes")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.samples, args.scrapes = 10, 10, 8
    print(f"bench_server: {args.kernels} kernels")
    started = time.monotonic()
    with fleet(args.kernels) as (server, roles, clients):
        print(f"  {args.kernels} kernels ready in {time.monotonic() - started:.0f} s")
        bench_quiet_view(server, args.requests)
        make_trouble(roles, clients)
        bench_views(server, roles, args.requests)
        bench_cpu(server, args.scrapes)
    bench_reply(args.samples)


if __name__ == "__main__":
    main()
