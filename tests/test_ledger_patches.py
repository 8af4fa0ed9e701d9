"""Every patch the ledger's kinds make goes through :class:`nbcoord.core.patches.ClassPatches`, which puts back exactly
what it replaced: a pool class's ``__init__``, ``DataLoader.__iter__``, and the event loop policy's
``new_event_loop`` (an instance attribute: :meth:`ClassPatches.patch_instance`). On stand-in classes, without a
kernel; the real libraries' classes are checked in tests/test_ledger_units.py.
"""

from __future__ import annotations

import logging
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from nbcoord.core.patches import ClassPatches
from nbcoord.ledger.dataloader import LoaderLedger
from nbcoord.ledger.pools import PoolLedger


class Policy:
    def new_event_loop(self) -> str:
        return "loop"


def test_patch_instance_wraps_one_object_and_restoring_removes_it() -> None:
    policy, other = Policy(), Policy()
    patches = ClassPatches()
    patches.patch_instance(policy, "new_event_loop", lambda original: lambda: "watched " + original())
    assert policy.new_event_loop() == "watched loop" and other.new_event_loop() == "loop"
    assert vars(Policy)["new_event_loop"] is Policy.new_event_loop and type(policy) is Policy
    wrapper = vars(policy)["new_event_loop"]
    assert wrapper.__wrapped__ == Policy.new_event_loop.__get__(policy) and wrapper.__name__ == "new_event_loop"
    assert patches.restore() == []
    assert "new_event_loop" not in vars(policy) and policy.new_event_loop() == "loop"
    assert patches.restore() == []  # nothing left to restore


def test_patch_instance_leaves_a_foreign_patch_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    policy = Policy()
    patches = ClassPatches()
    patches.patch_instance(policy, "new_event_loop", lambda original: lambda: "watched " + original())
    policy.new_event_loop = lambda: "theirs"  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="nbcoord"):
        assert patches.restore() == ["Policy.new_event_loop"]
    assert policy.new_event_loop() == "theirs"
    assert "Policy.new_event_loop was patched again after nbcoord" in caplog.text


def test_patch_instance_on_an_object_without_attributes_patches_nothing() -> None:
    class Slotted:
        __slots__ = ()

        def new_event_loop(self) -> str:
            return "loop"

    patches = ClassPatches()
    with pytest.raises(AttributeError):
        patches.patch_instance(Slotted(), "new_event_loop", lambda original: original)
    with pytest.raises(AttributeError):
        patches.patch_instance(Policy(), "missing", lambda original: original)
    assert patches.restore() == []


def test_pool_constructors_are_wrapped_and_put_back_exactly() -> None:
    class Pool:
        def __init__(self, size: int) -> None:
            self.size = size

    class Executor:
        def __init__(self) -> None:
            self.made = True

    module = ModuleType("stand_in_pools")
    module.Pool, module.Executor = Pool, Executor  # type: ignore[attr-defined]
    originals = vars(Pool)["__init__"], vars(Executor)["__init__"]
    kind = PoolLedger(SimpleNamespace(active=False))  # type: ignore[arg-type]
    kind.patch(module, "Pool", "multiprocessing")
    kind.patch(module, "Executor", "futures")
    kind.patch(module, "Missing", "futures")  # not there: logged, nothing patched
    assert vars(Pool)["__init__"].__wrapped__ is originals[0] and vars(Executor)["__init__"].__wrapped__ is originals[1]
    assert vars(Pool)["__init__"].__qualname__ == originals[0].__qualname__
    assert Pool(3).size == 3 and Executor().made
    kind.uninstall()
    assert (vars(Pool)["__init__"], vars(Executor)["__init__"]) == originals


def test_dataloader_iter_is_wrapped_and_put_back_exactly() -> None:
    class _MultiProcessingDataLoaderIter:
        def __next__(self) -> int:
            raise StopIteration

    class DataLoader:
        def __iter__(self) -> Any:
            return _MultiProcessingDataLoaderIter()

    module = ModuleType("stand_in_dataloader")
    module.DataLoader = DataLoader  # type: ignore[attr-defined]
    module._MultiProcessingDataLoaderIter = _MultiProcessingDataLoaderIter  # type: ignore[attr-defined]
    original = vars(DataLoader)["__iter__"]
    kind = LoaderLedger(SimpleNamespace(active=False))  # type: ignore[arg-type]
    assert kind.install(module)
    assert vars(DataLoader)["__iter__"].__wrapped__ is original
    assert isinstance(DataLoader().__iter__(), _MultiProcessingDataLoaderIter)
    kind.uninstall()
    assert vars(DataLoader)["__iter__"] is original
    kind.uninstall()  # a second unload changes nothing
    assert vars(DataLoader)["__iter__"] is original
