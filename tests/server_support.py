"""A real Jupyter server with nbcoord's server extension, real kernels in it, and a real Prometheus.

The server is ``python -m jupyter_server`` isolated in a temporary folder (BROWSER-TESTING.md), enabled the way a user
gets it: the repository's ``jupyter-config/jupyter_server_config.d/nbcoord.json`` is copied into its config dir,
nothing on the command line names the extension. Kernels are started through the server's own sessions API (so
that they have notebook paths) and driven with a ``jupyter_client`` client attached to their connection files.

Kernel specs written for the server:

``python3``          this interpreter (ipykernel 7), nbcoord importable
``nbcoord-ik6``      .venv-ik6's interpreter (ipykernel 6)
``nbcoord-profile``  this interpreter with ``IPYTHONDIR`` pointing at a profile whose ``ipython_kernel_config.py``
                     says ``c.InteractiveShellApp.extensions = ["nbcoord"]``: nbcoord in every kernel of one user

GPU memory: no GPU here, so :data:`FAKE_NVML` (a FAKE of ``pynvml``, written into the server's path and named by
``--NBCoordServer.nvml_module``) lists the processes and bytes that a test writes to a JSON file.
"""

from __future__ import annotations

import ast
import contextlib
import http.cookies
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from browser_support import IK6_PYTHON, _free_port, _isolated_env
from helpers import wait_until
from jupyter_client import BlockingKernelClient

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "jupyter-config" / "jupyter_server_config.d" / "nbcoord.json"
PROMETHEUS = Path(os.environ.get("NBCOORD_PROMETHEUS", "/usr/bin/prometheus"))
PROFILE_KERNEL = "nbcoord-profile"
IK6_KERNEL = "nbcoord-ik6"

#: A FAKE of NVIDIA's NVML binding for the server process: one 80 GiB device whose compute processes are read, at
#: each call, from the JSON file named by NBCOORD_FAKE_GPU ({"pid": bytes}). Not the real library; no driver.
FAKE_NVML = textwrap.dedent(
    '''
    """FAKE pynvml for tests: processes and their GPU bytes come from the JSON file in $NBCOORD_FAKE_GPU."""
    import json, os
    from types import SimpleNamespace

    class NVMLError(Exception):
        pass

    def nvmlInit():
        pass

    def nvmlShutdown():
        pass

    def nvmlDeviceGetCount():
        return 1

    def nvmlDeviceGetHandleByIndex(index):
        return index

    def nvmlDeviceGetName(handle):
        return "NVIDIA Fake GPU"

    def _held():
        try:
            with open(os.environ["NBCOORD_FAKE_GPU"]) as f:
                return {int(pid): int(used) for pid, used in json.load(f).items()}
        except (OSError, ValueError):
            return {}

    def nvmlDeviceGetMemoryInfo(handle):
        used = sum(_held().values())
        return SimpleNamespace(total=80 * 2**30, used=used, free=80 * 2**30 - used)

    def nvmlDeviceGetComputeRunningProcesses(handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in _held().items()]
    '''
)


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


