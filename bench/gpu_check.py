"""The GPU part of output-and-memory (issue 14), for a person to run on a machine with an NVIDIA GPU.

    python bench/gpu_check.py [--device 0] [--gib 1.0]

Needs: an NVIDIA driver, ``nvidia-ml-py`` (the ``gpu`` extra) and a CUDA build of PyTorch in the interpreter that
runs this script (the kernel runs on the same one, with this checkout's nbcoord first on its path). It starts a real
kernel through jupyter_client and checks, with the real NVML and real CUDA tensors:

1. the memory ledger names the cell that took GPU memory: ``cell [N]: +X GiB on GPU d, still held``;
2. a failed cell whose frame holds a CUDA tensor keeps it (PyTorch's allocator says so), and ``reclaim`` gives it back:
   PyTorch's allocated memory drops by the tensor's size, ``torch.cuda.empty_cache()`` returns the cached blocks (its
   reserved memory drops), and NVML shows this process's memory on the device drop by about as much;
3. after ``del`` and another reclaim, the ledger says the first cell's memory was given back;
4. the report lists the remaining CUDA tensor by name with device ``cuda:d``, and says PyTorch's CUDA context stays.

NVML's per-process figures are not visible in some containers (no host PID namespace): the script then says so and
checks PyTorch's allocator figures only. It prints every figure, one PASS/FAIL line per check, and exits 1 if any
check failed. Written where no GPU was lent (the issue's machine): not yet run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kernels import kernel_env, kernel_manager

GiB = 2**30

SETUP = """%load_ext nbcoord
import json, gc, time
import torch
import nbcoord
from nbcoord.resources import memory as _memory
from nbcoord.resources import reclaim as _reclaim
_ext = nbcoord._extension
if getattr(_ext, "memory", None) is None:  # before the wiring: install the ledger here
    _ext.host.add_undo(_memory.install(_ext).uninstall)
DEVICE = torch.device("cuda", {device})
torch.zeros(1, device=DEVICE)  # the CUDA context: from here on, what nbcoord reads is ours
def reclaim(outputs=False):
    api = getattr(nbcoord, "reclaim", None)
    report = api(outputs=outputs) if api else _reclaim.reclaim(_ext, outputs=outputs)
    print(report["text"])
    return report
def ledger():
    return {{row["cell"]: row for row in nbcoord.snapshot()["cell_memory"]}}
