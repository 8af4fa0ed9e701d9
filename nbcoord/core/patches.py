"""Class-attribute patches that remember what they replaced and put it back exactly.

TensorFlow exports the same classes under several namespaces (``tf.compat.v1.Session`` is
``tensorflow.python.client.session.Session``), so a patch on the class attribute is seen by every name; a module
function would have to be patched in every namespace that bound it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("nbcoord")


@dataclass
class _Applied:
    cls: type
    name: str
    original: Any
    replacement: Any
    #: The original came from a base class: restoring deletes the attribute from ``cls`` again.
    inherited: bool = False


class ClassPatches:
    """A set of class-attribute patches, undone together, newest first."""

    def __init__(self) -> None:
        self._applied: list[_Applied] = []

    def patch(
        self, cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]], *, inherited: bool = False
    ) -> None:
        """Replace ``cls.name`` by ``make(original)``. ``cls`` itself must define it, unless ``inherited``: then the
        attribute a base class defines (TensorFlow's ``Graph.get_operations`` is its C++ base's) is wrapped on
        ``cls``, and restoring removes it from ``cls`` again."""
        from_base = inherited and name not in cls.__dict__
        original = getattr(cls, name) if from_base else cls.__dict__[name]
        replacement = make(original)
        try:
            replacement = functools.wraps(original)(replacement)
        except (AttributeError, TypeError):  # a C method without every attribute wraps copies
            replacement.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, name, replacement)
        self._applied.append(_Applied(cls, name, original, replacement, from_base))

    def restore(self) -> list[str]:
        """Put every original back; returns the attributes that someone else had replaced meanwhile."""
        foreign: list[str] = []
        while self._applied:
            applied = self._applied.pop()
            label = f"{applied.cls.__qualname__}.{applied.name}"
            if applied.cls.__dict__.get(applied.name) is applied.replacement:
                if applied.inherited:
                    delattr(applied.cls, applied.name)
                else:
                    setattr(applied.cls, applied.name, applied.original)
            else:
                # Someone patched on top of us: restoring would drop their patch. Theirs stays; ours is off
                # because every patched function checks that the integration is still active.
                log.warning("nbcoord: %s was patched again after nbcoord; leaving it", label)
                foreign.append(label)
        return foreign
