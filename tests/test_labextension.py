"""nbcoord's JupyterLab extension (labextension/) in JupyterLab 4.6 and Notebook 7.6, in Debian's Chromium.

The extension is the prebuilt one of this checkout (nbcoord/labextension, found by the server on its labextensions
path: tests/browser_support.py), reading nbcoord's server API. Checked, as the issue lists them:

- the status item appears without any cell run, counts a cell's threads, turns to zombies (highlighted) after the
  cell is interrupted; "Stop zombies" stops them and the item shows 0 within 2 s of the command;
- a kernel without nbcoord reads "nbcoord: not loaded", and "Load nbcoord in this kernel" loads it;
- "Show nbcoord panel" opens the server page for that kernel alone in a main-area tab (nothing enters the notebook);
- at most one request per 3 s while the page only watches, none while the tab is hidden;
- Notebook 7: the same item (in the notebook's toolbar: its shell has no status bar) and the same commands.

The screenshot of the item goes to test-artifacts/, or over docs/labextension-status.png with
``NBCOORD_UPDATE_SCREENSHOT=1``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_support import PRELOADED_KERNEL, JupyterServer, browser, jupyter_server  # noqa: F401
from helpers import wait_until

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
PICTURES = REPO / "docs" if os.environ.get("NBCOORD_UPDATE_SCREENSHOT") == "1" else ARTIFACTS
ITEM = "[data-nbcoord=status]"
API = "/nbcoord/api/kernels"

KEPT = """import nbcoord, threading, time
kept = [threading.Thread(target=nbcoord.wait_for_stop, name=f"kept-{i}") for i in range(3)]
for t in kept:
    t.start()"""
INTERRUPTED = """lost = [threading.Thread(target=nbcoord.wait_for_stop, name=f"lost-{i}") for i in range(2)]
for t in lost:
    t.start()
