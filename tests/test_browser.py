"""The panel in JupyterLab and Notebook 7, in Debian's Chromium, clicked like a person would.

Each test opens a fresh notebook on the session's one server (tests/browser_support.py), runs its cells one by
one (``notebook:run-cell`` on a pinned cell index, after the kernel-ready wait of BROWSER-TESTING.md), and
checks: the panel renders and updates live; a thread started by a later cell appears; a thread named
``<img src=x onerror=alert(1)>`` shows as those characters and no dialog opens; Stop all clicked while a cell
sleeps stops the threads, and the panel says so while the cell is still running. The JupyterLab test also takes
the screenshot the README shows: into test-artifacts/, or over docs/panel.png when ``NBCOORD_UPDATE_SCREENSHOT=1``
(a test run leaves tracked files as they were).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import IK6_KERNEL, IK6_PYTHON, JupyterServer, browser, jupyter_server  # noqa: F401
from helpers import wait_until

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
#: Where the screenshot goes: the README's picture only when asked for.
SCREENSHOT = (
    REPO / "docs" / "panel.png"
    if os.environ.get("NBCOORD_UPDATE_SCREENSHOT") == "1"
    else REPO / "test-artifacts" / "panel.png"
)
HOSTILE = "<img src=x onerror=alert(1)>"

SETUP = """%load_ext nbcoord
%nbcoord config panel_interval=0.25
import nbcoord, threading, time
def work():
    while not nbcoord.should_stop():
        time.sleep(0.02)
loaders = [threading.Thread(target=work, name=f"loader-{i}") for i in range(3)]
for t in loaders:
    t.start()
nbcoord.panel()"""
LATER = f"""hostile = threading.Thread(target=work, name={HOSTILE!r})
hostile.start()
nbcoord.panel()  # a second view of the same panel"""
BUSY = """print("busy", flush=True)
time.sleep(30)"""
# Holds the GIL in one C call: no Python thread (the panel's sender included) runs meanwhile. Long enough for
# the front end to miss three beats at the interval the sender announces (longer than panel_interval while
# ticks are expensive), and more.
NATIVE = """from nbcoord import _panel
_hold = 3 * _panel.controller_for(nbcoord._extension)._wait() + 4
def _took(n):
    t = time.perf_counter(); sum(range(n)); return time.perf_counter() - t
_n = int(10**6 * _hold / min(_took(10**6) for _ in range(3)))
print("native", flush=True)
time.sleep(0.3)
_ = sum(range(_n))"""


class NotebookPage:
    """One notebook open in a browser page, with its cells pinned by index."""

    def __init__(self, page: Any, server: JupyterServer, name: str) -> None:
        self.page = page
        self.server = server
        self.name = name
        self.cells = page.locator(".jp-Notebook .jp-Cell")
        self.views = page.locator("[data-nbcoord=panel]")
        self.panel = self.views.first

    def wait_ready(self) -> None:
        """The notebook's kernel exists, is connected and idle (the kernel-ready race), on the server and here."""
        wait_until(lambda: self.server.kernel_ready(self.name), 60, 0.1, "the notebook's kernel")
        self.page.wait_for_function(
            """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }""",
            timeout=60_000,
        )
        self.cells.first.wait_for()

    def run(self, index: int) -> None:
        """Run one cell in place (no new cell is created, the index stays valid)."""
        self.page.evaluate(
            """(index) => { const w = window.jupyterapp.shell.currentWidget;
            w.content.activeCellIndex = index;
            // Not awaited: the command's promise ends with the cell's execution.
            void window.jupyterapp.commands.execute('notebook:run-cell'); }""",
            index,
        )

    def prompt(self, index: int) -> str:
        return str(self.cells.nth(index).locator(".jp-InputPrompt").inner_text()).strip()

    def wait_done(self, index: int, timeout: float = 60) -> None:
        wait_until(lambda: re.fullmatch(r"\[\d+\]:?", self.prompt(index)), timeout, 0.05, f"cell {index} done")

    def output(self, index: int, text: str) -> Any:
        return self.cells.nth(index).locator(".jp-OutputArea-output", has_text=text)


ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def open_notebook(
    browser: Any,  # noqa: F811
    jupyter_server: JupyterServer,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[Any]:
    """Opens notebooks in fresh pages; closes their pages and sessions after the test (a failed test leaves
    a screenshot of each page, the pages' console and the server's log in test-artifacts/)."""
    opened: list[tuple[Any, str, list[str], list[str]]] = []
    console: list[str] = []  # everything the pages logged, written out when the test fails
    failed_before = request.session.testsfailed

    def open_(app: str, cells: list[str], kernel: str = "python3") -> NotebookPage:
        name = jupyter_server.write_notebook(cells, kernel)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        dialogs: list[str] = []

        def on_dialog(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda exc: errors.append(str(exc)) if "nbc" in str(exc) else None)
        page.on(
            "console",
            lambda msg: errors.append(msg.text) if msg.type == "error" and "nbcoord" in msg.text else None,
        )
        page.on("console", lambda msg: console.append(f"{name} {msg.type}: {msg.text}"))
        page.on("pageerror", lambda exc: console.append(f"{name} pageerror: {exc}"))
        opened.append((context, name, errors, dialogs))
        page.goto(jupyter_server.page_url(app, name))
        notebook = NotebookPage(page, jupyter_server, name)
        notebook.wait_ready()
        return notebook

    yield open_
    failed = request.session.testsfailed > failed_before
    if failed:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"{request.node.name}-console.log").write_text("\n".join(console))
        (ARTIFACTS / f"{request.node.name}-server.log").write_bytes(jupyter_server.log.read_bytes())
    for context, name, errors, dialogs in opened:
        if failed:
            for page in context.pages:
                page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-{name}.png"), full_page=True)
        context.close()
        jupyter_server.close_notebook(name)
        assert dialogs == [], f"a dialog opened: {dialogs}"
        assert errors == [], f"errors from nbcoord's module: {errors}"


