"""A kernel stuck in a C call that holds the GIL, in JupyterLab and Notebook 7 (issue 24, points 2, 3 and 5).

The cell ``sum(range(n))`` holds the GIL for about half a minute without checking signals: the kernel sends
nothing, not even its busy status, and cannot answer the panel. The panel asks nbcoord's server extension for the
kernel's stacks (``nbcoord/api/kernels/<id>/stacks``) and shows where the main thread is; its status line never
says "kernel idle" meanwhile (the DOM is read every 100 ms over the whole spell, in the page); Interrupt cannot end
the call and the panel says so after reading the stacks again; Restart, clicked twice, restarts the kernel.
"""

from __future__ import annotations

import re
import time
from typing import Any

import psutil
import pytest
from browser_support import browser, jupyter_server  # noqa: F401
from helpers import wait_until
from notebook_support import KERNEL_IDLE_JS, NotebookPage, in_c_call, open_notebook  # noqa: F401

pytestmark = pytest.mark.browser

SETUP = """%load_ext nbcoord
%nbcoord config panel_interval=0.25
%nbcoord panel"""
#: How many items make sum(range(n)) take about 30 s here (measured in the kernel: machines differ).
CALIBRATE = """import time
def _took(n):
    t = time.perf_counter(); sum(range(2**62, 2**62 + n)); return time.perf_counter() - t
_n = int(10**6 * 30 / min(_took(10**6) for _ in range(3)))"""
#: Line 1 of its cell: the C call. The items are past 2**62 so that the sum takes CPython's slow path from the start
#: (PyLong objects, no signal checks) and its speed is the one measured.
STUCK = "sum(range(2**62, 2**62 + _n))"

#: In the page: the panel's status line and banner every 100 ms, with the page's time; the first time the banner
#: shows the server's read (``holding the GIL``).
RECORD_JS = """() => {
  const panel = document.querySelector('[data-nbcoord=panel]');
  const status = panel.querySelector('.nbc-status');
  const banner = panel.querySelector('.nbc-banner');
  window.nbcSeen = []; window.nbcOutside = null; window.nbcRunAt = null;
  window.nbcRecorder = setInterval(() => {
    const text = banner.hidden ? '' : banner.textContent;
    window.nbcSeen.push([performance.now(), status.textContent, text]);
    if (window.nbcOutside === null && text.includes('holding the GIL')) window.nbcOutside = performance.now();
  }, 100);
}"""


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_a_kernel_stuck_in_a_c_call_is_read_from_outside_and_restarted(
    open_notebook: Any,  # noqa: F811
    app: str,
    record_property: Any,
) -> None:
    notebook: NotebookPage = open_notebook(app, [SETUP, CALIBRATE, STUCK])
    notebook.run(0)
    notebook.wait_done(0)
    notebook.panel.locator(".nbc-status", has_text="kernel idle").wait_for(timeout=20_000)
    notebook.run(1)
    notebook.wait_done(1)
    count = notebook.count(1) + 1
    pid = notebook.kernel_pid()
    notebook.page.evaluate(RECORD_JS)
    notebook.page.evaluate("() => { window.nbcRunAt = performance.now(); }")
    notebook.run(2)
    wait_until(in_c_call(pid), 20, 0.05, "the cell's C call")
    banner = notebook.panel.locator(".nbc-banner")
    notebook.wait_shown(banner.get_by_text("holding the GIL"), 10, "the server's read of the main thread")
    took = notebook.page.evaluate("window.nbcOutside - window.nbcRunAt")
    record_property(f"{app}-run-to-stacks-shown-ms", round(took))
    text = banner.inner_text()
    assert f"cell [{count}], line 1" in text, text
    assert "(read from outside at" in text
    # The kernel sent nothing since the cell was sent: it went quiet then.
    assert took <= 3000, f"the server's read was shown {took:.0f} ms after the cell was run"
    status = notebook.panel.locator(".nbc-status")
    assert re.search(rf"cell \[{count}\] running for (at least )?[\d.]+ s \(read from outside\)", status.inner_text())

    interrupt = notebook.panel.get_by_role("button", name="Interrupt")
    assert "Interrupt sends SIGINT: ends Python code, not a C call that never checks signals." in text
    assert "Restart ends the kernel and everything in it; variables are lost." in text
    interrupt.click()
    verdict = notebook.panel.locator(".nbc-verdict", has_text="Interrupt cannot end this call; Restart will.")
    notebook.wait_shown(verdict, 6, "the verdict")
    assert wait_until(in_c_call(pid), 5, 0.05, "the C call, still running after Interrupt")

    # Native frames, on a click only: the C function the main thread is in.
    notebook.panel.get_by_role("button", name="Native frames").click()
    native = notebook.panel.locator(".nbc-native", has_text="builtin_sum")
    notebook.wait_shown(native, 15, "the main thread's native frames")
    record_property(f"{app}-native-frames", native.inner_text()[:300])

    seen = notebook.page.evaluate("() => { clearInterval(window.nbcRecorder); return window.nbcSeen; }")
    assert len(seen) >= 30, seen
    idle = [(round(at), line) for at, line, _ in seen if "kernel idle" in line]
    assert not idle, f"the status line said idle while the kernel was stuck: {idle[:5]}"

    restart = notebook.panel.locator("[data-way=restart]")
    restart.click()
    assert restart.inner_text() == "Click again to restart"
    started = time.monotonic()
    restart.click()
    notebook.wait_shown(banner.get_by_text("The kernel of this panel is gone"), 30, "the restart")
    notebook.page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000)
    record_property(f"{app}-restart-to-idle-s", round(time.monotonic() - started, 1))
    wait_until(lambda: not psutil.pid_exists(pid), 10, 0.1, "the old kernel to end")
