"""The server's /nbcoord/ page in Debian's Chromium, for what the newcomer's issue found missing: the last stop's age
moves on while the page refreshes, and threads that ignored a stop can be forced from the page (without a cell).

One Jupyter server with one kernel that loads nbcoord (tests/server_support.py); the fleet's other page test
(rows, hostile names, keyed updates, Stop zombies) is in test_server.py.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's Chromium)
from helpers import wait_until
from server_support import Attached, FleetServer, fleet_server_running

pytestmark = [pytest.mark.kernel, pytest.mark.browser]

#: A thread that never asks nbcoord whether to stop: a stop leaves it running, a forced one ends it.
STUBBORN = """\
import threading, time
def _stubborn():
    while True:
        time.sleep(0.02)
stubborn = threading.Thread(target=_stubborn, name="stubborn-loop", daemon=True)
stubborn.start()
"""


@pytest.fixture(scope="module")
def server_and_kernel() -> Iterator[tuple[FleetServer, Attached]]:
    with fleet_server_running("--NBCoordServer.page_interval=1") as server:
        kernel = server.attach(server.start("stubborn.ipynb"))
        kernel.run("%load_ext nbcoord")
        yield server, kernel


def test_threads_that_ignored_a_stop_are_forced_from_the_page_and_the_stops_age_moves_on(
    server_and_kernel: tuple[FleetServer, Attached],
    browser: Any,  # noqa: F811
) -> None:
    server, kernel = server_and_kernel
    kernel.run(STUBBORN)
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    try:
        page.goto(f"{server.url}/nbcoord/?token={urllib.parse.quote(server.token)}")
        row = page.locator(f"tr[data-kernel-id='{kernel.kernel_id}']")
        row.get_by_role("button", name="Stop all", exact=True).wait_for(timeout=20_000)
        row.get_by_role("button", name="Stop all", exact=True).click()
        row.locator(".nbf-result", has_text="still alive: stubborn-loop").wait_for(timeout=30_000)
        last = row.locator("td[data-col=last-stop]")
        force = last.get_by_role("button", name="Force stop")
        force.wait_for(timeout=20_000)
        assert "1 alive" in last.inner_text()

        def age() -> int:
            match = re.search(r"(\d+) s ago", last.inner_text())
            return int(match.group(1)) if match else -1

        wait_until(lambda: age() >= 0, timeout=10, what="the last stop's age")
        first = age()
        wait_until(lambda: age() >= first + 2, timeout=15, what=f"the last stop's age to move on from {first} s")

        force.click()
        row.locator(".nbf-result", has_text="Stopped 1 thread").wait_for(timeout=30_000)
        wait_until(lambda: kernel.evaluate("stubborn.is_alive()") is False, timeout=20, what="the thread to end")
        force.wait_for(state="detached", timeout=20_000)
        assert "alive" not in last.inner_text()
        assert not problems, problems
    finally:
        context.close()


def test_a_kernel_that_does_not_answer_shows_its_call_and_offers_a_way_out(
    server_and_kernel: tuple[FleetServer, Attached],
    browser: Any,  # noqa: F811
) -> None:
    """A C call that holds the GIL and never checks for signals: the page reads the main thread from outside, an
    Interrupt does not end the call (and the page says so), a Restart does."""
    server, _kernel = server_and_kernel
    kernel_id = server.start("frozen.ipynb")
    kernel = server.attach(kernel_id)
    kernel.run("%load_ext nbcoord")
    old_pid = server.kernel_pid(kernel)
    msg_id = kernel.submit("total = sum(range(10**11))")
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    try:
        page.goto(f"{server.url}/nbcoord/?token={urllib.parse.quote(server.token)}")
        row = page.locator(f"tr[data-kernel-id='{kernel_id}']")
        doing = row.locator(".nbf-doing")
        doing.wait_for(timeout=30_000)
        text = doing.inner_text()
        assert re.search(r"Main thread: busy, holding the GIL, cell \[\d+\], line 1 in <module>, for \d", text), text
        row.get_by_role("button", name="Interrupt", exact=True).click()
        row.locator(".nbf-result", has_text="Interrupt cannot end this call").wait_for(timeout=30_000)
        row.get_by_role("button", name="Restart", exact=True).click()
        row.get_by_role("button", name="Click again to restart").click()
        restarted = row.locator(".nbf-result", has_text="Restarted")
        restarted.wait_for(timeout=60_000)
        # A new process: the old one, with its endless call, is gone.
        wait_until(lambda: not _alive(old_pid), timeout=30, what="the old kernel process to end")
        row.locator(".nbf-doing").wait_for(state="detached", timeout=30_000)
        assert msg_id and not problems, problems
    finally:
        context.close()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie until the server reaps it counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