def row(notebook: NotebookPage, name: str) -> Any:
    return notebook.panel.locator(".nbc-row .nbc-name", has_text=name)


def check_panel_live_and_stop(notebook: NotebookPage) -> int:
    """The shared flow; returns the click-to-handler latency the panel reports, in ms."""
    notebook.run(0)
    notebook.panel.wait_for(timeout=60_000)
    for i in range(3):
        row(notebook, f"loader-{i}").wait_for()
    status = notebook.panel.locator(".nbc-status")
    notebook.wait_done(0)
    # Live: the panel follows the kernel from "cell running" to idle without any new display.
    wait_until(lambda: "kernel idle" in status.inner_text(), 15, 0.05, "the panel to see the idle kernel")
    # A thread started by a later cell appears, its hostile name as plain text.
    notebook.run(1)
    hostile = row(notebook, "onerror")
    hostile.wait_for(timeout=15_000)
    assert hostile.text_content() == HOSTILE
    assert notebook.views.locator("img").count() == 0
    notebook.wait_done(1)
    # The cell displayed the panel again: a second view of the same state.
    wait_until(lambda: notebook.views.count() == 2, 15, 0.05, "the second view")
    notebook.views.nth(1).locator(".nbc-row .nbc-name", has_text="onerror").wait_for(timeout=15_000)
    # Stop all while a cell sleeps: the threads are gone, and the panel says so, before the cell ends.
    notebook.run(2)
    notebook.output(2, "busy").wait_for(timeout=30_000)
    notebook.panel.get_by_role("button", name="Stop all").click()
    last = notebook.panel.locator("[data-section=last-stop]")
    last.get_by_text("4 stopped, 0 still alive").wait_for(timeout=15_000)
    wait_until(lambda: notebook.views.locator(".nbc-row").count() == 0, 10, 0.05, "the rows to go, in both views")
    notebook.views.nth(1).locator("[data-section=last-stop]").get_by_text("4 stopped, 0 still alive").wait_for()
    assert notebook.prompt(2) == "[*]:"
    latency = int(last.locator("[data-latency]").get_attribute("data-latency"))
    notebook.server.interrupt(notebook.name)
    notebook.wait_done(2, timeout=30)
    return latency


def fast_route_taken(notebook: NotebookPage) -> str:
    """Which copy of the click acted. On ipykernel 7 both are fast: JupyterLab and Notebook 7 send widget
    messages to a kernel subshell by default ("commsOverSubshells"), which may handle the ordinary message
    while the main thread sleeps, racing the shell-channel route; the click id makes the loser a no-op."""
    text = notebook.panel.locator("[data-section=last-stop]").inner_text()
    match = re.search(r"via (the shell-channel route|the widget message)", text)
    assert match, text
    return match.group(1)


def test_panel_in_jupyterlab(open_notebook: Any, record_property: Any) -> None:
    notebook = open_notebook("lab", [SETUP, LATER, BUSY])
    latency = check_panel_live_and_stop(notebook)
    record_property("jupyterlab-ipykernel7-click-to-handler-ms", latency)
    record_property("jupyterlab-ipykernel7-route", fast_route_taken(notebook))


def test_panel_in_notebook7(open_notebook: Any, record_property: Any) -> None:
    notebook = open_notebook("notebook", [SETUP, LATER, BUSY, NATIVE])
    latency = check_panel_live_and_stop(notebook)
    record_property("notebook7-ipykernel7-click-to-handler-ms", latency)
    record_property("notebook7-ipykernel7-route", fast_route_taken(notebook))
    # A C call that holds the GIL: no update can come; the panel says why, and recovers when it returns.
    banner = notebook.panel.locator(".nbc-banner")
    assert banner.is_hidden()
    notebook.run(3)
    # Not waiting for the cell's "native" output first: under load it may only get out after the C call.
    banner.get_by_text("busy in native code").wait_for(timeout=30_000)
    assert "stop will act when it returns" in banner.inner_text()
    notebook.wait_done(3, timeout=60)
    banner.wait_for(state="hidden", timeout=15_000)