@dataclass
class Attached:
    """A client attached to one of the server's kernels through its connection file."""

    kernel_id: str
    client: BlockingKernelClient
    pending: list[str] = field(default_factory=list)

    def run(self, code: str, timeout: float = 60.0, allow_error: bool = False) -> dict[str, Any]:
        """Execute a cell and wait for its reply (outputs are not needed here). A cell that may fail does not make
        the kernel abort the requests queued behind it (``stop_on_error=False``)."""
        msg_id = self.client.execute(code, stop_on_error=not allow_error)
        reply = self.reply(msg_id, timeout)
        if not allow_error and reply["content"]["status"] != "ok":
            raise AssertionError(f"cell failed: {reply['content']}")
        return reply

    def submit(self, code: str) -> str:
        """Execute a cell without waiting."""
        msg_id = str(self.client.execute(code))
        self.pending.append(msg_id)
        return msg_id

    def reply(self, msg_id: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no reply to {msg_id} within {timeout} s")
            try:
                msg = self.client.get_shell_msg(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                if msg_id in self.pending:
                    self.pending.remove(msg_id)
                return dict(msg)

    def evaluate(self, expression: str) -> Any:
        """The value of a JSON-serialisable expression, through user_expressions (no output needed)."""
        msg_id = self.client.execute("", user_expressions={"v": f"__import__('json').dumps({expression})"})
        content = self.reply(msg_id)["content"]
        value = content["user_expressions"]["v"]
        assert value["status"] == "ok", value
        # The expression's repr: the repr of a JSON string.
        return json.loads(ast.literal_eval(value["data"]["text/plain"]))

    def close(self) -> None:
        self.client.stop_channels()


@dataclass
class FleetServer:
    """A running Jupyter server with nbcoord's extension enabled by its config file."""

    url: str
    token: str
    root: Path
    runtime: Path
    process: subprocess.Popen[bytes]
    log: Path
    gpu_file: Path
    attached: list[Attached] = field(default_factory=list)

    # ------------------------------------------------------------------------------------------------- HTTP
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: bool = True,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout: float = 30.0,
        follow: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request; returns (status, headers, body) whatever the status."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": "application/json"}
        if token:
            all_headers["Authorization"] = f"token {self.token}"
        all_headers.update(headers or {})
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=all_headers)
        opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def api(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """A JSON API call that must succeed."""
        status, _headers, raw = self.request(method, path, body, **kwargs)
        parsed = json.loads(raw) if raw else None
        if status >= 400:
            raise ApiError(status, parsed)
        return parsed

    def view(self) -> dict[str, Any]:
        """``GET /nbcoord/api/kernels``."""
        view: dict[str, Any] = self.api("GET", "/nbcoord/api/kernels")
        return view

    def row(self, kernel_id: str, view: dict[str, Any] | None = None) -> dict[str, Any]:
        view = view if view is not None else self.view()
        return next(k for k in view["kernels"] if k["id"] == kernel_id)

    # ---------------------------------------------------------------------------------------------- kernels
    def start(self, path: str, kernel: str = "python3") -> str:
        """A session (notebook path) with a new kernel; returns the kernel id once the kernel answers."""
        session = self.api("POST", "/api/sessions", {"path": path, "type": "notebook", "name": path,
                                                      "kernel": {"name": kernel}})
        return str(session["kernel"]["id"])

    def attach(self, kernel_id: str, timeout: float = 60.0) -> Attached:
        """A client on the kernel's connection file, once the kernel is ready."""
        connection = self.runtime / f"kernel-{kernel_id}.json"
        wait_until(connection.exists, timeout=timeout, what=f"the connection file of {kernel_id}")
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        # No heartbeat channel: a client without a KernelManager takes one unanswered heartbeat within 1 s as the
        # kernel's death, and wait_for_ready then fails on a loaded machine while the kernel is only slow to start.
        # Ready is its kernel_info reply within ``timeout``; the server, not this client, watches the process.
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=timeout)
        attached = Attached(kernel_id, client)
        self.attached.append(attached)
        return attached

    def kernel_pid(self, kernel: Attached) -> int:
        return int(kernel.evaluate("__import__('os').getpid()"))

    def set_gpu(self, held: dict[int, int]) -> None:
        """What the FAKE NVML lists: pid -> bytes on device 0."""
        tmp = self.gpu_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(pid): used for pid, used in held.items()}))
        tmp.replace(self.gpu_file)

    def login_cookies(self) -> dict[str, str]:
        """Cookies of a browser that opened the page with the token (the login cookie and ``_xsrf``)."""
        url = f"{self.url}/nbcoord/?token={urllib.parse.quote(self.token)}"
        opener = urllib.request.build_opener(_NoRedirect())
        with opener.open(urllib.request.Request(url), timeout=30) as response:
            assert response.status == 200, response.status
            jar = http.cookies.SimpleCookie()
            for header in response.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        return {name: morsel.value for name, morsel in jar.items()}

    def stop(self) -> None:
        for attached in self.attached:
            with contextlib.suppress(Exception):
                attached.close()
        with contextlib.suppress(Exception):
            self.request("POST", "/api/shutdown", timeout=5)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _kernel_specs(env: dict[str, str], base: Path) -> None:
    kernels = Path(env["JUPYTER_DATA_DIR"]) / "kernels"
    profile = base / "ipython-profile"
    (profile / "profile_default").mkdir(parents=True)
    (profile / "profile_default" / "ipython_kernel_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["nbcoord"]\n'
    )
    specs: dict[str, tuple[str, dict[str, str]]] = {
        "python3": (sys.executable, {}),
        PROFILE_KERNEL: (sys.executable, {"IPYTHONDIR": str(profile)}),
    }
    if IK6_PYTHON.exists():
        specs[IK6_KERNEL] = (str(IK6_PYTHON), {})
    for name, (python, extra) in specs.items():
        spec = kernels / name
        spec.mkdir(parents=True)
        argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        kernel_env = {"PYTHONPATH": str(REPO), **extra}
        (spec / "kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": name, "language": "python", "env": kernel_env})
        )


