"""Background output goes home (nbcoord/kernel/output.py), in real kernels on ipykernel 7 and 6, read from raw iopub.

What a front end sees is the messages: a thread's text written after its cell finished must arrive as one
``display_data`` whose parent is the starting cell's request (JupyterLab and Notebook 7 keep that cell's future, so
it shows there), then ``update_display_data`` messages with the same display id (matched by id, never shown under
the running cell), and never as a ``stream`` message of the cell that runs. tests/test_output_browser.py checks the
same in a real browser.

Before the lead wires ``_output.install`` into the extension's load, :data:`INSTALL` installs it from a cell (and
registers its removal with the extension, so that ``%unload_ext`` removes it); once wired, ``_ext.output`` exists
and the install line does nothing.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from helpers import Kernel, kernel_params, wait_until
from interpreters import IK6, KERNEL_PYTHONS

pytestmark = pytest.mark.kernel

#: ipykernel 7 on every kernel interpreter (3.10 has IPython 8, without its per-cell stream wrapper).
PYTHONS7 = [pytest.param(p.values[0], id=f"ipykernel7-{p.id}") for p in KERNEL_PYTHONS]
#: And ipykernel 6, which routes a cell's threads' text to that cell itself (nbcoord then leaves it alone).
PYTHONS = [*PYTHONS7, IK6]

#: Before ``%load_ext nbcoord``: the excepthook the kernel had, to check unload against.
BEFORE = "import threading\n_hook_before_nbcoord = threading.excepthook"
#: After it, the route. The `_output.install` line is unnecessary once the extension's load installs it.
INSTALL = """import json, os, sys, threading, time, warnings
import nbcoord
from nbcoord.kernel import output as _output
_ext = nbcoord._extension
_router = getattr(_ext, "output", None)
if _router is None:  # before the wiring: install it here, removed by %unload_ext like the rest
    _router = _output.install(_ext)
    _ext.host.add_undo(_router.uninstall)
def set_routing(on):
    if _ext.config.has_trait("route_output"):
        _ext.config.route_output = on
    else:  # before the wiring: the setting's effect, directly
        _router._enabled = on
        _router._update_routing()
"""


def areas(kernel: Kernel) -> dict[str, dict[str, Any]]:
    """nbcoord's output areas by display id: the parent of the message that placed it, and its latest text."""
    found: dict[str, dict[str, Any]] = {}
    for msg in kernel.messages:
        kind = msg["msg_type"]
        if kind not in ("display_data", "update_display_data"):
            continue
        display_id = msg["content"].get("transient", {}).get("display_id", "")
        if not display_id.startswith("nbcoord-output-"):
            continue
        if kind == "display_data":
            found[display_id] = {"parent": msg["parent_header"].get("msg_id"), "updates": 0}
        area = found.setdefault(display_id, {"parent": None, "updates": 0})
        area["text"] = msg["content"]["data"]["text/plain"]
        area["updates"] += kind == "update_display_data"
    return found


def wait_for_area(kernel: Kernel, *needles: str, timeout: float = 20.0) -> tuple[str, dict[str, Any]]:
    """The area whose text holds every needle (pumping iopub meanwhile)."""

    def found() -> tuple[str, dict[str, Any]] | None:
        kernel.pump()
        for display_id, area in areas(kernel).items():
            if all(needle in area.get("text", "") for needle in needles):
                return display_id, area
        return None

    result = wait_until(found, timeout, 0.05, f"an output area with {needles}")
    assert result is not None
    return result


#: A kernel per test (conftest's ``own_kernel``: each test reads every message its kernel sent), nbcoord and the route
#: loaded, on ipykernel 7 on every interpreter and on ipykernel 6.
KERNEL_OPTIONS = kernel_params(PYTHONS, setup=BEFORE, after=INSTALL)
#: The kernels whose ipykernel sends a thread's text under the latest request: the text nbcoord routes.
ROUTING = pytest.mark.parametrize("own_kernel", kernel_params(PYTHONS7, setup=BEFORE, after=INSTALL), indirect=True)
#: ipykernel 6 only, and ipykernel 7 on this interpreter only.
IPYKERNEL6 = pytest.mark.parametrize("own_kernel", kernel_params([IK6], setup=BEFORE, after=INSTALL), indirect=True)
IPYKERNEL7 = pytest.mark.parametrize(
    "own_kernel",
    kernel_params([pytest.param(sys.executable, id="ipykernel7")], setup=BEFORE, after=INSTALL),
    indirect=True,
)


