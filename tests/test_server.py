"""The server extension end to end: a real Jupyter server with several real kernels, Prometheus, Chromium.

One server for the module (``server_support``), with these kernels, all started through the sessions API:

zombie    ipykernel 7, nbcoord loaded, a failed cell left a thread running; FAKE NVML says it holds 1 GiB of GPU
busy      ipykernel 7, nbcoord loaded, its main thread busy in a long cell for the whole module
plain     ipykernel 7 without nbcoord, a hostile notebook name, one child process holding GPU memory (FAKE NVML)
ik6       ipykernel 6, nbcoord loaded
profile   nbcoord loaded by IPython's own configuration (``c.InteractiveShellApp.extensions``), no cell run
gil       ipykernel 7, nbcoord loaded; a test makes it hold the GIL in a C call

The server runs with ``KernelManager.autorestart=False`` (a killed kernel stays dead, so that a test sees it dead),
``NBCoordServer.absent_recheck=0`` (kernels load nbcoord after the server first sees them) and a 1 s page interval.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's Chromium)
from helpers import wait_until
from prometheus_client.parser import text_string_to_metric_families
from server_support import (
    IK6_KERNEL,
    PROFILE_KERNEL,
    PROMETHEUS,
    Attached,
    FleetServer,
    fleet_server_running,
    prometheus_config,
    prometheus_running,
)

pytestmark = pytest.mark.kernel

GIB = 2**30
HOSTILE = '<img src=x onerror="window.__pwned=1">&amp;<b>bold</b>.ipynb'
ROW_KEYS = {
    "id", "name", "path", "execution_state", "last_activity", "connections", "pid", "rss", "gpu",
    "worker_processes", "status", "error", "answer_ms", "nbcoord", "attention",
}  # fmt: skip
#: The README's example alert rule (``for: 10m``): GPU memory held by a kernel with zombie threads.
ALERT_RULE = """\
groups:
  - name: nbcoord
    rules:
      - alert: KernelHoldsGpuWithZombieThreads
        expr: >
          sum by (instance, kernel_id, notebook) (nbcoord_kernel_gpu_memory_bytes) > 0
          and on (instance, kernel_id, notebook) nbcoord_kernel_zombie_threads > 0
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: "{{ $labels.notebook }} has held GPU memory with zombie threads for 10 minutes"
          description: "Stop them from the server's /nbcoord/ page, or with %nbcoord stop --zombies."
"""
LEAVE_ZOMBIE = """\
import threading, time, nbcoord
def _cooperative():
    while not nbcoord.should_stop():
        time.sleep(0.01)
