"""The demo notebooks, executed end to end with nbclient, as a user would run them top to bottom.

Every notebook under ``notebooks/`` runs in a fresh kernel on this interpreter, one at a time. A notebook fails if a
cell raises unless that cell is tagged ``raises-exception`` (the interrupted and failing cells the scenarios are
about), if any error output appears in an untagged cell, or if its outputs lack what its first markdown cell
promises (``EXPECTED``) or show what must not happen (``FORBIDDEN``). The executed copies are written to
``test-artifacts/notebooks/`` for reading after a failure.

A second test checks that the committed notebooks carry no outputs and no execution counts.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from helpers import kernel_manager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat import NotebookNode

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))

#: nbclient's limit for one cell; every demo notebook runs in well under a minute in total.
CELL_TIMEOUT_S = 60
ALLOW_ERROR_TAG = "raises-exception"

#: What each notebook must show, as (regular expression, what it means), searched in all its outputs together.
EXPECTED: dict[str, list[tuple[str, str]]] = {
    "00-quickstart": [
        (r"\[display application/vnd\.jupyter\.widget-view\+json\]", "the panel is displayed as a widget"),
        (r"started 3 workers", "the workers started"),
        (r"Cell \[\d+\] \(ok\): import threading\n(.*\n)*?\s+t\d+\s+worker-0", "%nbcoord lists workers by cell"),
        (r"cell \[\d+\] was interrupted and left 1 thread\(s\) running: poller", "zombie announced"),
        (r"poller \| running \| ZOMBIE: cell \[\d+\] interrupted", "%nbcoord zombies names the poller"),
        (r"stopped 3 thread\(s\), 1 still alive", "stop_all stops the workers and reports the poller"),
        (r"still alive: poller \(started by cell \[\d+\]\): ignored the stop request at ", "why the poller lives"),
        (r"stopped: poller \(t\d+\) \[forced\]", "the forced stop ends the poller"),
        (r"ERROR KeyboardInterrupt", "the interrupted cell ends with KeyboardInterrupt"),
    ],
    "01-empty-queue-hang": [
        (r"start_queue_runners started 0 threads", "the slip"),
        (r"(?m)^nbcoord: .*\binput\b", "the blocked run's sentence names the queue"),
        (r"queue 'input': 0 of 100 elements, open", "the queue's fill level while blocked"),
        (r"the blocked sess\.run ended \d{1,3} ms after Interrupt was pressed", "Interrupt ends the run at once"),
        (r"ERROR KeyboardInterrupt", "the interrupted cell ends with KeyboardInterrupt"),
        (r"----> 3 sess\.run\(dequeue\)  # blocks[^\n]*\n\nKeyboardInterrupt: nbcoord cancelled",
         "the traceback ends at the blocked run, the cell's last frame"),
        (r"enqueued 42\.0, dequeued 42\.0", "session and queue still usable"),
        (r"stopped and joined 2 runner threads; session closed", "the fix works"),
    ],
    "02-with-session-trap": [
        (r"2 runner threads started; a batch:", "runners started inside the block"),
        (r"QueueRunnerThread-numbers-\S+ \|.*owner: ", "runner threads shown with their owners"),
        (r"numbers: \d+ of 10 \(open", "the queue's fill level"),
        (r"after the with block: 0 runner threads alive", "closing the session stopped its runners"),
        (r"threads in the kernel before: (\d+), after three more runs: \1\b", "no thread piles up"),
    ],
    "03-join-without-stop": [
        (r"cell \[\d+\] was interrupted and left 2 thread\(s\) running", "both runners named"),
        (r"nbcoord stop \(all\): 2 stopped, 0 still alive", "%nbcoord stop rescues the runners"),
        (r"runner threads still running: \[\]", "no runner thread left"),
        (r"Stop all: \d+ thread\(s\) stopped in \d+ ms, 0 still alive", "Stop all while the cell is busy"),
        (r"joined 2 runner threads and closed the session", "the cell's finally block completes"),
    ],
    "04-coordinator-pattern": [
        (r"QueueRunnerThread-examples-\S+ \|.*owner: ", "runner threads shown with their owners"),
        (r"examples: \d+ of 8 \(open", "the queue's fill level"),
        (r"coord\.join returned in \d+ ms; threads alive: 0", "the coordinator pattern stops everything"),
    ],
    "05-an-exception-in-one-thread": [
        (r"ERROR ValueError: worker-2: corrupt record at step 5", "coord.join re-raises the worker's exception"),
        (r"worker-2 \(started by cell \[\d+\]\) raised ValueError:\nTraceback", "failure kept with its traceback"),
        (r"last failure: shard-loader \(started by cell \[\d+\]\): FileNotFoundError", "plain thread failure kept"),
        (r"nbcoord: thread 'shard-loader' started by cell \[\d+\] failed", "failure announced under the next cell"),
        (r"stop requested: True", "request_stop(ValueError(...)) requests the stop"),
        (r"ERROR ValueError: validation loss is NaN", "join re-raises it"),
    ],
    "06-two-queues-fill-levels": [
        (r"filenames \[#+\.*\] +\d+/32 +examples \[#+\.*\] +\d+/64", "fill levels printed as bars"),
        (r"average fill: filenames (9\d|100)%, examples ([89]\d|100)%", "phase 1: both queues full"),
        (r"average fill: filenames (9\d|100)%, examples ([0-9]|[1-3]\d)%", "phase 2: examples run empty"),
        (r"in [\d.]+/s, out [\d.]+/s", "%nbcoord shows enqueue and dequeue rates"),
        (r"ERROR FloatingPointError: loss is NaN at step 30", "coord.join re-raises the loop's error"),
        (r"runner threads alive: 0", "all runners stopped together"),
        (r"filenames: \d+ of 32 \(closed", "the filename queue is closed"),
        (r"examples: \d+ of 64 \(closed", "the example queue is closed"),
    ],
    "07-leak-hunting": [
        (r"QueueRunnerThread-batches_1-\S+ +daemon=False", "threading.enumerate() shows the leaks"),
        (r"QueueRunnerThread-batches-\S+ \|.*owner: ", "%nbcoord names the owners"),
        (r"batches: \d+ of 16", "the forgotten queue's fill level"),
        (r"batches_1: \d+ of 16", "the current queue's fill level"),
        (r"nbcoord stop \(cell\): 2 stopped, 0 still alive", "the first run's runners stopped by cell"),
        (r"nbcoord stop \(all\): 4 stopped, 0 still alive", "the rest stopped"),
        (r"leaked threads left: \[\]", "no leak left"),
    ],
    "08-stuck-thread": [
        (r"stuck workers: \['worker-2'\]", "the stuck worker, and only it, found by its idle time"),
        (r"stopped the group's 5 threads in \d+ ms(.*\n)*?stopped the group's 5 threads", "group stopped twice"),
        (r"stuck workers: none", "after the restart every worker is active"),
    ],
    "09-restart-frees-the-gpu": [
        (r"reference: the kernel process ended [\d.]+ s .*exit status 0: it exited by itself", "reference"),
        (r"without nbcoord: the kernel process ended [\d.]+ s .*exit status -15: killed by SIGTERM", "baseline"),
        (r"with nbcoord: the kernel process ended [\d.]+ s .*exit status 0: it exited by itself", "prompt exit"),
    ],
    "10-eager-queues": [
        (r"queue 'input' \(eager\): 3 of 10 elements, created by cell \[\d+\]", "the eager queue is registered"),
        (r"input: 3 of 10 \(open", "%nbcoord shows its fill level"),
        (
            r"nbcoord: MainThread blocked [\d.]+ s in dequeue of eager queue `input` \(0 of 10 elements, no live "
            r"producer\)",
            "the blocked call explained",
        ),
        (r"the blocked dequeue ended 0\.\d\d s after Interrupt was pressed", "Interrupt ends it at once"),
        (
            r"ERROR KeyboardInterrupt: nbcoord cancelled the dequeue: .*Eager queue `input` is now closed",
            "KeyboardInterrupt and one sentence",
        ),
        (
            r"nbcoord: eager queue `input` was closed .*by nbcoord, when Interrupt ended the blocked call in cell "
            r"\[\d+\]",
            "the later error explained",
        ),
        (
            r"Blocked: producer blocked [\d.]+ s in enqueue of eager queue `full` \(2 of 2 elements, no thread "
            r"dequeuing\)",
            "the blocked producer explained",
        ),
        (r"nbcoord stop \(all\): 1 stopped, 0 still alive", "the stop ends the producer"),
        (r"producer alive: False", "no producer left"),
        (r"failures reported: \[\]", "stopped, not failed"),
    ],
    "11-stuck-pipeline": [
        # Two runner threads fill `examples`, in an order that changes from run to run: which records a batch
        # holds is not the point, that two steps ran before the failure is.
        (r"step 0: batch \[\d+\.0, \d+\.0\]\nstep 1: batch \[\d+\.0, \d+\.0\]", "training ran before the failure"),
        (
            r"nbcoord: dequeue_many\(2\) of queue `examples` timed out: it held 0 of 20 elements, and 2 runner "
            r"threads feed it \(2 stuck",
            "the deadline explained",
        ),
        (
            r"nbcoord: QueueRunnerThread-examples-examples_enqueue is stuck: no enqueue for [\d.]+ s while queue "
            r"`examples` had room; it waits in dequeue of queue `raw` \(0 of 10 elements, no live producer\)",
            "stuck runners and what they wait on",
        ),
        (r"session s\d+: 2 stuck runner threads; restartable: True", "the session can be restarted"),
        (
            r"thread 'QueueRunnerThread-raw-raw_enqueue' started by cell \[\d+\] failed: UnknownError: "
            r"FileNotFoundError",
            "the reader's failure announced",
        ),
        (
            r"nbcoord restart of session s\d+: 2 stopped, 0 still alive; 2 QueueRunner\(s\) restarted with 5 "
            r"thread\(s\)",
            "the restart report",
        ),
        (r"trained 5 more steps after the restart", "the pipeline flows again"),
        (r"runner threads alive: \[\]", "everything stopped at the end"),
    ],
    "12-tasks-on-the-event-loop": [
        (
            r"task-\d+  asyncio task Task-\d+: poll_forever\(\) \| waiting \| cell \[\d+\] \| ZOMBIE: cell \[\d+\] "
            r"interrupted \| waits at cell \[\d+\], line \d+ in poll_forever",
            "the pollers listed with cell, reason and line",
        ),
        (
            r"task-\d+  asyncio task Task-\d+: stubborn\(\) \| waiting \| cell \[\d+\] \| ZOMBIE: cell \[\d+\] "
            r"interrupted",
            "the stubborn task listed",
        ),
        (r"cancel requested: it ends once this cell returns", "the stop in a cell says when the cancellation happens"),
        (r"tasks still running: \['stubborn'\]", "only the task that swallows CancelledError is left"),
        (
            r"stopped=False; swallowed the CancelledError \(or is still cleaning up\); it waits at cell \[\d+\], "
            r"line \d+ in stubborn",
            "the stop from another thread names it, with its line",
        ),
        (r"tasks left: \[\]", "no task left"),
        (r"ERROR KeyboardInterrupt", "the interrupted cell ends with KeyboardInterrupt"),
    ],
    "13-worker-pools": [
        (r"worker processes: 12", "twelve workers outlive the interrupted cells"),
        (
            r"pool-\d+  multiprocessing\.Pool, 4 workers \| running \| cell \[\d+\] \| ZOMBIE: cell \[\d+\] "
            r"interrupted \| processes \d+, \d+, \d+, \d+",
            "the Pool listed",
        ),
        (
            r"concurrent\.futures\.ProcessPoolExecutor, 4 workers \| running \| cell \[\d+\] \| ZOMBIE: cell "
            r"\[\d+\] interrupted",
            "the executor listed",
        ),
        (
            r"joblib's reusable loky executor, 4 workers \| running \| cell \[\d+\] \| ZOMBIE: cell \[\d+\] "
            r"interrupted",
            "loky's executor listed",
        ),
        (r"process \d+ \| \w+ \| cell \[\d+\] \| processes \d+ \| Pool worker \d of 4, pool-\d+", "workers named"),
        (
            r"stopped: multiprocessing\.Pool, 4 workers \(pool-\d+\): terminate\(\) took \d+ ms",
            "the Pool terminated",
        ),
        (
            r"stopped: concurrent\.futures\.ProcessPoolExecutor, 4 workers \(pool-\d+\): "
            r"shutdown\(cancel_futures=True\) took \d+ ms; 4 worker\(s\) got SIGTERM",
            "the executor shut down, its busy workers terminated",
        ),
        (
            r"stopped: joblib's reusable loky executor, 4 workers \(pool-\d+\): shutdown\(kill_workers=True\) took "
            r"\d+ ms",
            "loky's executor shut down with its workers",
        ),
        (r"worker processes left: \[\]", "no worker left"),
    ],
    "14-dataloader-workers": [
        (r"DataLoader workers: 4", "four workers outlive the interrupted loop"),
        (
            r"loader-\d+  DataLoader iterator over Images, 4 workers \(persistent\) \| running \| cell \[\d+\] \| "
            r"ZOMBIE: cell \[\d+\] interrupted",
            "the iterator listed",
        ),
        (r"DataLoader worker \d of 4 of cell \[\d+\], loader-\d+", "each worker named"),
        (
            r"stopped: DataLoader iterator over Images, 4 workers \(persistent\) \(loader-\d+\): PyTorch's worker "
            r"shutdown took \d+ ms",
            "PyTorch's own shutdown",
        ),
        (r"DataLoader workers left: \[\]", "no worker left"),
        (r"ERROR KeyboardInterrupt", "the interrupted loop ends with KeyboardInterrupt"),
    ],
    "15-output-and-memory": [
        (r"trainer started; it reports in the background", "the trainer started"),
        (r"evaluating something else\ndone evaluating", "the running cell shows only its own output"),
        (
            r"nbcoord: thread 'trainer' started by cell \[(\d+)\] failed: RuntimeError: validation set missing\. "
            r"Its traceback is under cell \[\1\]",
            "the failure announced, with where its traceback went",
        ),
        (r"cell \[\d+\]: \d+ line\(s\) from trainer \(t\d+, failed\); last: RuntimeError: validation set missing",
         "%nbcoord links the thread to its output"),
        (r"trainer \(t\d+\): \d+ lines under cell \[\d+\]", "the snapshot links the thread to its output"),
        (r"10,000 lines written, 200 shown, 9,800 not shown", "the flood is bounded"),
        (r"ERROR ValueError: loss is NaN", "the training step fails"),
        (r"cell \[(\d+)\]: \+5\d\d\.\d MiB host, still held", "the ledger names the cell that keeps the memory"),
        (r"IPython's last exception, ValueError: loss is NaN from cell \[\d+\]", "reclaim drops the last exception"),
        (r"nbcoord reclaim: host memory \(RSS\) .*: gave back (4[89]\d|5\d\d)\.\d MiB", "512 MiB given back"),
        (r"Out\[\d+\] +torch\.Tensor +cpu +256\.0 MiB +\(67108864,\) float32 \[output cache\]",
         "what the output cache still holds, by name"),
        (r"the output cache: 1 value\(s\)", "--outputs drops the output cache"),
        (r"gave back (2[3-6]\d)\.\d MiB", "the displayed tensor's 256 MiB given back"),
        (r"cell \[\d+\]: \+5\d\d\.\d MiB host, given back", "the ledger sees the memory given back"),
    ],
}

#: What no notebook may show: errors nbcoord exists to prevent, and nbcoord's own failures.
FORBIDDEN_EVERYWHERE = [
    (r"MISMATCH", "a KeyboardInterrupt replaced by pybind11's MISMATCH error"),
    (r"nbcoord: (snapshot source|stopper|an unload step|\w+ hook failed|monitor task|could not)", "nbcoord failed"),
    (r"stopper \S+ failed", "a stopper failed"),
]
FORBIDDEN: dict[str, list[tuple[str, str]]] = {
    "01-empty-queue-hang": [
        (r"nbcoord/tensorflow/", "nbcoord's own frame in the traceback"),
        (r"Interrupt did not reach", "Interrupt did not end the blocked run"),
        (r"nbcoord reported no blocked run", "no diagnosis"),
    ],
    "02-with-session-trap": [
        (r"Session has been closed|Run call was cancelled|was cancelled", "runners outlived their session"),
        (r"Exception in QueueRunner|Exception in thread", "a runner failed"),
        (r"Thread failures:", "a thread failed"),
    ],
    "03-join-without-stop": [
        (r"the stop left runners alive", "the stop did not stop the runners"),
        (r"STILL ALIVE", "a thread survived a stop"),
        (r"Exception in QueueRunner|Exception in thread", "a runner failed"),
    ],
    "05-an-exception-in-one-thread": [
        (r"TypeError", "TensorFlow's request_stop bug was not worked around"),
        (r"nbcoord has no record", "the coordinator's exception was not kept"),
    ],
    "06-two-queues-fill-levels": [(r"no queues reported", "no fill levels")],
    "07-leak-hunting": [(r"STILL ALIVE", "a thread survived a stop")],
    "10-eager-queues": [
        (r"Interrupt did not reach", "Interrupt did not end the call"),
        (r"STILL ALIVE", "a thread survived a stop"),
    ],
    "11-stuck-pipeline": [
        (r"STILL ALIVE", "a thread survived the restart"),
        (r"NOT reopened", "a queue was left closed"),
    ],
    "12-tasks-on-the-event-loop": [
        (r"Task was destroyed but it is pending", "a task lost"),
        (r"Task exception was never retrieved", "a task's error lost"),
    ],
    "13-worker-pools": [(r"STILL ALIVE", "something survived the stop")],
    "14-dataloader-workers": [
        (r"STILL ALIVE", "something survived the stop"),
        (r"exited unexpectedly", "PyTorch's SIGCHLD check raised"),
    ],
    "15-output-and-memory": [
        (r"epoch \d: loss", "the trainer's lines landed in a running cell"),
        (r"the learning-rate schedule ended early", "the trainer's warning landed in a running cell"),
        (r"Exception in thread trainer", "the trainer's traceback landed in a running cell"),
        (r"flood line \d+", "the flood landed in a running cell"),
    ],
}

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def uses_tensorflow(path: Path) -> bool:
    return "import tensorflow" in path.read_text()


def notebook_params() -> Iterator[object]:
    for path in NOTEBOOKS:
        marks = [pytest.mark.tensorflow] if uses_tensorflow(path) else []
        yield pytest.param(path, marks=marks, id=path.stem)


def demo_python() -> str:
    """The interpreter the notebooks run on: the demo's environment, nbcoord with the ``demo`` extra alone as
    ``tools/dev.py demo`` installs it (``$NBCOORD_DEMO_PYTHON``, which ``tools/dev.py test`` sets, else
    ``.venv-demo`` when it exists), so that a notebook needing a package only the test extra brings fails here;
    this interpreter where neither is there."""
    configured = os.environ.get("NBCOORD_DEMO_PYTHON")
    if configured:
        return configured
    built = ROOT / ".venv-demo" / "bin" / "python"
    return str(built) if built.exists() else sys.executable


def execute(path: Path, tmp_path: Path) -> NotebookNode:
    """Run the notebook top to bottom in a fresh kernel; the executed copy is kept under test-artifacts/."""
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"), PYTHONUNBUFFERED="1")
    client = NotebookClient(
        nb,
        km=kernel_manager(demo_python(), tmp_path),
        timeout=CELL_TIMEOUT_S,
        startup_timeout=60,
        allow_errors=False,  # nbclient still lets cells tagged raises-exception fail
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(env=env)  # the kernel starts in tmp_path (resources' path)
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell raised outside a {ALLOW_ERROR_TAG} cell:\n{ANSI.sub('', str(exc))[-3000:]}")
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / path.name)
    return nb


def output_text(output: NotebookNode) -> str:
    """One output as text: streams as printed, errors as ``ERROR name: value``, displays by their mime types."""
    kind = output.output_type
    if kind == "stream":
        return str(output.text)
    if kind == "error":
        return f"ERROR {output.ename}: {output.evalue}\n" + "\n".join(output.traceback)
    data = output.get("data", {})
    parts = [f"[display {mime}]" for mime in sorted(data)]
    return "\n".join([*parts, str(data.get("text/plain", ""))])


def all_output(nb: NotebookNode) -> str:
    texts = [output_text(out) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    return ANSI.sub("", "\n".join(texts))


def unexpected_errors(nb: NotebookNode) -> list[str]:
    """Error outputs in cells not tagged raises-exception."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or ALLOW_ERROR_TAG in cell.metadata.get("tags", []):
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                found.append(f"cell {index} ({cell.source.splitlines()[0]!r}): {out.ename}: {out.evalue}")
    return found