@pytest.mark.skipif(not IK6_PYTHON.exists(), reason=f"no ipykernel 6 environment at {IK6_PYTHON}")
def test_stop_on_ipykernel6_takes_the_control_channel(open_notebook: Any, record_property: Any) -> None:
    notebook = open_notebook("lab", [SETUP, BUSY], kernel=IK6_KERNEL)
    notebook.run(0)
    row(notebook, "loader-2").wait_for(timeout=60_000)
    notebook.wait_done(0)
    notebook.run(1)
    notebook.output(1, "busy").wait_for(timeout=30_000)
    notebook.panel.get_by_role("button", name="Stop all").click()
    last = notebook.panel.locator("[data-section=last-stop]")
    last.get_by_text("3 stopped, 0 still alive").wait_for(timeout=15_000)
    assert notebook.prompt(1) == "[*]:"
    assert "via the control route" in last.inner_text()
    record_property(
        "jupyterlab-ipykernel6-click-to-handler-ms", int(last.locator("[data-latency]").get_attribute("data-latency"))
    )
    notebook.server.interrupt(notebook.name)
    notebook.wait_done(1, timeout=30)


DEMO = [
    """%load_ext nbcoord
%nbcoord config panel_interval=0.5
import nbcoord, threading, time
nbcoord.panel()""",
    """import tensorflow as tf
tf.compat.v1.disable_eager_execution()
def slow_parse(name):
    time.sleep(0.03)
    return float(len(name))
filenames = tf.compat.v1.FIFOQueue(64, tf.string, shapes=[[]], name="filenames")
examples = tf.compat.v1.FIFOQueue(32, tf.float32, shapes=[[]], name="examples")
read = filenames.enqueue(tf.constant("part-00017.tfrecord"))
parsed = tf.compat.v1.numpy_function(slow_parse, [filenames.dequeue()], tf.float64)
parse = examples.enqueue(tf.reshape(tf.cast(parsed, tf.float32), []))
batch = examples.dequeue_many(8)
tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(filenames, [read]))
tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(examples, [parse] * 2))
sess = tf.compat.v1.Session()
coord = tf.compat.v1.train.Coordinator()
runners = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
def train():
    step = 0
    while not coord.should_stop() and not nbcoord.should_stop():
        sess.run(batch)
        step += 1
        time.sleep(0.6 if (step // 10) % 2 else 0.0)  # training steps, then a slow evaluation phase
threading.Thread(target=train, name="train-loop", daemon=True).start()""",
    """from concurrent.futures import ThreadPoolExecutor
prefetch = ThreadPoolExecutor(2, thread_name_prefix="prefetch")
for _ in range(2):
    prefetch.submit(nbcoord.wait_for_stop)
raise ValueError("batch shape (8, 224) does not match (8, 224, 3)")""",
    """def write_metrics():
    raise OSError("disk quota exceeded: /logs/metrics.csv")
threading.Thread(target=write_metrics, name="metrics-writer").start()""",
]


def test_screenshot_for_the_readme(open_notebook: Any) -> None:
    pytest.importorskip("tensorflow")
    notebook = open_notebook("lab", DEMO)
    notebook.run(0)
    notebook.panel.wait_for(timeout=60_000)
    notebook.wait_done(0)
    notebook.run(1)
    notebook.wait_done(1, timeout=120)
    notebook.run(2)
    notebook.wait_done(2)
    notebook.run(3)
    notebook.wait_done(3)
    panel = notebook.panel
    panel.locator(".nbc-q .nbc-name", has_text="filenames").wait_for(timeout=20_000)
    panel.locator(".nbc-ghead .nbc-chip", has_text="Zombies").wait_for(timeout=20_000)
    # The failures section (the thread's own row may also show it as its last error while it ends).
    panel.get_by_text("OSError: disk quota exceeded: /logs/metrics.csv", exact=True).first.wait_for(timeout=20_000)
    # Let the fill levels draw a few minutes' worth of sparkline, then take the picture.
    examples = panel.locator(".nbc-q", has_text="examples").locator("path.nbc-spark")
    wait_until(lambda: str(examples.get_attribute("d") or "").count("V") >= 6, 60, 0.1, "a few fill-level changes")
    wait_until(lambda: panel.locator(".nbc-mem path.nbc-spark").count() >= 1, 30, 0.1, "memory sparkline")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    panel.screenshot(path=str(SCREENSHOT), animations="disabled")
    assert SCREENSHOT.stat().st_size > 10_000
