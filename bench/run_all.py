"""Every benchmark in one run, and one table of their headline figures.

Run: ``python bench/run_all.py [--quick] [--only NAME ...] [--verbose]`` (under five minutes on 2 cores; ``--quick``
about half that).

Each ``bench/bench_*.py`` runs in turn as a subprocess of this interpreter, with smaller repeat counts than it
uses alone (smaller still with ``--quick``). Each prints its own human table and one ``RESULT<TAB>{json}`` line per
headline figure (bench/_results.py); this script collects those lines and prints, on stdout, the date, Python,
CPUs and machine, then one markdown table: the figure with nbcoord, its baseline measured in the same run, their
ratio, the target and whether it was met. Progress goes to stderr (with ``--verbose``, every script's own output
too), so that stdout can be pasted into bench/README.md as it is.

The exit status is non-zero only when a script crashed (or ran past ``--timeout``), never for a missed target.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _results import parse

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

#: (script name, arguments for the full run, arguments for --quick). A flag the script does not know (its source
#: never mentions it) is left out, so that a script may change its options without breaking this one.
PLAN: list[tuple[str, list[str], list[str]]] = [
    ("core", [], ["--quick"]),
    ("probes", ["--budget", "0.5"], ["--budget", "0.2"]),
    ("tensorflow", [], ["--quick"]),
    ("shutdown", ["--repeat", "2"], ["--repeat", "1"]),
    ("click_latency", [], ["--clicks", "3", "--busy", "1.0", "--no-tf"]),
    ("panel", [], ["--busy", "0.5", "--reps", "1", "--window", "3"]),
    ("panel_browser", [], ["--updates", "12"]),
    ("flood", [], ["--clicks", "10000"]),
    ("tf_interrupt", [], ["--quick"]),
    ("server", [], ["--quick"]),
    ("stacks", [], ["--reads", "5"]),
    ("labextension", [], ["--window", "15"]),
    ("output", [], ["--quick"]),
    ("ledger", [], ["--quick"]),
    ("idle", ["--window", "30", "--loads", "5"], ["--window", "10", "--loads", "2"]),
]
PACKAGES = ("ipykernel", "ipython", "jupyter_client", "psutil", "tensorflow-cpu", "tensorflow")


@dataclass
class Run:
    """One script's run: its exit status, its RESULT records, and the tail of its output."""

    name: str
    command: list[str]
    returncode: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.timed_out or self.returncode != 0


def scripts() -> list[str]:
    """Every bench script's short name: the planned ones in plan order, then any others by name."""
    found = sorted(path.stem.removeprefix("bench_") for path in BENCH.glob("bench_*.py"))
    planned = [name for name, _, _ in PLAN if name in found]
    return planned + [name for name in found if name not in planned]


def arguments(name: str, quick: bool) -> list[str]:
    """The planned arguments for ``name``, less any flag its source does not mention."""
    planned = next(((full, fast) for plan, full, fast in PLAN if plan == name), ([], []))[1 if quick else 0]
    source = (BENCH / f"bench_{name}.py").read_text(encoding="utf-8")
    kept: list[str] = []
    skipping = False
    for token in planned:
        if token.startswith("--"):
            skipping = f'"{token}"' not in source
            if skipping:
                print(f"  note: bench_{name}.py has no {token}; left out", file=sys.stderr)
        if not skipping:
            kept.append(token)
    return kept


def run_script(name: str, quick: bool, timeout: float, verbose: bool) -> Run:
    """Run one script to its end (or its timeout), collecting RESULT lines as they come."""
    command = [sys.executable, str(BENCH / f"bench_{name}.py"), *arguments(name, quick)]
    run = Run(name, command)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    began = time.monotonic()
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )

    def kill() -> None:
        run.timed_out = True
        process.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            record = parse(line.rstrip("\n"))
            if record is not None:
                run.records.append(record)
            elif verbose:
                sys.stderr.write(line)
            run.tail = [*run.tail[-39:], line.rstrip("\n")]
        run.returncode = process.wait()
    finally:
        timer.cancel()
    run.seconds = time.monotonic() - began
    return run


