"""``GET /nbcoord/api/kernels/<id>/stacks``: a kernel's threads read from outside, in a real Jupyter Server, from real
kernels that cannot answer (a C call holding the GIL) or whose threads deadlock or sleep in C.

The reader is pystack (the ``native`` extra), called in the server's own process, the kernels' parent.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import Kernel, wait_until
from server_support import Attached, FleetServer, fleet_server_running

from nbcoord.resources.stacks import called_c_function, read_stacks

pytestmark = pytest.mark.kernel

#: A sum that holds the GIL for seconds and never checks for signals (builtin_sum's loop over a range).
GIL_CELL = "total = sum(range({n}))"
N = 6 * 10**8

@pytest.fixture(scope="module")
def server() -> Iterator[FleetServer]:
    with fleet_server_running("--KernelManager.autorestart=False") as running:
        yield running

def started(server: FleetServer, name: str) -> tuple[str, Attached]:
    kernel_id = server.start(f"{name}.ipynb")
    kernel = server.attach(kernel_id)
    kernel.run("%load_ext nbcoord")
    return kernel_id, kernel

def stacks(server: FleetServer, kernel_id: str, native: bool = False) -> dict[str, Any]:
    read: dict[str, Any] = server.api("GET", f"/nbcoord/api/kernels/{kernel_id}/stacks" + ("?native=1" * native))
    assert read["available"], read["reason"]
    return read

def test_a_c_call_holding_the_gil_is_read_from_outside(server: FleetServer) -> None:
    kernel_id, kernel = started(server, "gil")
    # The number the front end shows for the cell: the one after the last cell's.
    count = kernel.run("pass")["content"]["execution_count"] + 1
    msg_id = kernel.submit(GIL_CELL.format(n=N))

    def in_the_call() -> dict[str, Any] | None:
        read = stacks(server, kernel_id)
        main = read["main"]
        return read if main is not None and main["holds_gil"] and main["cell"] is not None else None

    read = wait_until(in_the_call, timeout=30, interval=0.1, what="the main thread in the C call, holding the GIL")
    main = read["main"]
    assert main["cell"] == count and main["line"] == 1 and main["since_exact"], (count, main)
    assert f"holding the GIL, cell [{count}], line 1 in <module>" in main["doing"], main
    # Read without stopping the kernel.
    assert read["paused_ms"] == 0 and read["native"] is False
    innermost = next(t for t in read["threads"] if t["main"])["frames"][-1]
    assert innermost["where"] == f"cell [{count}], line 1 in <module>"

    native = stacks(server, kernel_id, native=True)
    assert native["native"] is True and native["paused_ms"] > 0
    assert native["main"]["function"] == "builtin_sum", native["main"]
    assert native["main"]["doing"].startswith("busy in builtin_sum, holding the GIL, cell ["), native["main"]
    assert native["main"]["in_c"] is True
    # The kernel's other threads are there too, with native frames.
    assert len(native["threads"]) > 3 and all(t["native"] for t in native["threads"])
    # Read by a child process, never by the kernel's parent: the server's own watch of its child (jupyter_client's
    # Popen.poll) never saw a ptrace stop, which it would take for the kernel's death (returncode -19).
    for _ in range(3):
        stacks(server, kernel_id, native=True)
    assert server.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] != "dead"
    assert server.row(kernel_id)["status"] != "dead"

    # The cell's result is unchanged by the reads.
    reply = kernel.reply(msg_id, timeout=120)
    assert reply["content"]["status"] == "ok" and reply["content"]["execution_count"] == count
    assert kernel.evaluate("total") == N * (N - 1) // 2
    # Idle again: the main thread runs no cell.
    assert stacks(server, kernel_id)["main"]["doing"] == "not running a cell"

DEADLOCK = textwrap.dedent("""\
    import threading
    first, second = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)
    def one():
        with first:
            both_hold.wait()
            with second:
                pass
    def two():
        with second:
            both_hold.wait()
            with first:
                pass
    threading.Thread(target=one, name="one", daemon=True).start()
    threading.Thread(target=two, name="two", daemon=True).start()
    """)
WAITERS = textwrap.dedent("""\
    import threading, queue, ctypes
    never = threading.Event()
    empty = queue.Queue()
    threading.Thread(target=never.wait, name="event-waiter", daemon=True).start()
    threading.Thread(target=empty.get, name="queue-waiter", daemon=True).start()
    sleeper = threading.Thread(target=ctypes.CDLL(None).sleep, args=(600,), name="c-sleeper", daemon=True)
    sleeper.start()
    threading.Thread(target=sleeper.join, name="joiner", daemon=True).start()
    """)

def by_name(read: dict[str, Any], native_ids: dict[str, int]) -> dict[str, dict[str, Any]]:
    threads = {t["tid"]: t for t in read["threads"]}
    return {name: threads[tid] for name, tid in native_ids.items() if tid in threads}

def native_ids(kernel: Attached, names: list[str]) -> dict[str, int]:
    expression = f"{{t.name: t.native_id for t in __import__('threading').enumerate() if t.name in {names!r}}}"
    found: dict[str, int] = wait_until(lambda: (ids := kernel.evaluate(expression)) and len(ids) == len(names) and ids,
                                       timeout=10, what="the threads")  # fmt: skip
    return found

def test_waits_are_named_from_outside(server: FleetServer) -> None:
    kernel_id, kernel = started(server, "waits")
    kernel.run(WAITERS)
    ids = native_ids(kernel, ["event-waiter", "queue-waiter", "c-sleeper", "joiner"])
    pid = server.kernel_pid(kernel)

    def named() -> dict[str, dict[str, Any]] | None:
        # The outside read alone (what the server has when the kernel cannot answer), made by this process.
        threads = by_name(dict(read_stacks(pid, native=True)), ids)
        return threads if threads["joiner"]["waits"] and threads["queue-waiter"]["waits"] else None

    threads = wait_until(named, timeout=30, interval=0.5, what="the waits named")
    assert threads["event-waiter"]["waits"] == "an Event"
    assert threads["queue-waiter"]["waits"] == "a Queue (empty)"
    assert threads["joiner"]["waits"] == f"thread {ids['c-sleeper']} to end"
    # The thread in a C sleep: its native frames show libc's sleep under ctypes' call.
    symbols = [frame["symbol"] for frame in threads["c-sleeper"]["native"]]
    sleeps = ("clock_nanosleep", "__GI___clock_nanosleep", "sleep", "__sleep")
    assert any(symbol.startswith(sleeps) for symbol in symbols[-6:]), symbols
    # Through the server, while the kernel can answer, its own account replaces what the frames say.
    served = by_name(stacks(server, kernel_id), ids)
    assert served["joiner"]["waits"].startswith("thread 'c-sleeper'"), served["joiner"]


def test_a_deadlock_shows_both_threads_waiting_in_the_cell(server: FleetServer) -> None:
    kernel_id, kernel = started(server, "deadlock")
    count = kernel.run(DEADLOCK)["content"]["execution_count"]
    ids = native_ids(kernel, ["one", "two"])

    def stuck() -> dict[str, dict[str, Any]] | None:
        threads = by_name(stacks(server, kernel_id, native=True), ids)
        inner = [(t["frames"][-1]["function"], t["frames"][-1]["line"]) for t in threads.values()]
        return threads if sorted(inner) == [("one", 7), ("two", 12)] else None

    threads = wait_until(stuck, timeout=30, interval=0.5, what="both threads at their second `with`")
    for name, line in (("one", 7), ("two", 12)):
        frames = threads[name]["frames"]
        # From outside, the cell's file is known by the mark only while that cell runs: these frames show the file.
        assert frames[-1]["line"] == line and frames[-1]["function"] == name, frames
        assert not threads[name]["holds_gil"]
        # The kernel's control thread answered too (the main thread is free): its account names the cell.
        assert threads[name]["stack_inside"][-1] == f"cell [{count}], line {line} in {name}", threads[name]
    read = stacks(server, kernel_id)
    assert read["waits_from_kernel"] is True
    [deadlock] = read["deadlocks"]
    assert sorted(deadlock["tids"]) == sorted(ids.values())
    assert deadlock["text"] in (
        "deadlock: thread 'one' holds first and waits for second; thread 'two' holds second and waits for first",
        "deadlock: thread 'two' holds second and waits for first; thread 'one' holds first and waits for second",
    ), deadlock


MAIN_DEADLOCK = textwrap.dedent("""\
    import threading
    a, b = threading.Lock(), threading.Lock()
    main_holds_a = threading.Event()
    def worker():
        with b:
            main_holds_a.wait()
            with a:
                pass
    threading.Thread(target=worker, name="worker", daemon=True).start()
    with a:
        main_holds_a.set()
        with b:
            pass
    """)


def test_a_main_thread_deadlocked_with_a_thread_is_named_while_the_cell_hangs(server: FleetServer) -> None:
    kernel_id, kernel = started(server, "main-deadlock")
    kernel.submit(MAIN_DEADLOCK)

    def named() -> dict[str, Any] | None:
        read = stacks(server, kernel_id)
        return read if read["deadlocks"] and read["main"] and read["main"]["cell"] is not None else None

    read = wait_until(named, timeout=30, interval=0.3, what="the deadlock of the main thread named")
    count = read["main"]["cell"]
    assert "thread 'worker' holds b and waits for a" in read["deadlocks"][0]["text"], read["deadlocks"]
    main = next(t for t in read["threads"] if t["main"])
    assert main["frames"][-1]["where"] == f"cell [{count}], line 12 in <module>"
    assert read["main"]["doing"].startswith(f"running cell [{count}], line 12 in <module>, for "), read["main"]
    # The way out that works here: an interrupt ends the main thread's wait.
    server.api("POST", f"/api/kernels/{kernel_id}/interrupt", {})
    wait_until(lambda: stacks(server, kernel_id)["main"]["doing"] == "not running a cell", timeout=30,
               what="the cell interrupted")  # fmt: skip


# ---------------------------------------------------------------------------------------- refused and bad requests
def test_bad_requests_are_refused_and_named(server: FleetServer) -> None:
    kernel_id = server.start("bad.ipynb")
    status, _headers, body = server.request("GET", f"/nbcoord/api/kernels/{kernel_id}/stacks?native=yes")
    assert status == 400 and 'must be given once, as 1 or 0' in json.loads(body)["message"]
    status, _headers, body = server.request("GET", f"/nbcoord/api/kernels/{kernel_id}/stacks?native=1&native=0")
    assert status == 400
    missing = "00000000-0000-0000-0000-000000000000"
    status, _headers, body = server.request("GET", f"/nbcoord/api/kernels/{missing}/stacks")
    assert status == 404 and b"no kernel" in body
    status, _headers, _body = server.request("GET", f"/nbcoord/api/kernels/{kernel_id}/stacks", token=False,
                                             follow=False)  # fmt: skip
    assert status in (302, 403)

def test_without_the_reader_one_sentence_says_why() -> None:
    read = read_stacks(os.getpid(), module="no_such_stack_reader")
    assert read["available"] is False and read["threads"] == []
    assert read["reason"] == (
        "Reading stacks from outside needs pystack: pip install 'nbcoord[native]' where the server runs."
    )

def test_a_gone_process_is_said_plainly() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    read = read_stacks(child.pid)
    assert read["available"] is False and read["reason"] == "The kernel's process is gone."

@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_permission_one_sentence_says_why() -> None:
    """A reader that may not ptrace the kernel (another user's process, no CAP_SYS_PTRACE): a real refusal, run as
    the unprivileged user ``nobody`` against a process of root."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = ("import json, sys; from nbcoord.resources.stacks import read_stacks; "
                f"print(json.dumps(read_stacks({target.pid})))")  # fmt: skip
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
            check=False, capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": "/tmp"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr

        read = json.loads(out.stdout)
        assert read["available"] is False
        assert read["reason"].startswith("No permission to read the kernel's memory (ptrace)"), read
    finally:
        target.kill()
        target.wait()

