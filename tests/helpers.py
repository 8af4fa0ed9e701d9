"""Shared test helpers: waiting on conditions with deadlines, and real kernels driven through jupyter_client.

:class:`Kernel` is the one test kernel: a real ipykernel process on any of the kernel interpreters
(tests/interpreters.py), driven as a front end drives it. :class:`KernelOptions` says how one starts (interpreter,
environment, nbcoord loaded by ``%load_ext``, by IPython's configuration or not at all, a cell run before the load,
its log in a file); :func:`start_kernel` starts one so; the ``kernel`` and ``own_kernel`` fixtures (conftest.py)
hand one to a test, and :func:`kernel_params` makes their parameters.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

T = TypeVar("T")


def ipc_transport(folder: Path) -> dict[str, str]:
    """A test kernel's transport: Unix sockets in ``folder``, not TCP ports. jupyter_client picks a free TCP port by
    binding and releasing it, and the kernel binds it a moment later: with tests in several processes starting
    kernels at once, another kernel took the port in between ("Address already in use", the kernel died)."""
    return {"transport": "ipc", "ip": str(folder / "kernel")}


def kernel_manager(python: str, folder: Path) -> KernelManager:
    """A KernelManager whose kernels run on ``python``, on Unix sockets in ``folder``. A kernel spec of its own in
    ``folder``: jupyter_client 8 ignores ``KernelManager.kernel_cmd``, and a machine's python3 spec would otherwise
    decide which interpreter (and which ipykernel) runs."""
    spec_dir = folder / "kernels" / "nbcoord-test"
    spec_dir.mkdir(parents=True)
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "nbcoord test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return KernelManager(
        kernel_name="nbcoord-test",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir.parent)]),
        **ipc_transport(folder),
    )


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


@dataclass
class CellResult:
    """What one execute request produced."""

    reply: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


class Kernel:
    """A real IPython kernel in its own process, with nbcoord importable, and helpers to drive it."""

    def __init__(
        self, python: str | None = None, env: dict[str, str] | None = None, *, log: bool = False, config: str = ""
    ) -> None:
        """``log``: the kernel's standard error (the Jupyter server's log, where nbcoord logs) goes to a file read by
        :meth:`log_text` instead of this process's, and its streams are captured as under a server. ``config``: the
        text of the kernel's ``ipython_kernel_config.py`` (in an IPython directory of its own)."""
        self.python = python or sys.executable
        self._tmp = tempfile.TemporaryDirectory(prefix="nbcoord-kernel-")
        if config:
            profile = Path(self._tmp.name) / "profile_default"
            profile.mkdir()
            (profile / "ipython_kernel_config.py").write_text(config, encoding="utf-8")
        self.log_path = Path(self._tmp.name) / "kernel-stderr.log" if log else None
        kernel_env = dict(os.environ)
        kernel_env.update({"IPYTHONDIR": self._tmp.name, "PYTHONUNBUFFERED": "1"})
        kernel_env.update(env or {})
        if log:
            # As a server starts it: ipykernel 7 then forwards file descriptors 1 and 2 to the running cell, which it
            # does not do under pytest (it looks for this variable).
            kernel_env.pop("PYTEST_CURRENT_TEST", None)
        self.km = kernel_manager(self.python, Path(self._tmp.name))
        if self.log_path is not None:
            with self.log_path.open("wb") as log_file:  # the kernel keeps its own descriptor of it
                self.km.start_kernel(env=kernel_env, cwd=self._tmp.name, stderr=log_file)
        else:
            self.km.start_kernel(env=kernel_env, cwd=self._tmp.name)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self._iopub: dict[str, CellResult] = {}
        #: Every iopub message read so far, in order, whatever its kind and parent.
        self.messages: list[dict[str, Any]] = []
        self._idle: set[str] = set()  # the requests whose idle status was read

    @property
    def pid(self) -> int:
        provisioner = self.km.provisioner
        assert provisioner is not None
        return int(provisioner.process.pid)  # type: ignore[attr-defined]

    @property
    def process(self) -> Any:
        return self.km.provisioner.process  # type: ignore[union-attr]

    def submit(self, code: str, *, cell_id: str | None = None, **kwargs: Any) -> str:
        """Send an execute request without waiting; returns its msg_id. ``cell_id``: the front end's id of the cell,
        in the request's metadata, as JupyterLab and Notebook 7 send it."""
        if cell_id is None:
            msg_id: str = self.kc.execute(code, **kwargs)
        else:
            content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                       "allow_stdin": False, "stop_on_error": True, **kwargs}
            msg = self.kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
            self.kc.shell_channel.send(msg)
            msg_id = msg["header"]["msg_id"]
        self._iopub[msg_id] = CellResult(reply={})
        return msg_id

    def submit_until_printed(self, code: str, marker: str, timeout: float = 30.0) -> str:
        """Submit a long cell and return its msg_id once it has printed ``marker`` (so that it is past that point)."""
        msg_id = self.submit(code)

        def printed() -> bool:
            self._drain_iopub(msg_id, 0.05)
            result = self._iopub[msg_id]
            if result.errors:
                raise AssertionError(f"the cell failed before printing {marker!r}: {result.errors}")
            return marker in result.stdout

        wait_until(printed, timeout=timeout, what=f"the cell to print {marker!r}")
        return msg_id

    def pump(self) -> None:
        """Read what iopub has now (into :attr:`messages` and the results of the requests)."""
        self._drain_iopub("", 0.05)

    def streams(self) -> str:
        """Every stream text the kernel sent, whatever its parent."""
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream")

    def collect(self, msg_id: str, timeout: float = 60.0) -> CellResult:
        """Wait for the reply and the idle status of a submitted request; returns everything it printed."""
        result = self._iopub.setdefault(msg_id, CellResult(reply={}))
        deadline = time.monotonic() + timeout
        reply = None
        idle = False
        while reply is None or not idle:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no reply for {msg_id} within {timeout} s; so far: {result.text!r}")
            if reply is None:
                try:
                    msg = self.kc.get_shell_msg(timeout=min(0.05, remaining))
                    if msg["parent_header"].get("msg_id") == msg_id:
                        reply = msg
                except queue.Empty:
                    pass
            idle = idle or self._drain_iopub(msg_id, 0.05)
        result.reply = reply
        return result

    def _drain_iopub(self, msg_id: str, timeout: float) -> bool:
        """Read what iopub has (waiting up to ``timeout`` for the first message); whether ``msg_id`` went idle."""
        try:
            while True:
                msg = self.kc.get_iopub_msg(timeout=timeout)
                timeout = 0.0
                self.messages.append(msg)
                parent = msg["parent_header"].get("msg_id")
                target = self._iopub.setdefault(parent, CellResult(reply={}))
                kind = msg["msg_type"]
                content = msg["content"]
                if kind == "stream":
                    if content["name"] == "stdout":
                        target.stdout += content["text"]
                    else:
                        target.stderr += content["text"]
                elif kind == "error":
                    target.errors.append(content)
                elif kind in ("execute_result", "display_data"):
                    target.data.append(content)
                elif kind == "status" and content["execution_state"] == "idle":
                    self._idle.add(parent)
        except queue.Empty:
            pass
        return msg_id in self._idle

    def run(self, code: str, timeout: float = 60.0, allow_error: bool = False) -> CellResult:
        """Execute a cell and wait for it; fails on an error unless ``allow_error``."""
        result = self.collect(self.submit(code), timeout)
        if not allow_error and result.status != "ok":
            raise AssertionError(f"cell failed: {result.errors or result.reply['content']}\n{result.text}")
        return result

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        """The value of a JSON-serialisable expression in the kernel."""
        return marked_json(self.run(f"import json as _j; print('@@' + _j.dumps({expression}))", timeout))

    def send_control(self, msg_type: str, content: dict[str, Any]) -> str:
        """Send a request on the control channel, as a server does, without waiting; returns its msg_id."""
        message = self.kc.session.msg(msg_type, content)
        self.kc.control_channel.send(message)
        return str(message["header"]["msg_id"])

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def request_shutdown(self, restart: bool = False) -> None:
        """Send a shutdown request on the control channel, as a front end does, without waiting."""
        self.kc.shutdown(restart=restart)

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for the kernel process to end; returns its exit status (negative: killed by that signal)."""
        try:
            return int(self.process.wait(timeout=timeout))
        except Exception:
            return None

    def log_text(self) -> str:
        """What the kernel wrote to its standard error so far (a kernel started with ``log=True``)."""
        assert self.log_path is not None, "started without log=True"
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        """Stop channels and make sure the process is gone."""
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
            self.km.cleanup_resources()
            self._tmp.cleanup()


def marked_json(result: CellResult) -> Any:
    """The JSON a cell printed after ``@@``."""
    line = next(line for line in result.stdout.splitlines() if line.startswith("@@"))
    return json.loads(line[2:])


@dataclass(frozen=True)
class KernelOptions:
    """How a test kernel starts (the parameter of the ``kernel`` and ``own_kernel`` fixtures).

    ``nbcoord``: ``"load_ext"`` (a cell runs ``%load_ext nbcoord``), ``"config"`` (IPython's configuration loads it,
    before ipykernel starts its parent poller, as a server-wide set-up does) or ``"off"``. ``setup``: a cell run
    before nbcoord is loaded (to keep what the load replaces); ``after``: a cell run after. ``log``: see
    :class:`Kernel`. ``timeout``: the limit, in seconds, of each of those set-up cells.
    """

    python: str = sys.executable
    nbcoord: Literal["load_ext", "config", "off"] = "load_ext"
    env: tuple[tuple[str, str], ...] = ()
    log: bool = False
    setup: str = ""
    after: str = ""
    timeout: float = 60.0


def start_kernel(options: KernelOptions | str | None = None) -> Kernel:
    """A kernel started as ``options`` say (a string: the python, nbcoord loaded by ``%load_ext``)."""
    if options is None or isinstance(options, str):
        options = KernelOptions(python=options or sys.executable)
    config = "c.InteractiveShellApp.extensions = ['nbcoord']\n" if options.nbcoord == "config" else ""
    kernel = Kernel(python=options.python, env=dict(options.env), log=options.log, config=config)
    try:
        if options.setup:
            kernel.run(options.setup, options.timeout)
        if options.nbcoord == "load_ext":
            kernel.run("%load_ext nbcoord", options.timeout)
        if options.after:
            kernel.run(options.after, options.timeout)
    except BaseException:
        kernel.close()
        raise
    return kernel


def kernel_params(pythons: list[Any], **options: Any) -> list[Any]:
    """One ``pytest.param`` of :class:`KernelOptions` per interpreter in ``pythons`` (``pytest.param`` of a python, as
    ``interpreters.KERNEL_PYTHONS``), each with the same ``options``, the interpreter's id and marks."""
    if "env" in options and isinstance(options["env"], dict):
        options["env"] = tuple(sorted(options["env"].items()))
    return [
        pytest.param(KernelOptions(python=str(p.values[0]), **options), id=p.id, marks=p.marks) for p in pythons
    ]
