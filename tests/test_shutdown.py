"""Every way a kernel ends, with leaked threads of four kinds: the process exits cleanly and promptly.

Measured without nbcoord (see bench/bench_shutdown.py): a leaked non-daemon thread keeps the kernel alive until
jupyter_client's SIGTERM at 2.5 s; here the test sends the shutdown message itself and never signals, so a kernel
that hangs fails the test instead of being killed.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from helpers import Kernel, wait_until

pytestmark = pytest.mark.kernel

LEAKS = {
    "cooperative": """
import nbcoord, threading, time
def work():
    while not nbcoord.should_stop():
        time.sleep(0.01)
threading.Thread(target=work, name="leak-cooperative").start()
""",
    "sleep-loop": """
import threading, time
def work():
    while True:
        time.sleep(0.05)
threading.Thread(target=work, name="leak-sleep-loop").start()
""",
    "blocked-in-c": """
import threading
threading.Thread(target=threading.Event().wait, name="leak-blocked").start()
""",
    "writer": """
import json, threading, time
def work(path):
    with open(path, "a") as f:
        i = 0
        while True:
            f.write(json.dumps({"i": i, "pad": "x" * 200}) + "\\n")
            i += 1
            time.sleep(0.001)
threading.Thread(target=work, args=(RECORDS,), name="leak-writer").start()
""",
}

#: Generous upper bounds for a loaded CI machine: the budget is 1.5 s, and jupyter_client would SIGTERM at 2.5 s.
PROMPT_EXIT_S = 2.4


def end_kernel(kernel: Kernel, route: str) -> None:
    if route == "shutdown":
        kernel.request_shutdown()
    elif route == "restart":
        kernel.request_shutdown(restart=True)
    elif route == "exit":
        kernel.submit("exit()")
    elif route == "sigterm":
        kernel.process.send_signal(signal.SIGTERM)


@pytest.mark.parametrize("leak", list(LEAKS))
@pytest.mark.parametrize("route", ["shutdown", "restart", "exit", "sigterm"])
def test_kernel_ends_cleanly_with_leaked_thread(kernel: Kernel, tmp_path: Path, route: str, leak: str) -> None:
    records = tmp_path / "records.jsonl"
    kernel.run(f"RECORDS = {str(records)!r}")
    kernel.run(LEAKS[leak])
    if leak == "writer":
        wait_until(lambda: records.exists() and records.stat().st_size > 1000, what="the writer to write")
    started = time.monotonic()
    end_kernel(kernel, route)
    status = kernel.wait_exit(timeout=10)
    took = time.monotonic() - started
    assert status is not None, f"kernel did not exit within 10 s after {route}"
    expected = -signal.SIGTERM if route == "sigterm" else 0
    assert status == expected, f"exit status {status} after {route}"
    assert took < PROMPT_EXIT_S, f"kernel took {took:.2f} s to exit after {route}"
    if leak == "writer":
        lines = records.read_text().splitlines()
        assert lines, "the writer wrote nothing"
        last = json.loads(lines[-1])  # raises if the last record was cut
        assert last["i"] == len(lines) - 1
