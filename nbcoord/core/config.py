"""nbcoord's settings, as a traitlets ``Configurable`` so that an IPython profile can set them.

In ``ipython_config.py`` (or ``ipython_kernel_config.py``)::

    c.NBCoord.grace_period = 2.0
    c.NBCoord.stop_on_interrupt = True

At run time: ``%nbcoord config grace_period=2``.
"""

from __future__ import annotations

import math
from typing import Any

from traitlets import Bool, Float, Integer, TraitError, validate
from traitlets.config import Configurable

#: The largest value each number of seconds may take: beyond it a setting is a mistake (an infinite panel interval
#: would end the panel's thread, a NaN budget turn every shutdown into SIGTERM).
UPPER_BOUNDS: dict[str, float] = {
    "grace_period": 3600.0,
    "shutdown_budget": 60.0,
    "shutdown_force_after": 60.0,
    "monitor_interval": 3600.0,
    "panel_interval": 3600.0,
    "stuck_after": 86400.0,
}


class NBCoord(Configurable):
    """Settings of the nbcoord extension."""

    grace_period = Float(
        1.0,
        min=0.0,
        help="Seconds a stop waits for threads to finish before it reports them as still alive.",
    ).tag(config=True)
    shutdown_budget = Float(
        1.5,
        min=0.1,
        help=(
            "Seconds the pre-shutdown hook may spend stopping and joining threads. jupyter_client sends SIGTERM "
            "2.5 s after a shutdown request, so keep this well under that."
        ),
    ).tag(config=True)
    stop_on_interrupt = Bool(
        False,
        help="Stop the threads a cell started when that cell is interrupted (default: only report them).",
    ).tag(config=True)
    force_on_shutdown = Bool(
        True,
        help="At shutdown, raise an exception in threads that ignore the stop flag after shutdown_force_after.",
    ).tag(config=True)
    shutdown_force_after = Float(
        0.05,
        min=0.0,
        help=(
            "At shutdown, seconds to wait for threads to stop by themselves before raising ThreadStopped in them. "
            "The exception arrives between Python statements, so `with` blocks still close their files."
        ),
    ).tag(config=True)
    monitor_interval = Float(
        1.0,
        min=0.05,
        help=(
            "Seconds between activity samples of nbcoord's monitor thread (idle times, CPU per thread) while "
            "something is live (a thread a cell started, a running cell, a ledger item); with nothing live, the "
            "monitor samples once a minute, or at once when a thread starts or a cell runs."
        ),
    ).tag(config=True)
    panel_interval = Float(
        1.0,
        min=0.1,
        help="Seconds between panel refreshes; nothing is sent when nothing changed.",
    ).tag(config=True)
    stuck_after = Float(
        30.0,
        min=0.1,
        help=(
            "Seconds a TensorFlow QueueRunner thread may go without an enqueue, while its queue has room, before "
            "it is called stuck (in the report, the panel and the JSON)."
        ),
    ).tag(config=True)
    max_report_threads = Integer(
        200,
        min=1,
        max=1_000_000,
        help="Rows per section shown by the text report before it summarises the rest.",
    ).tag(config=True)
    route_output = Bool(
        True,
        help=(
            "Show what a background thread writes (print, warnings, its uncaught exception) under the cell that "
            "started it, in an output area nbcoord adds there once that cell has finished, instead of under "
            "whichever cell runs. False leaves thread output to the kernel."
        ),
    ).tag(config=True)
    output_lines = Integer(
        200,
        min=10,
        max=100_000,
        help=(
            "Lines of background output each cell's output area keeps and shows; older lines are counted, and the "
            "area says how many are not shown."
        ),
    ).tag(config=True)

    @validate(*UPPER_BOUNDS)
    def _finite_seconds(self, proposal: dict[str, Any]) -> float:
        """Every number of seconds is finite and below its bound (``min`` is checked by the trait itself)."""
        name, value = proposal["trait"].name, float(proposal["value"])
        if not math.isfinite(value) or value > UPPER_BOUNDS[name]:
            raise TraitError(f"{name} must be a finite number of seconds up to {UPPER_BOUNDS[name]:g}, not {value}")
        return value


#: Settings that ``%nbcoord config`` may change, with the type each is parsed as.
RUNTIME_SETTINGS: dict[str, type] = {
    "grace_period": float,
    "shutdown_budget": float,
    "stop_on_interrupt": bool,
    "force_on_shutdown": bool,
    "shutdown_force_after": float,
    "monitor_interval": float,
    "panel_interval": float,
    "stuck_after": float,
    "max_report_threads": int,
    "route_output": bool,
    "output_lines": int,
}
