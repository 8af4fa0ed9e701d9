"""The package as users get it: the built wheel carries the panel's module, and installs and loads on its own.

The wheel is built from this checkout without build isolation (``python -m build --wheel --no-isolation``), so
hatchling must be importable here. It is installed into a fresh venv (no system site-packages, so that a missing
runtime dependency shows up), with the dependencies from pip's cache or the registry, and a real kernel started
with that venv's interpreter loads the extension from there, not from this checkout.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import Kernel

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]
PANEL_JS = REPO / "js" / "panel.js"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"wheel build failed (is hatchling installed?):\n{done.stdout}\n{done.stderr}"
    wheels = list(out.glob("nbcoord-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_contains_the_panel_module_and_py_typed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "nbcoord/static/panel.js" in names, sorted(names)
        assert "nbcoord/static/fleet.js" in names, sorted(names)
        assert "nbcoord/py.typed" in names, sorted(names)
        # The server extension is enabled on install: its config file lands in etc/jupyter/jupyter_server_config.d.
        assert any(n.endswith(".data/data/etc/jupyter/jupyter_server_config.d/nbcoord.json") for n in names), names
        # The prebuilt JupyterLab extension, where JupyterLab and Notebook 7 find it without a rebuild.
        lab = "nbcoord-0.1.0.data/data/share/jupyter/labextensions/nbcoord/"
        assert {f"{lab}package.json", f"{lab}install.json", f"{lab}static/style.js"} <= names, sorted(names)
        assert any(n.startswith(f"{lab}static/remoteEntry.") for n in names), sorted(names)
        shipped = archive.read("nbcoord/static/panel.js")
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert shipped, "the wheel's panel.js is empty"
    assert shipped == PANEL_JS.read_bytes(), "the wheel's panel.js differs from js/panel.js"
    # No checkout-only files leak into the package.
    assert not [n for n in names if n.startswith(("tests/", "bench/", "js/", "notebooks/"))]
    for dependency in ("ipykernel", "ipywidgets", "anywidget", "psutil"):
        assert f"Requires-Dist: {dependency}" in metadata, metadata


def test_installed_wheel_loads_in_a_fresh_venv_kernel(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = tmp_path / "venv"
    # Without pip of its own (ensurepip costs seconds): this interpreter's pip installs into it with --python.
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"pip install of the wheel failed:\n{done.stdout}\n{done.stderr}"

    # An empty PYTHONPATH, and the kernel's cwd is a temporary folder: only the venv can provide nbcoord.
    kernel = Kernel(python=str(python), env={"PYTHONPATH": ""})
    try:
        assert Path(kernel.evaluate("__import__('sys').prefix")).resolve() == env_dir.resolve()
        kernel.run("%load_ext nbcoord")
        kernel.run(
            "import threading\n_gate = threading.Event()\n"
            "threading.Thread(target=_gate.wait, name='package-check', daemon=True).start()"
        )
        report = kernel.run("%nbcoord").stdout
        assert f"nbcoord: kernel pid {kernel.pid}:" in report, report
        assert "package-check" in report, report

        kernel.run("import hashlib, nbcoord\nfrom nbcoord.ui import widget as _panel")
        where = kernel.evaluate("nbcoord.__file__")
        assert Path(where).resolve().is_relative_to(env_dir.resolve()), where
        assert not Path(where).resolve().is_relative_to(REPO), where

        # The panel's ES module comes from the installed static file, and is the module this checkout has.
        esm = kernel.evaluate("str(_panel.esm_path())")
        assert Path(esm).resolve().is_relative_to(env_dir.resolve()), esm
        assert Path(esm).parts[-3:] == ("nbcoord", "static", "panel.js"), esm
        digest = kernel.evaluate("hashlib.sha256(_panel.NBCoordPanel._esm.encode()).hexdigest()")
        assert digest == hashlib.sha256(PANEL_JS.read_bytes()).hexdigest()
        kernel.run("_gate.set()")
    finally:
        kernel.close()


def _dev_tool() -> Any:
    """tools/dev.py as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "tools" / "dev.py"
    spec = importlib.util.spec_from_file_location("nbcoord_dev_tool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_demo_opens_working_copies_and_keeps_edits(tmp_path: Path) -> None:
    dev = _dev_tool()
    dev.DEMO_NOTEBOOKS = tmp_path / "copies"
    originals = sorted((Path(dev.ROOT) / "notebooks").glob("*.ipynb"))
    assert originals, "no demo notebooks"
    folder = dev.demo_notebooks()
    assert folder == tmp_path / "copies"
    assert [p.name for p in sorted(folder.glob("*.ipynb"))] == [p.name for p in originals]
    assert all((folder / p.name).read_bytes() == p.read_bytes() for p in originals)
    edited = folder / originals[0].name
    edited.write_text("{}")  # as JupyterLab's autosave would
    dev.demo_notebooks()
    assert edited.read_text() == "{}", "a second start overwrote the user's working copy"
    assert originals[0].read_bytes() != b"{}"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(Path(dev.ROOT) / "demo-notebooks" / originals[0].name)],
        cwd=dev.ROOT, check=False,
    )
    assert ignored.returncode == 0, "the demo's copies are not git-ignored"
