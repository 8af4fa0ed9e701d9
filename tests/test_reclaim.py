"""``reclaim`` (nbcoord/resources/reclaim.py) in a real kernel with PyTorch (CPU build) and NumPy.

Host memory is real and measured: a failed cell's traceback keeps a 256 MiB tensor alive through its frame, and
reclaim must give back at least 200 MiB of RSS. GPU figures come from tests/fake_nvml.py, a FAKE of nvidia-ml-py's
``pynvml`` behind the same interface (this machine has no GPU), put in ``sys.modules["pynvml"]`` before nbcoord
loads. bench/gpu_check.py does the same with real CUDA tensors on a GPU machine.

Until the lead wires ``%nbcoord reclaim`` and ``nbcoord.reclaim``, the cells call ``_reclaim.reclaim`` directly
(:data:`RECLAIM`): once wired, ``nbcoord.reclaim(outputs=...)`` is the same call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import Kernel, KernelOptions

from nbcoord.resources.reclaim import JAX_NOTE, release_frameworks
from nbcoord.tensorflow import memory as tensorflow_memory
from nbcoord.tensorflow.memory import TF_HOLDS_GPU

pytest.importorskip("torch")

MiB, GiB = 2**20, 2**30
TESTS = Path(__file__).resolve().parent

SETUP = f"""import os, sys, gc, json, threading
sys.path.insert(0, {str(TESTS)!r})
import fake_nvml
fake_nvml.reset([fake_nvml.FakeDevice(processes=[fake_nvml.FakeProcess(os.getpid(), 3 * 2**30)])])
sys.modules["pynvml"] = fake_nvml  # the FAKE NVML, where the probe imports the real one
"""

#: After ``%load_ext nbcoord`` (the kernel's :class:`helpers.KernelOptions` runs :data:`SETUP`, the load, then this).
AFTER_LOAD = """import numpy as np
import torch
import nbcoord
from nbcoord.resources import reclaim as _reclaim
def reclaim(outputs=False):
    report = getattr(nbcoord, "reclaim", None)  # once wired: nbcoord.reclaim(outputs=...)
    report = report(outputs=outputs) if report else nbcoord._extension.reclaim(outputs=outputs)
    print(report["text"])
    print("@@" + json.dumps({k: v for k, v in report.items() if k != "text"}))
"""

#: The module's kernel (conftest's ``kernel``): the fake NVML in place, nbcoord loaded, PyTorch imported.
KERNEL_OPTIONS = [KernelOptions(setup=SETUP, after=AFTER_LOAD)]


def reclaimed(kernel: Kernel, outputs: bool = False) -> tuple[dict[str, Any], str]:
    result = kernel.run(f"reclaim(outputs={outputs})")
    text, _, data = result.stdout.rpartition("@@")
    return json.loads(data), text


@pytest.mark.kernel
def test_a_failed_cells_tensor_is_given_back(kernel: Kernel) -> None:
    kernel.run("kept = 42")
    failed = kernel.run(
        "def train_step():\n"
        "    activations = torch.ones(64 * 2**20)  # 256 MiB, kept alive by the traceback\n"
        "    raise ValueError('loss is NaN')\n"
        "train_step()",
        allow_error=True,
    )
    count = failed.reply["content"]["execution_count"]
    assert kernel.evaluate("hasattr(sys, 'last_value')")
    report, text = reclaimed(kernel)
    assert report["rss_freed"] >= 200 * MiB, text
    assert report["dropped"][0].startswith(f"IPython's last exception, ValueError: loss is NaN from cell [{count}]")
    assert text.startswith("nbcoord reclaim: host memory (RSS) ")
    assert "gave back 2" in text.splitlines()[0]
    # What stays: the user's namespace, untouched; IPython's last exception is gone.
    assert kernel.evaluate("[kept, hasattr(sys, 'last_value'), hasattr(sys, 'last_traceback')]") == [42, False, False]
    # A second reclaim has nothing left to drop.
    again, _ = reclaimed(kernel)
    assert again["dropped"] == []


@pytest.mark.kernel
def test_the_output_cache_only_when_asked(kernel: Kernel) -> None:
    shown = kernel.run("torch.ones(32 * 2**20)  # 128 MiB, kept by Out and _")
    count = shown.reply["content"]["execution_count"]
    kernel.run("pass")
    report, text = reclaimed(kernel)
    held = {row["name"]: row for row in report["largest"]}
    assert held[f"Out[{count}]"]["held_by"] == "output cache"
    assert held[f"Out[{count}]"]["bytes"] == 128 * MiB
    assert "%nbcoord reclaim --outputs drops it" in text
    assert report["rss_freed"] < 64 * MiB
    report, text = reclaimed(kernel, outputs=True)
    assert any(what.startswith("the output cache: ") for what in report["dropped"]), text
    assert report["rss_freed"] >= 100 * MiB, text
    assert kernel.evaluate("[len(Out), _ == '']") == [0, True]
    assert not any(row["held_by"] == "output cache" for row in report["largest"])


@pytest.mark.kernel
def test_the_largest_objects_by_name(kernel: Kernel) -> None:
    kernel.run("""
