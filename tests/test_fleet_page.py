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
