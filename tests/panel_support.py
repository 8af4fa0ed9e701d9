"""Shared by the panel's kernel tests (test_panel_kernel.py, test_panel_fuzz.py): a real kernel with nbcoord's
panel displayed, driven as a front end drives it, over iopub and comm messages."""

from __future__ import annotations

import json
import queue
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from helpers import Kernel, wait_until
from jupyter_client.jsonutil import json_default

from nbcoord.ui.rows import drawn_order
from nbcoord.ui.rowsync import KEYS, MESSAGE_TYPE, TRAITS

REPO = Path(__file__).resolve().parents[1]
INTERVAL = 0.2

SETUP = f"""
%load_ext nbcoord
%nbcoord config panel_interval={INTERVAL}
import json, logging, threading, time
import nbcoord
from nbcoord.ui import panel as _panel
from nbcoord.ui import commands as _panel_commands
log_lines = []
class _Keep(logging.Handler):
    def emit(self, record):
        log_lines.append(record.levelname + " " + record.getMessage())
for _h in [h for h in logging.getLogger("nbcoord").handlers if type(h).__name__ == "_Keep"]:
    logging.getLogger("nbcoord").removeHandler(_h)
logging.getLogger("nbcoord").addHandler(_Keep())
logging.getLogger("nbcoord").setLevel(logging.INFO)
def workers(prefix, n=3):
    def work():
        while not nbcoord.should_stop():
            time.sleep(0.01)
    threads = [threading.Thread(target=work, name=f"{{prefix}}-{{i}}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads
p = nbcoord.panel()
controller = nbcoord._extension.panel_controller()
p
"""


class RowsView:
    """The rows as a view keeps them (js/src/panel/rows.js, in Python): keyed, sorted by the kernel's key, a
    difference applied only onto its base. ``gaps`` counts the differences it could not apply (the module would
    ask for every row then)."""

    def __init__(self) -> None:
        self.seq: int | None = None
        self.maps: dict[str, dict[str, dict[str, Any]]] = {trait: {} for trait in KEYS}
        self.lists: dict[str, list[Any]] = {}
        self.gaps = 0

    def apply(self, message: dict[str, Any]) -> None:
        if self.seq is not None and message["seq"] <= self.seq:
            return
        if not message["full"] and message["base"] != self.seq:
            self.gaps += 1
            return
        for trait in TRAITS:
            part = message.get(trait)
            if part is None and not message["full"]:
                continue
            key = KEYS.get(trait)
            if key is None:
                self.lists[trait] = part or []
                continue
            rows = self.maps[trait]
            if message["full"]:
                rows.clear()
            for k in part["remove"]:
                rows.pop(k, None)
            rows.update((row[key], row) for row in part["upsert"])
            self.lists[trait] = sorted(rows.values(), key=drawn_order(key))
        self.seq = message["seq"]


def rows_message(msg: dict[str, Any]) -> dict[str, Any] | None:
    """The rows message a comm message carries (nbcoord.ui.rowsync), or None."""
    data = msg["content"].get("data", {})
    content = data.get("content") if msg["msg_type"] == "comm_msg" and data.get("method") == "custom" else None
    return content if isinstance(content, dict) and content.get("type") == MESSAGE_TYPE else None


def _lenient_pack(obj: object) -> bytes:
    # ASCII JSON: a lone surrogate travels as its escape (valid UTF-8 on the wire), NaN as NaN.
    return json.dumps(obj, default=json_default).encode("ascii")


