"""Each test of another project's suite as one notebook cell, inside an IPython shell, with or without nbcoord.

nbcoord attributes threads, tasks and pools to the cell that runs when they start, and it learns which cell runs
from the shell's ``pre_run_cell`` / ``post_run_cell`` events (nbcoord/_wiring.py). Only what a cell started is
the user's and gets nbcoord's patched behaviour, so a suite that merely imported nbcoord would exercise none of it:
here every test is framed by those two events, with IPython's own ExecutionInfo/ExecutionResult, exactly as
``run_cell`` frames a cell (count taken, then bumped, before ``pre_run_cell``; the exception in ``error_in_exec``).

The run without nbcoord goes through the same shell and the same events, only without ``%load_ext nbcoord``
(``NBCOORD_SUITE_WITH`` unset), so that the comparison isolates nbcoord.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

#: Set by suites/run.py for the run with nbcoord loaded.
WITH_NBCOORD = os.environ.get("NBCOORD_SUITE_WITH") == "1"


class Cells:
    """One InteractiveShell for the whole suite; ``begin``/``end`` frame one test as a cell."""

    def __init__(self) -> None:
        # A profile of its own, so that no user's or developer's startup files or extensions take part.
        os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="nbcoord-suite-ipython-"))
        from IPython.core import interactiveshell
        from traitlets.config import Config

        ipython: Any = interactiveshell  # IPython is only partly typed
        config = Config()
        config.HistoryManager.hist_file = ":memory:"  # no sqlite file, no history thread
        self._info = ipython.ExecutionInfo
        self._result = ipython.ExecutionResult
        self.shell: Any = ipython.InteractiveShell.instance(config=config)
        # As a user would: a cell of its own. The run without nbcoord runs a cell too, so both start at count 2.
        first = self.shell.run_cell("%load_ext nbcoord" if WITH_NBCOORD else "pass", store_history=True)
        if not first.success:
            first.raise_error()
        loaded = "nbcoord" in self.shell.extension_manager.loaded
        if loaded != WITH_NBCOORD:
            raise RuntimeError(f"nbcoord loaded: {loaded}, wanted {WITH_NBCOORD}")

    def begin(self, name: str) -> Any:
        """``pre_run_cell`` for the test ``name``; returns the ExecutionResult that ``end`` completes."""
        info = self._info(f"# {name}", True, False, True, None)
        result = self._result(info)
        result.execution_count = self.shell.execution_count
        self.shell.execution_count += 1  # as run_cell does for a stored cell, before the event
        self.shell.events.trigger("pre_execute")
        self.shell.events.trigger("pre_run_cell", info)
        return result

    def end(self, result: Any, error: BaseException | None) -> None:
        """``post_run_cell``: outcome ok, or error (interrupted for KeyboardInterrupt) when the test raised."""
        result.error_in_exec = error
        self.shell.events.trigger("post_execute")
        self.shell.events.trigger("post_run_cell", result)