WORKER = """
printed, go = threading.Event(), threading.Event()
def worker():
    print("worker: while cell A runs", flush=True)
    printed.set()
    go.wait(30)
    print("worker: line 1")
    print("worker: line 2", flush=True)
    warnings.warn("worker warning")
    raise RuntimeError("worker failed")
t = threading.Thread(target=worker, name="worker")
t.start()
printed.wait(10)
"""


@ROUTING
def test_thread_output_goes_to_the_cell_that_started_it(own_kernel: Kernel) -> None:
    kernel = own_kernel
    a_id = kernel.submit(WORKER)
    a = kernel.collect(a_id)
    assert a.status == "ok"
    assert "worker: while cell A runs" in a.stdout  # its own cell still ran: plain output, as without nbcoord
    b = kernel.run('print("cell B runs"); go.set(); t.join(10)')
    _, area = wait_for_area(kernel, "worker: line 2", "RuntimeError: worker failed", "UserWarning: worker warning")
    text = area["text"]
    assert area["parent"] == a_id, "the area is placed under cell A's own request"
    assert text.startswith("nbcoord: output of thread 'worker' started by this cell, written after it finished:")
    assert "Exception in thread worker:\nTraceback" in text
    assert text.index("worker: line 1") < text.index("worker: line 2") < text.index("RuntimeError: worker failed")
    # The running cell stays clean; no stream message anywhere carries the routed text.
    assert "cell B runs" in b.stdout
    for needle in ("worker: line", "worker warning", "worker failed"):
        assert needle not in b.text
        assert needle not in kernel.streams()
    # nbcoord's one-line notice of the failure, in the next cell, is still there.
    assert "nbcoord: thread 'worker' started by cell" in kernel.run("pass").stderr
    # The snapshot section links the thread to its output.
    rows = kernel.evaluate("_router.section()['outputs']")
    (row,) = rows
    count = a.reply["content"]["execution_count"]
    assert row["cell"] == count
    assert row["display_id"] is not None
    (thread,) = row["threads"]
    assert thread["name"] == "worker" and thread["cell"] == count and thread["failed"] is True
    assert thread["lines"] >= 4 and thread["tid"].startswith("t")


def stream_text_by_parent(kernel: Kernel) -> dict[str, str]:
    """Every stream message's text, joined by the request it was sent under."""
    found: dict[str, str] = {}
    for msg in kernel.messages:
        if msg["msg_type"] == "stream":
            parent = msg["parent_header"].get("msg_id", "")
            found[parent] = found.get(parent, "") + msg["content"]["text"]
    return found


@IPYKERNEL6
def test_ipykernel6_routes_a_cells_threads_itself_and_nbcoord_leaves_it(own_kernel: Kernel) -> None:
    kernel = own_kernel
    a_id = kernel.submit(WORKER)
    assert kernel.collect(a_id).status == "ok"
    b = kernel.run('print("cell B runs"); go.set(); t.join(10); sys.stderr.flush(); sys.stdout.flush()')
    by_parent = wait_until(
        lambda: kernel.pump() or ("RuntimeError: worker failed" in stream_text_by_parent(kernel).get(a_id, "")
                                  and stream_text_by_parent(kernel)),
        20, 0.05, "the worker's text and traceback under cell A, as ipykernel 6 sends them",
    )
    assert "worker: line 1\nworker: line 2\n" in by_parent[a_id]
    assert "UserWarning: worker warning" in by_parent[a_id]
    assert areas(kernel) == {}, "nbcoord moved text that ipykernel 6 routes itself"
    assert "cell B runs" in b.stdout and "worker:" not in b.text


LATE_NEWLINE = """
done = threading.Event()
def late_newline():
    sys.stdout.write("text while its cell runs")
    sys.stdout.flush()
    while _ext.host.registry.current_cell() is not None:  # until the cell has ended, before any other request
        time.sleep(0.001)
    sys.stdout.write("\\n")
    sys.stdout.flush()
    done.set()
threading.Thread(target=late_newline).start()
"""


@ROUTING
def test_text_written_after_its_cell_ended_but_before_another_request_stays_with_the_kernel(own_kernel: Kernel) -> None:
    # ipykernel sends it under the latest request, still the thread's own cell: the stream that cell showed
    # (ipykernel's test_print_to_correct_cell_from_thread[none] lost a print's newline, written just after the cell).
    kernel = own_kernel
    a_id = kernel.submit(LATE_NEWLINE)
    assert kernel.collect(a_id).status == "ok"
    wait_until(
        lambda: kernel.pump() or stream_text_by_parent(kernel).get(a_id) == "text while its cell runs\n",
        10, 0.05, "the newline under the thread's own cell",
    )
    assert kernel.evaluate("done.wait(10)") is True
    assert areas(kernel) == {}


