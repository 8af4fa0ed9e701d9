"""Background output in a real browser: JupyterLab 4 and Notebook 7 in Debian's Chromium (tests/browser_support.py).

A thread started by the first cell writes (two lines and a warning) while the second cell runs. The text must appear
under the first cell, in nbcoord's output area, while the second cell is still running, and never under the second
cell. This is the front ends' own handling of the messages tests/test_output.py checks (a ``display_data`` whose
parent is a finished request, then ``update_display_data`` by display id), on ipykernel 7 in both front ends; on
ipykernel 6, which sends a cell's threads' text under that cell itself, JupyterLab shows the kernel's own routing.

Until the lead wires ``_output.install`` into the extension's load, the first cell installs it (the ``if`` block of
:data:`FIRST`); once wired, that block does nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import IK6_KERNEL, IK6_PYTHON, JupyterServer, browser, jupyter_server  # noqa: F401
from helpers import wait_until

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


class NotebookPage:
    """One notebook open in a page, its cells pinned by index (run in place, as tests/test_browser.py does)."""

    def __init__(self, page: Any, server: JupyterServer, name: str) -> None:
        self.page = page
        self.server = server
        self.name = name
        self.cells = page.locator(".jp-Notebook .jp-Cell")

    def wait_ready(self) -> None:
        """The kernel exists, is connected and idle, on the server and in the page (BROWSER-TESTING.md)."""
        wait_until(lambda: self.server.kernel_ready(self.name), 60, 0.1, "the notebook's kernel")
        self.page.wait_for_function(
            """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }""",
            timeout=60_000,
        )
        self.cells.first.wait_for()

    def run(self, index: int) -> None:
        self.page.evaluate(
            """(index) => { const w = window.jupyterapp.shell.currentWidget;
            w.content.activeCellIndex = index;
            void window.jupyterapp.commands.execute('notebook:run-cell'); }""",
            index,
        )

    def prompt(self, index: int) -> str:
        """A cell's prompt as its DOM holds it. Not innerText: JupyterLab skips rendering the cells outside the
        viewport (content-visibility), and the innerText of a skipped cell is empty."""
        return str(self.cells.nth(index).locator(".jp-InputPrompt").text_content() or "").strip()

    def wait_done(self, index: int, timeout: float = 60) -> None:
        wait_until(lambda: re.fullmatch(r"\[\d+\]:?", self.prompt(index)), timeout, 0.05, f"cell {index} done")

    def output(self, index: int, text: str) -> Any:
        return self.cells.nth(index).locator(".jp-OutputArea-output", has_text=text)


@pytest.fixture
def open_notebook(
    browser: Any,  # noqa: F811
    jupyter_server: JupyterServer,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., NotebookPage]]:
    """Opens notebooks in fresh pages; closes them and their sessions after the test (a failed test leaves a
    screenshot of each page in test-artifacts/)."""
    opened: list[tuple[Any, str, list[str]]] = []
    failed_before = request.session.testsfailed

    def open_(app: str, cells: list[str], kernel: str = "python3") -> NotebookPage:
        name = jupyter_server.write_notebook(cells, kernel)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)) if "nbc" in str(exc) else None)
        opened.append((context, name, errors))
        page.goto(jupyter_server.page_url(app, name))
        notebook = NotebookPage(page, jupyter_server, name)
        notebook.wait_ready()
        return notebook

    yield open_
    failed = request.session.testsfailed > failed_before
    for context, name, errors in opened:
        if failed:
            ARTIFACTS.mkdir(exist_ok=True)
            for page in context.pages:
                page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-{name}.png"), full_page=True)
        context.close()
        jupyter_server.close_notebook(name)
        assert errors == [], f"errors from nbcoord: {errors}"


FIRST = """%load_ext nbcoord
import threading, time, warnings, nbcoord
from nbcoord.kernel import output as _output
_ext = nbcoord._extension
if getattr(_ext, "output", None) is None:  # before the wiring: install the route here
    _ext.host.add_undo(_output.install(_ext).uninstall)
go = threading.Event()
def background():
    go.wait(120)
    print("background line 1 from the first cell")
    warnings.warn("background warning")
    print("background line 2 from the first cell", flush=True)
threading.Thread(target=background, name="bg-worker").start()
print("first cell done")"""
SECOND = """print("second cell runs", flush=True)
go.set()
time.sleep(8)  # the thread writes while this cell runs
print("second cell ends")"""


def check_output_goes_home(notebook: NotebookPage) -> None:
    notebook.run(0)
    notebook.wait_done(0)
    notebook.output(0, "first cell done").wait_for(timeout=30_000)
    notebook.run(1)
    notebook.output(1, "second cell runs").wait_for(timeout=30_000)
    home = notebook.output(0, "background line 2 from the first cell")
    home.wait_for(timeout=30_000)
    # It arrived while the second cell still runs: under the first cell, not the running one.
    assert notebook.prompt(1) == "[*]:"
    text = str(home.inner_text())
    assert text.startswith("nbcoord: output of thread 'bg-worker' started by this cell, written after it finished:")
    assert "background line 1 from the first cell" in text
    assert "UserWarning: background warning" in text
    notebook.wait_done(1, timeout=60)
    running = str(notebook.cells.nth(1).locator(".jp-Cell-outputArea").inner_text())
    assert "second cell ends" in running
    for leaked in ("background line", "background warning", "nbcoord: output of"):
        assert leaked not in running
    # Exactly one area, in the first cell.
    areas = notebook.page.locator(".jp-OutputArea-output", has_text="nbcoord: output of thread")
    wait_until(lambda: areas.count() == 1, 10, 0.05, "one output area")


def test_output_goes_home_in_jupyterlab(open_notebook: Any) -> None:
    check_output_goes_home(open_notebook("lab", [FIRST, SECOND]))


def test_output_goes_home_in_notebook7(open_notebook: Any) -> None:
    check_output_goes_home(open_notebook("notebook", [FIRST, SECOND]))


@pytest.mark.skipif(not IK6_PYTHON.exists(), reason=f"no ipykernel 6 environment at {IK6_PYTHON}")
def test_ipykernel6_sends_it_home_itself_and_nbcoord_leaves_it(open_notebook: Any) -> None:
    """ipykernel 6 sends a cell's threads' text under that cell as plain stream output: nbcoord moves nothing."""
    notebook = open_notebook("lab", [FIRST, SECOND], kernel=IK6_KERNEL)
    notebook.run(0)
    notebook.wait_done(0)
    notebook.output(0, "first cell done").wait_for(timeout=30_000)
    notebook.run(1)
    notebook.output(1, "second cell runs").wait_for(timeout=30_000)
    notebook.output(0, "background line 2 from the first cell").wait_for(timeout=30_000)
    notebook.wait_done(1, timeout=60)
    running = str(notebook.cells.nth(1).locator(".jp-Cell-outputArea").inner_text())
    assert "second cell ends" in running and "background line" not in running
    first = str(notebook.cells.nth(0).locator(".jp-Cell-outputArea").inner_text())
    assert "background line 1 from the first cell" in first and "UserWarning: background warning" in first
    assert notebook.page.locator(".jp-OutputArea-output", has_text="nbcoord: output of thread").count() == 0
