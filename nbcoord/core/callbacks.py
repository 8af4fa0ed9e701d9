"""A small thread-safe table of named callbacks, for the places where parts plug into each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class Callbacks(Generic[F]):
    """Named callbacks; adding returns the function that removes exactly that one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _items
        self._items: dict[str, F] = {}

    def add(self, name: str, callback: F) -> Callable[[], None]:
        """Register ``callback`` under ``name`` (replacing an older one); returns its remover."""
        with self._lock:
            self._items[name] = callback

        def remove() -> None:
            with self._lock:
                if self._items.get(name) is callback:
                    del self._items[name]

        return remove

    def items(self) -> list[tuple[str, F]]:
        """A copy of the table, safe to iterate while others add or remove."""
        with self._lock:
            return list(self._items.items())
