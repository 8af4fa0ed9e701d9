"""What the TensorFlow test modules share: the TensorFlow releases their kernels run on, the options of a kernel with
nbcoord's test diagnostics (for conftest's ``kernel`` and ``own_kernel``), and the Interrupt's collection.

:data:`TF_KERNELS`: tensorflow-cpu 2.21 in ``.venv``, and the oldest claimed, 2.15, in ``.venv-tf215``
(``NBCOORD_TF215_PYTHON``; ``tools/dev.py test`` builds it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import CellResult, Kernel, kernel_params, wait_until

KERNEL_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
REPO = Path(__file__).resolve().parent.parent


def _tf_kernels() -> list[Any]:
    """The interpreters the TensorFlow tier runs its kernels on: this one (tensorflow-cpu 2.21), and the one of the
    oldest TensorFlow the package claims (2.15): ``$NBCOORD_TF215_PYTHON`` (empty: not built here), else
    ``.venv-tf215`` when it exists."""
    params = [pytest.param(sys.executable, id="tf2.21")]
    configured = os.environ.get("NBCOORD_TF215_PYTHON")
    if configured is None:
        env = REPO / ".venv-tf215" / "bin" / "python"
        configured = str(env) if env.exists() else ""
    if configured:
        params.append(pytest.param(configured, id="tf2.15"))
    return params


#: One ``pytest.param`` per TensorFlow release tested: the kernel's python, with the id ``tf<version>``.
TF_KERNELS = _tf_kernels()


def collect_interrupted(kernel: Kernel, msg_id: str) -> CellResult:
    """Collect a cell that was interrupted; if the kernel hangs instead, fail with every thread's stack."""
    try:
        return kernel.collect(msg_id, timeout=20)
    except AssertionError as error:
        dump = Path(kernel._tmp.name) / "stacks.txt"
        os.kill(kernel.pid, signal.SIGUSR1)  # faulthandler, registered by DIAGNOSTICS
        wait_until(lambda: dump.exists() and dump.stat().st_size > 0, 5, what="the stack dump")
        # The main thread first: CI shows the start and the end of a long failure, and it is the one that hangs.
        stacks = dump.read_text().strip().split("\n\n")
        stacks.sort(key=lambda stack: "kernelapp.py" not in stack)
        raise AssertionError(f"{error}\nkernel stacks, the main thread first:\n" + "\n\n".join(stacks)) from None


#: nbcoord's test diagnostics, the cell a kernel runs before nbcoord loads: SIGUSR1 dumps every thread's stack to
#: stacks.txt in the kernel's working directory, which is its temporary directory (:class:`helpers.Kernel`).
DIAGNOSTICS = """
import faulthandler as _faulthandler, signal as _signal
_stacks = open("stacks.txt", "w")
_faulthandler.register(_signal.SIGUSR1, file=_stacks, all_threads=True)
"""


def tf_kernel_params(*, setup: str = DIAGNOSTICS, after: str = "", **options: Any) -> list[Any]:
    """Parameters of conftest's ``kernel`` or ``own_kernel``, one per release of :data:`TF_KERNELS`: the kernel's
    environment quiets TensorFlow, ``setup`` (dedented; by default :data:`DIAGNOSTICS`) runs before nbcoord loads and
    ``after`` (dedented) after; ``options``: the other fields of :class:`helpers.KernelOptions`."""
    return kernel_params(
        TF_KERNELS, env=KERNEL_ENV, setup=textwrap.dedent(setup), after=textwrap.dedent(after), **options
    )


def submit_blocked(kernel: Kernel, tmp_path: Path, statement: str) -> tuple[str, list[dict[str, Any]]]:
    """Start a cell whose ``statement`` blocks in a session run; return its msg_id once the snapshot says so.

    A thread in the kernel waits for the blocked run to appear in the snapshot and writes the rows to a file
    (the kernel cannot answer requests while the cell runs). The cell prints how long the KeyboardInterrupt
    took to arrive after the watcher saw SIGINT.
    """
    blocked = tmp_path / "blocked.json"
    cell = kernel.submit(
        textwrap.dedent(
            f"""
            def spy():
                while not (rows := nbcoord.snapshot()["blocked_runs"]):
                    time.sleep(0.02)
                with open({str(blocked)!r}, "w") as f:
                    json.dump(rows, f)
            threading.Thread(target=spy, name="spy", daemon=True).start()
            try:
                {statement}
            except KeyboardInterrupt:
                integration = nbcoord.tensorflow.integration.current()
                print(f"@@latency {{time.monotonic() - integration.last_sigint_at:.4f}}")
                raise
            """
        )
    )
    wait_until(lambda: blocked.exists() and blocked.stat().st_size > 0, 30, what="the blocked run in the snapshot")
    return cell, json.loads(blocked.read_text())


def shutdown_exit_status(kernel: Kernel, filled: str, size: int) -> int | None:
    """Once ``filled`` (an expression) reads ``size``, ask the kernel to shut down and return its exit status, or
    None when it is still running 30 s later.

    Without nbcoord such a kernel never exits by itself (the interpreter joins its non-daemon threads forever), so
    the deadline only tells an exit from a hang; how fast the exit comes is measured against a baseline in
    bench/bench_shutdown.py, not bounded here by the wall clock of a loaded machine."""
    wait_until(lambda: kernel.evaluate(filled) == size, 20, what="the queue to fill")
    started = time.monotonic()
    kernel.request_shutdown()
    status = kernel.wait_exit(timeout=30)
    print(f"kernel exited with {status} in {time.monotonic() - started:.2f} s")
    return status
