"""A notebook open in a real browser page, for the browser tests: :class:`NotebookPage` (cells pinned by index,
the panel, the kernel), the ``open_notebook`` fixture that opens them and cleans up, and ``in_c_call``.

Shared by tests/test_browser.py and tests/test_browser_stacks.py (a test module never imports another).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from browser_support import JupyterServer, browser, jupyter_server  # noqa: F401
from helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
#: Where the screenshots go: the README's pictures only when asked for.
PICTURES = REPO / "docs" if os.environ.get("NBCOORD_UPDATE_SCREENSHOT") == "1" else ARTIFACTS
LIGHT, DARK, HIGH_CONTRAST = "JupyterLab Light", "JupyterLab Dark", "JupyterLab Dark High Contrast"
SHORT = {LIGHT: "light", DARK: "dark", HIGH_CONTRAST: "highcontrast"}
AA = 4.5

#: Contrast of every rendered text of the panel: the text colour over the backgrounds composited behind it.
CONTRAST_JS = """(root) => {
  const parse = (c) => {
    const m = /rgba?\\(([^)]+)\\)/.exec(c || "");
    if (!m) return null;
    const p = m[1].split(/[\\s,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => [0, 1, 2].map((i) => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const background = (el) => {
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const bg = parse(getComputedStyle(n).backgroundColor);
      if (bg && bg[3] > 0) { layers.push(bg); if (bg[3] >= 1) break; }
    }
    let color = [255, 255, 255, 1];
    for (const layer of layers.reverse()) color = over(layer, color);
    return color;
  };
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const out = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || !node.textContent.trim() || el.closest("style, title, [hidden]")) continue;
    if (!el.getClientRects().length || getComputedStyle(el).visibility === "hidden") continue;
    let opacity = 1;
    for (let n = el; n; n = n.parentElement) opacity *= Number(getComputedStyle(n).opacity);
    const fg = parse(getComputedStyle(el).color);
    if (!fg) continue;
    const bg = background(el);
    const shown = over([fg[0], fg[1], fg[2], fg[3] * opacity], bg);
    out.push({ text: node.textContent.trim().slice(0, 50), ratio: Math.round(ratio(shown, bg) * 100) / 100,
      color: getComputedStyle(el).color, background: `rgb(${bg.slice(0, 3).map(Math.round).join(", ")})` });
  }
  return out;
}"""

# Wraps the page's kernel connection's message handler (messages are handled one after another) to keep, for a
# failed test, the last 300 messages with when their handling began and ended: one that never ends stalls all
# that follow, replies included. A private name of JupyterLab's: where it is missing, there is no trace.
TRACE_JS = """() => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  if (kernel.nbcTraced || typeof kernel._handleMessage !== "function") return;
  kernel.nbcTraced = true;
  const trace = (window.nbcTrace = window.nbcTrace || []);
  const handle = kernel._handleMessage.bind(kernel);
  kernel._handleMessage = async (msg) => {
    const content = msg.content || {};
    const entry = { t: Date.now(), type: msg.header.msg_type, parent: msg.parent_header && msg.parent_header.msg_type,
                    detail: content.execution_state || content.status || content.ename || content.name
                      || (content.data && content.data.method) || "", done: null };
    trace.push(entry);
    if (trace.length > 300) trace.shift();
    try { return await handle(msg); } finally { entry.done = Date.now(); }
  };
}"""

#: True once the page's notebook has a kernel, connected and idle (the kernel-ready race of BROWSER-TESTING.md).
KERNEL_IDLE_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }"""


