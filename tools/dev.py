"""Set-up and entry points for developers, using only the Python standard library.

    python3 tools/dev.py demo    # .venv with nbcoord + JupyterLab + TensorFlow (CPU); opens JupyterLab on notebooks/
    python3 tools/dev.py test    # .venv (+ .venv-ik6 for ipykernel 6) with the test extras; lint, types, all tests

Both are idempotent: a second run reuses the environments and only installs what changed.
The browser tests need Debian's Chromium at /usr/bin/chromium; ``test`` installs it with apt-get when run as
root on Debian and it is missing (never a browser download).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
VENV_IK6 = ROOT / ".venv-ik6"
CHROMIUM = Path("/usr/bin/chromium")
IK6_PACKAGES = ["ipykernel>=6.29,<7", "ipywidgets==8.1.9", "anywidget==0.11.0", "psutil", "pytest", "pytest-timeout"]


def run(*cmd: str | Path, **kwargs: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def ensure_venv(env: Path, *packages: str) -> Path:
    if not python_of(env).exists():
        venv.EnvBuilder(with_pip=True).create(env)
        run(python_of(env), "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(python_of(env), "-m", "pip", "install", "-q", *packages)
    return python_of(env)


def ensure_chromium() -> None:
    if CHROMIUM.exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run("apt-get", "update", "-qq", env=env)
        run("apt-get", "install", "-y", "-qq", "chromium", env=env)
        return
    sys.exit("The browser tests need Debian's Chromium: run `sudo apt-get install -y chromium` and try again.")


def demo(args: argparse.Namespace) -> None:
    python = ensure_venv(VENV, "-e", f"{ROOT}[demo]")
    # JupyterLab refuses to run as root without this flag (containers and CI machines often are root).
    as_root = ["--allow-root"] if os.geteuid() == 0 and "--allow-root" not in args.extra else []
    command = [str(python), "-m", "jupyter", "lab", str(ROOT / "notebooks"), *as_root, *args.extra]
    print("+", " ".join(command), flush=True)
    os.execv(command[0], command)


def check(*cmd: str | Path) -> bool:
    """Run a check; report, rather than stop at, its failure so that one run shows every problem."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=False, cwd=ROOT).returncode == 0


def test(args: argparse.Namespace) -> None:
    ensure_chromium()
    python = ensure_venv(VENV, "-e", f"{ROOT}[test]")
    ensure_venv(VENV_IK6, *IK6_PACKAGES, "-e", str(ROOT))
    results = {
        "ruff": check(python, "-m", "ruff", "check", "nbcoord", "tests", "bench", "tools"),
        "mypy": check(python, "-m", "mypy"),
        "pytest": check(python, "-m", "pytest", *args.extra),
    }
    failed = [name for name, passed in results.items() if not passed]
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="open JupyterLab on notebooks/ with nbcoord installed").set_defaults(func=demo)
    sub.add_parser("test", help="lint, type-check and run every test").set_defaults(func=test)
    args, extra = parser.parse_known_args()
    args.extra = extra
    args.func(args)


if __name__ == "__main__":
    main()