@pytest.mark.notebooks
@pytest.mark.kernel
@pytest.mark.parametrize("path", list(notebook_params()))
def test_notebook_runs_and_shows_what_it_promises(path: Path, tmp_path: Path) -> None:
    nb = execute(path, tmp_path)
    assert not unexpected_errors(nb), unexpected_errors(nb)
    text = all_output(nb)
    missing = [what for pattern, what in EXPECTED.get(path.stem, []) if not re.search(pattern, text)]
    seen = [what for pattern, what in FORBIDDEN_EVERYWHERE + FORBIDDEN.get(path.stem, []) if re.search(pattern, text)]
    assert not missing and not seen, (
        f"{path.name}: missing {missing}; shows {seen}. Executed copy: {ARTIFACTS / path.name}"
    )


def test_every_notebook_has_expectations() -> None:
    assert {p.stem for p in NOTEBOOKS} == set(EXPECTED), "a notebook was added or removed without updating EXPECTED"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_is_clean(path: Path) -> None:
    """No outputs, no execution counts or run metadata, a python3 kernel, and a first cell that says what to expect."""
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    assert nb.cells and nb.cells[0].cell_type == "markdown", "the first cell must say what the user will see"
    assert "What you will see" in nb.cells[0].source
    assert set(nb.metadata) <= {"kernelspec", "language_info"}, f"notebook metadata from a run: {set(nb.metadata)}"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {index} has outputs"
            assert cell.execution_count is None, f"cell {index} has an execution count"
            assert set(cell.metadata) <= {"tags"}, f"cell {index} has metadata from a run: {set(cell.metadata)}"
        else:
            assert "tags" not in cell.metadata, f"cell {index}: only code cells are tagged"


def test_notebooks_are_numbered_without_gaps_and_titled_by_what_they_show() -> None:
    """One situation per notebook: the files are numbered 00, 01, ... without a gap; each title starts with its
    notebook's number and says what it shows, and no two titles are alike (scenario numbers such as "S8" are not
    titles: two notebooks were both "S8")."""
    numbers = [path.stem[:2] for path in NOTEBOOKS]
    assert numbers == [f"{n:02d}" for n in range(len(NOTEBOOKS))], numbers
    titles = {}
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=nbformat.NO_CONVERT).cells[0].source.splitlines()[0]
        match = re.fullmatch(r"# (\d\d) · (.{10,})", first)
        assert match and match.group(1) == path.stem[:2], f"{path.name}: title {first!r}"
        assert not re.search(r"\bS\d+\b", match.group(2)), f"{path.name}: a scenario number as title: {first!r}"
        titles[path.name] = match.group(2).lower()
    assert len(set(titles.values())) == len(titles), titles