# ------------------------------------------------------------------------------------------------- table
def number(value: float | None) -> str:
    """About three significant figures, without exponents."""
    if value is None:
        return "-"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1 or size == 0:
        return f"{value:.2f}"
    return f"{value:.2g}" if size < 0.01 else f"{value:.3f}"


def with_unit(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{number(value)} {unit}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def load() -> str:
    """The 1-minute load average: other work on the machine moves every figure."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def machine(load_before: str) -> list[str]:
    """The lines that say when and where the figures were measured."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        pass
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"- date: {now}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}); {', '.join(versions)}",
        f"- CPUs: {os.cpu_count()}" + (f" ({cpu})" if cpu else ""),
        f"- machine: {platform.platform()} {platform.machine()}",
        f"- load average (1 min) before / after the run: {load_before} / {load()}",
    ]


def table(runs: list[Run]) -> list[str]:
    """The markdown table, then the notes its rows point to (what each baseline is, and remarks)."""
    lines = [
        "| benchmark | figure | with nbcoord | baseline | ratio | target | met |",
        "| --- | --- | ---: | ---: | ---: | --- | :---: |",
    ]
    notes: dict[str, int] = {}
    for run in runs:
        if run.crashed:
            status = "timed out" if run.timed_out else f"exit status {run.returncode}"
            lines.append(f"| {run.name} | CRASHED ({status}) after {run.seconds:.0f} s | | | | | |")
        if not run.records and not run.crashed:
            lines.append(f"| {run.name} | (no RESULT lines: see `python bench/bench_{run.name}.py`) | | | | | |")
        for record in run.records:
            remark = "; ".join(filter(None, [f"baseline: {record['vs']}" if record.get("vs") else "", record["note"]]))
            mark = ""
            if remark:
                mark = f" [{notes.setdefault(remark, len(notes) + 1)}]"
            met = {True: "yes", False: "**no**", None: "-"}[record["met"]]
            ratio = "-" if record["ratio"] is None else f"x{number(record['ratio'])}"
            lines.append(
                f"| {run.name} | {cell(record['name'])}{mark} | {with_unit(record['value'], record['unit'])} "
                f"| {with_unit(record['baseline'], record['unit'])} | {ratio} | {cell(record['target'] or '-')} "
                f"| {met} |"
            )
    lines.append("")
    lines += [f"[{index}] {remark}" for remark, index in notes.items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller repeat counts (noisier figures)")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this script (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one script may run")
    parser.add_argument("--verbose", action="store_true", help="echo every script's own output on stderr")
    args = parser.parse_args()
    names = scripts()
    if args.only:
        wanted = [re.sub(r"^bench_|\.py$", "", name) for name in args.only]
        unknown = [name for name in wanted if name not in names]
        if unknown:
            parser.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(names)})")
        names = [name for name in names if name in wanted]

    began, load_before = time.monotonic(), load()
    runs = []
    for index, name in enumerate(names, 1):
        print(f"[{index}/{len(names)}] bench_{name}.py ...", file=sys.stderr, flush=True)
        run = run_script(name, args.quick, args.timeout, args.verbose)
        runs.append(run)
        verdict = "CRASHED" if run.crashed else "ok"
        print(f"    {verdict}: {len(run.records)} figures in {run.seconds:.1f} s", file=sys.stderr, flush=True)
        if run.crashed:
            print("\n".join(f"    | {line}" for line in run.tail), file=sys.stderr, flush=True)

    command = "python bench/run_all.py" + (" --quick" if args.quick else "")
    command += "".join(f" --only {name}" for name in args.only or [])
    print(f"nbcoord benchmarks: `{command}` ({time.monotonic() - began:.0f} s)")
    print()
    print("\n".join(machine(load_before)))
    print()
    print("\n".join(table(runs)))
    print("ratio: with nbcoord / baseline, unless a note says otherwise. met: the target of the issue that set it.")
    sys.exit(1 if any(run.crashed for run in runs) else 0)


if __name__ == "__main__":
    main()