class PanelKernel:
    """A real kernel (helpers.Kernel) with nbcoord's panel displayed, and the bookkeeping of a front end (it reads the
    kernel's iopub itself)."""

    def __init__(self, name: str, python: str, *, log: bool = False) -> None:
        """``log``: the kernel's standard error (the Jupyter server's log, where nbcoord logs) goes to a file that
        :meth:`log_text` reads, and the kernel captures its streams as under a server (ipykernel 7 then forwards
        file descriptors 1 and 2 into the running cell, which it does not do under pytest)."""
        self.name = name
        self.kernel = Kernel(python, env={"PYTHONPATH": str(REPO)}, log=log)
        self.km, self.kc, self.log_path = self.kernel.km, self.kernel.kc, self.kernel.log_path
        self.comm_msgs: list[tuple[float, dict[str, Any]]] = []
        self.streams: dict[str, str] = {}
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.replies: dict[str, dict[str, Any]] = {}
        self.idle: set[str] = set()
        msg_id = self.submit(SETUP)
        self.finish(msg_id)
        self.comm_id = self.value("p.comm.comm_id")
        self.route = self.value("p._fast_route['kind']")

    # ------------------------------------------------------------------------------------- plumbing
    def pump(self, timeout: float = 0.02) -> None:
        """Read what the kernel sent so far (iopub and shell), keeping what the tests look at."""
        kc = self.kc
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                break
            timeout = 0.0
            parent = msg["parent_header"].get("msg_id", "")
            kind, content = msg["msg_type"], msg["content"]
            if kind.startswith("comm_"):
                self.comm_msgs.append((time.time(), msg))
            elif kind == "stream":
                self.streams[parent] = self.streams.get(parent, "") + content["text"]
            elif kind in ("execute_result", "display_data"):
                self.results.setdefault(parent, []).append(content)
            elif kind == "error":
                self.streams[parent] = self.streams.get(parent, "") + "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                self.idle.add(parent)
        while True:
            try:
                reply = kc.get_shell_msg(timeout=0)
            except queue.Empty:
                break
            self.replies[reply["parent_header"].get("msg_id", "")] = reply

    def submit(self, code: str) -> str:
        return str(self.kc.execute(textwrap.dedent(code)))

    @property
    def pid(self) -> int:
        return self.kernel.pid

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def finish(self, msg_id: str, timeout: float = 60.0, allow_error: bool = False) -> str:
        """Wait for a submitted cell's reply and idle status; returns what it printed."""

        def done() -> bool:
            self.pump()
            return msg_id in self.replies and msg_id in self.idle

        wait_until(done, timeout, what=f"cell {msg_id} to finish; printed so far: {self.streams.get(msg_id)!r}")
        if not allow_error:
            status = self.replies[msg_id]["content"]["status"]
            assert status == "ok", self.streams.get(msg_id)
        return self.streams.get(msg_id, "")

    def run(self, code: str, timeout: float = 60.0) -> str:
        return self.finish(self.submit(code), timeout)

    def value(self, expression: str) -> Any:
        out = self.run(f"print('@@' + json.dumps({expression}))")
        line = next(line for line in out.splitlines() if line.startswith("@@"))
        return json.loads(line[2:])

    def printed(self, msg_id: str, text: str) -> bool:
        """Whether the cell ``msg_id`` printed ``text`` so far."""
        self.pump()
        return text in self.streams.get(msg_id, "")

    def state(self) -> dict[str, Any]:
        """The widget's state as the front end has it: comm_open's state, then every update, in order, and the rows
        as a view that was there from the start has them (:class:`RowsView`)."""
        self.pump()
        state: dict[str, Any] = {}
        rows = RowsView()
        for _, msg in self.comm_msgs:
            content = msg["content"]
            if content.get("comm_id") != self.comm_id:
                continue
            data = content.get("data", {})
            if msg["msg_type"] == "comm_open" or data.get("method") == "update":
                state.update(data.get("state", {}))
            elif (message := rows_message(msg)) is not None:
                rows.apply(message)
        assert rows.gaps == 0, f"{rows.gaps} rows messages did not follow the one before"
        state.update(rows.lists)
        return state

    def rows_messages(self, since: float = 0.0) -> list[tuple[float, dict[str, Any]]]:
        """The rows messages of this panel received since ``since`` (``time.time()``), with when."""
        self.pump()
        return [
            (at, message)
            for at, msg in self.comm_msgs
            if at >= since and msg["content"].get("comm_id") == self.comm_id and (message := rows_message(msg))
        ]

    def updates_until(self, until: float) -> list[dict[str, Any]]:
        return [
            msg["content"]["data"]["state"]
            for at, msg in self.comm_msgs
            if at < until
            and msg["msg_type"] in ("comm_open", "comm_msg")
            and msg["content"].get("comm_id") == self.comm_id
            and "state" in msg["content"]["data"]
        ]

    def updates_since(self, since: float) -> list[dict[str, Any]]:
        """The trait updates since ``since``, and each rows message as the sections it brings (its parts)."""
        self.pump()
        updates = []
        for at, msg in self.comm_msgs:
            if at < since or msg["msg_type"] != "comm_msg" or msg["content"].get("comm_id") != self.comm_id:
                continue
            if msg["content"]["data"].get("method") == "update":
                updates.append(msg["content"]["data"]["state"])
            elif (message := rows_message(msg)) is not None:
                updates.append({trait: message[trait] for trait in TRAITS if trait in message})
        return updates

    def send(
        self, command: dict[str, Any], comm_id: str | None = None, method: str = "custom", subshell_id: str = ""
    ) -> str:
        """Send a command as the panel's module does: ordinary message, plus control when that is the route; to a
        subshell (``subshell_id``, as JupyterLab 4.6 sends comm messages by default). Returns the shell message's
        id."""
        kc = self.kc
        data: dict[str, Any] = {"method": method}
        if method == "custom":
            data["content"] = command
        else:
            data.update(command)
        content = {"comm_id": comm_id or self.comm_id, "data": data}
        if self.route == "control":
            kc.control_channel.send(kc.session.msg("comm_msg", content))
        msg = kc.session.msg("comm_msg", content)
        if subshell_id:
            msg["header"]["subshell_id"] = subshell_id
        kc.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])

    def create_subshell(self, timeout: float = 10.0) -> str:
        """A new subshell of the kernel (ipykernel 7), as JupyterLab creates one per comm target; returns its id."""
        kc = self.kc
        request = kc.session.msg("create_subshell_request", {})
        kc.control_channel.send(request)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = kc.control_channel.get_msg(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                return str(reply["content"]["subshell_id"])
        raise AssertionError(f"no create_subshell_reply within {timeout} s")

    def send_raw(self, command: object, comm_id: str | None = None) -> None:
        """Send ``command`` as a panel command whatever it holds: NaN and infinities go out as JSON's ``NaN`` and
        ``Infinity`` (which the kernel's JSON reader takes), where jupyter_client's own packer would refuse them."""
        kc = self.kc
        content = {"comm_id": comm_id or self.comm_id, "data": {"method": "custom", "content": command}}
        msg = kc.session.msg("comm_msg", content)
        pack = kc.session.pack
        try:
            kc.session.pack = _lenient_pack  # type: ignore[method-assign]
            if self.route == "control":
                kc.control_channel.send(msg)
            kc.shell_channel.send(msg)
        finally:
            kc.session.pack = pack  # type: ignore[method-assign]

    def log_text(self) -> str:
        """What the kernel wrote to its standard error so far (started with ``log=True``)."""
        return self.kernel.log_text()

    def open_view(self) -> str:
        view = f"view{uuid.uuid4().hex[:8]}"
        self.send({"type": "view", "view_id": view, "action": "open", "click_id": f"{view}-0", "client_time": 0})
        return view

    def close(self) -> None:
        self.kernel.close()


def reported(pk: PanelKernel, click_id: str, timeout: float = 10) -> dict[str, Any]:
    """The stop's report as the front end has it, once it answers ``click_id``."""

    def seen() -> dict[str, Any] | None:
        last = pk.state().get("last_stop")
        return last if last and last.get("click_id") == click_id else None

    value = wait_until(seen, timeout, what=f"the report of {click_id}")
    assert value is not None
    return value


def click(prefix: str = "c") -> str:
    """A click id as the module makes them: ``<view id>-<n>`` (a view of its own for each click here)."""
    return f"{prefix.replace('-', '')}{uuid.uuid4().hex[:8]}-1"
