"""Fixtures shared by the test tiers: the one test kernel.

``kernel`` is one kernel for the module (per parameter): kernel starts are the expensive part, so tests share it, and
each test starts threads with names of its own, looks only at those, and ends them or puts back what it changed.
``own_kernel`` is a kernel for one test alone, for tests that end it or must see it fresh. Both take a
:class:`helpers.KernelOptions` (or a python's path) as parameter: from ``@pytest.mark.parametrize("kernel", ...,
indirect=True)`` on the test, else from the module's ``KERNEL_OPTIONS`` (a list of parameters, e.g.
``helpers.kernel_params(KERNEL_PYTHONS)``), else the default: this interpreter, nbcoord loaded by ``%load_ext``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Kernel, KernelOptions, start_kernel

KERNEL_FIXTURES = ("kernel", "own_kernel")
#: The order in which test files start, by their slowest marker: pytest-xdist hands whole files to its workers in
#: collection order, so the long files (a browser file takes minutes) start first and the short ones fill in around
#: them, instead of one long file starting last and running alone.
LONGEST_FIRST = ("browser", "notebooks", "tensorflow", "kernel")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (see ``LONGEST_FIRST``); a file's tests stay together and in their order."""
    rank: dict[str, int] = {}
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        own = min((i for i, name in enumerate(LONGEST_FIRST) if name in marks), default=len(LONGEST_FIRST))
        rank[item.nodeid.split("::")[0]] = min(own, rank.get(item.nodeid.split("::")[0], own))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the kernel fixtures with the module's ``KERNEL_OPTIONS`` where the test does not itself."""
    options = getattr(metafunc.module, "KERNEL_OPTIONS", None)
    if options is None:
        return
    for name in KERNEL_FIXTURES:
        if name not in metafunc.fixturenames:
            continue
        own = [m for m in metafunc.definition.iter_markers("parametrize") if name in _argnames(m.args[0])]
        if not own:
            metafunc.parametrize(name, options, indirect=True)


def _argnames(names: Any) -> list[str]:
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def _options(request: pytest.FixtureRequest) -> KernelOptions | str | None:
    options: KernelOptions | str | None = getattr(request, "param", None)
    return options


@pytest.fixture(scope="module")
def kernel(request: pytest.FixtureRequest) -> Iterator[Kernel]:
    """One kernel for the module's tests (per parameter)."""
    k = start_kernel(_options(request))
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def own_kernel(request: pytest.FixtureRequest) -> Iterator[Kernel]:
    """A kernel for this test alone."""
    k = start_kernel(_options(request))
    try:
        yield k
    finally:
        k.close()
