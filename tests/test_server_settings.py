"""nbcoord in every kernel a server starts: the server setting ``NBCoordServer.load_in_kernels`` (a real server).

(The per-user way, IPython's ``c.InteractiveShellApp.extensions``, is the ``profile`` kernel of tests/test_server.py.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import wait_until
from server_support import IK6_KERNEL, FleetServer, fleet_server_running

from nbcoord.server._kernels import EXTENSION_ARGUMENT

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def server() -> Iterator[FleetServer]:
    with fleet_server_running("--NBCoordServer.load_in_kernels=True") as running:
        yield running


def test_every_ipython_kernel_the_server_starts_loads_nbcoord(server: FleetServer) -> None:
    kernel_ids = {kernel: server.start(f"{kernel}.ipynb", kernel) for kernel in ("python3", IK6_KERNEL)}
    for kernel_id in kernel_ids.values():
        attached = server.attach(kernel_id)
        # No cell ran %load_ext: the kernel's command line asked IPython to load the extension.
        assert EXTENSION_ARGUMENT in attached.evaluate("__import__('sys').argv")
        assert attached.evaluate("'nbcoord' in get_ipython().extension_manager.loaded") is True
        row = server.row(kernel_id)
        assert row["status"] == "ok", row
        assert row["nbcoord"]["threads"] == 0
    assert "every IPython kernel this server starts loads nbcoord" in server.log.read_text()


def test_a_restarted_kernel_loads_it_again(server: FleetServer) -> None:
    kernel_id = server.start("restarted.ipynb")
    first = server.row(kernel_id)["pid"]
    server.api("POST", f"/api/kernels/{kernel_id}/restart")

    def answers_again() -> bool:
        row = server.row(kernel_id)
        return bool(row["pid"] != first and row["status"] == "ok")

    wait_until(answers_again, timeout=60, interval=0.2, what="the restarted kernel to answer with nbcoord loaded")