@contextlib.contextmanager
def fleet_server_running(*extra_args: str) -> Iterator[FleetServer]:
    """Start a Jupyter server with nbcoord's extension enabled by its config file; stop it afterwards."""
    with tempfile.TemporaryDirectory(prefix="nbcoord-server-") as tmp:
        base = Path(tmp)
        env = _isolated_env(base)
        config_d = Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.d"
        config_d.mkdir()
        shutil.copy(CONFIG_FILE, config_d / CONFIG_FILE.name)
        _kernel_specs(env, base)
        shim = base / "shim"
        shim.mkdir()
        (shim / "fleet_fake_nvml.py").write_text(FAKE_NVML)
        gpu_file = base / "gpu.json"
        gpu_file.write_text("{}")
        env["NBCOORD_FAKE_GPU"] = str(gpu_file)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env["PYTHONPATH"]])
        root = base / "root"
        root.mkdir()
        port, token = _free_port(), uuid.uuid4().hex
        log = base / "server.log"
        command = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--allow-root", "--NBCoordServer.nvml_module=fleet_fake_nvml", *extra_args,
        ]  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        server = FleetServer(f"http://127.0.0.1:{port}", token, root, Path(env["JUPYTER_RUNTIME_DIR"]), process, log,
                             gpu_file)
        try:
            def up() -> bool:
                if process.poll() is not None:
                    raise RuntimeError(f"jupyter server exited:\n{log.read_text()[-3000:]}")
                try:
                    return server.request("GET", "/api/status", timeout=2)[0] == 200
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    return False

            wait_until(up, timeout=60, interval=0.1, what="the jupyter server")
            yield server
        finally:
            server.stop()


# ------------------------------------------------------------------------------------------------- Prometheus
@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through Prometheus's HTTP API; returns the result vector."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            targets: list[dict[str, Any]] = json.loads(response.read())["data"]["activeTargets"]
        return targets


def prometheus_config(server: FleetServer, rules: Path | None = None) -> str:
    """A scrape configuration for one Jupyter server (the README's, with a short interval for the test)."""
    address = urllib.parse.urlparse(server.url).netloc
    rule_files = f"rule_files: [{json.dumps(str(rules))}]\n" if rules is not None else ""
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + rule_files
        + "scrape_configs:\n"
        "  - job_name: jupyter\n"
        "    metrics_path: /nbcoord/metrics\n"
        "    authorization:\n"
        f"      credentials: {json.dumps(server.token)}\n"
        f"    static_configs:\n      - targets: [{json.dumps(address)}]\n"
    )


@contextlib.contextmanager
def prometheus_running(config: str) -> Iterator[Prometheus]:
    """Debian's Prometheus on a loopback port with ``config``, its data in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="nbcoord-prometheus-") as tmp:
        base = Path(tmp)
        (base / "prometheus.yml").write_text(config)
        port = _free_port()
        log = base / "prometheus.log"
        command = [
            str(PROMETHEUS), f"--config.file={base / 'prometheus.yml'}", f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
        ]  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log)

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        try:
            wait_until(ready, timeout=60, interval=0.1, what="prometheus to be ready")
            yield prometheus
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