class NotebookPage:
    """One notebook open in a browser page, with its cells pinned by index."""

    def __init__(self, page: Any, server: JupyterServer, name: str, app: str) -> None:
        self.page = page
        self.server = server
        self.name = name
        self.app = app
        self.cells = page.locator(".jp-Notebook .jp-Cell")
        self.views = page.locator("[data-nbcoord=panel]")
        self.panel = self.views.first

    def wait_ready(self) -> None:
        """The notebook's kernel exists, is connected and idle (the kernel-ready race), on the server and here."""
        wait_until(lambda: self.server.kernel_ready(self.name), 60, 0.1, "the notebook's kernel")
        self.page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000)
        self.cells.first.wait_for()
        self.page.evaluate(TRACE_JS)

    def reload(self) -> None:
        """Save (so that no leave-the-page dialog stops the reload), reload the page as a user does, and wait until
        its kernel is connected and idle again (the reloaded page may keep the first cell out of view)."""
        self.page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        self.page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        self.page.reload()
        self.page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000)
        self.page.evaluate(TRACE_JS)

    def kernel_trace(self) -> list[str]:
        """The kernel messages the page handled last, a line each: when its handling began and how long it took
        ('NOT DONE': it never ended)."""
        return list(
            self.page.evaluate(
                "() => (window.nbcTrace || []).map((e) => `${e.t} ${e.type} < ${e.parent} ${e.detail} "
                "${e.done === null ? 'NOT DONE' : `done +${e.done - e.t} ms`}`)"
            )
        )

    def summary(self) -> str:
        """What the panel shows and the kernel messages the page handled last: the failure message's context
        (CI prints the test's output, not test-artifacts/)."""
        try:
            head = self.panel.locator(".nbc-head").all_text_contents()
            groups = self.panel.locator(".nbc-ghead").all_text_contents()
            status = self.panel.locator(".nbc-status").all_text_contents()
            trace = self.kernel_trace()[-12:]
        except Exception as exc:  # the page may be gone
            return f"no summary of {self.name} ({exc})"
        lines = [f"panel head {head}", f"group heads {groups}", f"status {status}", "last kernel messages:", *trace]
        return "\n".join(lines)

    def wait_shown(self, locator: Any, timeout: float, what: str) -> None:
        """``locator`` visible within ``timeout`` seconds; else a failure that says what the panel showed."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

        try:
            locator.wait_for(timeout=timeout * 1000)
        except PlaywrightTimeoutError:
            raise AssertionError(f"{what} not shown after {timeout} s\n{self.summary()}") from None

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
        """A cell's prompt as its DOM holds it. Not innerText: JupyterLab skips rendering the cells outside the
        viewport (content-visibility), and the innerText of a skipped cell is empty."""
        return str(self.cells.nth(index).locator(".jp-InputPrompt").text_content() or "").strip()

    def count(self, index: int) -> int:
        """The execution count of a finished cell."""
        match = re.fullmatch(r"\[(\d+)\]:?", self.prompt(index))
        assert match, self.prompt(index)
        return int(match.group(1))

    def wait_done(self, index: int, timeout: float = 60) -> None:
        try:
            wait_until(lambda: re.fullmatch(r"\[\d+\]:?", self.prompt(index)), timeout, 0.05, f"cell {index} done")
        except AssertionError as exc:
            model = self.page.evaluate(
                """(index) => { const w = window.jupyterapp.shell.currentWidget; const cell = w.content.widgets[index];
                return { count: cell.model.executionCount, state: cell.model.executionState,
                         kernel: w.sessionContext.session.kernel.status, active: w.content.activeCellIndex }; }""",
                index,
            )
            areas = self.cells.nth(index).locator(".jp-OutputArea-output")
            outputs = [text[:300] for text in areas.all_text_contents()]
            raise AssertionError(f"{exc}: prompt {self.prompt(index)!r}, model {model}, outputs {outputs}") from None

    def output(self, index: int, text: str) -> Any:
        return self.cells.nth(index).locator(".jp-OutputArea-output", has_text=text)

    def kernel_status(self) -> str:
        """The page's own idea of the kernel's status (the toolbar's indicator reads it)."""
        return str(
            self.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
        )

    def kernel_pid(self) -> int:
        match = re.search(r"kernel (\d+)", self.panel.locator(".nbc-head").inner_text())
        assert match
        return int(match.group(1))

    def set_theme(self, theme: str) -> None:
        """Switch the page's theme and wait until its colours are applied."""
        before = self.page.evaluate("getComputedStyle(document.body).getPropertyValue('--jp-layout-color1')")
        self.page.evaluate("(theme) => window.jupyterapp.commands.execute('apputils:change-theme', { theme })", theme)
        self.page.wait_for_function(
            """([theme, before]) => document.body.dataset.jpThemeName === theme
            && (theme === 'JupyterLab Light' || getComputedStyle(document.body)
                .getPropertyValue('--jp-layout-color1') !== before)""",
            arg=[theme, before],
            timeout=30_000,
        )

    def contrast(self, label: str, record: Any) -> float:
        """Every text of the first view meets WCAG AA; the figures are kept; returns the lowest ratio."""
        rows = self.panel.evaluate(CONTRAST_JS)
        assert len(rows) > 10, rows
        lowest = min(rows, key=lambda r: r["ratio"])
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"contrast-{label}.json").write_text(json.dumps(rows, indent=1))
        record(
            f"contrast-min-{label}",
            f"{lowest['ratio']} ({lowest['text']!r}: {lowest['color']} on {lowest['background']})",
        )
        failing = [r for r in rows if r["ratio"] < AA]
        assert not failing, f"{label}: {failing}"
        return float(lowest["ratio"])


