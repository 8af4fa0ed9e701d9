"""Kernels for the benchmarks: a kernel spec of our own, so that the interpreter (and its ipykernel) is the one asked.

jupyter_client 8 ignores ``KernelManager.kernel_cmd``, and a user-level ``python3`` spec would otherwise decide
which interpreter runs.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]


def kernel_manager(workdir: str, python: str = sys.executable) -> KernelManager:
    """A manager for a kernel on ``python``, its spec written under ``workdir`` (a temporary folder)."""
    spec_dir = Path(workdir) / "kernels" / "nbcoord-bench"
    spec_dir.mkdir(parents=True)
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "bench", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    return KernelManager(kernel_name="nbcoord-bench", kernel_spec_manager=specs)


def run_cell(client: Any, code: str, timeout: float = 120) -> str:
    """Run ``code`` (dedented) and return what it printed; an error in the cell raises with its traceback."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))

    client.execute_interactive(textwrap.dedent(code), timeout=timeout, output_hook=hook)
    return "".join(out)


def thread_cpu_ns(pid: int, tid: int | str) -> int | None:
    """Nanoseconds thread ``tid`` of ``pid`` has spent on a CPU, from its scheduler counter (None: not readable
    here, or the thread ended)."""
    try:
        return int((Path("/proc") / str(pid) / "task" / str(tid) / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kernel_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark kernel: this checkout's nbcoord first on the path."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}
