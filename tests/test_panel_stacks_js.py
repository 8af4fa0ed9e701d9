"""The panel when its kernel does not answer (issue 24): the ES module alone in a blank Chromium page, with the
fake model and the fake clock of test_panel_js.py, and the server's stacks endpoint served by ``page.route``.

- A kernel silent for 2 s while it owes an answer (a running cell, an execute request, a click) is asked about
  from outside, at most once per 2 s, and the server's ``main.doing`` shown; asking stops when it answers again.
- The status line never says "kernel idle" while the kernel is silent (the page's own status may still say idle:
  the busy message waits behind the GIL too).
- Without the server (VS Code: no Jupyter config) nothing is asked and the fallback says what it can; where the
  server cannot read stacks, its reason is added.
- Interrupt and Restart: Interrupt through the kernel connection, then a second read that says whether the call
  ended; Restart only on a second click within 5 s.

See test_browser_stacks.py for the same against a real server and a kernel stuck in ``sum(range(...))``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's one Chromium)
from panel_js_support import BIDI, HOSTILE, NOW, ORIGIN, base_state, header, mount, page, set_trait  # noqa: F401

pytestmark = pytest.mark.browser

REASON = "This kernel runs on another machine: its stacks cannot be read from here."


def answer(**main: Any) -> dict[str, Any]:
    """A stacks answer (schema nbcoord.stacks/1) whose main thread holds the GIL in builtin_sum."""
    value: dict[str, Any] = {
        "tid": 4242,
        "holds_gil": True,
        "in_c": True,
        "doing": "busy in builtin_sum, holding the GIL, cell [3], line 2, for 4.1 s",
        "cell": 3,
        "line": 2,
        "function": "builtin_sum",
        "since": NOW - 2,
        "since_exact": True,
    }
    value.update(main)
    return {
        "schema": "nbcoord.stacks/1", "kernel_id": "k-1", "pid": 4242, "available": True, "reason": None,
        "read_at": NOW + 2, "read_ms": 40.0, "paused_ms": 0.0, "native": False, "main": value,
        "threads": [], "deadlocks": [],
    }  # fmt: skip


class Server:
    """The server's stacks endpoint and the kernels API, as ``page.route`` serves them; what was asked."""

    def __init__(self, page: Any) -> None:  # noqa: F811
        self.requests: list[dict[str, Any]] = []
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        self.body: Any = answer()
        page.route(f"{ORIGIN}/nbcoord/api/**", self.stacks)
        page.route(f"{ORIGIN}/api/kernels/**", self.kernels)
        # The panel's HEAD of the server page, at its start: nbcoord's extension is there.
        page.route(f"{ORIGIN}/nbcoord/", lambda route: route.fulfill(status=200, body=""))

    def stacks(self, route: Any) -> None:
        request = route.request
        self.requests.append({"url": request.url, "headers": request.headers, "method": request.method})
        text = self.body if isinstance(self.body, str) else json.dumps(self.body)
        route.fulfill(status=self.status, content_type="application/json", body=text)

    def kernels(self, route: Any) -> None:
        self.posts.append({"url": route.request.url, "headers": route.request.headers, "method": route.request.method})
        route.fulfill(status=204, body="")


@pytest.fixture
def server(page: Any) -> Iterator[Server]:  # noqa: F811
    """A Jupyter page (its config names the base URL, its cookie the XSRF token) with the endpoint served."""
    page.evaluate(
        """() => { const node = document.createElement('script'); node.id = 'jupyter-config-data';
        node.type = 'application/json'; node.textContent = JSON.stringify({ baseUrl: '/' });
        document.head.appendChild(node); document.cookie = '_xsrf=token-1; path=/'; }"""
    )
    yield Server(page)


def status_text(page: Any) -> str:  # noqa: F811
    return str(page.locator(".nbc-status").inner_text())


def banner(page: Any) -> Any:  # noqa: F811
    return page.locator(".nbc-banner")


