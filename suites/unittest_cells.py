"""Run stdlib unittest suites (CPython's own tests) with each test as one notebook cell, recording each outcome.

    python suites/unittest_cells.py --report OUT.jsonl [--timeout S] [--deselect ID ...] [--exclude RE] NAME ...

NAME is what ``unittest`` loads (``test.test_asyncio.test_tasks``, or a class or a test in it). Each test runs
between the shell's cell events (suites/cells.py), nbcoord loaded when ``NBCOORD_SUITE_WITH=1``.

Why not regrtest: regrtest runs the tests itself and gives no hook around one test, so it cannot frame them as cells.
What it adds that matters here is kept: a hang becomes a failure with every thread's stack (faulthandler, as
regrtest's ``--timeout``), and a test that alters the environment (threads or processes left behind, which
``test.support`` checks after each module) is recorded, as regrtest's ENV_CHANGED is.

A hang ends this process (faulthandler can only exit); the report is written line by line, so suites/run.py reads
which test hung and starts this runner again with the finished tests (``--done``) left out.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import re
import sys
import time
import unittest
from collections.abc import Iterator
from typing import Any, TextIO


def flatten(suite: unittest.TestSuite | unittest.TestCase) -> Iterator[unittest.TestCase]:
    if isinstance(suite, unittest.TestCase):
        yield suite
        return
    for test in suite:
        yield from flatten(test)


def environment_altered() -> bool:
    support = sys.modules.get("test.support")
    return bool(getattr(support, "environment_altered", False))


def reset_environment_altered() -> None:
    support = sys.modules.get("test.support")
    if support is not None and hasattr(support, "environment_altered"):
        setattr(support, "environment_altered", False)  # noqa: B010 (no stub knows this flag)


class CellResult(unittest.TextTestResult):
    """A text result (dots, then the failures' tracebacks) that also writes one JSON line per test and frames each
    test as a cell."""

    def __init__(self, stream: Any, descriptions: bool, verbosity: int, *, report: TextIO, cells: Any,
                 timeout: float) -> None:
        super().__init__(stream, descriptions, verbosity)
        self.report = report
        self.cells = cells
        self.timeout = timeout
        self.current: dict[str, Any] = {}

    def _write(self, line: dict[str, Any]) -> None:
        self.report.write(json.dumps(line) + "\n")
        self.report.flush()

    def startTest(self, test: unittest.TestCase) -> None:
        reset_environment_altered()
        self._write({"start": test.id()})
        self.current = {"id": test.id(), "outcome": "passed", "started": time.monotonic(), "error": None}
        faulthandler.dump_traceback_later(self.timeout, exit=True)
        super().startTest(test)
        self.current["cell"] = self.cells.begin(test.id())

    def _outcome(self, outcome: str, err: Any = None) -> None:
        if self.current["outcome"] in {"passed", "skipped"}:
            self.current["outcome"] = outcome
        if err is not None and self.current["error"] is None:
            self.current["error"] = err[1]

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._outcome("error", err)

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._outcome("failed", err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._outcome("failed" if issubclass(err[0], test.failureException) else "error", err)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._outcome("skipped")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._outcome("xfailed")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._outcome("xpassed")

    def stopTest(self, test: unittest.TestCase) -> None:
        cell = self.current.pop("cell", None)
        if cell is not None:
            self.cells.end(cell, self.current["error"])
        super().stopTest(test)
        faulthandler.cancel_dump_traceback_later()
        outcome = self.current["outcome"]
        if outcome == "passed" and environment_altered():
            outcome = "env_changed"
        seconds = round(time.monotonic() - self.current["started"], 3)
        self._write({"id": test.id(), "outcome": outcome, "seconds": seconds})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--report", required=True, help="JSON lines: {'start': id} then {'id', 'outcome', 'seconds'}")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one test may take before it is a hang")
    parser.add_argument("--deselect", action="append", default=[], help="a test id (or a prefix of ids) to leave out")
    parser.add_argument("--exclude", default=None, help="a regular expression: test ids it finds are left out")
    parser.add_argument("--done", default=None, help="a file of test ids already run, one a line, to leave out")
    args = parser.parse_args()

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from cells import Cells

    cells = Cells()
    done = set()
    if args.done:
        with open(args.done, encoding="utf-8") as file:
            done = {line.strip() for line in file if line.strip()}
    loaded = unittest.defaultTestLoader.loadTestsFromNames(args.names)
    tests = [
        test
        for test in flatten(loaded)
        if test.id() not in done
        and not any(test.id().startswith(prefix) for prefix in args.deselect)
        and not (args.exclude and re.search(args.exclude, test.id()))
    ]
    with open(args.report, "a", encoding="utf-8") as report:
        stream = unittest.runner._WritelnDecorator(sys.stderr)  # what TextTestRunner gives its result
        result = CellResult(stream, True, 1, report=report, cells=cells, timeout=args.timeout)
        started = time.perf_counter()
        unittest.TestSuite(tests)(result)
        result.printErrors()
        # Module cleanups (test.support's thread and process checks) run after the last test of each module.
        if environment_altered():
            result._write({"id": "(environment after the last module)", "outcome": "env_changed", "seconds": 0})
        print(f"\nran {result.testsRun} tests in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
