"""The Python interpreters the kernel-level tests start kernels on: the oldest supported, this one, the newest.

Parametrize a kernel-level test (or a fixture) with :data:`KERNEL_PYTHONS`; each value is the path of a python
that has ipykernel 7 and nbcoord (editable) installed, for ``helpers.Kernel(python=...)``::

    from interpreters import KERNEL_PYTHONS, version_of

    @pytest.mark.parametrize("python", KERNEL_PYTHONS)
    def test_shutdown(python: str) -> None:
        kernel = Kernel(python=python)
        if version_of(python) >= (3, 13): ...

    cases = [pytest.param(p.values[0], id=p.id) for p in KERNEL_PYTHONS if version_of(p) != (3, 10)]

    @pytest.fixture(scope="module", params=KERNEL_PYTHONS)
    def kernel(request: pytest.FixtureRequest) -> Iterator[Kernel]: ...

The ids are ``py3.10``, ``py3.11`` and ``py3.13`` (select with ``-k py3.13``):

- ``py3.11``: ``sys.executable``, the interpreter running pytest (``.venv``, ipykernel 7.4);
- ``py3.10``: ``$NBCOORD_PY310_PYTHON``, else ``.venv-py310/bin/python`` (ipykernel 7.3.0, the last for 3.10);
- ``py3.13``: ``$NBCOORD_PY313_PYTHON``, else ``.venv-py313/bin/python`` (ipykernel 7.4).

``python3 tools/dev.py test`` builds those environments and sets both variables; it sets one to the empty string
when that Python is not installed here, and says so at its start and in its summary. An interpreter that is not
there is left out of the list, so its tests are not collected at all rather than reported as skipped.

:data:`IK6` is the kernel of the older ipykernel line (6, in ``.venv-ik6``, on this Python; ``$NBCOORD_IK6_PYTHON``
overrides), id ``ipykernel6``, skipped where that environment is not built.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: (version, variable tools/dev.py sets, environment it builds), besides the interpreter running pytest.
_OTHERS = (
    ((3, 10), "NBCOORD_PY310_PYTHON", REPO / ".venv-py310"),
    ((3, 13), "NBCOORD_PY313_PYTHON", REPO / ".venv-py313"),
)


def _discover() -> dict[str, tuple[int, int]]:
    """Path of each available kernel python -> its (major, minor), oldest first."""
    found: dict[tuple[int, int], str] = {}
    for version, variable, env in _OTHERS:
        configured = os.environ.get(variable)
        if configured is None:  # pytest run by hand: use the environment tools/dev.py builds, when it is there
            configured = str(env / "bin" / "python") if (env / "bin" / "python").exists() else ""
        if configured:
            found[version] = configured
    found[sys.version_info[:2]] = sys.executable
    return {python: version for version, python in sorted(found.items())}


_VERSIONS = _discover()

#: One ``pytest.param`` per available interpreter: the python's path, with the id ``py<major>.<minor>``.
KERNEL_PYTHONS = [pytest.param(python, id=f"py{major}.{minor}") for python, (major, minor) in _VERSIONS.items()]

#: The python of the ipykernel 6 environment tools/dev.py builds.
IK6_PYTHON = Path(os.environ.get("NBCOORD_IK6_PYTHON", REPO / ".venv-ik6" / "bin" / "python"))
#: ``pytest.param`` of :data:`IK6_PYTHON`, id ``ipykernel6``.
IK6 = pytest.param(
    str(IK6_PYTHON),
    id="ipykernel6",
    marks=pytest.mark.skipif(not IK6_PYTHON.exists(), reason=f"no ipykernel 6 environment at {IK6_PYTHON}"),
)


def version_of(python: object) -> tuple[int, int]:
    """The (major, minor) of one of :data:`KERNEL_PYTHONS`, e.g. ``(3, 13)``.

    ``python`` is the param itself, its value (the path a parametrized test receives) or its id (``"py3.13"``).
    """
    values = getattr(python, "values", None)
    key = values[0] if isinstance(values, tuple) and values else python
    for path, (major, minor) in _VERSIONS.items():
        if key in (path, f"py{major}.{minor}"):
            return major, minor
    raise ValueError(f"{python!r} is not one of the kernel interpreters: {sorted(_VERSIONS)}")
