"""Forked children: nbcoord belongs to the process that loaded it, and does nothing in a child.

A child made by fork (``multiprocessing``'s default start method on Linux before Python 3.14, PyTorch's
DataLoader workers, ``os.fork``) is a copy of the kernel, with nbcoord's patched ``Thread.start``, its
``threading`` exit hook, its SIGTERM handler and its registry in it. Left alone, a child running its exit hook
would stop "everything" as if it were the kernel: signal the kernel's other children and itself. So:

- one function is registered with ``os.register_at_fork`` (which cannot be undone; it is registered once per
  process and does nothing unless an extension is loaded) and, in the child, marks nbcoord as forked and runs the
  loaded extension's child actions: each part turns itself off there (hooks pass straight through, handlers
  behave as the ones they replaced);
- the paths that act on processes and threads (the stop, the shutdown routes, the probes) also compare the pid
  with the loading process's, for children made by a ``fork()`` that Python did not see (a C library's);
- the public API raises :class:`RuntimeError` in a child.

The child actions run in the child right after the fork, where a lock held by another thread of the parent at
that moment stays held for ever: they take no lock and do not block.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("nbcoord")

#: True in a forked child of the process that loaded nbcoord.
forked = False
#: The pid of the process that loaded nbcoord; 0 before the first load.
_owner_pid = 0
#: Run in a forked child; replaced as a whole (never mutated) so that the child reads it without a lock.
_child_actions: tuple[Callable[[], None], ...] = ()
_registered = False


def claim() -> None:
    """Make the calling process nbcoord's owner (at load), and see forks from now on."""
    global _owner_pid, _registered, forked
    _owner_pid = os.getpid()
    forked = False
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _registered = True


def owner_pid() -> int:
    """The pid of the process that loaded nbcoord."""
    return _owner_pid


def in_owner() -> bool:
    """Whether this is the process that loaded nbcoord (False in any child, however it was forked)."""
    return not forked and os.getpid() == _owner_pid


def ensure_owner() -> None:
    """Raise :class:`RuntimeError` in a forked child, where nbcoord does nothing."""
    if not in_owner():
        raise RuntimeError(
            f"nbcoord belongs to process {_owner_pid}, which loaded it; this is a forked child "
            f"(pid {os.getpid()}), where nbcoord does nothing."
        )


def on_fork_child(action: Callable[[], None]) -> Callable[[], None]:
    """Run ``action`` in every forked child from now on; returns the function that removes it."""
    global _child_actions
    _child_actions = (*_child_actions, action)

    def remove() -> None:
        global _child_actions
        _child_actions = tuple(a for a in _child_actions if a is not action)

    return remove


def _after_fork_in_child() -> None:
    global forked
    if _owner_pid == 0:
        return  # nbcoord was never loaded in this process
    forked = True
    for action in _child_actions:
        try:
            action()
        except Exception:  # the child goes on as if nbcoord were not there
            log.debug("nbcoord: a fork-child action failed", exc_info=True)
