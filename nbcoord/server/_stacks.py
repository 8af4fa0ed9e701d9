"""``GET /nbcoord/api/kernels/<id>/stacks``: one kernel's threads, read from outside (:mod:`nbcoord.resources.stacks`).

The Python frames are read in the server's process (the kernel's parent, which Yama's ptrace_scope 1 allows), on a
worker thread of its own, never on the server's event loop, one read per kernel at a time (a request that comes
while one runs shares it); such a read does not stop the kernel. Native frames (``?native=1``) stop the kernel, which
the kernel's parent must never do (its own wait for the kernel would take the stop for the kernel's death: see
:mod:`nbcoord.resources.stacks`), so they are read by a child process, killed if it takes over
:data:`READ_TIMEOUT_S`; where that child may not read the kernel (ptrace_scope 1), the answer is the Python frames,
with ``native_reason`` saying why. Native reads are made at most once per :data:`NATIVE_INTERVAL_S` per kernel; a
request within that interval gets the last native read again, with its ``read_at``.

When the kernel can answer (a deadlock leaves its control thread free), what it says of its threads' waits
(:mod:`nbcoord.core.waits`: which lock, who holds it, deadlocks) is added through ``ask_waits``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nbcoord.resources.stack_model import StacksRead
from nbcoord.resources.stacks import read_stacks, unavailable
from nbcoord.server._outside import kernel_pid

log = logging.getLogger("nbcoord.server")

#: A native read stops the kernel; it is made at most this often per kernel.
NATIVE_INTERVAL_S = 10.0
#: How long a request waits for a read (a read of 100 threads takes 0.2-0.4 s here).
READ_TIMEOUT_S = 10.0

AskWaits = Callable[[str, float], Awaitable["dict[str, Any] | None"]]
#: How long a read waits for the kernel's own account of its waits: a kernel whose main thread holds the GIL answers
#: in about 40 ms if it loops in Python and never if it is in a C call (and the read should not wait for that).
WAITS_TIMEOUT_S = 0.5
WAITS_TIMEOUT_GIL_S = 0.15


@dataclass
class _Reads:
    running: dict[bool, asyncio.Future[StacksRead]] = field(default_factory=dict)
    last_native: StacksRead | None = None
    last_native_at: float = 0.0


class StacksReader:
    """Reads kernels' stacks for the handler (see the module docstring)."""

    def __init__(self, kernel_manager: Any, *, module: str = "pystack", ask_waits: AskWaits | None = None) -> None:
        self._kernels = kernel_manager
        self._module = module
        self._ask_waits = ask_waits
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nbcoord-stacks")
        self._reads: dict[str, _Reads] = {}

    async def read(self, kernel_id: str, *, native: bool) -> dict[str, Any]:
        """The kernel's stacks as JSON (``available`` false, with one sentence, where they cannot be read)."""
        manager = self._kernels.get_kernel(kernel_id)
        pid = kernel_pid(manager)
        if pid is None:
            found = unavailable(None, "This kernel's process is not on the server's machine (a remote kernel): its "
                                      "stacks cannot be read from here.", native=native)  # fmt: skip
            return {"kernel_id": kernel_id, **found}
        for gone in [kid for kid in self._reads if kid != kernel_id and kid not in self._kernels]:
            del self._reads[gone]  # kept only for the server's kernels: nothing grows with the kernels that ended
        reads = self._reads.setdefault(kernel_id, _Reads())
        if native and reads.last_native is not None and time.monotonic() - reads.last_native_at < NATIVE_INTERVAL_S:
            return {"kernel_id": kernel_id, **reads.last_native, "repeated": True}
        native_reason = None
        if native:
            found = await self._shared(reads, True, lambda: asyncio.ensure_future(self._native(pid)))
            if not found["available"]:
                native_reason = found["reason"]
        if not native or native_reason is not None:
            loop = asyncio.get_running_loop()
            found = await self._shared(reads, False, lambda: loop.run_in_executor(self._executor, self._read, pid))
        if not found["available"]:
            log.info("nbcoord: the stacks of kernel %s could not be read: %s", kernel_id, found["reason"])
        if native and found["available"]:
            reads.last_native, reads.last_native_at = found, time.monotonic()
        answer: dict[str, Any] = {"kernel_id": kernel_id, **found}
        if native_reason is not None:
            answer["native_reason"] = native_reason
        if self._ask_waits is not None:
            # After the read, not beside it: the kernel's threads answering it would move under a read that does
            # not stop them.
            main = found["main"]
            holding = main is not None and main["holds_gil"]
            merge_waits(answer, await self._ask_waits(kernel_id, WAITS_TIMEOUT_GIL_S if holding else WAITS_TIMEOUT_S))
        return answer

    async def _shared(
        self, reads: _Reads, native: bool, start: Callable[[], asyncio.Future[StacksRead]]
    ) -> StacksRead:
        """The read of this kind running for the kernel, or a new one; a read that takes too long is given up."""
        running = reads.running.get(native)
        if running is None or running.done():
            running = start()
            reads.running[native] = running
        try:
            return await asyncio.wait_for(asyncio.shield(running), READ_TIMEOUT_S + 1)
        except asyncio.TimeoutError:
            return unavailable(None, f"Reading the stacks took over {READ_TIMEOUT_S:.0f} s.", native=native)

    def _read(self, pid: int) -> StacksRead:
        """The Python frames, in this process (no ptrace stop: see the module docstring)."""
        try:
            return read_stacks(pid, native=False, module=self._module)
        except Exception as error:  # read_stacks does not raise; this is the last guard of the server
            log.warning("nbcoord: reading the stacks of pid %s failed", pid, exc_info=True)
            return unavailable(pid, f"The stacks could not be read: {type(error).__name__}.")

    async def _native(self, pid: int) -> StacksRead:
        """Python and native frames, read by a child process (never by the kernel's parent)."""
        command = [sys.executable, "-m", "nbcoord.resources.stacks", str(pid), "--native", "--module", self._module]
        child = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(child.communicate(), READ_TIMEOUT_S)
        except asyncio.TimeoutError:
            child.kill()  # a tracer that ends lets its tracee go on
            await child.wait()
            return unavailable(pid, f"Reading native frames took over {READ_TIMEOUT_S:.0f} s.", native=True)
        try:
            found: StacksRead = json.loads(out)
        except ValueError:
            log.warning("nbcoord: the native stack reader failed: %s", err.decode("utf-8", "replace")[-500:])
            return unavailable(pid, "The native stack reader failed (the server's log says why).", native=True)
        return found

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def merge_waits(answer: dict[str, Any], waits: dict[str, Any] | None) -> None:
    """Add what the kernel said of its threads' waits (by native thread id) to a read from outside."""
    if not waits:
        return
    by_tid = {row.get("tid"): row for row in waits.get("threads", []) if isinstance(row, dict)}
    for thread in answer.get("threads", []):
        inside = by_tid.get(thread["tid"])
        if inside is None:
            continue
        if isinstance(inside.get("waits"), str):
            thread["waits"] = inside["waits"]
        if inside.get("stack"):
            # The kernel's own account names every cell's frames ("cell [2], line 7 in one"), not only the
            # running cell's.
            thread["stack_inside"] = inside["stack"]
    deadlocks = waits.get("deadlocks")
    if isinstance(deadlocks, list) and deadlocks:
        answer["deadlocks"] = deadlocks
    answer["waits_from_kernel"] = True
