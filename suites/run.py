"""Other people's test suites, run with nbcoord loaded and compared test by test with the same suite without it.

    python3 suites/run.py                     # every suite: without, then with nbcoord; compare; ratio table
    python3 suites/run.py --suite joblib      # one suite (repeatable)
    python3 suites/run.py --update            # regenerate suites/known/*.json (runs without nbcoord twice)
    python3 suites/run.py --list              # the suites, their subsets and why

Standard library only, like tools/dev.py, which runs this after pytest. Nothing of another project is kept in this
repository (a workplace rule): each suite is obtained at run time from PyPI or from what is installed, and cached
under ``.suites-cache/`` (git-ignored), with its licence beside it. ipykernel's tests are in its sdist only: fetched
through PyPI's JSON simple API (PEP 691), sha256 checked, and only ``tests/`` and ``LICENSE`` extracted.

Each suite runs as a user would have nbcoord: in-process suites (joblib, CPython's asyncio and concurrent.futures)
inside an IPython shell with ``%load_ext nbcoord``, each test one cell (suites/cells.py); ipykernel's suite starts
kernels, which load nbcoord through the IPython profile (``c.IPKernelApp.extensions``) of ``IPYTHONDIR``.

The tier fails when, for a suite: a test's outcome with nbcoord differs from the one without it and the difference
is not allowed (with a reason) in its known-outcomes file; an outcome differs from the known file; the set of tests
changes; nbcoord was not loaded where it should be (or was where it should not); or nbcoord wrote lines of its own
into the suite's output. The wall-time ratio (with / without) is printed, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "suites"
KNOWN = HERE / "known"
CACHE = ROOT / ".suites-cache"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PY313_PYTHON = Path(os.environ.get("NBCOORD_PY313_PYTHON") or ROOT / ".venv-py313" / "bin" / "python")
#: pytest plugins ipykernel's tests need that .venv lacks: its conftest imports pytest_asyncio (asyncio_mode=auto).
#: Installed with --target into the cache, not into .venv: in .venv it would load into every run of nbcoord's own
#: tests too. ``flaky`` (upstream retries) is deliberately not installed: a test runs once here (pytest_cells.py).
PYTEST_PLUGINS = ["pytest-asyncio==1.5.0"]
PYPI_SIMPLE = "https://pypi.org/simple/{name}/"
PEP691 = "application/vnd.pypi.simple.v1+json"
OUTCOMES = {"passed", "failed", "error", "skipped", "xfailed", "xpassed", "env_changed", "hung", "missing"}


@dataclass
class Run:
    """One run of one suite: outcomes by test id, its wall time, its output, and what it said about nbcoord."""

    outcomes: dict[str, str]
    seconds: float
    log: Path
    problems: list[str] = field(default_factory=list)


@dataclass
class Suite:
    name: str
    python: Path
    kind: str  # "pytest" or "unittest"
    source: str  # where it comes from, for the known file and the report
    subset: str  # which tests, and why these
    targets: list[str]  # pytest paths/--pyargs names, or unittest names
    prepare: Callable[[Suite], Path]  # obtains the suite; returns the folder to run in
    run_timeout: float = 300.0
    extra_args: list[str] = field(default_factory=list)
    exclude: str | None = None  # unittest: a regular expression of test ids outside the subset


def say(text: str) -> None:
    print(f"[suites] {text}", flush=True)


# --- obtaining the suites ---------------------------------------------------------------------------------------


def installed_version(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def fetch_sdist(name: str, version: str) -> Path:
    """The sdist of ``name==version`` from PyPI, cached; its sha256 is checked against the index's."""
    request = urllib.request.Request(PYPI_SIMPLE.format(name=name), headers={"Accept": PEP691})
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    wanted = f"{name}-{version}.tar.gz"
    entry = next((f for f in index["files"] if f["filename"] == wanted), None)
    if entry is None:
        raise RuntimeError(f"PyPI lists no {wanted}")
    target = CACHE / "downloads" / wanted
    if not target.exists() or hashlib.sha256(target.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
        target.parent.mkdir(parents=True, exist_ok=True)
        say(f"downloading {entry['url']}")
        with urllib.request.urlopen(entry["url"], timeout=120) as response:
            data = response.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["hashes"]["sha256"]:
            raise RuntimeError(f"{wanted}: sha256 {digest} is not PyPI's {entry['hashes']['sha256']}")
        target.write_bytes(data)
    return target


def prepare_ipykernel(suite: Suite) -> Path:
    """ipykernel's tests/ at .venv's version, from its sdist; plus the pytest plugins they need."""
    version = installed_version(suite.python, "ipykernel")
    folder = CACHE / f"ipykernel-{version}"
    if not (folder / "tests" / "conftest.py").exists():
        sdist = fetch_sdist("ipykernel", version)
        partial = Path(tempfile.mkdtemp(dir=CACHE, prefix="partial-"))
        prefix = f"ipykernel-{version}/"
        keep = ("tests/", "LICENSE", "pyproject.toml")
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            # Only the tests, the licence and pytest's settings: never the package itself, which would shadow the
            # installed ipykernel (pytest puts the rootdir on sys.path for tests/__init__.py).
            members = [m for m in members if m.name[len(prefix):].startswith(keep) and m.isreg()]
            for member in members:
                member.name = member.name[len(prefix):]
                archive.extract(member, partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    site = CACHE / "site"
    if not (site / "pytest_asyncio").exists():
        subprocess.run(
            [str(suite.python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *PYTEST_PLUGINS],
            check=True,
        )
    return folder


def prepare_neutral(suite: Suite) -> Path:
    """An empty folder with an empty pytest.ini: the suite's tests are installed; no settings of this repository's
    (pyproject's addopts, filterwarnings, markers) may reach them."""
    folder = CACHE / suite.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest.ini").write_text("[pytest]\n")
    return folder


# --- the suites -------------------------------------------------------------------------------------------------

IPYKERNEL_FILES = [
    # The kernel-level tests: real kernels, executing code that prints from threads, runs asyncio, starts and
    # shuts down kernels: what nbcoord patches. Left out for time (whole suite: 243 tests, ~130 s per run here):
    # test_subshells/test_subshell_wedge (subshell threads, ~40 s), the debugger, message-spec schema checks,
    # the in-process kernel, and the unit tests of ipykernel's own classes that start no kernel.
    "tests/test_kernel.py",
    "tests/test_start_kernel.py",
    "tests/test_async.py",
    "tests/test_embed_kernel.py",
    "tests/test_io.py",
]

JOBLIB_K = (
    "not multiprocessing and not (test_threadpool_limitation_in_child_override or "
    "test_parallel_with_unpicklable_functions_in_args or test_initializer_not_reused or "
    "test_dispatch_race_condition or test_initializer_reused or test_no_blas_crash_or_freeze_with_subprocesses)"
)

SUITES = [
    Suite(
        name="ipykernel",
        python=VENV_PYTHON,
        kind="pytest",
        source="ipykernel's tests/ from the sdist of .venv's ipykernel on PyPI (BSD-3-Clause, LICENSE kept beside)",
        subset=" ".join(IPYKERNEL_FILES) + ": the tests that run kernels doing what nbcoord patches",
        targets=IPYKERNEL_FILES,
        prepare=prepare_ipykernel,
        extra_args=["-o", "asyncio_default_fixture_loop_scope=function"],
    ),
    Suite(
        name="concurrent_futures",
        python=PY313_PYTHON,
        kind="unittest",
        source="CPython 3.13's Lib/test/test_concurrent_futures (installed with .venv-py313's Python; PSF licence "
        "at lib/python3.13/LICENSE.txt); 3.11.7's stdlib here has no such package",
        subset="all but: the forkserver and spawn variants of the process-pool tests (the same tests under another "
        "start method, 3x the time), the process-pool variants of wait and as_completed (the waiting is the thread "
        "variant's code; ~16 s of sleeps) and test_map_timeout (6 s of sleep each); 130 of 256 tests, ~65 s a run "
        "before",
        targets=["test.test_concurrent_futures"],
        exclude=r"\.ProcessPool(Forkserver|Spawn)|\.ProcessPoolFork(Wait|AsCompleted)Test\.|\.test_map_timeout$",
        prepare=prepare_neutral,
    ),
    Suite(
        name="asyncio_tasks",
        python=VENV_PYTHON,
        kind="unittest",
        source="CPython 3.11's Lib/test/test_asyncio test_tasks and test_taskgroups (installed with .venv's Python; "
        "PSF licence at lib/python3.11/LICENSE.txt)",
        subset="test_taskgroups, and test_tasks with the C Task and C Future (what asyncio.Task is) of its nine "
        "Task/Future implementation pairings, plus its tests that are not per implementation",
        targets=["test.test_asyncio.test_tasks", "test.test_asyncio.test_taskgroups"],
        exclude=r"test_tasks\.(Py\w+|CTaskSubclass_PyFuture_Tests|CTask_CFuture_SubclassTests|CTask_PyFuture_Tests)\.",
        prepare=prepare_neutral,
    ),
    Suite(
        name="joblib",
        python=VENV_PYTHON,
        kind="pytest",
        source="joblib/test/test_parallel.py, shipped inside .venv's joblib wheel (BSD-3-Clause, in its dist-info)",
        subset="test_parallel.py but its multiprocessing-backend variants (loky is joblib's default) and six tests "
        "that spend ~80 s in worker start-ups and sleeps (the whole file: 647 tests, ~180 s a run)",
        targets=["--pyargs", "joblib.test.test_parallel", "-k", JOBLIB_K],
        prepare=prepare_neutral,
    ),
]


# --- running ----------------------------------------------------------------------------------------------------


def kernel_profile(with_nbcoord: bool) -> Path:
    """An IPYTHONDIR whose default profile loads nbcoord into every kernel started from it (or nothing)."""
    folder = Path(tempfile.mkdtemp(prefix="nbcoord-suite-ipython-"))
    profile = folder / "profile_default"
    profile.mkdir()
    lines = ['c.IPKernelApp.extensions = ["nbcoord"]\n'] if with_nbcoord else []
    (profile / "ipython_kernel_config.py").write_text("".join(lines))
    return folder


def deselected(known: dict[str, Any]) -> list[str]:
    return sorted(known.get("deselected", {}))


def run_pytest(suite: Suite, folder: Path, with_nbcoord: bool, known: dict[str, Any], log: Path) -> Run:
    report = log.with_suffix(".json")
    report.unlink(missing_ok=True)
    ipython_dir = kernel_profile(with_nbcoord)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(CACHE / "site"), str(HERE)]),
        IPYTHONDIR=str(ipython_dir),
        NBCOORD_SUITE_REPORT=str(report),
        NBCOORD_SUITE_WITH="1" if with_nbcoord else "",
    )
    if suite.name == "ipykernel":
        env["NBCOORD_SUITE_KERNEL_CHECK"] = "1"
    else:
        env["NBCOORD_SUITE_CELLS"] = "1"
    command = [str(suite.python), "-m", "pytest", "-p", "pytest_cells", "-p", "no:cacheprovider", "--color=no",
               "-q", "-o", "addopts=", *suite.extra_args]
    for test in deselected(known):
        command += ["--deselect", test]
    command += suite.targets
    started = time.perf_counter()
    problems = []
    with log.open("w") as output:
        try:
            subprocess.run(command, cwd=folder, env=env, stdout=output, stderr=subprocess.STDOUT,
                           timeout=suite.run_timeout, check=False)
        except subprocess.TimeoutExpired:
            problems.append(f"did not finish in {suite.run_timeout:.0f} s")
    seconds = time.perf_counter() - started
    shutil.rmtree(ipython_dir, ignore_errors=True)
    if not report.exists():
        return Run({}, seconds, log, [*problems, "wrote no report"])
    data = json.loads(report.read_text())
    outcomes = {test: entry["outcome"] for test, entry in data["tests"].items()}
    if suite.name == "ipykernel" and data["kernel_has_nbcoord"] is not with_nbcoord:
        problems.append(f"a kernel had nbcoord loaded: {data['kernel_has_nbcoord']}, wanted {with_nbcoord}")
    if suite.name != "ipykernel" and data["nbcoord_loaded"] is not with_nbcoord:
        problems.append(f"the shell had nbcoord loaded: {data['nbcoord_loaded']}, wanted {with_nbcoord}")
    return Run(outcomes, seconds, log, problems)