def watch_status(page: Any, ms: int, step: int = 100) -> list[str]:  # noqa: F811
    """The status line every ``step`` ms of the fake clock over ``ms``."""
    seen = []
    for _ in range(ms // step):
        page.clock.run_for(step)
        seen.append(status_text(page))
    return seen


def test_a_silent_kernel_is_asked_about_from_outside_and_its_answer_shown(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.clock.run_for(1_900)
    assert server.requests == []  # beats may be late: not asked before 2 s
    page.clock.run_for(200)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    (asked,) = server.requests
    assert asked["url"] == f"{ORIGIN}/nbcoord/api/kernels/k-1/stacks"
    assert asked["method"] == "GET"
    assert asked["headers"].get("x-xsrftoken") == "token-1"
    text = banner(page).inner_text()
    assert "Kernel busy in builtin_sum, holding the GIL, cell [3], line 2, for 4.1 s (read from outside at" in text
    assert page.get_by_role("button", name="Interrupt").is_visible()
    assert page.get_by_role("button", name="Restart").is_visible()
    assert "Interrupt sends SIGINT: ends Python code, not a C call that never checks signals." in text
    assert "Restart ends the kernel and everything in it; variables are lost." in text
    assert re.search(r"cell \[3\] running for 4\.1 s \(read from outside\)", status_text(page)), status_text(page)
    page.clock.run_for(900)
    assert len(server.requests) == 1  # at most once per 2 s
    page.clock.run_for(1_100)
    page.wait_for_function("() => true")
    assert len(server.requests) == 2
    # The kernel answers again: the banner goes, and nothing more is asked.
    set_trait(page, "beat", {"at": NOW + 4, "every": 1.0})
    banner(page).wait_for(state="hidden", timeout=5_000)
    assert re.search(r"cell \[3\] running for \d+ s", status_text(page))
    page.clock.run_for(1_500)
    assert len(server.requests) == 2


def test_the_status_line_never_says_idle_while_the_kernel_is_silent(page: Any) -> None:  # noqa: F811
    # No Jupyter config (VS Code): nothing is asked. The page's status stays idle and the kernel's header says no
    # cell runs: the cell's busy message and the header's update both wait behind the GIL. The page sent the cell.
    mount(page, base_state())
    assert "kernel idle" in status_text(page)
    page.evaluate(
        """() => window.model.kernel.anyMessage.emit({ direction: 'send',
        msg: { header: { msg_type: 'execute_request', msg_id: 'e-1' }, content: { code: 'sum(range(10**10))' } } })"""
    )
    seen = watch_status(page, 6_000)
    assert not [line for line in seen if "kernel idle" in line], seen
    assert seen[0].startswith("kernel busy"), seen[0]
    assert "kernel not answering for 6.0 s" in seen[-1], seen[-1]
    text = banner(page).inner_text()
    assert "Kernel busy in native code, not answering since" in text
    assert page.get_by_role("button", name="Interrupt").is_visible()
    # The reply comes: the kernel is idle again.
    page.evaluate(
        """() => window.model.kernel.anyMessage.emit({ direction: 'recv',
        msg: { header: { msg_type: 'execute_reply', msg_id: 'r-1' }, parent_header: { msg_id: 'e-1' },
               content: {} } })"""
    )
    page.clock.run_for(100)
    assert "kernel idle" in status_text(page)
    assert banner(page).is_hidden()


def test_a_page_busy_kernel_that_sends_nothing_is_not_idle(page: Any) -> None:  # noqa: F811
    mount(page, base_state())
    page.evaluate("window.model.kernelStatus('busy')")
    seen = watch_status(page, 5_000)
    assert not [line for line in seen if "kernel idle" in line], seen
    assert "kernel not answering for 5.0 s" in seen[-1]


def test_a_server_that_cannot_read_stacks_adds_its_reason(page: Any, server: Server) -> None:  # noqa: F811
    server.body = {**answer(), "available": False, "reason": REASON, "main": None}
    mount(page, base_state(header=header(running_cell=3, running_since=NOW)))
    page.clock.run_for(2_100)
    page.wait_for_function("() => true")
    assert len(server.requests) == 1
    seen = watch_status(page, 3_000)
    assert "kernel not answering for" in seen[-1] and "cell [3] running for 5 s" in seen[-1], seen[-1]
    text = banner(page).inner_text()
    assert "Kernel busy in native code, not answering since" in text
    assert f"No stacks from outside: {REASON}" in text


def test_a_server_without_the_endpoint_is_asked_once(page: Any, server: Server) -> None:  # noqa: F811
    server.status, server.body = 404, "<html>404: Not Found</html>"
    mount(page, base_state(header=header(running_cell=3, running_since=NOW)))
    seen = watch_status(page, 8_000)
    assert len(server.requests) == 1
    assert "kernel not answering for 8.0 s" in seen[-1]
    assert "Kernel busy in native code" in banner(page).inner_text()
    # Chromium logs the 404 of the one read.
    page.nbc_errors.remove("Failed to load resource: the server responded with a status of 404 (Not Found)")


def test_an_unanswered_click_asks_at_once_and_the_answer_says_the_click_waits(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.get_by_role("button", name="Stop background work").click()
    page.clock.run_for(700)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    assert "Your click waits: the stop will act when the call returns." in banner(page).inner_text()
    assert len(server.requests) == 1


def test_interrupt_then_the_call_goes_on_then_restart_on_a_second_click(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.clock.run_for(2_100)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    page.get_by_role("button", name="Interrupt").click()
    assert page.evaluate("window.model.kernel.interrupts") == 1
    page.get_by_role("button", name="Interrupting…").wait_for(timeout=5_000)
    asked = len(server.requests)
    page.clock.run_for(1_600)  # read again 1.5 s after: the main thread is where it was
    page.locator(".nbc-verdict", has_text="Interrupt cannot end this call; Restart will.").wait_for(timeout=5_000)
    assert len(server.requests) == asked + 1
    restart = page.locator("[data-way=restart]")
    restart.click()
    assert restart.inner_text() == "Click again to restart"
    assert page.evaluate("window.model.kernel.restarts") == 0
    page.clock.run_for(5_100)  # no second click within 5 s: it asks again
    assert restart.inner_text() == "Restart"
    restart.click()
    page.clock.run_for(1_000)
    restart.click()
    assert page.evaluate("window.model.kernel.restarts") == 1
    assert server.posts == []  # the kernel connection did both


def test_interrupt_that_ends_the_call_lets_the_banner_go(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.clock.run_for(2_100)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    page.get_by_role("button", name="Interrupt").click()
    page.clock.run_for(500)
    set_trait(page, "header", header(running_cell=None, running_since=None))  # the kernel speaks again
    banner(page).wait_for(state="hidden", timeout=5_000)
    page.clock.run_for(1_500)
    assert banner(page).is_hidden()
    assert "kernel idle" in status_text(page)


def test_without_the_connections_methods_interrupt_posts_to_the_server(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.evaluate("() => { delete window.model.kernel.interrupt; delete window.model.kernel.restart; }")
    page.clock.run_for(2_100)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    page.get_by_role("button", name="Interrupt").click()
    page.wait_for_function("() => true")
    page.clock.run_for(100)
    (post,) = server.posts
    assert post["method"] == "POST"
    assert post["url"] == f"{ORIGIN}/api/kernels/k-1/interrupt"
    assert post["headers"].get("x-xsrftoken") == "token-1"


def test_the_servers_strings_are_text(page: Any, server: Server) -> None:  # noqa: F811
    server.body = answer(doing=f"busy in {HOSTILE} {BIDI}")
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.clock.run_for(2_100)
    page.locator(".nbc-banner", has_text="onerror").wait_for(timeout=5_000)
    assert page.locator(".nbc-banner img").count() == 0
    text = banner(page).inner_text()
    assert HOSTILE in text
    assert "evil\\u202eexe.txt\\nnext\\u0000\\u200d" in text


def test_native_frames_only_on_a_click(page: Any, server: Server) -> None:  # noqa: F811
    mount(page, base_state(header=header(running_cell=3, running_since=NOW - 2)))
    page.clock.run_for(2_100)
    page.locator(".nbc-banner", has_text="busy in builtin_sum").wait_for(timeout=5_000)
    assert all("native" not in r["url"] for r in server.requests)
    body = answer()
    frames = [{"symbol": "_start", "library": "python3.11"}, {"symbol": HOSTILE, "library": "libpython3.11.so.1.0"},
              {"symbol": "builtin_sum", "library": "libpython3.11.so.1.0"}]  # fmt: skip
    body["threads"] = [{"tid": 4242, "name": "MainThread", "main": True, "holds_gil": True, "state": "running",
                        "frames": [], "native": frames, "waits": None}]  # fmt: skip
    server.body = body
    page.get_by_role("button", name="Native frames").click()
    line = page.locator(".nbc-native")
    line.wait_for(timeout=5_000)
    assert server.requests[-1]["url"].endswith("/stacks?native=1")
    assert line.inner_text() == (
        f"Main thread, native, innermost first: builtin_sum (libpython3.11.so.1.0) \u2190 {HOSTILE} "
        "(libpython3.11.so.1.0) \u2190 _start (python3.11)"
    )
    assert page.locator(".nbc-banner img").count() == 0
    asked = len(server.requests)
    page.clock.run_for(2_000)  # the reads that follow leave native frames out
    page.wait_for_function("() => true")
    assert len(server.requests) == asked + 1
    assert not server.requests[-1]["url"].endswith("native=1")
