"""What the panel's action commands do, on the panel's action thread (never a kernel channel thread, never main).

- **Stop all** (``stop`` with ``scope="all"`` and ``interrupt``): the one stop of everything cells started, then,
  if the cell that was running at the click still runs, an Interrupt of it, through the same path as the
  kernel's Interrupt: SIGINT delivered to the main thread. Python's C-level handler trips the SIGINT handler
  (the running Python code gets ``KeyboardInterrupt``), makes a blocking call in the main thread return
  (``time.sleep``, a lock's wait) and writes the signal wakeup fd, which TensorFlow's integration watches to
  cancel a run blocked in C++ (the session stays usable). ``_thread.interrupt_main()`` does the first and the
  last, but not the second: a cell in ``time.sleep(30)`` would sleep on. It is the fallback where
  ``signal.pthread_kill`` is missing.
- **Stop background work** (``stop`` without ``interrupt``) and the per-cell, per-thread and zombie stops: the
  one stop only; the running cell goes on.
- **Restart** a TensorFlow session's runners: :func:`nbcoord.restart_runners`.
- **Reclaim memory**: the extension's ``reclaim(outputs=False)`` where it has one, on the main thread (the
  controller runs it there: at once, or when the kernel's event loop is next free).
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
from typing import Any

log = logging.getLogger("nbcoord")


def interrupt_main() -> str | None:
    """Interrupt the main thread as the kernel's Interrupt does; None once sent, else why it was not.

    Only while Python handles SIGINT: between cells ipykernel ignores it (``SIG_IGN``), and a process whose
    handler is the default one would be killed by a real signal.
    """
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        return "SIGINT is not handled by Python here, so the cell cannot be interrupted"
    main = threading.main_thread()
    ident = main.ident
    if ident is None or not main.is_alive():
        return "the main thread is gone"
    try:
        signal.pthread_kill(ident, signal.SIGINT)
    except (AttributeError, OSError, ValueError):
        log.debug("nbcoord: pthread_kill failed; interrupting with _thread.interrupt_main", exc_info=True)
        _thread.interrupt_main()
    return None


def restart_session(session: str) -> dict[str, Any]:
    """Restart a TensorFlow session's queue runners through the public API; returns its report."""
    import nbcoord

    return nbcoord.restart_runners(session)


def reclaim(extension: Any) -> dict[str, Any]:
    """The extension's reclaim of memory (outputs left alone), where it has one; raises ``RuntimeError`` else."""
    method = getattr(extension, "reclaim", None)
    if not callable(method):
        raise RuntimeError("this version of nbcoord cannot reclaim memory")
    report = method(outputs=False)
    return dict(report) if isinstance(report, dict) else {"text": str(report)}
