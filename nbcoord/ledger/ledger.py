"""The ledger: what cells leave running besides threads, one kind per module, behind one source and one stopper.

Kinds (S11, S12):

- :mod:`.tasks`: asyncio tasks, on the kernel's event loop and on loops that cells' threads run (installed at
  load: the kernel has imported asyncio already);
- :mod:`.pools`: ``multiprocessing`` pools, ``concurrent.futures.ProcessPoolExecutor`` and joblib's (loky's)
  executors, each installed when the user imports that library;
- :mod:`.dataloader`: PyTorch ``DataLoader`` iterators with worker processes, installed when the user imports
  ``torch``;
- :mod:`.processes`: every child process, the whole tree, with the role a pool or loader gives it.

:func:`watch` makes one :class:`~nbcoord.ledger.base.Ledger` for the extension and installs the kinds on it. The
ledger registers one snapshot source (the ``ledger`` section), one stopper, one monitor task, one cell listener and
one fork-child action, and asks each kind for its rows and its stops: a kind plugs into the ledger, the ledger into
the Host's extension points, and the stop and the snapshot never import a library. Nothing of a library is
imported here: each kind installs from the post-import hook (:func:`nbcoord.core.imports.when_imported`).

The modules import one way: this one imports the kinds; each kind imports :mod:`.base` (the ledger's common
ground), :mod:`.stopping` (waiting for what a stop started) and :mod:`.internals` (every private name of the
libraries, with its fallback), never this module nor another kind. A new kind is a new module and one entry in
:data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable

from nbcoord.core.host import Host
from nbcoord.ledger import dataloader, pools, processes, tasks
from nbcoord.ledger.base import KindInstaller, Ledger
from nbcoord.resources.probes import ResourceProbe

#: Every kind, in the order they are installed. Order matters for rows only: processes last, so that the roles
#: pools and loaders give are known.
KINDS: tuple[KindInstaller, ...] = (tasks.watch, pools.watch, dataloader.watch, processes.watch)

#: The ledger of the loaded extension (one per process), for tests, the bench and debugging.
_current: Ledger | None = None


def current() -> Ledger | None:
    """The ledger of the loaded extension, if any."""
    return _current


def watch(host: Host, probe: ResourceProbe) -> Callable[[], None]:
    """Install the ledger and its kinds for ``host``; returns the undo."""
    global _current
    ledger = Ledger(host, probe)
    try:
        ledger.install(KINDS)
    except BaseException:
        ledger.uninstall()
        raise
    _current = ledger

    def undo() -> None:
        global _current
        ledger.uninstall()
        if _current is ledger:
            _current = None

    return undo