def test_the_called_c_function_is_the_one_below_the_evaluation_loop() -> None:
    frames = [{"symbol": s, "library": "libpython"} for s in (
        "_PyEval_EvalFrameDefault", "cfunction_vectorcall_FASTCALL_KEYWORDS", "builtin_sum", "PyIter_Next",
        "rangeiter_next")]  # fmt: skip
    assert called_c_function(frames) == "builtin_sum"  # type: ignore[arg-type]
    assert called_c_function([]) is None


class Kernels:
    """The server's kernel manager as the stack reader uses it (``get_kernel``, ``in``), for one kernel process
    started by the test: the reader's part that needs no server."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def get_kernel(self, _kernel_id: str) -> Any:
        return self.manager

    def __contains__(self, _kernel_id: object) -> bool:
        return True


def test_the_kernels_parent_never_stops_it() -> None:
    """The server is its kernels' parent, and watches them with ``Popen.poll`` (jupyter_client's ``is_alive``). A
    ptrace stop made by the parent itself can reach that ``waitpid`` too: ``poll`` returns -19 (the kernel taken for
    dead) while the reader waits for ever for the stop it lost (a race: seen in the server, rare in a loop). Native
    reads are made by a child process instead: here, this process plays the server, and the kernel's TracerPid
    during the reads must never be this process."""
    import asyncio

    from nbcoord.server._stacks import StacksReader

    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        wait_until(lambda: read_stacks(child.pid)["available"], timeout=20, what="the child readable")
        manager = SimpleNamespace(provisioner=SimpleNamespace(pid=child.pid))
        reader = StacksReader(Kernels(manager))
        polls: list[int | None] = []
        tracers: set[int] = set()
        mine: set[int] = set()
        reading = True

        def poll() -> None:  # as often as it can: os.waitpid and reads of /proc release the GIL
            while reading:
                polls.append(child.poll())
                with open(f"/proc/{child.pid}/status") as status:
                    tracer = next(int(line.split()[1]) for line in status if line.startswith("TracerPid:"))
                if tracer:
                    tracers.add(tracer)
                    # Checked at once: the tracer lives while it traces, and pids are reused (pid_max 32768 here).
                    if os.path.exists(f"/proc/self/task/{tracer}"):
                        mine.add(tracer)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            # Three kernel ids: each read is made (no repeat of the last one within NATIVE_INTERVAL_S).
            # In a thread of its own: a test process may already run an event loop in this one (Playwright's).
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                reads = [pool.submit(asyncio.run, reader.read(f"k{n}", native=True)).result() for n in range(3)]
        finally:
            reading = False
            poller.join()
            reader.close()
        for read in reads:
            assert read["available"] and read["native"] and read["paused_ms"] > 0, read
        # The reads stopped the child (a tracer was seen), never from this process, its parent.
        # (TracerPid is the tracing thread's id: a thread of this process has an entry under our /proc task list.)
        assert tracers and not mine, (tracers, mine)
        assert len(polls) > 100 and set(polls) == {None}, set(polls)
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------------------------ %nbcoord threads --native
NATIVE_THREADS = textwrap.dedent("""\
    import threading, ctypes, time
    def in_c():
        ctypes.CDLL(None).sleep(600)
    threading.Thread(target=in_c, name="in-c", daemon=True).start()
    threading.Thread(target=time.sleep, args=(600,), name="py-sleep", daemon=True).start()
    """)


def test_threads_native_names_the_c_function_of_a_thread_stuck_in_c(kernel: Kernel) -> None:
    """The main thread answers; a child process reads the kernel's native frames (the kernel names it with
    PR_SET_PTRACER, so that Yama's ptrace_scope 1 lets it)."""
    count = kernel.run(NATIVE_THREADS).reply["content"]["execution_count"]
    names = "sorted(t.name for t in threading.enumerate() if t.name in ('in-c', 'py-sleep'))"
    wait_until(lambda: kernel.evaluate(names) == ["in-c", "py-sleep"], timeout=10, what="both threads")
    text = kernel.run("%nbcoord threads --native").stdout
    assert "Native frames (read by a child process; the kernel was paused " in text, text
    line = next(line for line in text.splitlines() if "thread 'in-c'" in line and "innermost" not in line)
    # ctypes calls libc's sleep through libffi: the C function Python called is ffi's, the thread's innermost libc's.
    assert line.endswith(f", called from cell [{count}], line 3 in in_c"), line
    innermost = text.splitlines()[text.splitlines().index(line) + 1]
    assert "nanosleep" in innermost or "sleep" in innermost.split(" <- ")[0], innermost
    assert "thread 'py-sleep'" in text  # time.sleep is C too (select/clock_nanosleep)
    assert "Usage" not in text
    error = kernel.run("%nbcoord report --native", allow_error=True)
    said = error.text + " ".join(str(e.get("evalue", "")) for e in error.errors) + str(error.reply["content"])
    assert "--native only goes with %nbcoord threads." in said, said


