"""The TensorFlow integration's entry point for the wiring: nothing of it is imported before TensorFlow is.

The integration is some forty modules (a third of loading nbcoord); a kernel that never imports TensorFlow, most
of a JupyterHub's, never pays for them. :func:`watch` registers one post-import hook
(:func:`nbcoord.core.imports.when_imported`, at once if TensorFlow is already imported) that imports the
integration (:mod:`.integration`) and TensorFlow's memory hooks (:mod:`.memory`) and installs both.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from nbcoord.core.host import Host
from nbcoord.core.imports import when_imported

if TYPE_CHECKING:
    from nbcoord.tensorflow.integration import TensorFlowIntegration

_INTEGRATION = "nbcoord.tensorflow.integration"


def watch(host: Host) -> Callable[[], None]:
    """Install the integration and the memory hooks once TensorFlow is imported (now, if it is); returns the undo."""
    # Objects can only predate the integration when TensorFlow was imported before nbcoord was loaded.
    scan = "tensorflow" in sys.modules
    undo_steps: list[Callable[[], None]] = []

    def on_import(_module: ModuleType) -> None:
        from nbcoord.tensorflow import integration, memory

        undo_steps.append(integration.start(host, scan=scan))
        undo_steps.append(memory.register())

    remove_hook = when_imported("tensorflow", on_import)

    def undo() -> None:
        remove_hook()
        while undo_steps:
            undo_steps.pop()()

    return undo


def current() -> TensorFlowIntegration | None:
    """The loaded extension's TensorFlow integration, if TensorFlow is imported (None: it is not, or nbcoord is not
    loaded)."""
    integration = sys.modules.get(_INTEGRATION)
    return None if integration is None else integration.current()
