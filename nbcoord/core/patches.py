"""Class-attribute patches that remember what they replaced and put it back exactly.

TensorFlow exports the same classes under several namespaces (``tf.compat.v1.Session`` is
``tensorflow.python.client.session.Session``), so a patch on the class attribute is seen by every name; a module
function would have to be patched in every namespace that bound it.

The ledger's kinds patch the same way (a pool class's ``__init__``, ``DataLoader.__iter__``), and, where the class
must stay as it is, one object's attribute (:meth:`ClassPatches.patch_instance`: the event loop policy's
``new_event_loop``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("nbcoord")

#: Makes the replacement from the original.
Maker = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass
class _Applied:
    #: The class patched (or, for :meth:`ClassPatches.patch_instance`, the object).
    target: Any
    name: str
    original: Any
    replacement: Any
    #: The original came from a base class (or the object's class): restoring deletes the attribute again.
    inherited: bool = False

    @property
    def label(self) -> str:
        owner = self.target if isinstance(self.target, type) else type(self.target)
        return f"{owner.__qualname__}.{self.name}"


class ClassPatches:
    """A set of class-attribute patches, undone together, newest first."""

    def __init__(self) -> None:
        self._applied: list[_Applied] = []

    def patch(self, cls: type, name: str, make: Maker, *, inherited: bool = False) -> None:
        """Replace ``cls.name`` by ``make(original)``. ``cls`` itself must define it, unless ``inherited``: then the
        attribute a base class defines (TensorFlow's ``Graph.get_operations`` is its C++ base's) is wrapped on
        ``cls``, and restoring removes it from ``cls`` again."""
        from_base = inherited and name not in cls.__dict__
        original = getattr(cls, name) if from_base else cls.__dict__[name]
        self._apply(cls, name, original, make, from_base)

    def patch_instance(self, obj: object, name: str, make: Maker) -> None:
        """Replace ``obj.name`` by ``make(original)`` on ``obj`` alone, as an instance attribute: its class, and so
        every ``isinstance`` check and every other instance, stay as they were; restoring removes the instance
        attribute again. ``original`` is what ``obj.name`` was (a bound method).

        Raises
        ------
        AttributeError, TypeError
            ``obj`` has no such attribute, or takes no instance attributes (``__slots__``): nothing was patched.
        """
        self._apply(obj, name, getattr(obj, name), make, name not in getattr(obj, "__dict__", {}))

    def _apply(self, target: Any, name: str, original: Any, make: Maker, inherited: bool) -> None:
        replacement = make(original)
        try:
            replacement = functools.wraps(original)(replacement)
        except (AttributeError, TypeError):  # a C method without every attribute wraps copies
            replacement.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(target, name, replacement)
        self._applied.append(_Applied(target, name, original, replacement, inherited))

    def restore(self) -> list[str]:
        """Put every original back; returns the attributes that someone else had replaced meanwhile."""
        foreign: list[str] = []
        while self._applied:
            applied = self._applied.pop()
            label = applied.label
            if getattr(applied.target, "__dict__", {}).get(applied.name) is applied.replacement:
                if applied.inherited:
                    delattr(applied.target, applied.name)
                else:
                    setattr(applied.target, applied.name, applied.original)
            else:
                # Someone patched on top of us: restoring would drop their patch. Theirs stays; ours is off
                # because every patched function checks that the integration is still active.
                log.warning("nbcoord: %s was patched again after nbcoord; leaving it", label)
                foreign.append(label)
        return foreign
