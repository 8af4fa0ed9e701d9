"""Worker processes (S12): with nbcoord loaded, multiprocessing's children behave as they do without it.

A child made by fork is a copy of the kernel with nbcoord in it. Before children were made inert, its exit ran the
``threading`` exit hook it inherited, and that stop sent SIGTERM to the kernel's other children and to the child
itself (its probe still held the kernel's ``psutil.Process``): five ``mp.Process`` children exited with ``-15``, a
long-running worker of an earlier cell was killed, and printed lines went missing.

What children print is checked in files: with fork, a child's fd 1 is the kernel process's own stdout, not the cell.
Each child's ``sys.stdout`` is a file of its own, buffered as usual, so a line reaches it only when multiprocessing
flushes the streams at the very end of the child's exit, as it does for the kernel's stream: a child killed during
its exit loses what it printed.

Most cases keep a *sentinel* alive: a forked worker started by an earlier cell that records every SIGTERM, SIGINT
and SIGHUP it receives and keeps running. It answers a ping only after handling any signal sent before the ping,
so "no signal reached it" is checked without waiting; at the end it must exit with 0 when told (its own exit is a
forked child's exit too).

Spawn and forkserver children are fresh interpreters without nbcoord; their cases guard against a fix that breaks
them, and their workers are children of the kernel, which a forked child's stop used to signal as well.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Kernel, kernel_params, marked_json, wait_until
from interpreters import KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

METHODS = ["fork", "forkserver", "spawn"]

#: The children's targets, importable by spawn and forkserver children (the kernel puts its folder on sys.path,
#: which multiprocessing hands on to them).
WORK = '''
"""Targets for the children of tests/test_fork.py."""
import json, os, signal, sys, threading, time
from pathlib import Path


def _write(path, text):
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def stdout_to_file(directory, name=None):
    """Make this process's stdout a file of its own, buffered as usual: what is printed reaches it only when
    multiprocessing flushes the standard streams as the process exits (after the threading exit hooks)."""
    sys.stdout = open(Path(directory) / f"stdout-{name or os.getpid()}.txt", "w")


def say(directory, name):
    stdout_to_file(directory, name)
    print(name)


def square(x):
    print(f"sq-{x}")
    return x * x


def sigterm_handler(directory):
    _write(Path(directory) / "handler", repr(signal.getsignal(signal.SIGTERM)))


def wait_in_c(directory):
    """Write ``ready``, then wait inside one C call that a signal does not end (glibc's sigwait retries on EINTR):
    a Python-level SIGTERM handler never gets to run here, the default action ends the process at once."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    _write(Path(directory) / "ready", str(os.getpid()))
    signal.sigwait({signal.SIGUSR2})


def worker(directory, trap=False):
    """Run until the file ``stop`` appears; write ``ready`` (the pid) first, answer ``ping-N`` with ``pong-N``.

    With ``trap``, SIGTERM, SIGINT and SIGHUP are appended to ``signals`` and ignored otherwise.
    """
    d = Path(directory)
    if trap:
        def note(signum, frame):
            with open(d / "signals", "a") as f:
                f.write(f"{signum}\\n")
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, note)
    _write(d / "ready", str(os.getpid()))
    while not (d / "stop").exists():
        for ping in d.glob("ping-*"):
            pong = d / ("pong-" + ping.name[5:])
            if not pong.exists():
                _write(pong, "")
        time.sleep(0.01)


def use_nbcoord(directory):
    """In a forked child: start a thread, then call nbcoord's API; write what each call did."""
    import nbcoord
    out = {"pid": os.getpid()}
    ran = []
    t = threading.Thread(target=ran.append, args=(1,), name="child-thread")
    t.start()
    t.join(5)
    out["thread_ran"] = ran == [1]
    calls = {"snapshot": nbcoord.snapshot, "stop_all": lambda: nbcoord.stop_all(grace=0.5)}
    for name, call in calls.items():
        out[name] = ["(did not return)", ""]
        _write(Path(directory) / "api.json", json.dumps(out))  # what it got to, should a call end the process
        try:
            value = call()
            out[name] = ["returned", repr(value)[:300]]
        except BaseException as e:
            out[name] = [type(e).__name__, str(e)]
    out["should_stop"] = nbcoord.should_stop()
    _write(Path(directory) / "api.json", json.dumps(out))
