"""The loaded extension: builds the :class:`~nbcoord.core.host.Host`, installs the parts on it, and removes them.

``load_ipython_extension`` creates one :class:`Extension` and calls :meth:`Extension.install`;
``unload_ipython_extension`` calls :meth:`Extension.uninstall`, which removes exactly what install added. This is
the one module (besides the package's public API) that imports the parts; each part receives the Host and, where
it needs them, the resource probe or a callable, never this object.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nbcoord.core import checks, fallbacks, fork, log
from nbcoord.core.cells import CellEvents
from nbcoord.core.config import NBCoord
from nbcoord.core.host import Host
from nbcoord.core.internals import running_cell
from nbcoord.core.snapshot import Snapshot
from nbcoord.core.stop import ScopeKind, StopReport, ThreadStopped
from nbcoord.core.threads import INTERNAL_PREFIX, ThreadHooks
from nbcoord.kernel import cellmark, control, output
from nbcoord.kernel.exit import ShutdownStop
from nbcoord.kernel.shutdown import ShutdownHooks
from nbcoord.ledger.ledger import watch as watch_ledger
from nbcoord.resources import memory
from nbcoord.resources.probes import ResourceProbe
from nbcoord.resources.sampling import ResourceWatch
from nbcoord.tensorflow.watch import current as current_tensorflow
from nbcoord.tensorflow.watch import watch as watch_tensorflow

if TYPE_CHECKING:
    from nbcoord.resources.reclaim import ReclaimReport

logger = logging.getLogger("nbcoord")


class Extension:
    """One loaded nbcoord: the Host, its parts, and the order they are installed and removed in."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.host = Host(shell, NBCoord(parent=shell))
        self.probe = ResourceProbe()
        self.hooks = ThreadHooks(
            self.host.registry,
            ignore_exception=lambda exc: isinstance(exc, ThreadStopped),
            started=self.host.monitor.wake,
        )
        self.resources = ResourceWatch(self.host, self.probe)
        self.output: output.OutputRouter | None = None
        self.memory: memory.MemoryLedger | None = None
        self.cells = CellEvents(self.host, lambda: self.output is not None and self.output.routing)
        # The shutdown pauses the monitor (nothing samples what its stop changes); the monitor still reads the
        # SIGTERM pipe then.
        self.exit = ShutdownStop(self.host, lambda: self.host.monitor.pause(timeout=0.2))
        self.shutdown = ShutdownHooks(
            self.exit.stop,
            wait_limit=lambda: self.host.config.shutdown_budget + 0.5,
            at_exit=self.exit.leave_unstoppable,
            watch_fd=self.host.monitor.add_reader,
        )
        self.host.shutdown_ran = lambda: self.shutdown.ran
        self.installed = False

    # ------------------------------------------------------------------------------------ load / unload
    def install(self) -> None:
        """Install every part; if one step fails, undo the others and re-raise (a half-loaded extension could not
        be unloaded)."""
        try:
            self._install()
        except BaseException:
            self.uninstall()
            raise

    def _install(self) -> None:
        host, undo = self.host, self.host.add_undo
        fork.claim()
        undo(fork.on_fork_child(self._forget_in_child))
        undo(log.install_handler())
        host.registry.adopt_existing(internal=lambda t: t.name.startswith(INTERNAL_PREFIX))
        loading_cell = running_cell(self.shell)
        if loading_cell is not None:
            # Loaded by %load_ext in a cell: what the rest of that cell starts is that cell's, like any other.
            host.registry.cell_started(*loading_cell)
        self.hooks.install()
        undo(self.hooks.uninstall)
        undo(self.cells.install())
        undo(cellmark.install(host))
        undo(host.stopper.add_stopper("user", host.run_user_stoppers))
        undo(self.resources.install())
        # After the thread hooks (the output route chains threading.excepthook above theirs) and after the
        # resources task (the ledger reads the sample that task takes on the same monitor tick).
        self.memory = memory.install(host, self.probe)
        undo(self.memory.uninstall)
        self.output = output.install(host)
        undo(self.output.uninstall)
        host.monitor.start()
        undo(host.monitor.stop)
        self.shutdown.install(self.shell)
        undo(self.shutdown.uninstall)
        undo(watch_tensorflow(host))
        undo(watch_ledger(host, self.probe))
        # Last: the Jupyter server's requests are answered only once everything else is in place (and unload
        # removes this first).
        undo(control.install(host))
        self.installed = True

    def _forget_in_child(self) -> None:
        """In a forked child (see :mod:`nbcoord.core.fork`): every hook passes through, no route stops anything."""
        self.installed = False
        self.hooks.forget_in_child()
        self.shutdown.forget_in_child()
        self.host.monitor.forget_in_child()

    def uninstall(self) -> None:
        """Undo everything, newest first; one failing step does not keep the others from running."""
        self.installed = False
        steps = self.host.undo
        while steps:
            step = steps.pop()
            try:
                step()
            except Exception:
                logger.warning("nbcoord: an unload step failed", exc_info=True)

    # ------------------------------------------------------------------- the public API's entry points
    def degraded(self) -> dict[str, str]:
        """What works differently here, and how: internals found missing, routes that could not be installed."""
        return {
            **fallbacks.degraded(),
            **self.host.degraded_routes,
        }

    @property
    def config(self) -> NBCoord:
        """The settings (``%nbcoord config``, ``c.NBCoord``)."""
        return self.host.config

    def fresh_resources(self) -> None:
        """Make the next snapshot read the resources afresh (not the probe's rate-limited last read)."""
        self.probe.invalidate()

    def snapshot(self, *, stacks: bool = False, waits: bool = False) -> Snapshot:
        """One snapshot of the kernel; ``waits``: with what each blocked thread waits on."""
        return self.host.snapshot(stacks=stacks, waits=waits)

    def stop(
        self,
        kind: ScopeKind = "all",
        *,
        grace: float | None = None,
        force: bool = False,
        cell: int | None = None,
        tid: str | None = None,
    ) -> StopReport:
        """The one stop (see :meth:`nbcoord.core.host.Host.stop`)."""
        return self.host.stop(kind, grace=grace, force=force, cell=cell, tid=tid)

    def reclaim(self, *, outputs: bool = False) -> ReclaimReport:
        """Give back what the kernel keeps by accident (see :mod:`nbcoord.resources.reclaim`; imported on first
        use, not at load)."""
        from nbcoord.resources.reclaim import reclaim

        return reclaim(self.host, self.probe, outputs=outputs)

    def native_stacks(self) -> Any:
        """This kernel's threads with native frames, read by a child process (see
        :mod:`nbcoord.resources.own_stacks`; imported on first use)."""
        import os

        from nbcoord.resources.own_stacks import read_own_native

        return read_own_native(os.getpid(), cell_of=self.host.cell_of_file)

    def restart_runners(self, session: Any, *, grace: float | None = None) -> dict[str, Any]:
        """Restart a TensorFlow session's queue runners (see :func:`nbcoord.restart_runners`)."""
        grace = checks.optional_seconds("grace", grace)
        integration = current_tensorflow()
        if integration is None or not integration.active:
            raise RuntimeError("TensorFlow is not imported: there is no session to restart.")
        report: dict[str, Any] = dict(integration.restart_runners(session, grace=grace))
        self.host.snapshots.last_restart = report
        return report

    def panel_controller(self) -> Any:
        """The panel's controller (one per kernel), created on first use."""
        from nbcoord.ui.actions import PanelActions
        from nbcoord.ui.panel import controller_for

        actions = PanelActions(
            history=self.probe.history,
            reclaim=lambda: self.reclaim(outputs=False),
            restart=self.restart_runners,
        )
        return controller_for(self.host, actions)

    def panel(self) -> Any:
        """The live panel (one per kernel; displaying it again shows another view of the same widget)."""
        return self.panel_controller().widget
