"""Post-import hooks: run a callback once a module has finished importing, without ever importing it ourselves.

:func:`when_imported` calls back at once when the module is already in ``sys.modules``; otherwise it puts one
finder at the front of ``sys.meta_path``. That finder answers only for the watched names: it asks the finders
behind it for the real spec and wraps the spec's loader, so that the callback runs right after the module's own
code has run, in the importing thread, before the ``import`` statement returns. A cell that imports TensorFlow
and creates its first Session on the next line is therefore seen from that Session on.

Removing the last callback removes the finder from ``sys.meta_path``; a module imported through the hook gets
its own loader back as soon as its import has finished.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("nbcoord")

ImportCallback = Callable[[ModuleType], None]


class _HookLoader(importlib.abc.Loader):
    """Wraps a module's real loader; runs the post-import callbacks after the module executed."""

    def __init__(self, loader: Any, finder: _PostImportFinder, name: str) -> None:
        self._loader = loader
        self._finder = finder
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # The module is complete: give it its own loader back, then call back.
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._finder.fire(self._name, module)

    def __getattr__(self, name: str) -> Any:
        # is_package, get_data, get_resource_reader...: the real loader answers.
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta path finder that only wraps the loaders of watched modules."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _callbacks
        self._callbacks: dict[str, list[ImportCallback]] = {}
        self._resolving = threading.local()

    def add(self, name: str, callback: ImportCallback) -> None:
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)

    def remove(self, name: str, callback: ImportCallback) -> bool:
        """Forget one callback; True when no callback is left at all."""
        with self._lock:
            callbacks = self._callbacks.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._callbacks.pop(name, None)
            return not self._callbacks

    def watches(self, name: str) -> bool:
        with self._lock:
            return name in self._callbacks

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._callbacks or getattr(self._resolving, "name", None) == fullname:
            return None
        self._resolving.name = fullname  # the finders behind us may call find_spec again: answer None then
        try:
            spec = self._real_spec(fullname, path, target)
        finally:
            self._resolving.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookLoader(spec.loader, self, fullname)
        return spec

    def _real_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def fire(self, name: str, module: ModuleType) -> None:
        """Run (once) and forget the callbacks of ``name``; a failing callback is logged, never raised."""
        with self._lock:
            callbacks = self._callbacks.pop(name, [])
            idle = not self._callbacks
        if idle:
            _drop_finder(self)
        for callback in callbacks:
            try:
                callback(module)
            except Exception:
                log.warning("nbcoord: post-import hook for %r failed", name, exc_info=True)


_finder: _PostImportFinder | None = None
_finder_lock = threading.Lock()  # guards _finder and its presence in sys.meta_path


def _drop_finder(finder: _PostImportFinder) -> None:
    """Take ``finder`` out of ``sys.meta_path`` (it has no callback left)."""
    global _finder
    with _finder_lock:
        while finder in sys.meta_path:
            sys.meta_path.remove(finder)
        if _finder is finder:
            _finder = None


def _is_initializing(module: ModuleType) -> bool:
    from nbcoord.core.internals import is_initializing

    return is_initializing(module)


def when_imported(name: str, callback: ImportCallback) -> Callable[[], None]:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is); returns the remover.

    The remover is safe to call at any time, more than once, and removes the meta path finder once no
    callback is left.
    """
    global _finder
    module = sys.modules.get(name)
    if module is not None and not _is_initializing(module):
        callback(module)
        return lambda: None
    with _finder_lock:
        if _finder is None:
            _finder = _PostImportFinder()
        finder = _finder
        finder.add(name, callback)
        if finder not in sys.meta_path:
            sys.meta_path.insert(0, finder)

    def remove() -> None:
        if finder.remove(name, callback):
            _drop_finder(finder)

    return remove


def hook_installed() -> bool:
    """Whether nbcoord's finder is in ``sys.meta_path`` (tests check that unload removed it)."""
    return any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path)


def watching(name: str) -> bool:
    """Whether a callback still waits for ``name`` to be imported (it leaves once it fired)."""
    finder = _finder
    return finder is not None and finder in sys.meta_path and finder.watches(name)