@ROUTING
def test_what_a_cells_threads_wrote_goes_out_before_the_cells_reply(own_kernel: Kernel) -> None:
    # The second line comes within the area's update interval of the first: not sent at once. It must still be out
    # before cell B's reply, not a second later under whichever request comes next.
    kernel = own_kernel
    kernel.run("""
go = threading.Event()
def two_lines():
    go.wait(30)
    print("first line", flush=True)
    print("second line", flush=True)
t = threading.Thread(target=two_lines)
t.start()""")
    kernel.run("go.set(); t.join(10)")
    (area,) = areas(kernel).values()  # what arrived up to B's idle status, nothing read since
    assert "first line\nsecond line" in area["text"]


EXPLICIT_PARENT = """
parent = get_ipython().get_parent()
step, done = threading.Event(), threading.Event()
def worker():
    token = get_ipython().set_thread_parent(parent)
    print("own parent, while its cell runs", flush=True)
    step.wait(30); step.clear()
    print("own parent, after its cell", flush=True)
    get_ipython().reset_thread_parent(token)
    done.set()
    step.wait(30)
    print("parent reset", flush=True)
t = threading.Thread(target=worker)
t.start()
"""


@IPYKERNEL7
def test_a_thread_that_sets_its_own_parent_is_left_to_the_kernel(own_kernel: Kernel) -> None:
    kernel = own_kernel  # set_thread_parent: ipykernel 7.4 (7.3, the last for Python 3.10, has only set_parent)
    a_id = kernel.submit(EXPLICIT_PARENT)
    assert kernel.collect(a_id).status == "ok"
    b_id = kernel.submit("step.set(); done.wait(10)")
    kernel.collect(b_id)
    c_id = kernel.submit("step.set(); t.join(10); sys.stdout.flush()")
    kernel.collect(c_id)
    by_parent = wait_until(
        lambda: kernel.pump() or ("parent reset" in stream_text_by_parent(kernel).get(c_id, "")
                                  and stream_text_by_parent(kernel)),
        20, 0.05, "the text after the reset, under the cell that runs (ipykernel 7's own routing)",
    )
    assert by_parent[a_id] == "own parent, while its cell runs\nown parent, after its cell\n"
    assert b_id not in by_parent
    assert by_parent[c_id] == "parent reset\n"
    assert areas(kernel) == {}, "nbcoord moved text whose parent the thread set"


@IPYKERNEL7
def test_a_flood_is_bounded(own_kernel: Kernel) -> None:
    kernel = own_kernel
    kernel.run("""
go = threading.Event()
def flood():
    go.wait(30)
    for i in range(5000):
        print(f"line {i}")
    print("no newline at the end", end="")
t = threading.Thread(target=flood, name="flood")
t.start()""")
    kernel.run("go.set(); t.join(30)")
    _, area = wait_for_area(kernel, "line 4999", "no newline at the end")
    lines = area["text"].split("\n")
    assert lines[1] == (
        "... 4,800 earlier line(s) not shown (nbcoord keeps the last 200 lines per cell: NBCoord.output_lines)"
    )
    assert lines[2] == "line 4800" and lines[-2] == "line 4999" and lines[-1] == "no newline at the end"
    assert len(lines) == 2 + 200 + 1
    # However fast the thread wrote, the front end got a few updates, not 5000 lines.
    assert area["updates"] < 20
    assert "line 4999" not in kernel.streams()
    (row,) = kernel.evaluate("_router.section()['outputs']")
    assert (row["lines"], row["shown"], row["hidden"]) == (5000, 200, 4800)
    assert row["last_lines"] == ["line 4997", "line 4998", "line 4999"]


@IPYKERNEL7
def test_carriage_returns_and_long_lines(own_kernel: Kernel) -> None:
    kernel = own_kernel
    kernel.run("""
go = threading.Event()
def progress():
    go.wait(30)
    for i in range(101):
        print(f"\\rprogress {i}%", end="", file=sys.stderr)
    print(file=sys.stderr)
    print("x" * 5000)
t = threading.Thread(target=progress, name="progress")
t.start()""")
    kernel.run("go.set(); t.join(30)")
    _, area = wait_for_area(kernel, "progress 100%", "more characters not shown")
    lines = area["text"].split("\n")
    assert lines[1:] == ["progress 100%", "x" * 2000 + "... [3,000 more characters not shown]"]


