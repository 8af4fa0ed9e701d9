"""TensorFlow integration (placeholder until the integration lands: it installs nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def watch(extension: Any) -> Callable[[], None]:
    """Install the integration now if TensorFlow is imported, else when it is; returns the undo."""
    return lambda: None
