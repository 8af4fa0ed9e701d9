"""Fixtures shared by the test tiers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import Kernel


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A fresh real kernel with nbcoord loaded."""
    k = Kernel()
    try:
        k.run("%load_ext nbcoord")
        yield k
    finally:
        k.close()


@pytest.fixture
def bare_kernel() -> Iterator[Kernel]:
    """A fresh real kernel without nbcoord."""
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def kernel_on(request: pytest.FixtureRequest) -> Iterator[Kernel]:
    """A fresh real kernel with nbcoord loaded, on the interpreter the test parametrizes it with (indirect)."""
    k = Kernel(python=request.param)
    try:
        k.run("%load_ext nbcoord")
        yield k
    finally:
        k.close()