threading.Thread(target=_cooperative, name={name!r}, daemon=True).start()
raise RuntimeError("this cell failed and left a thread running")
"""


@dataclass
class Fleet:
    server: FleetServer
    kernels: dict[str, Attached]
    ids: dict[str, str]
    pids: dict[str, int]
    worker_pid: int

    def row(self, name: str, view: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.server.row(self.ids[name], view)


def leave_zombie(kernel: Attached, name: str) -> int:
    """Run a failing cell that leaves a cooperative thread behind; returns the cell's execution count."""
    reply = kernel.run(LEAVE_ZOMBIE.format(name=name), allow_error=True)
    assert reply["content"]["status"] == "error"
    return int(reply["content"]["execution_count"])


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    args = ("--KernelManager.autorestart=False", "--NBCoordServer.absent_recheck=0",
            "--NBCoordServer.page_interval=1")  # fmt: skip
    with fleet_server_running(*args) as server:
        specs = {"zombie": "python3", "busy": "python3", "plain": "python3", "ik6": IK6_KERNEL,
                 "profile": PROFILE_KERNEL, "gil": "python3"}  # fmt: skip
        paths = {name: f"{name}.ipynb" for name in specs} | {"plain": HOSTILE}
        ids = {name: server.start(paths[name], kernel) for name, kernel in specs.items()}
        kernels = {name: server.attach(kernel_id) for name, kernel_id in ids.items()}
        pids = {name: server.kernel_pid(kernel) for name, kernel in kernels.items()}
        for name in ("zombie", "busy", "ik6", "gil"):
            kernels[name].run("%load_ext nbcoord")
        leave_zombie(kernels["zombie"], "zombie-loop")
        worker_pid = int(kernels["plain"].evaluate(
            "(globals().__setitem__('_worker', __import__('subprocess').Popen([__import__('sys').executable, '-c', "
            "'import time; time.sleep(600)'])), _worker.pid)[1]"
        ))  # fmt: skip
        server.set_gpu({pids["zombie"]: GIB, worker_pid: GIB // 2})
        kernels["busy"].submit("import time\nfor _ in range(6000):\n    time.sleep(0.1)")
        try:
            yield Fleet(server, kernels, ids, pids, worker_pid)
        finally:
            os.kill(worker_pid, signal.SIGKILL)


def rows_by_name(fleet: Fleet, view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    by_id = {row["id"]: row for row in view["kernels"]}
    return {name: by_id[kernel_id] for name, kernel_id in fleet.ids.items() if kernel_id in by_id}


# ------------------------------------------------------------------------------------------------------ the view
def test_the_config_file_enables_the_extension(fleet: Fleet) -> None:
    # The server was started without naming the extension: the JSON file in jupyter_server_config.d did it.
    assert "nbcoord.server | extension was successfully loaded" in fleet.server.log.read_text()
    assert fleet.server.view()["schema"] == 1


def test_every_kernel_in_one_view_with_what_needs_attention_first(fleet: Fleet) -> None:
    view = fleet.server.view()
    rows = rows_by_name(fleet, view)
    assert set(rows) == set(fleet.ids)
    for row in view["kernels"]:
        assert set(row) == ROW_KEYS, row

    zombie = rows["zombie"]
    assert zombie["status"] == "ok", zombie
    assert zombie["path"] == "zombie.ipynb"
    assert zombie["pid"] == fleet.pids["zombie"]
    assert zombie["nbcoord"]["zombies"] == 1
    assert zombie["nbcoord"]["zombie_reasons"] == {"cell-error": 1}
    assert [c["zombies"] for c in zombie["nbcoord"]["cells"]] == [1]
    assert zombie["gpu"] == [{"index": 0, "bytes": GIB, "workers_bytes": 0}]
    assert zombie["attention"] == ["zombies", "gpu"]
    assert view["kernels"][0]["id"] == fleet.ids["zombie"], "zombies holding GPU memory come first"

    busy = rows["busy"]
    assert busy["status"] == "ok", "a kernel answers while its main thread runs a cell"
    assert busy["execution_state"] == "busy"
    assert busy["nbcoord"]["running_cell"] is not None

    plain = rows["plain"]
    assert plain["status"] == "no-nbcoord"
    assert plain["nbcoord"] is None
    assert plain["path"] == HOSTILE
    assert plain["pid"] == fleet.pids["plain"]
    assert plain["rss"] > 10 * 2**20
    assert plain["worker_processes"] == 1
    assert plain["gpu"] == [{"index": 0, "bytes": 0, "workers_bytes": GIB // 2}], "GPU by pid, without nbcoord"
    assert plain["attention"] == ["gpu"]

    assert rows["ik6"]["status"] == "ok", rows["ik6"]
    assert rows["profile"]["status"] == "ok", "IPython's own configuration loads nbcoord in every kernel"
    assert rows["profile"]["nbcoord"]["threads"] == 0
    assert view["gpu"]["available"] is True
    assert [d["name"] for d in view["gpu"]["devices"]] == ["NVIDIA Fake GPU"]


def test_a_kernel_holding_the_gil_is_shown_not_answering_and_never_stalls_the_others(fleet: Fleet) -> None:
    gil = fleet.kernels["gil"]
    # libc's sleep through ctypes.PyDLL keeps the GIL for the whole call: no thread of the kernel can answer.
    msg_id = gil.submit("import ctypes\nctypes.PyDLL(None).sleep(4)")

    def frozen() -> dict[str, Any] | None:
        view = fleet.server.view()
        return view if fleet.row("gil", view)["status"] == "not-answering" else None

    view = wait_until(frozen, timeout=15, interval=0.2, what="the GIL-holding kernel to show as not answering")
    rows = rows_by_name(fleet, view)
    assert "stuck" in rows["gil"]["attention"]
    assert "no answer within" in rows["gil"]["error"]
    for name in ("zombie", "busy", "ik6", "profile"):
        assert rows[name]["status"] == "ok", f"{name} answered in the same view: {rows[name]}"
    gil.reply(msg_id)
    last: list[dict[str, Any]] = []

    def answers() -> bool:
        last[:] = [fleet.row("gil")]
        return bool(last[0]["status"] == "ok")

    try:
        wait_until(answers, timeout=15, interval=0.2, what="the kernel to answer again")
    except AssertionError as error:
        raise AssertionError(f"{error}; last: {last}") from None


def test_the_servers_requests_are_not_user_activity(fleet: Fleet) -> None:
    def model(name: str) -> dict[str, Any]:
        kernel_model: dict[str, Any] = fleet.server.api("GET", f"/api/kernels/{fleet.ids[name]}")
        return kernel_model

    idle_before = model("zombie")
    busy_before = model("busy")
    assert idle_before["execution_state"] == "idle"
    assert busy_before["execution_state"] == "busy"
    for _ in range(3):
        fleet.server.view()
        fleet.server.request("GET", "/nbcoord/metrics")
    idle_after, busy_after = model("zombie"), model("busy")
    # Idle culling reads last_activity; front ends read the busy/idle state: a scrape must move neither.
    assert idle_after["last_activity"] == idle_before["last_activity"]
    assert idle_after["execution_state"] == "idle"
    assert busy_after["execution_state"] == "busy"


# --------------------------------------------------------------------------------------------------- metrics
def metric_samples(text: str) -> list[Any]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def test_metrics_in_the_text_exposition_format_with_bounded_labels(fleet: Fleet) -> None:
    status, headers, body = fleet.server.request("GET", "/nbcoord/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = metric_samples(body.decode())
    zombie_id, plain_id = fleet.ids["zombie"], fleet.ids["plain"]

    def value(name: str, kernel_id: str, **labels: str) -> float | None:
        for sample in samples:
            if sample.name == name and sample.labels.get("kernel_id") == kernel_id and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
        return None

    assert value("nbcoord_kernel_zombie_threads", zombie_id) == 1
    assert value("nbcoord_kernel_gpu_memory_bytes", zombie_id, gpu="0") == GIB
    assert value("nbcoord_kernel_threads", zombie_id, state="running") is not None
    assert (value("nbcoord_kernel_rss_bytes", plain_id) or 0) > 0
    assert value("nbcoord_kernel_worker_gpu_memory_bytes", plain_id, gpu="0") == GIB // 2
    assert value("nbcoord_kernel_zombie_threads", plain_id) is None, "no nbcoord there: nothing from inside"
    assert value("nbcoord_kernel_info", plain_id, notebook=HOSTILE, status="no-nbcoord") == 1
    allowed = {"kernel_id", "notebook", "kernel_name", "status", "state", "gpu", "queue"}
    assert {label for sample in samples for label in sample.labels} <= allowed, "no per-thread labels"

    status, headers, body = fleet.server.request(
        "GET", "/nbcoord/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.decode().rstrip().endswith("# EOF")


@pytest.mark.skipif(not PROMETHEUS.exists(), reason=f"no Prometheus at {PROMETHEUS} (apt-get install prometheus)")
def test_prometheus_scrapes_the_server_and_promql_finds_the_kernel(fleet: Fleet, tmp_path: Path) -> None:
    rules = tmp_path / "nbcoord-rules.yml"
    rules.write_text(ALERT_RULE)
    promtool = PROMETHEUS.with_name("promtool")
    if promtool.exists():
        checked = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True,
                                 timeout=60, check=False)  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
    with prometheus_running(prometheus_config(fleet.server, rules)) as prometheus:
        up = wait_until(
            lambda: [t for t in prometheus.targets() if t["health"] == "up"],
            timeout=60, interval=0.2, what="Prometheus to scrape /nbcoord/metrics",
        )  # fmt: skip
        assert up[0]["scrapeUrl"].endswith("/nbcoord/metrics")
        zombie_id = fleet.ids["zombie"]
        query = f'nbcoord_kernel_zombie_threads{{kernel_id="{zombie_id}"}}'
        result = wait_until(lambda: prometheus.query(query), timeout=30, interval=0.2, what=query)
        assert len(result) == 1
        assert result[0]["metric"]["notebook"] == "zombie.ipynb"
        assert result[0]["value"][1] == "1"
        # The README's alert expression picks that kernel, and no other.
        expression = ALERT_RULE.split("expr: >\n", 1)[1].split("for:", 1)[0]
        alerting = prometheus.query(" ".join(expression.split()))
        assert [r["metric"]["kernel_id"] for r in alerting] == [zombie_id]


# ------------------------------------------------------------------------------------------------------ stops
def test_stop_the_zombies_from_outside(fleet: Fleet) -> None:
    zombie_id = fleet.ids["zombie"]
    if fleet.row("zombie")["nbcoord"]["zombies"] == 0:
        leave_zombie(fleet.kernels["zombie"], "zombie-loop")
    answer = fleet.server.api("POST", f"/nbcoord/api/kernels/{zombie_id}/stop", {"scope": "zombies", "grace": 5})
    report = answer["report"]
    assert answer["kernel_id"] == zombie_id
    assert [row["name"] for row in report["stopped"]] == ["zombie-loop"]
    assert report["alive"] == []
    row = fleet.row("zombie")
    assert row["nbcoord"]["zombies"] == 0
    assert row["nbcoord"]["last_stop"]["scope"] == "zombies"
    assert row["nbcoord"]["last_stop"]["stopped"] == 1
    assert "zombies" not in row["attention"]


def test_stop_one_cell_from_outside_on_ipykernel_6(fleet: Fleet) -> None:
    kernel = fleet.kernels["ik6"]
    first = leave_zombie(kernel, "first-cell")
    second = leave_zombie(kernel, "second-cell")
    answer = fleet.server.api(
        "POST", f"/nbcoord/api/kernels/{fleet.ids['ik6']}/stop", {"scope": "cell", "cell": first, "grace": 5}
    )
    assert [row["name"] for row in answer["report"]["stopped"]] == ["first-cell"]
    cells = fleet.row("ik6")["nbcoord"]["cells"]
    assert [c["cell"] for c in cells] == [second]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{bad", "the body must be JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"scope": "everything"}', '"scope" must be one of'),
        (b'{"scope": "all", "evil": 1}', "unknown field(s): evil"),
        (b'{"scope": "cell"}', '"cell" must be'),
        (b'{"scope": "zombies", "cell": 3}', '"cell" is only allowed'),
        (b'{"scope": "all", "grace": -1}', '"grace" must be between'),
        (b'{"scope": "all", "grace": "1"}', '"grace" must be a number'),
        (b'{"scope": "all", "force": "yes"}', '"force" must be true or false'),
        (b'{"scope": "cell", "cell": 9999}', "no cell [9999]"),
    ],
)
def test_a_malformed_stop_is_refused_with_a_message(fleet: Fleet, body: bytes, message: str) -> None:
    status, _headers, raw = fleet.server.request("POST", f"/nbcoord/api/kernels/{fleet.ids['profile']}/stop",
                                                 raw=body)  # fmt: skip
    assert status == 400, raw
    assert message in json.loads(raw)["message"]


def test_unknown_kernels_404_and_kernels_without_nbcoord_409(fleet: Fleet) -> None:
    for kernel_id in ("not-a-kernel", "00000000-0000-0000-0000-000000000000"):
        status, _headers, raw = fleet.server.request("POST", f"/nbcoord/api/kernels/{kernel_id}/stop",
                                                     {"scope": "all"})  # fmt: skip
        assert status == 404, raw
    status, _headers, raw = fleet.server.request(
        "POST", f"/nbcoord/api/kernels/{fleet.ids['plain']}/stop", {"scope": "all"}
    )
    assert status == 409, raw
    assert "nbcoord is not loaded" in json.loads(raw)["message"]
    assert "%load_ext nbcoord" in json.loads(raw)["message"]


def test_unauthenticated_and_cross_site_requests_are_refused(fleet: Fleet) -> None:
    server = fleet.server
    stop_path = f"/nbcoord/api/kernels/{fleet.ids['profile']}/stop"
    assert server.request("GET", "/nbcoord/api/kernels", token=False)[0] == 403
    assert server.request("POST", stop_path, {"scope": "all"}, token=False)[0] == 403
    assert server.request("GET", "/nbcoord/metrics", token=False)[0] == 403
    wrong = {"Authorization": "token wrong"}
    assert server.request("GET", "/nbcoord/api/kernels", token=False, headers=wrong)[0] == 403
    status, headers, _ = server.request("GET", "/nbcoord/", token=False, follow=False)
    assert status == 302
    assert "/login" in headers["Location"]
    assert server.request("HEAD", "/nbcoord/", token=False, follow=False)[0] in (302, 403)
    assert server.request("HEAD", "/nbcoord/")[0] == 200, "the panel's check that the page is there"

    # A browser holding the login cookie: without the XSRF token, or from another origin, a POST is refused.
    cookies = server.login_cookies()
    assert "_xsrf" in cookies
    cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
    same_origin = {"Cookie": cookie, "Origin": server.url, "Referer": f"{server.url}/nbcoord/"}
    assert server.request("POST", stop_path, {"scope": "all"}, token=False, headers=same_origin)[0] == 403
    foreign = {**same_origin, "Origin": "http://evil.example", "X-XSRFToken": cookies["_xsrf"]}
    assert server.request("POST", stop_path, {"scope": "all"}, token=False, headers=foreign)[0] == 403
    allowed = {**same_origin, "X-XSRFToken": cookies["_xsrf"]}
    status, _headers, raw = server.request("POST", stop_path, {"scope": "all"}, token=False, headers=allowed)
    assert status == 200, raw


def test_a_kernel_that_dies_during_a_stop_gives_a_clear_error_and_shows_dead(fleet: Fleet, tmp_path: Path) -> None:
    server = fleet.server
    kernel_id = server.start("doomed.ipynb")
    kernel = server.attach(kernel_id)
    pid = server.kernel_pid(kernel)
    marker = tmp_path / "asked"
    kernel.run("%load_ext nbcoord")
    kernel.run(
        "import threading, time, pathlib, nbcoord\n"
        "def _stubborn():\n"
        "    while not nbcoord.should_stop():\n"
        "        time.sleep(0.01)\n"
        f"    pathlib.Path({str(marker)!r}).write_text('asked')\n"
        "    while True:\n"
        "        time.sleep(0.01)\n"
        "threading.Thread(target=_stubborn, name='stubborn', daemon=True).start()\n"
    )
    outcome: dict[str, Any] = {}

    def post() -> None:
        outcome["answer"] = server.request("POST", f"/nbcoord/api/kernels/{kernel_id}/stop",
                                           {"scope": "all", "grace": 20})  # fmt: skip

    poster = threading.Thread(target=post)
    poster.start()
    wait_until(marker.exists, timeout=30, what="the stop to reach the kernel")
    os.kill(pid, signal.SIGKILL)
    poster.join(30)
    status, _headers, raw = outcome["answer"]
    assert status == 502, raw
    assert "died during the request" in json.loads(raw)["message"]

    row = fleet.server.row(kernel_id)
    assert row["status"] == "dead"
    assert row["attention"] == ["dead"]
    assert row["rss"] is None
    assert row["error"] == "the kernel process is not running"
    others = rows_by_name(fleet, fleet.server.view())
    assert others["zombie"]["status"] == "ok", "a dead kernel does not keep the others from answering"
    session = next(s for s in server.api("GET", "/api/sessions") if s["kernel"]["id"] == kernel_id)
    server.request("DELETE", f"/api/sessions/{session['id']}")


# ------------------------------------------------------------------------------------------------------ the page
@pytest.mark.browser
def test_the_page_lists_the_kernels_renders_names_as_text_and_stops_zombies(fleet: Fleet, browser: Any) -> None:  # noqa: F811
    server = fleet.server
    kernel = fleet.kernels["zombie"]
    if fleet.row("zombie")["nbcoord"]["zombies"] == 0:
        leave_zombie(kernel, "zombie-loop")
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    # Count the page's refreshes, to wait for one without a fixed sleep.
    page.add_init_script("window.__fetches = 0; const f = window.fetch; "
                         "window.fetch = (...a) => { window.__fetches++; return f(...a); };")  # fmt: skip
    try:
        page.goto(f"{server.url}/nbcoord/?token={urllib.parse.quote(server.token)}")
        rows = page.locator("tr[data-kernel-id]")
        wait_until(lambda: rows.count() >= len(fleet.ids), timeout=20, what="a row per kernel")
        zombie_row = page.locator(f"tr[data-kernel-id='{fleet.ids['zombie']}']")
        assert rows.first.get_attribute("data-kernel-id") == fleet.ids["zombie"], "what needs attention first"
        # The page draws what its refreshes read: wait for the row's chips rather than read them once.
        zombie_row.locator(".nbf-chip.zombies").first.wait_for(timeout=20000)
        zombie_row.locator(".nbf-chip.gpu").first.wait_for(timeout=20000)
        assert zombie_row.locator(".nbf-chip.gpu").first.text_content() == "GPU held"

        # The hostile notebook name is text: no element made of it, no script run.
        plain_row = page.locator(f"tr[data-kernel-id='{fleet.ids['plain']}']")
        assert plain_row.locator(".nbf-path").text_content() == HOSTILE
        assert page.locator("main img, main b").count() == 0
        assert page.evaluate("window.__pwned") is None

        # Keyed updates: a refresh keeps the row elements it finds.
        page.evaluate(f"document.querySelector(\"tr[data-kernel-id='{fleet.ids['plain']}']\").__kept = true")
        seen = page.evaluate("window.__fetches")
        page.wait_for_function(f"window.__fetches >= {seen + 2}", timeout=15000)
        assert page.evaluate(f"document.querySelector(\"tr[data-kernel-id='{fleet.ids['plain']}']\").__kept") is True

        zombie_row.get_by_role("button", name="Stop zombies").click()
        zombie_row.locator(".nbf-result", has_text="Stopped 1 thread").wait_for(timeout=20000)
        zombie_row.locator(".nbf-chip.zombies").first.wait_for(state="detached", timeout=20000)
        assert fleet.row("zombie")["nbcoord"]["zombies"] == 0
        assert not problems, problems
    finally:
        context.close()


def test_recent_views_are_shared_by_polls_and_never_by_other_requests(fleet: Fleet) -> None:
    """``?recent=1`` (the JupyterLab extension's periodic polls): a view collected less than a second ago answers;
    without it, every request is collected afresh; a bad flag is refused with a sentence."""
    server = fleet.server
    for _ in range(5):  # a pair of polls well within the second (a loaded machine may stall one)
        first = server.api("GET", "/nbcoord/api/kernels?recent=1")
        answered = time.monotonic()
        again = server.api("GET", "/nbcoord/api/kernels?recent=1")
        if time.monotonic() - answered < 0.5:
            break
    assert again["taken_at"] == first["taken_at"]
    fresh = server.api("GET", "/nbcoord/api/kernels")
    assert fresh["taken_at"] > first["taken_at"]
    status, _headers, body = server.request("GET", "/nbcoord/api/kernels?recent=maybe")
    assert status == 400 and '"recent" must be given once, as 1 or 0' in json.loads(body)["message"]