print("started", flush=True)
time.sleep(60)"""


@dataclass
class Page:
    page: Any
    server: JupyterServer
    name: str
    requests: list[float]  # when the page asked the server for the kernels (monotonic)

    @property
    def item(self) -> Any:
        return self.page.locator(ITEM)

    def text(self) -> str:
        return str(self.item.text_content()) if self.item.count() else ""

    def wait_text(self, text: str, timeout: float = 10.0) -> float:
        """Seconds until the item reads ``text``."""
        started = time.monotonic()
        try:
            wait_until(lambda: self.text() == text, timeout=timeout, what=f"the item to read {text!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it reads {self.text()!r}") from None
        return time.monotonic() - started

    def run_cell(self, index: int) -> None:
        self.page.evaluate(
            """(i) => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = i;
            void window.jupyterapp.commands.execute('notebook:run-cell'); }""",
            index,
        )

    def execute(self, command: str) -> None:
        self.page.evaluate("(c) => window.jupyterapp.commands.execute(c)", command)

    def kernel_id(self) -> str:
        session = self.server.session_for(self.name)
        assert session is not None
        return str(session["kernel"]["id"])


@pytest.fixture
def open_page(browser: Any, jupyter_server: JupyterServer) -> Iterator[Any]:  # noqa: F811
    opened: list[tuple[Any, Page]] = []

    def open_(app: str, cells: list[str], kernel: str = PRELOADED_KERNEL) -> Page:
        name = jupyter_server.write_notebook(cells, kernel)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        requests: list[float] = []
        page.on("request", lambda r: requests.append(time.monotonic()) if r.url.split("?")[0].endswith(API) else None)
        page.goto(jupyter_server.page_url(app, name))
        opened.append((context, Page(page, jupyter_server, name, requests)))
        wait_until(lambda: jupyter_server.kernel_ready(name), timeout=60, what="the notebook's kernel to be ready")
        return opened[-1][1]

    yield open_
    for context, page in opened:
        try:
            if not page.page.is_closed():
                page.page.screenshot(path=str(ARTIFACTS / f"labextension-{page.name}.png"))
        except Exception as exc:  # the page may be gone
            print(f"no screenshot of {page.name}: {exc}")
        context.close()
        jupyter_server.close_notebook(page.name)


@pytest.fixture(autouse=True)
def _artifacts() -> None:
    ARTIFACTS.mkdir(exist_ok=True)


def test_status_item_counts_threads_and_zombies_and_stop_zombies_clears_them(open_page: Any) -> None:
    lab = open_page("lab", [KEPT, INTERRUPTED])
    # Without any cell run: the kernel loaded nbcoord as it started.
    lab.wait_text("nbcoord: 0 threads · 0 zombies", timeout=20)
    assert lab.page.locator(f"#jp-main-statusbar {ITEM}").count() == 1

    lab.run_cell(0)
    lab.wait_text("nbcoord: 3 threads · 0 zombies")
    assert lab.item.locator(".nbcoord-alert").count() == 0

    lab.run_cell(1)
    wait_until(lambda: lab.page.locator(".jp-OutputArea-output", has_text="started").count(), what="cell 1 to start")
    lab.server.interrupt(lab.name)
    wait_until(lambda: lab.server.kernel_ready(lab.name), what="the interrupted cell to end")
    took = lab.wait_text("nbcoord: 5 threads · 2 zombies", timeout=5)
    assert took < 2.5, f"the zombies showed {took:.1f} s after the cell ended"
    assert lab.item.locator(".nbcoord-alert").text_content() == "2 zombies"
    assert "zombie" in str(lab.item.get_attribute("title"))
    statusbar = lab.page.locator("#jp-main-statusbar")
    statusbar.screenshot(path=str(PICTURES / "labextension-status.png"))

    started = time.monotonic()
    lab.execute("nbcoord:stop-zombies")
    lab.wait_text("nbcoord: 3 threads · 0 zombies", timeout=5)
    took = time.monotonic() - started
    assert took < 2.0, f"the item showed 0 zombies {took:.1f} s after Stop zombies"

    # Stop all background work: the kept threads too.
    lab.execute("nbcoord:stop-all")
    lab.wait_text("nbcoord: 0 threads · 0 zombies", timeout=5)


def test_commands_in_the_palette_and_the_kernel_menu_and_the_panel_shows_one_kernel(open_page: Any) -> None:
    lab = open_page("lab", [KEPT])
    lab.wait_text("nbcoord: 0 threads · 0 zombies", timeout=20)
    labels = [
        "Stop all background work",
        "Stop zombies",
        "Show nbcoord panel",
        "Open all kernels",
    ]
    lab.page.get_by_role("menuitem", name="Kernel", exact=True).click()
    menu = lab.page.locator(".lm-Menu").last
    for label in labels:
        assert menu.get_by_text(label, exact=True).filter(visible=True).count() == 1, label
    # A kernel with nbcoord is not offered to load it.
    assert menu.get_by_text("Load nbcoord in this kernel", exact=True).filter(visible=True).count() == 0
    lab.page.keyboard.press("Escape")
    lab.page.keyboard.press("Control+Shift+C")
    palette = lab.page.locator("#command-palette")
    for label in labels:
        assert palette.locator(".lm-CommandPalette-itemLabel", has_text=label).count() >= 1, label

    other = lab.server.api("POST", "/api/kernels", {"name": "python3"})  # a second kernel: the panel shows one
    try:
        cells_before = lab.page.evaluate(CELLS_JS)
        lab.execute("nbcoord:show-panel")
        frame = lab.page.frame_locator(".nbcoord-panel iframe")
        src = lab.page.locator(".nbcoord-panel iframe").get_attribute("src")
        assert src is not None and src.endswith(f"/nbcoord/?kernel={lab.kernel_id()}"), src
        wait_until(lambda: frame.locator("tr[data-kernel-id]").count() == 1, what="the panel's one row")
        assert frame.locator("tr[data-kernel-id]").get_attribute("data-kernel-id") == lab.kernel_id()
        lab.execute("nbcoord:open-fleet")
        fleet = lab.page.frame_locator(".nbcoord-panel:visible iframe")
        wait_until(lambda: fleet.locator(f"tr[data-kernel-id='{other['id']}']").count() == 1, what="the fleet's rows")
        # Nothing entered the notebook.
        assert lab.page.evaluate(CELLS_JS) == cells_before
    finally:
        lab.server.api("DELETE", f"/api/kernels/{other['id']}")


def test_a_kernel_without_nbcoord_reads_not_loaded_and_can_load_it(open_page: Any) -> None:
    lab = open_page("lab", ["1 + 1"], kernel="python3")
    lab.wait_text("nbcoord: not loaded", timeout=20)
    assert lab.page.evaluate("window.jupyterapp.commands.isVisible('nbcoord:load')")
    assert not lab.page.evaluate("window.jupyterapp.commands.isEnabled('nbcoord:stop-zombies')")
    lab.execute("nbcoord:load")
    lab.wait_text("nbcoord: loaded, waiting for the server")
    kernel = lab.kernel_id()
    # The kernel has nbcoord now: a stop through the server is accepted (409 while nbcoord is absent).
    reply = lab.server.api("POST", f"/nbcoord/api/kernels/{kernel}/stop", {"scope": "zombies"})
    assert reply["kernel_id"] == kernel


CELLS_JS = """() => Array.from(window.jupyterapp.shell.widgets('main'))
  .filter((w) => w.content && w.content.widgets && w.sessionContext).map((w) => w.content.widgets.length)"""
HIDE_JS = """(hidden) => {
  Object.defineProperty(document, 'visibilityState', { value: hidden ? 'hidden' : 'visible', configurable: true });
  Object.defineProperty(document, 'hidden', { value: hidden, configurable: true });
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_one_request_per_3_s_and_none_while_the_tab_is_hidden(open_page: Any) -> None:
    lab = open_page("lab", [KEPT])
    lab.wait_text("nbcoord: 0 threads · 0 zombies", timeout=20)
    # Observation windows of a fixed length: what is measured is how many requests a span of time holds.
    start = time.monotonic()
    lab.page.wait_for_timeout(9500)
    watched = [t for t in lab.requests if t >= start]
    assert 1 <= len(watched) <= 4, f"{len(watched)} requests in 9.5 s while the page only watched"
    gaps = [b - a for a, b in itertools.pairwise(watched)]
    assert all(gap >= 2.9 for gap in gaps), gaps

    lab.page.evaluate(HIDE_JS, True)
    hidden_at = time.monotonic()
    lab.page.wait_for_timeout(7000)
    during = [t for t in lab.requests if t > hidden_at + 0.2]  # one already on the wire may land
    assert during == [], f"{len(during)} requests while the tab was hidden"

    # Shown again: a fresh view at once, not at the next tick.
    with lab.page.expect_request(lambda r: r.url.split("?")[0].endswith(API), timeout=2000):
        lab.page.evaluate(HIDE_JS, False)


def test_notebook7_has_the_item_in_its_toolbar_and_the_commands(open_page: Any) -> None:
    nb = open_page("notebook", [KEPT])
    nb.wait_text("nbcoord: 0 threads · 0 zombies", timeout=20)
    assert nb.page.locator(f".jp-NotebookPanel-toolbar {ITEM}").count() == 1
    nb.run_cell(0)
    nb.wait_text("nbcoord: 3 threads · 0 zombies")
    for command in ("nbcoord:stop-all", "nbcoord:stop-zombies", "nbcoord:show-panel", "nbcoord:open-fleet"):
        assert nb.page.evaluate("(c) => window.jupyterapp.commands.hasCommand(c)", command), command
    nb.execute("nbcoord:stop-all")
    nb.wait_text("nbcoord: 0 threads · 0 zombies", timeout=5)