@pytest.fixture
def open_notebook(
    browser: Any,  # noqa: F811
    jupyter_server: JupyterServer,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[Any]:
    """Opens notebooks in fresh pages; closes their pages and sessions after the test (a failed test leaves
    a screenshot of each page, the pages' console and the server's log in test-artifacts/). Puts the theme back
    to Light: the theme is a setting of the server's user, which the next test would inherit."""
    opened: list[tuple[Any, NotebookPage, list[str], list[str]]] = []
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
        page.on(
            "pageerror", lambda exc: errors.append(str(exc)) if "nbc" in str(exc) or "Cannot send" in str(exc) else None
        )
        page.on(
            "console",
            lambda msg: errors.append(msg.text) if msg.type == "error" and "nbcoord" in msg.text else None,
        )
        page.on("console", lambda msg: console.append(f"{name} {msg.type}: {msg.text}"))
        page.on("pageerror", lambda exc: console.append(f"{name} pageerror: {exc}\n{getattr(exc, 'stack', '')}"))
        page.goto(jupyter_server.page_url(app, name))
        notebook = NotebookPage(page, jupyter_server, name, app)
        opened.append((context, notebook, errors, dialogs))
        notebook.wait_ready()
        return notebook

    yield open_
    failed = request.session.testsfailed > failed_before
    if failed:
        ARTIFACTS.mkdir(exist_ok=True)
        traces = []
        for _context, notebook, _errors, _dialogs in opened:
            try:
                traces += ["", f"{notebook.name}: the kernel messages it handled last", *notebook.kernel_trace()]
            except Exception as exc:  # the page may be gone
                traces.append(f"{notebook.name}: no trace ({exc})")
        (ARTIFACTS / f"{request.node.name}-console.log").write_text("\n".join([*console, *traces]))
        for _context, notebook, _errors, _dialogs in opened:
            print(f"{notebook.name} at the failure:\n{notebook.summary()}")  # in the report, beside the failure
        (ARTIFACTS / f"{request.node.name}-server.log").write_bytes(jupyter_server.log.read_bytes())
    for context, notebook, errors, dialogs in opened:
        if failed:
            for page in context.pages:
                page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-{notebook.name}.png"), full_page=True)
        try:
            if notebook.page.evaluate("document.body.dataset.jpThemeName") != LIGHT:
                notebook.set_theme(LIGHT)
        finally:
            context.close()
            jupyter_server.close_notebook(notebook.name)
        assert dialogs == [], f"a dialog opened: {dialogs}"
        assert errors == [], f"errors from nbcoord's module: {errors}"



def in_c_call(pid: int) -> Any:
    """A condition for ``wait_until``: the kernel's main thread burns CPU (the cell's C call holds the GIL), at
    least 60 % of a core between two polls at least 0.15 s apart."""
    samples: list[tuple[float, float]] = []

    def burning() -> bool:
        thread = next(t for t in psutil.Process(pid).threads() if t.id == pid)
        samples.append((time.monotonic(), thread.user_time + thread.system_time))
        while len(samples) > 1 and samples[-1][0] - samples[1][0] >= 0.15:
            samples.pop(0)
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return t1 - t0 >= 0.15 and (c1 - c0) / (t1 - t0) >= 0.6

    return burning