def runner_end(code: int) -> str:
    """How the unittest runner ended in the middle of a test: its own timeout (faulthandler exits with 1 after
    writing every thread's stack above), a signal, or another exit code."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}: no stacks"
    if code == 1:
        return "exit code 1: a hang makes faulthandler write every stack above and exit with it"
    return f"exit code {code}"


def run_unittest(suite: Suite, folder: Path, with_nbcoord: bool, known: dict[str, Any], log: Path) -> Run:
    """The unittest runner, started again past a test that hung (it exits with the stacks; the test is "hung")."""
    report = log.with_suffix(".jsonl")
    report.unlink(missing_ok=True)
    done_file = log.with_suffix(".done")
    env = dict(os.environ, NBCOORD_SUITE_WITH="1" if with_nbcoord else "", PYTHONPATH=str(HERE))
    env["IPYTHONDIR"] = str(kernel_profile(False))  # the shell's own, empty profile; nbcoord comes from %load_ext
    command = [str(suite.python), str(HERE / "unittest_cells.py"), "--report", str(report), "--done", str(done_file),
               "--timeout", "60"]
    for test in deselected(known):
        command += ["--deselect", test]
    if suite.exclude:
        command += ["--exclude", suite.exclude]
    command += suite.targets
    outcomes: dict[str, str] = {}
    problems: list[str] = []
    started = time.perf_counter()
    with log.open("w") as output:
        for _attempt in range(6):
            done_file.write_text("".join(f"{test}\n" for test in outcomes))
            left = suite.run_timeout - (time.perf_counter() - started)
            try:
                exited = subprocess.run(command, cwd=folder, env=env, stdout=output, stderr=subprocess.STDOUT,
                                        timeout=max(left, 1), check=False).returncode
            except subprocess.TimeoutExpired:
                problems.append(f"did not finish in {suite.run_timeout:.0f} s")
                break
            running = None
            for line in report.read_text().splitlines() if report.exists() else []:
                entry = json.loads(line)
                if "start" in entry:
                    running = entry["start"]
                else:
                    outcomes[entry["id"]] = entry["outcome"]
                    running = None
            if exited == 0 and running is None:
                break
            if running is None:
                problems.append(f"the runner exited with {exited} between tests")
                break
            outcomes[running] = "hung"
            output.write(f"\n[suites] {running} ended the runner ({runner_end(exited)}); starting again after it\n")
            output.flush()
    shutil.rmtree(env["IPYTHONDIR"], ignore_errors=True)
    return Run(outcomes, time.perf_counter() - started, log, problems)


def run_suite(suite: Suite, folder: Path, with_nbcoord: bool, known: dict[str, Any], tag: str) -> Run:
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{suite.name}-{tag}.log"
    runner = run_pytest if suite.kind == "pytest" else run_unittest
    say(f"{suite.name}: {'with' if with_nbcoord else 'without'} nbcoord ({tag}) ...")
    run = runner(suite, folder, with_nbcoord, known, log)
    say(f"{suite.name}: {len(run.outcomes)} tests in {run.seconds:.1f} s; log {log.relative_to(ROOT)}")
    return run


#: pytest's header of one test's failure report ("____ test_name[param] ____"), and of a new part of its summary.
_FAILURE_HEADER = re.compile(r"^_{3,} (\S+) _{3,}$")
_SUMMARY_HEADER = re.compile(r"^={3,}")


def nbcoord_lines(with_run: Run, without_run: Run, allowed: Collection[str] = ()) -> list[str]:
    """Lines of the run with nbcoord that mention nbcoord and that the run without it does not have: what nbcoord
    printed of its own into the suite's output (a warning, an announcement, a traceback through its code). The
    failure report of a test whose difference is allowed (``allowed``: test names, as pytest heads its report)
    quotes what nbcoord did by design, and is left out."""
    pattern = re.compile("nbcoord", re.IGNORECASE)
    without = set(without_run.log.read_text(errors="replace").splitlines())
    found: list[str] = []
    skipping = in_summary = False
    for line in with_run.log.read_text(errors="replace").splitlines():
        header = _FAILURE_HEADER.match(line)
        if header is not None:
            skipping = header.group(1) in allowed
        elif _SUMMARY_HEADER.match(line):
            skipping, in_summary = False, "short test summary" in line
        elif in_summary and not line[:1].isspace():
            # A summary line: "FAILED id - message", its message going on in indented lines below it.
            skipping = line.startswith(("FAILED ", "ERROR ")) and any(f"::{name} " in line for name in allowed)
        if skipping or line.startswith("[suites]") or line in without:
            continue
        if pattern.search(line):
            found.append(line)
    return found


# --- comparing --------------------------------------------------------------------------------------------------


def known_path(suite: Suite) -> Path:
    return KNOWN / f"{suite.name}.json"


def load_known(suite: Suite) -> dict[str, Any]:
    path = known_path(suite)
    return json.loads(path.read_text()) if path.exists() else {}


def compare(suite: Suite, known: dict[str, Any], with_run: Run, without_run: Run) -> list[str]:
    """Every reason the suite fails, one line each (empty: it passed)."""
    failures = [f"with nbcoord: {p}" for p in with_run.problems] + [f"without: {p}" for p in without_run.problems]
    expected: dict[str, str] = known.get("expected", {})
    allowed: dict[str, dict[str, str]] = known.get("allowed_differences", {})
    if not expected:
        failures.append(f"no known outcomes: run `python3 suites/run.py --update --suite {suite.name}`")
    if expected and len(with_run.outcomes) != len(expected):
        failures.append(f"test count {len(with_run.outcomes)}, known {len(expected)}")
    if len(with_run.outcomes) != len(without_run.outcomes):
        failures.append(f"test count with nbcoord {len(with_run.outcomes)}, without {len(without_run.outcomes)}")
    for test in sorted(set(with_run.outcomes) | set(without_run.outcomes) | set(expected)):
        got = with_run.outcomes.get(test, "missing")
        base = without_run.outcomes.get(test, "missing")
        if got != base and allowed.get(test, {}).get("with") != got:
            failures.append(f"{test}: {got} with nbcoord, {base} without")
        if expected and got != expected.get(test, "missing"):
            failures.append(f"{test}: {got} with nbcoord, known {expected.get(test, 'missing')}")
    allowed_names = {test.rsplit("::", 1)[-1] for test in allowed}
    for line in nbcoord_lines(with_run, without_run, allowed_names)[:10]:
        failures.append(f"nbcoord wrote into the suite's output: {line.strip()[:200]}")
    return failures


def update(suite: Suite, known: dict[str, Any], runs: list[Run], with_run: Run) -> None:
    """Write the known file from a run with nbcoord; a test whose outcome differed between the two runs without
    nbcoord is flaky by itself and is deselected (with that as its reason), never retried. Allowed differences are
    kept, never added: each needs a person's reason."""
    first, second = runs
    flaky = {
        test: f"flaky by itself: {first.outcomes.get(test, 'missing')}, then {second.outcomes.get(test, 'missing')} "
        "without nbcoord"
        for test in set(first.outcomes) | set(second.outcomes)
        if first.outcomes.get(test) != second.outcomes.get(test)
    }
    deselect: dict[str, str] = {**known.get("deselected", {}), **flaky}
    content = {
        "suite": suite.name,
        "source": suite.source,
        "subset": suite.subset,
        "deselected": dict(sorted(deselect.items())),
        "allowed_differences": known.get("allowed_differences", {}),
        "expected": {t: o for t, o in sorted(with_run.outcomes.items()) if t not in flaky},
    }
    KNOWN.mkdir(exist_ok=True)
    known_path(suite).write_text(json.dumps(content, indent=1) + "\n")
    say(f"{suite.name}: wrote {known_path(suite).relative_to(ROOT)} ({len(flaky)} flaky by themselves deselected)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", choices=[s.name for s in SUITES], help="run only this suite")
    parser.add_argument("--update", action="store_true", help="regenerate the known-outcomes files")
    parser.add_argument("--list", action="store_true", help="list the suites and their subsets")
    args = parser.parse_args()
    suites = [s for s in SUITES if not args.suite or s.name in args.suite]
    if args.list:
        for suite in suites:
            print(f"{suite.name}: {suite.source}\n  subset: {suite.subset}")
        return 0
    CACHE.mkdir(exist_ok=True)
    failed: dict[str, list[str]] = {}
    left_out: list[str] = []
    table: list[tuple[str, int, float, float]] = []
    started = time.perf_counter()
    for suite in suites:
        if not suite.python.exists():
            # As tools/dev.py does for a Python that is not installed (.venv-py313 needs pyenv's 3.13): said, left out.
            say(f"{suite.name}: not run: {suite.python} is not there (tools/dev.py test builds it where it can)")
            left_out.append(suite.name)
            continue
        try:
            folder = suite.prepare(suite)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
            failed[suite.name] = [f"could not obtain the suite: {error}"]
            continue
        known = load_known(suite)
        without = run_suite(suite, folder, False, known, "without")
        if args.update:
            again = run_suite(suite, folder, False, known, "without-again")
        with_run = run_suite(suite, folder, True, known, "with")
        if args.update:
            update(suite, known, [without, again], with_run)
            known = load_known(suite)
            with_run.outcomes = {t: o for t, o in with_run.outcomes.items() if t in known["expected"]}
            without.outcomes = {t: o for t, o in without.outcomes.items() if t in known["expected"]}
        table.append((suite.name, len(with_run.outcomes), without.seconds, with_run.seconds))
        problems = compare(suite, known, with_run, without)
        if problems:
            failed[suite.name] = problems
    print("\nsuites: wall time with nbcoord / without (printed, not asserted; target <= 1.15x)")
    print(f"  {'suite':<20} {'tests':>6} {'without':>9} {'with':>9} {'ratio':>6}")
    for name, count, without_s, with_s in table:
        print(f"  {name:<20} {count:>6} {without_s:>8.1f}s {with_s:>8.1f}s {with_s / max(without_s, 1e-9):>5.2f}x")
    for name, problems in failed.items():
        print(f"\n{name} FAILED:")
        for problem in problems[:40]:
            print(f"  {problem}")
        if len(problems) > 40:
            print(f"  ... and {len(problems) - 40} more")
    passed = [s.name for s in suites if s.name not in failed and s.name not in left_out]
    not_run = f", not run: {', '.join(left_out)}" if left_out else ""
    print(f"\nsuites {'passed' if not failed else 'FAILED'}: {len(passed)} passed, {len(failed)} failed{not_run} "
          f"({time.perf_counter() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