weights = np.ones((1024, 1024))            # 8 MiB
alias = weights                             # the same memory
rows_view = weights[:512]                   # a view: 4 MiB of the same memory
t = torch.ones(4 * 2**20)                   # 16 MiB
layer = torch.nn.Linear(2048, 1024)         # 8 MiB of parameters
batch = [torch.ones(2**20) for _ in range(4)]  # 16 MiB in a list
small = np.ones(10)""")
    report, text = reclaimed(kernel)
    held = {row["name"]: row for row in report["largest"]}
    assert held["t"]["type"] == "torch.Tensor" and held["t"]["device"] == "cpu" and held["t"]["bytes"] == 16 * MiB
    assert held["t"]["shape"] == "(4194304,)" and held["t"]["dtype"] == "float32"
    assert held["batch"]["type"] == "list of 4 torch.Tensor" and held["batch"]["bytes"] == 16 * MiB
    assert held["layer"]["type"] == "torch.nn.Module (Linear)" and held["layer"]["bytes"] == 2048 * 1024 * 4 + 4096
    assert held["weights"]["type"] == "numpy.ndarray" and held["weights"]["bytes"] == 8 * MiB
    shared = {held["weights"]["shares_memory_with"], held["alias"]["shares_memory_with"]}
    assert shared == {None, "weights"} or shared == {None, "alias"}
    assert held["rows_view"]["shares_memory_with"] in ("weights", "alias")
    assert "small" not in held
    assert [row["bytes"] for row in report["largest"]] == sorted((r["bytes"] for r in report["largest"]), reverse=True)
    assert "Still held (largest first; `del` a name to give its memory back):" in text
    kernel.run("del weights, alias, rows_view, t, layer, batch, small")


@pytest.mark.kernel
def test_gpu_figures_per_device(kernel: Kernel) -> None:
    report, text = reclaimed(kernel)
    (before,) = report["before"]["gpu"]
    assert before["index"] == 0 and before["name"] == "NVIDIA Fake GPU"
    assert before["process_used"] == 3 * GiB and before["process_visible"]
    assert before["torch_reserved"] is None  # PyTorch has not used CUDA: nothing asked, no context started
    assert report["gpu_freed"] == [{"index": 0, "bytes": 0}]
    assert "GPU 0 (NVIDIA Fake GPU): this process 3.0 GiB -> 3.0 GiB: gave back 0 B." in text
    torch = {"framework": "PyTorch", "action": "nothing cached on a GPU: it has not used CUDA in this process",
             "note": None}
    assert torch in report["frameworks"]
    assert "  - PyTorch: nothing cached on a GPU: it has not used CUDA in this process" in text
    assert kernel.evaluate("torch.cuda.is_initialized()") is False


@pytest.mark.kernel
def test_only_on_the_main_thread(kernel: Kernel) -> None:
    result = kernel.run("""
errors = []
def other():
    try:
        _reclaim.reclaim(nbcoord._extension.host, nbcoord._extension.probe)
    except RuntimeError as exc:
        errors.append(str(exc))
t = threading.Thread(target=other); t.start(); t.join()
print(errors)""")
    assert "reclaim runs on the kernel's main thread" in result.stdout


@pytest.fixture
def tensorflow_part() -> Iterator[None]:
    """TensorFlow's memory hooks registered, as the wiring registers them once TensorFlow is imported."""
    remove = tensorflow_memory.register()
    yield
    remove()


@pytest.mark.usefixtures("tensorflow_part")
def test_frameworks_that_keep_memory_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only membership in sys.modules is asked of TensorFlow and JAX: empty modules stand in for them.
    monkeypatch.setitem(sys.modules, "tensorflow", ModuleType("tensorflow"))
    monkeypatch.setitem(sys.modules, "jax", ModuleType("jax"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    actions = {a["framework"]: a for a in release_frameworks(TF_HOLDS_GPU)}
    assert actions["TensorFlow"] == {"framework": "TensorFlow", "action": "", "note": TF_HOLDS_GPU}
    assert actions["JAX"]["note"] == JAX_NOTE
    assert actions["glibc"]["action"].startswith("malloc_trim(0)")
    without_gpu = {a["framework"]: a for a in release_frameworks(None)}
    assert without_gpu["TensorFlow"]["note"] == "TensorFlow has no public call that gives its allocator's memory back."


@pytest.mark.kernel
@pytest.mark.tensorflow
@pytest.mark.parametrize("own_kernel", [KernelOptions()], indirect=True)  # no fake NVML, no PyTorch
def test_tensorflow_tensors_are_measured_once_tensorflow_is_imported(own_kernel: Kernel) -> None:
    # TensorFlow's part plugs in when the user imports TensorFlow (nbcoord.tensorflow.memory, wired at load):
    # without it a tensor is not measured at all, and the GPU figures lack the allocator's note.
    own_kernel.run("import nbcoord\nimport tensorflow as tf\nbig = tf.ones((4, 1024, 1024))")
    held = own_kernel.evaluate("{row['name']: (row['type'], row['bytes']) for row in nbcoord.reclaim()['largest']}")
    assert held["big"] == ["tensorflow EagerTensor", 16 * MiB], held