'''

#: Bounded waits inside the kernel: a cell never hangs, a lost child shows as a wrong exit code instead.
JOIN_S = 30


#: One kernel per interpreter (conftest's ``kernel``) with nbcoord loaded, the targets importable (written into its
#: working folder, on its sys.path), and the SIGTERM handler it had before nbcoord recorded as ``SIGTERM_BEFORE``.
KERNEL_OPTIONS = kernel_params(
    KERNEL_PYTHONS,
    setup=f"import sys, os; open('nbcoord_forkwork.py', 'w').write({WORK!r}); sys.path.insert(0, os.getcwd())\n"
    "import concurrent.futures as cf, multiprocessing as mp, os, signal, json, time\n"
    "import nbcoord_forkwork as fw\n"
    "SIGTERM_BEFORE = repr(signal.getsignal(signal.SIGTERM))",
)


def run_json(kernel: Kernel, code: str, timeout: float = 90) -> Any:
    """Run a cell that sets ``RESULT``; returns it."""
    return marked_json(kernel.run(code + "\nimport json as _j; print('@@' + _j.dumps(RESULT))", timeout=timeout))


_pings = itertools.count()


class Worker:
    """A long-running child of the kernel, started by a cell of its own, watched from the test through files."""

    def __init__(self, kernel: Kernel, directory: Path, method: str = "fork", trap: bool = False) -> None:
        self.kernel, self.dir = kernel, directory
        directory.mkdir()
        self.var = f"W_{directory.name.replace('-', '_')}"
        kernel.run(
            f"{self.var} = mp.get_context({method!r}).Process(target=fw.worker, args=({str(directory)!r}, {trap}),"
            " daemon=True)\n"
            f"{self.var}.start()"
        )
        self.pid = int(wait_until(lambda: self._read("ready"), timeout=30, what=f"the {method} worker to start"))

    def _read(self, name: str) -> str:
        path = self.dir / name
        return path.read_text() if path.exists() else ""

    def signals(self) -> list[int]:
        return [int(s) for s in self._read("signals").split()]

    def assert_untouched(self, after: str) -> None:
        """Alive, not a zombie, answering, and (for a trap) never signalled."""
        n = next(_pings)
        (self.dir / f"ping-{n}").write_text("")
        try:
            wait_until((self.dir / f"pong-{n}").exists, timeout=10, what="the worker to answer a ping")
        except AssertionError:
            status = _status(self.pid)
            raise AssertionError(f"the worker started earlier is gone after {after} (status {status})") from None
        assert _status(self.pid) not in (None, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        assert self.signals() == [], f"{after} sent signals {self.signals()} to the worker started earlier"

    def finish(self, after: str) -> None:
        """:meth:`assert_untouched`, then it ends normally (exit code 0) when told."""
        self.assert_untouched(after)
        assert self.end() == 0, f"the worker started earlier did not end normally after {after}"

    def end(self) -> int | None:
        """Tell it to stop; its exit code, as the kernel's Process object sees it."""
        (self.dir / "stop").write_text("")
        code: int | None = run_json(self.kernel, f"{self.var}.join({JOIN_S}); RESULT = {self.var}.exitcode")
        return code

    def stop_quietly(self) -> None:
        """At teardown: tell it to stop and wait for it, so that its exit cannot act during the next test."""
        (self.dir / "stop").write_text("")
        self.kernel.run(f"{self.var}.join({JOIN_S})", allow_error=True)


def printed_lines(directory: Path) -> list[str]:
    """Every line the children printed to their stdout files."""
    return [line for f in sorted(directory.glob("stdout-*.txt")) for line in f.read_text().splitlines()]


def _status(pid: int) -> str | None:
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


@pytest.fixture
def sentinel(kernel: Kernel, tmp_path: Path) -> Iterator[Worker]:
    """A forked worker, started by an earlier cell, that records every signal it gets."""
    w = Worker(kernel, tmp_path / "sentinel", "fork", trap=True)
    try:
        yield w
    finally:
        w.stop_quietly()


CELLS = {
    "pool": """
ctx = mp.get_context({method!r})
pool = ctx.Pool(3, initializer=fw.stdout_to_file, initargs=(D,))
results = pool.map_async(fw.square, range(8)).get({join})
procs = list(pool._pool)
pool.close()
pool.join()
RESULT = {{"results": results, "codes": [p.exitcode for p in procs]}}
""",
    "executor": """
ctx = mp.get_context({method!r})
ex = cf.ProcessPoolExecutor(max_workers=3, mp_context=ctx, initializer=fw.stdout_to_file, initargs=(D,))
results = list(ex.map(fw.square, range(8), timeout={join}))
procs = list(ex._processes.values())
ex.shutdown(wait=True)
RESULT = {{"results": results, "codes": [p.exitcode for p in procs]}}
""",
    # Five batches of five: one lost line in a batch showed in 6 runs of 20.
    "process": """
ctx = mp.get_context({method!r})
codes = []
for batch in range(5):
    ps = [ctx.Process(target=fw.say, args=(D, f"p{{batch}}-{{i}}")) for i in range(5)]
    for p in ps:
        p.start()
    for p in ps:
        p.join({join})
    codes.append([p.exitcode for p in ps])
p = ctx.Process(target=sys.exit, args=(7,))
p.start()
p.join({join})
RESULT = {{"codes": codes, "exit7": p.exitcode}}
""",
}


@pytest.mark.parametrize("kind", list(CELLS))
@pytest.mark.parametrize("method", METHODS)
def test_children_exit_cleanly_and_nothing_is_lost(
    kernel: Kernel, sentinel: Worker, tmp_path: Path, method: str, kind: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    kernel.run(f"D = {str(out)!r}")
    got = run_json(kernel, CELLS[kind].format(method=method, join=JOIN_S))
    printed = printed_lines(out)
    problems = []
    if kind == "process":
        expected = {f"p{b}-{i}" for b in range(5) for i in range(5)}
        if got["codes"] != [[0] * 5] * 5:
            problems.append(f"exit codes of five batches of five children: {got['codes']}")
        if got["exit7"] != 7:
            problems.append(f"a child's sys.exit(7) gave exit code {got['exit7']}")
    else:
        expected = {f"sq-{x}" for x in range(8)}
        if got["results"] != [x * x for x in range(8)]:
            problems.append(f"results {got['results']}")
        if not got["codes"] or got["codes"] != [0] * len(got["codes"]):
            problems.append(f"exit codes of the workers: {got['codes']}")
    if sorted(printed) != sorted(expected):
        lost = sorted(expected - set(printed))
        problems.append(f"{len(lost)} of {len(expected)} printed lines lost: {lost}; printed: {sorted(printed)}")
    assert not problems, f"{method} {kind}: " + "; ".join(problems)
    sentinel.finish(f"{method} {kind} children")


@pytest.mark.parametrize("worker_method", METHODS)
def test_worker_of_an_earlier_cell_survives_forked_children(kernel: Kernel, tmp_path: Path, worker_method: str) -> None:
    worker = Worker(kernel, tmp_path / "worker", worker_method)
    try:
        out = tmp_path / "out"
        out.mkdir()
        got = run_json(
            kernel,
            f"""
ctx = mp.get_context("fork")
codes = []
for batch in range(3):
    ps = [ctx.Process(target=fw.say, args=({str(out)!r}, f"p{{batch}}-{{i}}")) for i in range(5)]
    for p in ps:
        p.start()
    for p in ps:
        p.join({JOIN_S})
    codes.append([p.exitcode for p in ps])
pool = ctx.Pool(2, initializer=fw.stdout_to_file, initargs=({str(out)!r},))
results = pool.map_async(fw.square, range(4)).get({JOIN_S})
pool.close()
pool.join()
RESULT = {{"codes": codes, "results": results, "alive": {worker.var}.is_alive()}}
""",
        )
        assert got["alive"], f"the {worker_method} worker started by an earlier cell died"
        worker.assert_untouched("a later cell's forked children")
        assert got["codes"] == [[0] * 5] * 3
        assert got["results"] == [0, 1, 4, 9]
        expected = [f"p{b}-{i}" for b in range(3) for i in range(5)] + [f"sq-{x}" for x in range(4)]
        assert sorted(printed_lines(out)) == sorted(expected)
        assert worker.end() == 0, "the worker did not end normally when told"
    finally:
        worker.stop_quietly()


def test_forked_child_has_the_kernels_own_sigterm_handler(kernel: Kernel, sentinel: Worker, tmp_path: Path) -> None:
    got = run_json(
        kernel,
        f"""
p = mp.get_context("fork").Process(target=fw.sigterm_handler, args=({str(tmp_path)!r},))
p.start()
p.join({JOIN_S})
RESULT = {{"code": p.exitcode, "before": SIGTERM_BEFORE}}
""",
    )
    handler = (tmp_path / "handler").read_text()
    assert handler == got["before"], "a forked child must have the SIGTERM handler the kernel had before nbcoord"
    assert got["code"] == 0


#: How long a cell waits for children that should die of SIGTERM at once, before it kills them itself.
DIE_S = 5

#: Start forked children that wait in C (``WAITERS`` folders), wait until all are ready, then run ``END``; give
#: the children ``DIE_S`` to die, kill those still alive, and report.
SIGTERM_CELL = """
import threading
ready = [os.path.join(d, "ready") for d in WAITERS]
t0 = time.monotonic()
while not all(map(os.path.exists, ready)) and time.monotonic() - t0 < {join}:
    time.sleep(0.01)
t0 = time.monotonic()
ender = threading.Thread(target=END, daemon=True)
ender.start()
ender.join({die})
for p in PROCS:
    p.join(max(0.0, {die} - (time.monotonic() - t0)))
took = time.monotonic() - t0
codes = [p.exitcode for p in PROCS]
for p in PROCS:
    if p.is_alive():
        p.kill()
        p.join({join})
ender.join({join})
RESULT = {{"took": took, "codes": codes, "before": SIGTERM_BEFORE}}
"""


def _waiters(tmp_path: Path, n: int) -> list[str]:
    folders = [tmp_path / f"waiter-{i}" for i in range(n)]
    for folder in folders:
        folder.mkdir()
    return [str(f) for f in folders]


def test_sigterm_ends_a_forked_child_at_once_and_only_it(kernel: Kernel, sentinel: Worker, tmp_path: Path) -> None:
    # The child waits inside a C call: only the default action (what it had before nbcoord) ends it there.
    (folder,) = _waiters(tmp_path, 1)
    got = run_json(
        kernel,
        f"""
WAITERS = [{folder!r}]
PROCS = [mp.get_context("fork").Process(target=fw.wait_in_c, args=(WAITERS[0],))]
PROCS[0].start()
END = lambda: os.kill(PROCS[0].pid, signal.SIGTERM)
"""
        + SIGTERM_CELL.format(join=JOIN_S, die=DIE_S),
    )
    assert got["before"] == repr(signal.SIG_DFL), "the kernel had a SIGTERM handler of its own before nbcoord"
    assert got["codes"] == [-signal.SIGTERM], f"a forked child sent SIGTERM: exit code {got['codes'][0]}"
    assert got["took"] < 3.0, f"the child took {got['took']:.2f} s to die of SIGTERM"
    sentinel.finish("SIGTERM to a forked sibling")


def test_pool_terminate_ends_forked_workers_promptly(kernel: Kernel, sentinel: Worker, tmp_path: Path) -> None:
    folders = _waiters(tmp_path, 3)
    got = run_json(
        kernel,
        f"""
WAITERS = {folders!r}
pool = mp.get_context("fork").Pool(3)
PROCS = list(pool._pool)
pending = pool.map_async(fw.wait_in_c, WAITERS, chunksize=1)
END = pool.terminate
"""
        + SIGTERM_CELL.format(join=JOIN_S, die=DIE_S),
    )
    assert got["codes"] == [-signal.SIGTERM] * 3, f"exit codes of the workers after Pool.terminate(): {got['codes']}"
    assert got["took"] < 3.0, f"Pool.terminate() took {got['took']:.2f} s"
    sentinel.finish("Pool.terminate()")


def test_nbcoord_does_nothing_in_a_forked_child(kernel: Kernel, sentinel: Worker, tmp_path: Path) -> None:
    got = run_json(
        kernel,
        f"""
p = mp.get_context("fork").Process(target=fw.use_nbcoord, args=({str(tmp_path)!r},))
p.start()
p.join({JOIN_S})
RESULT = {{"code": p.exitcode, "pid": os.getpid()}}
""",
    )
    report = tmp_path / "api.json"
    assert report.exists(), f"the forked child wrote nothing (exit code {got['code']})"
    api = json.loads(report.read_text())
    assert api["thread_ran"], "a thread started in a forked child did not run"
    for call in ("snapshot", "stop_all"):
        kind, message = api[call]
        assert kind == "RuntimeError", f"nbcoord.{call}() in a forked child: {kind}: {message}"
        assert "fork" in message or str(got["pid"]) in message, message
    assert api["should_stop"] is False
    assert got["code"] == 0, f"the forked child's exit code: {got['code']}"
    sentinel.finish("a forked child calling nbcoord")
