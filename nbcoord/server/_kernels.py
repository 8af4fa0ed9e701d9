"""Every IPython kernel the server starts loads nbcoord: the server setting ``NBCoordServer.load_in_kernels``.

A kernel's command comes from its kernel spec. :class:`NBCoordKernelManager` is jupyter_server's own kernel
manager with one change: when the command starts an IPython kernel (``ipykernel_launcher`` or ``ipykernel``), it
appends ``--InteractiveShellApp.extra_extensions=nbcoord``, the option IPython itself offers for loading an extension
from the command line (``--ext``). ``extra_extensions`` adds to the user's own ``c.InteractiveShellApp.extensions``
rather than replacing it, and loading nbcoord twice is harmless. Kernels of other languages are left as they are; a
kernel whose environment cannot import nbcoord logs IPython's "Error in loading extension" and starts anyway.

The extension installs this class when ``c.NBCoordServer.load_in_kernels = True`` and the server uses the default
kernel manager class; a server configured with a kernel manager class of its own gets a warning instead (it can
subclass this one). Restarts keep the option: jupyter_client formats the command again for each start.
"""

from __future__ import annotations

import logging
from pathlib import PurePath
from typing import Any

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

log = logging.getLogger("nbcoord.server")

EXTENSION_ARGUMENT = "--InteractiveShellApp.extra_extensions=nbcoord"
DEFAULT_CLASS = "jupyter_server.services.kernels.kernelmanager.ServerKernelManager"
CLASS_NAME = "nbcoord.server.NBCoordKernelManager"


def is_ipython_kernel(argv: list[str]) -> bool:
    """Whether a kernel command starts ipykernel (``python -m ipykernel_launcher ...`` or ``-m ipykernel``)."""
    for index, part in enumerate(argv):
        if part == "-m" and index + 1 < len(argv) and argv[index + 1] in ("ipykernel_launcher", "ipykernel"):
            return True
        if PurePath(part).stem == "ipykernel_launcher":
            return True
    return False


def with_nbcoord(argv: list[str]) -> list[str]:
    """``argv`` with the option that loads nbcoord, when it starts an IPython kernel and has not got it yet."""
    if not is_ipython_kernel(argv) or EXTENSION_ARGUMENT in argv:
        return argv
    return [*argv, EXTENSION_ARGUMENT]


class NBCoordKernelManager(ServerKernelManager):
    """jupyter_server's kernel manager, whose IPython kernels load nbcoord at start."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        """The kernel's command, with nbcoord's option for IPython kernels."""
        command: list[str] = super().format_kernel_cmd(extra_arguments)
        return with_nbcoord(command)


def use_in(kernel_manager: Any) -> bool:
    """Make ``kernel_manager`` (the server's mapping kernel manager) start kernels with NBCoordKernelManager.

    Returns False, with a warning, when the server already uses a kernel manager class of its own.
    """
    current = str(getattr(kernel_manager, "kernel_manager_class", ""))
    if current == CLASS_NAME:
        return True
    if current != DEFAULT_CLASS:
        log.warning(
            "nbcoord: NBCoordServer.load_in_kernels is set, but the server's kernel manager class is %s; nbcoord "
            "leaves it alone. Make that class derive from %s, or load nbcoord through IPython's configuration.",
            current,
            CLASS_NAME,
        )
        return False
    # The mapping kernel manager rebuilds its factory when this trait changes (jupyter_client observes it).
    kernel_manager.kernel_manager_class = CLASS_NAME
    return True
