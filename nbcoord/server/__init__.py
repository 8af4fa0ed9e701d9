"""nbcoord's Jupyter Server extension: every kernel of the server in one view, Prometheus metrics, stop from outside.

Enabled on install (the wheel puts ``etc/jupyter/jupyter_server_config.d/nbcoord.json`` in place, as
jupyter-resource-usage does); nothing to run. It serves, under the server's base URL:

``/nbcoord/``
    a page listing the kernels, what needs attention first (zombies, GPU memory held, stuck), with stop buttons;
``/nbcoord/api/kernels``
    the same as JSON (schema: :mod:`nbcoord.server._model`);
``/nbcoord/api/kernels/<id>/stop``
    POST ``{"scope": "zombies" | "all" | "cell", "cell": N, "grace": S, "force": bool}``: that kernel's one
    bounded stop, through its control channel (served while the kernel's main thread is busy); answers the report;
``/nbcoord/api/kernels/<id>/stacks``
    GET (``?native=1`` for native frames too): that kernel's threads read from outside, without its help, while a C
    call holds its GIL or its threads deadlock (:mod:`nbcoord.server._stacks`; needs the ``native`` extra);
``/nbcoord/metrics``
    Prometheus metrics per kernel (:mod:`nbcoord.server._metrics`).

It asks each kernel over the kernel's control channel (:mod:`nbcoord.core.schema`); kernels without nbcoord are shown
with what the server sees from outside (pid, memory, GPU memory by pid). It never imports the in-kernel parts of
nbcoord. Settings (``c.NBCoordServer.<name>`` in a ``jupyter_server_config.py``, or ``--NBCoordServer.<name>=``):

``reply_timeout`` (0.15)
    seconds each kernel has to answer; one that does not is shown as not answering;
``load_in_kernels`` (False)
    make every IPython kernel the server starts load nbcoord (:mod:`nbcoord.server._kernels`);
``page_interval`` (5.0)
    seconds between the page's refreshes;
``absent_recheck`` (30.0)
    seconds before a kernel found without nbcoord, and used since, is asked again;
``nvml_module`` ("pynvml")
    the NVML binding for GPU memory by pid (``nvidia-ml-py``, the ``gpu`` extra);
``stacks_module`` ("pystack")
    the library that reads kernels' stacks from outside (the ``native`` extra);
``unauthenticated_kernel_labels`` (False)
    with ``ServerApp.authenticate_prometheus = False``, label the metrics of a scrape without credentials by kernel
    id and notebook path too (by default such a scrape gets totals only, as the server's own ``/metrics``).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Unicode

from nbcoord.core.schema import REPLY, REQUEST
from nbcoord.server._fleet import Fleet
from nbcoord.server._gpu import Nvml
from nbcoord.server._handlers import SETTINGS_KEY, handlers
from nbcoord.server._kernels import NBCoordKernelManager, use_in
from nbcoord.server._stacks import StacksReader
from nbcoord.server._text import install_log_filter

__all__ = ["NBCoordKernelManager", "NBCoordServer"]


class NBCoordServer(ExtensionApp):
    """The extension app: its settings are ``c.NBCoordServer.*``."""

    name = "nbcoord"
    load_other_extensions = True

    reply_timeout = Float(
        0.15, help="Seconds each kernel has to answer the server; one that does not is shown as not answering."
    ).tag(config=True)
    absent_recheck = Float(
        30.0, help="Seconds before a kernel found without nbcoord, and used since, is asked again."
    ).tag(config=True)
    page_interval = Float(5.0, help="Seconds between the page's refreshes.").tag(config=True)
    load_in_kernels = Bool(
        False, help="Make every IPython kernel this server starts load nbcoord (IPython's extra_extensions)."
    ).tag(config=True)
    nvml_module = Unicode("pynvml", help="The NVML binding for GPU memory by process (nvidia-ml-py).").tag(
        config=True
    )
    stacks_module = Unicode(
        "pystack", help="The library that reads a kernel's stacks from outside (pystack, the native extra)."
    ).tag(config=True)
    unauthenticated_kernel_labels = Bool(
        False,
        help="With ServerApp.authenticate_prometheus=False, also give a scrape of /nbcoord/metrics that carries no "
        "credentials the per-kernel series, labelled with kernel ids and notebook paths: whoever can reach the URL "
        "sees them. By default such a scrape gets totals over the kernels only, as the server's own /metrics; an "
        "authenticated scrape always gets the per-kernel series.",
    ).tag(config=True)

    def initialize_settings(self) -> None:
        """Make the fleet, keep the server's activity tracking blind to our messages, and (if asked) load nbcoord
        in every kernel."""
        serverapp: Any = self.serverapp
        install_log_filter()
        fleet = Fleet(
            serverapp.kernel_manager,
            serverapp.session_manager,
            reply_timeout=self.reply_timeout,
            absent_recheck=self.absent_recheck,
            nvml=Nvml(self.nvml_module),
        )
        self.settings[SETTINGS_KEY] = {
            "fleet": fleet,
            "stacks": StacksReader(serverapp.kernel_manager, module=self.stacks_module, ask_waits=fleet.ask_waits),
            "page_interval": self.page_interval,
            "unauthenticated_kernel_labels": self.unauthenticated_kernel_labels,
        }
        untrack_messages(serverapp)
        if self.load_in_kernels and use_in(serverapp.kernel_manager):
            self.log.info("nbcoord: every IPython kernel this server starts loads nbcoord")

    def initialize_handlers(self) -> None:
        """The page, the API, the metrics."""
        self.handlers.extend(handlers())

    async def stop_extension(self) -> None:
        """Close the links to the kernels."""
        options = self.settings.get(SETTINGS_KEY)
        if options is not None:
            await options["fleet"].close()
            options["stacks"].close()


def untrack_messages(serverapp: Any) -> None:
    """Add nbcoord's control messages to the kernel manager's ``untracked_message_types``.

    The server counts every other message type as user activity (idle culling) and takes the busy/idle status that
    follows it as the kernel's execution state; JupyterLab and Notebook 7 read the same list from the page config
    to keep their kernel indicator still. A scrape must do neither.
    """
    kernel_manager = serverapp.kernel_manager
    current = list(getattr(kernel_manager, "untracked_message_types", None) or [])
    if not hasattr(kernel_manager, "untracked_message_types"):
        return
    kernel_manager.untracked_message_types = [*current, *(t for t in (REQUEST, REPLY) if t not in current)]
    page = serverapp.web_app.settings.get("page_config_data")
    if isinstance(page, dict) and isinstance(page.get("untracked_message_types"), list):
        # JupyterLab copied the list when it loaded (before nbcoord, in the server's alphabetical order).
        page["untracked_message_types"] = list(kernel_manager.untracked_message_types)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "nbcoord.server", "app": NBCoordServer}]