@IPYKERNEL7
def test_setting_off_leaves_output_to_the_kernel(own_kernel: Kernel) -> None:
    kernel = own_kernel
    kernel.run("""
set_routing(False)
go = threading.Event()
def late():
    go.wait(30)
    print("late line", flush=True)
t = threading.Thread(target=late)
t.start()""")
    b = kernel.run("go.set(); t.join(10); sys.stdout.flush()")
    assert "late line" in b.stdout  # ipykernel 7's own routing: the latest request
    kernel.pump()
    assert areas(kernel) == {}
    kernel.run("set_routing(True)")


@IPYKERNEL7
def test_a_rerun_cell_gets_the_output_of_its_earlier_run(own_kernel: Kernel) -> None:
    kernel = own_kernel
    code = """
if "gates" not in globals():
    gates = []
gate = threading.Event()
gates.append(gate)
def waiter(gate=gate, run=len(gates)):
    gate.wait(30)
    print(f"from run {run}", flush=True)
threading.Thread(target=waiter, name=f"waiter-{len(gates)}").start()"""
    first = kernel.collect(kernel.submit(code, cell_id="cell-x"))
    second_id = kernel.submit(code, cell_id="cell-x")
    second = kernel.collect(second_id)
    kernel.run("gates[0].set()")
    _, area = wait_for_area(kernel, "from run 1")
    assert area["parent"] == second_id, "the area is in the rerun: the first run's output is gone from the page"
    first_count = first.reply["content"]["execution_count"]
    assert area["text"].startswith(
        f"nbcoord: output of thread 'waiter-1' started by an earlier run of this cell ([{first_count}]):"
    )
    (row,) = kernel.evaluate("_router.section()['outputs']")
    assert row["cell"] == second.reply["content"]["execution_count"] and row["cell_id"] == "cell-x"
    kernel.run("gates[1].set()")
    wait_for_area(kernel, "from run 1", "from run 2")


KERNELS_OWN_WRITE = """
def kernels_own_write(stream):
    # Below IPython 9's per-cell wrapper (if any), the stream's write is the kernel's OutStream.write again.
    write = stream.__dict__.get("write", stream.write)
    while getattr(write, "__qualname__", "") == "InteractiveShell._tee.<locals>.write":
        write = dict(zip(write.__code__.co_freevars, write.__closure__))["original_write"].cell_contents
    return getattr(write, "__func__", None) is type(stream).write
"""


def test_unload_removes_the_route(own_kernel: Kernel) -> None:
    kernel = own_kernel
    kernel.run(KERNELS_OWN_WRITE)
    assert kernel.evaluate("[kernels_own_write(sys.stdout), kernels_own_write(sys.stderr)]") == [False, False]
    kernel.run("""
go = threading.Event()
def after_unload():
    go.wait(30)
    print("after unload", flush=True)
t = threading.Thread(target=after_unload)
t.start()
%unload_ext nbcoord""")
    assert kernel.evaluate(
        "[kernels_own_write(sys.stdout), kernels_own_write(sys.stderr), threading.excepthook is _hook_before_nbcoord]"
    ) == [True, True, True]
    kernel.run("go.set(); t.join(10); sys.stdout.flush()")
    # The kernel's own routing again: a plain stream (ipykernel 7: under the running cell; 6: the starting one).
    wait_until(lambda: kernel.pump() or "after unload" in kernel.streams(), 10, 0.05, "the plain stream")
    assert areas(kernel) == {}


@IPYKERNEL7
def test_inert_in_a_forked_child(own_kernel: Kernel) -> None:
    result = own_kernel.run("""
r, w = os.pipe()
def forker():
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps([_router._routing, _router._active]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
t = threading.Thread(target=forker)
t.start(); t.join(10)
print("child:", os.read(r, 100).decode(), "parent:", json.dumps([_router._routing, _router._active]))""")
    assert re.search(r"child: \[false, false\] parent: \[true, true\]", result.stdout), result.stdout


@IPYKERNEL7
def test_a_failure_inside_the_route_never_loses_the_text(own_kernel: Kernel) -> None:
    kernel = own_kernel
    kernel.run("""
def broken(*args, **kwargs):
    raise RuntimeError("the route broke")
_router._route = broken
go = threading.Event()
def writer():
    go.wait(30)
    print("still delivered", flush=True)
t = threading.Thread(target=writer)
t.start()""")
    b = kernel.run("go.set(); t.join(10); sys.stdout.flush()")
    assert "still delivered" in b.stdout  # the kernel's own route: nothing lost
    assert "the route broke" not in kernel.streams()  # nbcoord's failure is logged to the kernel's stderr only
    kernel.run("del _router._route")
