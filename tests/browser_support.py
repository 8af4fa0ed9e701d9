"""Real-browser support: Debian's Chromium through Playwright, and an isolated Jupyter server.

Follows ../shared/BROWSER-TESTING.md: never a downloaded browser; Chromium launched with the flags that keep it
off the network; every Jupyter directory in a temporary folder; the server in its own process group, stopped by
``POST /api/shutdown`` and killed as a last resort; the kernel-ready race avoided by waiting on the session's
kernel (``connections >= 1`` and ``idle``) before running anything.

One server and one browser serve a whole pytest session (``jupyter_server`` and ``browser`` fixtures, imported by
the test modules); each test opens its own notebook copy and deletes its session afterwards, so a test never
reconnects to an old kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("NBCOORD_CHROMIUM", "/usr/bin/chromium"))
#: nbcoord's JupyterLab extension as built from labextension/ (git-ignored).
LABEXTENSION = REPO / "nbcoord" / "labextension"
IK6_PYTHON = Path(os.environ.get("NBCOORD_IK6_PYTHON", REPO / ".venv-ik6" / "bin" / "python"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
#: The kernel spec of the ipykernel 6 environment, written into the isolated data dir.
IK6_KERNEL = "nbcoord-ik6"
#: A kernel spec whose kernels load nbcoord as they start (IPython's extra_extensions, as NBCoordServer's
#: load_in_kernels does): the JupyterLab extension's item has counts before any cell runs.
PRELOADED_KERNEL = "nbcoord-preloaded"


@contextlib.contextmanager
def launch_chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, kept off the network."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class JupyterServer:
    """A running ``jupyter lab`` server (which also serves Notebook 7 at /notebooks/)."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path
    opened: list[str] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def write_notebook(self, cells: list[str], kernel: str = "python3") -> str:
        """A fresh notebook in the server's root; returns its name."""
        name = f"nb-{uuid.uuid4().hex[:8]}.ipynb"
        notebook = {
            "cells": [
                {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
                for source in cells
            ],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(notebook))
        self.opened.append(name)
        return name

    def page_url(self, app: str, name: str) -> str:
        if app == "lab":
            return f"{self.url}/lab/tree/{name}?reset&token={self.token}"
        return f"{self.url}/notebooks/{name}?token={self.token}"

    def session_for(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.api("GET", "/api/sessions") if s["path"].endswith(name)), None)

    def kernel_ready(self, name: str) -> bool:
        """The notebook's kernel exists, has a connection, and is idle (BROWSER-TESTING: the ready race)."""
        session = self.session_for(name)
        if session is None:
            return False
        kernel = session["kernel"]
        return bool(kernel.get("connections", 0) >= 1 and kernel.get("execution_state") == "idle")

    def interrupt(self, name: str) -> None:
        session = self.session_for(name)
        if session is not None:
            self.api("POST", f"/api/kernels/{session['kernel']['id']}/interrupt")

    def close_notebook(self, name: str) -> None:
        """Delete the notebook's session (its kernel is shut down), so that nothing reconnects to it."""
        session = self.session_for(name)
        if session is not None:
            with contextlib.suppress(urllib.error.URLError):
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=15)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.api("POST", "/api/shutdown", timeout=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def _isolated_env(base: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTERLAB_SETTINGS_DIR",
        "JUPYTERLAB_WORKSPACES_DIR",
        "IPYTHONDIR",
    ):
        path = base / key.lower()
        path.mkdir()
        env[key] = str(path)
    notification = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    # The widget front ends (ipywidgets, anywidget) come from this environment's share/jupyter; nbcoord's JupyterLab
    # extension from this checkout's build (nbcoord/labextension, tools/dev.py builds it), ahead of the copy an
    # install put in share/jupyter (JupyterLab takes an extension from the first path that has it).
    paths = [str(Path(sys.prefix) / "share" / "jupyter")]
    if (LABEXTENSION / "package.json").exists():
        (base / "labextension" / "labextensions").mkdir(parents=True)
        (base / "labextension" / "labextensions" / "nbcoord").symlink_to(LABEXTENSION, target_is_directory=True)
        paths.insert(0, str(base / "labextension"))
    env["JUPYTER_PATH"] = os.pathsep.join(paths)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("JUPYTER_PLATFORM_DIRS", None)
    return env


def _kernel_specs(env: dict[str, str]) -> None:
    kernels = Path(env["JUPYTER_DATA_DIR"]) / "kernels"
    specs = {"python3": sys.executable, PRELOADED_KERNEL: sys.executable}
    if IK6_PYTHON.exists():
        specs[IK6_KERNEL] = str(IK6_PYTHON)
    for name, python in specs.items():
        spec = kernels / name
        spec.mkdir(parents=True)
        argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        if name == PRELOADED_KERNEL:
            argv.append("--InteractiveShellApp.extra_extensions=nbcoord")
        (spec / "kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": name, "language": "python", "env": {"PYTHONPATH": str(REPO)}})
        )


@contextlib.contextmanager
def jupyter_server_running() -> Iterator[JupyterServer]:
    """Start ``jupyter lab`` isolated in a temporary folder; stop it (or kill its group) afterwards."""
    with tempfile.TemporaryDirectory(prefix="nbcoord-browser-") as tmp:
        base = Path(tmp)
        env = _isolated_env(base)
        _kernel_specs(env)
        root = base / "root"
        root.mkdir()
        port, token = _free_port(), uuid.uuid4().hex
        log = base / "server.log"
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--allow-root",
            "--LabApp.expose_app_in_browser=True",
            "--JupyterNotebookApp.expose_app_in_browser=True",
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = JupyterServer(f"http://127.0.0.1:{port}", token, root, process, log)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    server.api("GET", "/api/status", timeout=2)
                    break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"jupyter server did not start:\n{log.read_text()[-3000:]}") from None
                    time.sleep(0.1)
            yield server
        finally:
            server.stop()


class _SharedChromium:
    """One Playwright and one Chromium per process, however many test modules import the ``browser`` fixture.

    pytest makes a separate fixture of each module's import of ``browser``, and Playwright's sync API cannot
    be started twice in one thread: the modules' fixtures share this instance, the last to finish closes it.
    """

    def __init__(self) -> None:
        self._users = 0
        self._context: contextlib.AbstractContextManager[Any] | None = None
        self._browser: Any = None

    def acquire(self) -> Any:
        if self._users == 0:
            self._context = launch_chromium()
            self._browser = self._context.__enter__()
        self._users += 1
        return self._browser

    def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._context is not None:
            context, self._context, self._browser = self._context, None, None
            context.__exit__(None, None, None)


_chromium = _SharedChromium()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One Chromium for the pytest session."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    chromium = _chromium.acquire()
    try:
        yield chromium
    finally:
        _chromium.release()


@pytest.fixture(scope="session")
def jupyter_server() -> Iterator[JupyterServer]:
    """One Jupyter server for the pytest session."""
    with jupyter_server_running() as server:
        yield server