"""


class Kernel:
    def __init__(self, workdir: str) -> None:
        self.km = kernel_manager(workdir)
        self.km.start_kernel(env=kernel_env(IPYTHONDIR=workdir), cwd=workdir)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, *, allow_error: bool = False) -> tuple[int, str]:
        out: list[str] = []

        def keep(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.kc.execute_interactive(code, timeout=300, output_hook=keep)
        if reply["content"]["status"] != "ok" and not allow_error:
            raise RuntimeError(f"cell failed: {reply['content']}\n{''.join(out)}")
        return int(reply["content"].get("execution_count") or 0), "".join(out)

    def value(self, expression: str) -> Any:
        _, text = self.run(f"import json; print('@@' + json.dumps({expression}))")
        return json.loads(text.rpartition("@@")[2])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self.km.cleanup_resources()


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {what}" + (f"  ({detail})" if detail else ""))
        self.failed += not ok


def wait_for(kernel: Kernel, expression: str, timeout: float = 30.0) -> Any:
    """The value of ``expression`` in the kernel once truthy (polling: NVML is read about once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        value = kernel.value(expression)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def device_figures(report: dict[str, Any], index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    def pick(figures: dict[str, Any]) -> dict[str, Any]:
        return next((d for d in figures["gpu"] if d["index"] == index), {})

    return pick(report["before"]), pick(report["after"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=int, default=0, help="the CUDA device to use (its NVML index must match)")
    parser.add_argument("--gib", type=float, default=1.0, help="size of each test tensor, GiB")
    args = parser.parse_args()
    size = int(args.gib * GiB)
    elements = size // 4
    checks = Checks()
    print(f"nbcoord GPU check: python {sys.version.split()[0]}, CUDA device {args.device}, tensors of {args.gib} GiB")
    with tempfile.TemporaryDirectory(prefix="nbcoord-gpu-check-") as workdir:
        kernel = Kernel(workdir)
        try:
            if not kernel.value("__import__('torch').cuda.is_available()"):
                print("no CUDA device for PyTorch here: this check needs a GPU machine and a CUDA build of PyTorch")
                return 2
            kernel.run(SETUP.format(device=args.device))
            print(kernel.value("{'torch': torch.__version__, 'cuda': torch.version.cuda, "
                               "'device': torch.cuda.get_device_name(DEVICE)}"))
            gpu = wait_for(kernel, "(nbcoord.snapshot()['resources'] or {}).get('gpu')")
            print("NVML:", json.dumps(gpu, indent=1))
            devices = {d["index"]: d for d in (gpu or {}).get("devices", [])}
            visible = bool(devices.get(args.device, {}).get("process_visible"))
            checks.check(args.device in devices, "NVML lists the device", (gpu or {}).get("reason") or "")
            if not visible:
                print(f"note: NVML does not show this process on device {args.device} here (a container without the "
                      "host's PID namespace?): the NVML checks below are left out, PyTorch's figures remain.")

            # 1. The ledger names the cell that keeps GPU memory.
            take, _ = kernel.run(f"kept = torch.ones({elements}, device=DEVICE); torch.cuda.synchronize()")
            if visible:
                row = wait_for(kernel, f"[r for r in [ledger().get({take})] if r and r['gpu_after'] is not None]")
                row = row[0] if row else {}
                print("ledger row:", json.dumps(row, indent=1))
                dev = next((d for d in row.get("gpu_devices", []) if d["index"] == args.device), {})
                grew = (dev.get("after") or 0) - (dev.get("before") or 0)
                checks.check(grew >= 0.9 * size, "the ledger sees the cell's GPU growth", f"{grew / GiB:.2f} GiB")
                checks.check(row.get("gpu_held") is True and "still held" in row.get("summary", ""),
                             "the ledger says it is still held", row.get("summary", ""))

            # 2. A failed cell's CUDA tensor, kept by the traceback, given back by reclaim.
            kernel.run(
                "def step():\n"
                f"    activations = torch.ones({elements}, device=DEVICE)\n"
                "    torch.cuda.synchronize()\n"
                "    raise ValueError('loss is NaN')\n"
                "step()",
                allow_error=True,
            )
            held = kernel.value("torch.cuda.memory_allocated(DEVICE)")
            checks.check(held >= 1.9 * size, "the failed cell's tensor is still allocated", f"{held / GiB:.2f} GiB")
            kernel.run("_report = reclaim()")
            report = kernel.value("{k: v for k, v in _report.items() if k != 'text'}")
            print(kernel.value("_report['text']"))
            before, after = device_figures(report, args.device)
            freed_alloc = (before.get("torch_allocated") or 0) - (after.get("torch_allocated") or 0)
            freed_reserved = (before.get("torch_reserved") or 0) - (after.get("torch_reserved") or 0)
            checks.check(
                freed_alloc >= 0.9 * size, "PyTorch's allocated memory dropped", f"{freed_alloc / GiB:.2f} GiB"
            )
            checks.check(freed_reserved >= 0.9 * size, "empty_cache() returned the cached blocks",
                         f"reserved dropped {freed_reserved / GiB:.2f} GiB")
            ran = any(a["framework"] == "PyTorch" and "empty_cache" in a["action"] for a in report["frameworks"])
            checks.check(ran, "the report says empty_cache() ran")
            if visible:
                freed_nvml = (before.get("process_used") or 0) - (after.get("process_used") or 0)
                checks.check(freed_nvml >= 0.9 * size, "NVML: this process's memory on the device dropped",
                             f"{freed_nvml / GiB:.2f} GiB")
            listed = {row["name"]: row for row in report["largest"]}
            checks.check(listed.get("kept", {}).get("device") == f"cuda:{args.device}",
                         "the remaining CUDA tensor is listed by name and device", json.dumps(listed.get("kept")))
            checks.check(any(a["framework"] == "PyTorch" and a["note"] for a in report["frameworks"]),
                         "the report says PyTorch's CUDA context stays until exit")

            # 3. del, reclaim: the ledger's first row is given back.
            kernel.run("del kept; gc.collect(); _report = reclaim()")
            if visible:
                row = wait_for(kernel, f"[r for r in [ledger().get({take})] if r and not r['gpu_held']]")
                row = row[0] if row else {}
                checks.check("given back" in row.get("summary", ""), "the ledger says the memory was given back",
                             row.get("summary", ""))
        finally:
            kernel.close()
    print(f"{checks.failed} check(s) failed" if checks.failed else "all checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