def test_a_remote_kernel_is_said_plainly() -> None:
    """A kernel whose process is not on the server's machine (a remote provisioner: no pid) is not read at all."""
    import asyncio

    from nbcoord.server._stacks import StacksReader

    remote = SimpleNamespace(provisioner=SimpleNamespace(pid=None, process=None))
    reader = StacksReader(Kernels(remote))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            read = pool.submit(asyncio.run, reader.read("remote", native=False)).result()
    finally:
        reader.close()
    assert read["available"] is False and read["pid"] is None
    assert read["reason"].startswith("This kernel's process is not on the server's machine (a remote kernel)")


def test_reads_are_kept_only_for_the_servers_kernels() -> None:
    """Nothing grows with the kernels that ended: the reader keeps its per-kernel state (the last native read) only
    for kernels the server still has."""
    import asyncio

    from nbcoord.server._stacks import StacksReader

    class Ending(Kernels):
        def __init__(self, manager: Any) -> None:
            super().__init__(manager)
            self.gone: set[str] = set()

        def __contains__(self, kernel_id: object) -> bool:
            return kernel_id not in self.gone

    kernels = Ending(SimpleNamespace(provisioner=SimpleNamespace(pid=os.getpid())))
    reader = StacksReader(kernels)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            for kernel_id in ("first", "second"):
                assert pool.submit(asyncio.run, reader.read(kernel_id, native=False)).result()["available"]
            assert set(reader._reads) == {"first", "second"}
            kernels.gone.add("first")
            pool.submit(asyncio.run, reader.read("third", native=False)).result()
        assert set(reader._reads) == {"second", "third"}
    finally:
        reader.close()
