"""The panel's protocol, fuzzed: a real kernel (ipykernel 7, the shell-channel route) gets what a hostile front end
can send, and must stay quiet, answer at once, and answer every click it acknowledged.

What is sent (fixed values, no randomness; every loop bounded):

- every field of every command type (``type``, ``click_id``, ``scope``, ``cell``, ``tid``, ``force``,
  ``interrupt``, ``clicked_at``, ``session``, ``view_id``, ``action``, ``client_time``), each time in an otherwise
  valid command, set to each value of :data:`WRONG` that is wrong for it: null, booleans, 0, -1, 1.5, 10**400 and
  -10**400, +-1e308, NaN and +-Infinity (JSON's, which the kernel's reader takes), the empty string, a string of
  escapes, control and bidi characters, a lone surrogate, a 100,000-character string, lists (empty, of a valid
  value, 20,000 numbers, nested 400 deep), objects (empty, ``{"$ne": 1}``, 5,000 keys);
- those values as the whole command, and as unknown keys (a 100,000-character key, a key of control characters);
- floods of 300 clicks of each command type (stop, stack, view, restart, reclaim) and of malformed ones;
- a thread whose name is 100,000 characters with control and bidi characters, shown by the panel;
- ten different stops at once, more than may wait.

What is asserted: every malformed command is rejected and nothing acts; nothing reaches the running cell (a cell
that waits meanwhile prints exactly what it printed); the kernel answers ``1+1`` within 1 s after any flood
(measured from sending the request to its reply); a flood of reclaims runs one or two reclaims; every click the
kernel acknowledged gets an outcome; the kernel's log (its standard error, the server's log) has a few rejection
lines a minute at most, none longer than :data:`MAX_LOG_LINE`, no traceback and no raw control or bidi character;
the panel's state carries names cut to 200 characters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from panel_support import REPO, PanelKernel

from nbcoord.ui import commands as _panel_commands

pytestmark = pytest.mark.kernel

#: The longest log line a rejection may write (its reason and the content, each cut short).
MAX_LOG_LINE = 600
#: Seconds within which the kernel must answer ``1+1`` after a flood.
ANSWER_S = 1.0
FLOOD = 300
#: The longest name the panel's state carries (nbcoord.core.text.NAME_CHARS), the last character an ellipsis.
NAME_CHARS = 200


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


HOSTILE_TEXT = "\x1b[31m\r\n\x00\u202eexe.txt\u2066\u200b"
WRONG: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    10**400,
    -(10**400),
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    HOSTILE_TEXT,
    "\ud800",
    "x" * 100_000,
    [],
    ["all"],
    list(range(20_000)),
    _deep(400),
    {},
    {"$ne": 1},
    {f"k{i}": i for i in range(5_000)},
]

FUZZ_SETUP = """
import os
%nbcoord config grace_period=0.5
fuzz_threads = workers('fuzz', 2)
fuzz_tid = next(r['tid'] for r in nbcoord.snapshot()['threads'] if r['name'] == 'fuzz-0')
fuzz_cell = next(r['cell'] for r in nbcoord.snapshot()['threads'] if r['name'] == 'fuzz-0')
reclaim_runs = [0]
_real_reclaim = nbcoord._extension.reclaim
def _counted_reclaim(*, outputs=False):
    reclaim_runs[0] += 1
    return _real_reclaim(outputs=outputs)
nbcoord._extension.reclaim = _counted_reclaim
"""


@pytest.fixture(scope="module")
def fk() -> Iterator[PanelKernel]:
    kernel = PanelKernel("ipykernel7", sys.executable, log=True)
    try:
        assert kernel.route == "shell-channel"
        kernel.run(FUZZ_SETUP)
        yield kernel
    finally:
        kernel.close()


def _acceptable(field: str, value: Any) -> bool:
    """Values that are right for ``field`` (left out of its wrong ones)."""
    if field in ("force", "interrupt"):
        return isinstance(value, bool)
    if field in ("clicked_at", "client_time"):
        return value is None or (type(value) in (int, float) and 0 <= value <= 1e15)
    return False


def _malformed(tid: str, cell: int) -> list[Any]:
    """Every field of every command type, each wrong value in an otherwise valid command; then whole commands."""
    bases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({"type": "stop", "scope": "zombies"}, ("type", "click_id", "scope", "force", "interrupt", "clicked_at")),
        ({"type": "stop", "scope": "cell", "cell": cell}, ("cell",)),
        ({"type": "stop", "scope": "thread", "tid": tid}, ("tid",)),
        ({"type": "stack", "tid": tid}, ("tid", "clicked_at", "click_id")),
        ({"type": "view", "view_id": "fuzzview", "action": "alive"}, ("view_id", "action", "client_time", "click_id")),
        ({"type": "restart", "session": "sess-1"}, ("session", "clicked_at", "click_id")),
        ({"type": "reclaim"}, ("clicked_at", "click_id")),
    ]
    commands: list[Any] = []
    n = 0
    for base, fields in bases:
        for field in fields:
            for value in WRONG:
                if _acceptable(field, value):
                    continue
                n += 1
                commands.append({**base, "click_id": f"fuzz-{n}", field: value})
    commands.extend(WRONG)
    for key in ("k" * 100_000, HOSTILE_TEXT, "__proto__"):
        n += 1
        commands.append({"type": "stop", "scope": "zombies", "click_id": f"fuzz-{n}", key: 1})
    return commands


def _log_lines(fk: PanelKernel, since: int) -> list[str]:
    return fk.log_text()[since:].splitlines()


def _raw_control(line: str) -> list[str]:
    """Control, format (bidi) and separator characters in a log line: none may be there raw."""
    return [f"U+{ord(c):04X}" for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") and c != "\t"]


def _check_log(fk: PanelKernel, since: int) -> list[str]:
    lines = _log_lines(fk, since)
    text = "\n".join(lines)
    failed = text.count("panel command failed")
    assert "Traceback" not in text, f"{failed} commands failed, {len(text):,} characters logged: {text[-2000:]}"
    rejections = [line for line in lines if "panel rejected a command" in line]
    # The window may begin inside this test: two windows' worth at most.
    assert len(rejections) <= 2 * _panel_commands.log_rejection.burst, "\n".join(rejections)
    for line in lines:
        assert len(line) <= MAX_LOG_LINE, f"a log line of {len(line)} characters: {line[:300]}..."
        assert not _raw_control(line), f"raw {_raw_control(line)} in the log: {line[:300]!r}"
    return lines


def _busy_cell(fk: PanelKernel, flag: Path) -> str:
    """A cell that prints, waits (sleeping) until ``flag`` exists, and prints again."""
    msg_id = fk.submit(
        "print('start', flush=True)\n"
        "_until = time.monotonic() + 60\n"
        f"while not os.path.exists({str(flag)!r}) and time.monotonic() < _until:\n"
        "    time.sleep(0.02)\n"
        "print('end', flush=True)\n"
    )
    wait_until(lambda: fk.printed(msg_id, "start"), 30, what="the busy cell")
    return msg_id


def _answer_time(fk: PanelKernel) -> float:
    """Seconds from sending ``1+1`` to its reply."""
    fk.pump()
    sent = time.monotonic()
    msg_id = fk.submit("1+1")
    wait_until(lambda: (fk.pump(0.001), msg_id in fk.replies)[1], 60, interval=0, what="the reply to 1+1")
    took = time.monotonic() - sent
    fk.finish(msg_id)
    return took


def _settled(fk: PanelKernel) -> None:
    """Every click the kernel acknowledged has its outcome (the counters of the controller agree)."""
    wait_until(
        lambda: fk.value("controller.clicks_acknowledged == controller.clicks_answered"),
        20,
        interval=0.1,
        what="an outcome for every acknowledged click",
    )


def test_malformed_values_of_every_field_are_rejected_quietly(fk: PanelKernel) -> None:
    tid, cell = fk.value("[fuzz_tid, fuzz_cell]")
    commands = _malformed(tid, cell)
    fk.run(
        "from nbcoord.kernel import fastcomm_worker as _fastcomm_worker\n"
        "rejections_before = _panel_commands.log_rejection.calls\n"
        "from nbcoord.ui import handling as _ui_handling\n"
        "failures_before = [_ui_handling.log_failure.calls,"
        " getattr(_fastcomm_worker, '_log_failed', _panel_commands.log_rejection).calls]"
    )
    before = fk.value("[p.last_stop, p.ack, p.outcome, sorted(controller._views)]")
    log_from = len(fk.log_text())
    with tempfile.TemporaryDirectory() as tmp:
        flag = Path(tmp) / "done"
        msg_id = _busy_cell(fk, flag)
        streams = dict(fk.streams)
        for command in commands:
            fk.send_raw(command)
        sentinel = f"sentinel{uuid.uuid4().hex[:6]}-1"
        fk.send({"type": "stack", "tid": tid, "click_id": sentinel})  # handled after every command above
        wait_until(lambda: (fk.state().get("stack") or {}).get("click_id") == sentinel, 60, what="the sentinel")
        flag.touch()
        output = fk.finish(msg_id)
    sync = fk.submit("pass")  # queued behind the ordinary copies: each has been judged once it replies
    assert fk.finish(sync) == ""
    assert output == "start\nend\n", f"the running cell got {len(output)} characters: {output[:2000]!r}"
    new = {k: v[len(streams.get(k, "")):] for k, v in fk.streams.items() if k != msg_id}
    assert not any(new.values()), f"output outside the cells: {str(new)[:2000]}"
    _check_log(fk, log_from)
    # Rejected, never raised: equal commands but for their click (clicked_at) join on the fast route and are
    # judged as one, so there may be fewer rejections than commands, but none raised.
    judged = fk.value("_panel_commands.log_rejection.calls - rejections_before")
    raised = fk.value(
        "[_ui_handling.log_failure.calls - failures_before[0], _fastcomm_worker._log_failed.calls - failures_before[1]]"
    )
    assert judged >= len(commands) // 2, f"{judged} rejections for {len(commands)} commands"
    assert raised == [0, 0], f"{raised} commands raised instead of being rejected"
    assert fk.value("[p.last_stop, p.ack, p.outcome, sorted(controller._views)]") == before, "a command acted"
    assert fk.value("[t.is_alive() for t in fuzz_threads]") == [True, True]


FLOODS: dict[str, dict[str, Any]] = {
    "stop": {"type": "stop", "scope": "zombies"},
    "stack": {"type": "stack", "tid": "TID"},
    "view": {"type": "view", "view_id": "floodview", "action": "alive"},
    "restart": {"type": "restart", "session": "sess-1"},
    "reclaim": {"type": "reclaim"},
    "malformed": {"type": "stop", "scope": ["all"]},
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_after_a_flood_of_each_command_type_the_kernel_answers_at_once(
    fk: PanelKernel, kind: str, record_property: Any
) -> None:
    tid = fk.value("fuzz_tid")
    fk.run("reclaims_before = reclaim_runs[0]")
    log_from = len(fk.log_text())
    view = f"fl{kind}{uuid.uuid4().hex[:6]}"
    base = {k: (tid if v == "TID" else v) for k, v in FLOODS[kind].items()}
    for n in range(1, FLOOD + 1):
        fk.send({**base, "click_id": f"{view}-{n}", "clicked_at": time.time() * 1000})
    took = _answer_time(fk)
    record_property(f"{kind}-flood-1+1-s", round(took, 3))
    assert took < ANSWER_S, f"{FLOOD} {kind} clicks: 1+1 answered after {took:.2f} s"
    _settled(fk)
    if kind == "reclaim":
        runs = fk.value("reclaim_runs[0] - reclaims_before")
        assert 1 <= runs <= 2, f"{runs} reclaims for {FLOOD} clicks"
        outcome = wait_until(
            lambda: (o := fk.state().get("outcome")) and f"{view}-{FLOOD}" in o.get("click_ids", []) and o, 10
        )
        assert outcome["ok"] is True and outcome["kind"] == "reclaim"
    _check_log(fk, log_from)


def test_a_huge_thread_name_reaches_the_panel_cut_short(fk: PanelKernel) -> None:
    limit = NAME_CHARS
    fk.open_view()
    fk.run(
        f"""
        _huge_name = "n" * 100_000 + {HOSTILE_TEXT!r}
        _huge_stop = threading.Event()
        huge = threading.Thread(target=_huge_stop.wait, name=_huge_name, daemon=True)
        huge.start()
        huge_tid = next(r['tid'] for r in nbcoord.snapshot()['threads'] if r['name'] == _huge_name)
        """
    )
    tid = fk.value("huge_tid")
    row = wait_until(
        lambda: next((r for r in fk.state().get("threads", []) if r["tid"] == tid), None), 15, what="the row"
    )
    assert len(row["name"]) <= limit and row["name"].endswith("…"), len(row["name"])
    assert row["name"].startswith("n" * 100)
    stack_click = f"huge{uuid.uuid4().hex[:6]}-1"
    fk.send({"type": "stack", "tid": tid, "click_id": stack_click})
    stack = wait_until(lambda: (s := fk.state().get("stack")) and s.get("click_id") == stack_click and s, 15)
    assert len(stack["name"]) <= limit
    fk.run("_huge_stop.set(); huge.join(5)")


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to load the panel's module")
def test_the_panel_module_shows_a_cut_hostile_name_as_escaped_text() -> None:
    # The module sets every string with textContent, after safe(); here safe() itself, on what the state carries.
    name = ("n" * 100_000 + HOSTILE_TEXT)[: NAME_CHARS - 1] + "…"
    hostile = HOSTILE_TEXT + "\u061c\u2028\ufeff"
    script = (
        f"import({json.dumps((REPO / 'js' / 'panel.js').as_uri())}).then((m) => "
        f"console.log(JSON.stringify([m.safe({json.dumps(name)}), m.safe({json.dumps(hostile)})])))"
    )
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30, check=True).stdout
    cut, escaped = json.loads(out)
    assert cut == name  # nothing to escape in it: the hostile tail was cut off
    assert not _raw_control(escaped), escaped
    assert "\\u202e" in escaped and "\\u001b" in escaped


def test_every_acknowledged_click_gets_an_outcome_when_too_many_stops_wait(fk: PanelKernel) -> None:
    # One stop waits its grace for a thread that ignores it; the clicks for ten other threads' stops come
    # meanwhile: eight may wait, the others are refused, and say so.
    fk.open_view()
    fk.run(
        """
        %nbcoord config grace_period=2
        _hold = [True]
        def _stubborn():
            while _hold[0]:
                time.sleep(0.02)
        stubborn = threading.Thread(target=_stubborn, name="fuzz-stubborn", daemon=True)
        stubborn.start()
        many = workers('fuzz-many', 10)
        _rows = {r['name']: r['tid'] for r in nbcoord.snapshot()['threads'] if r['alive']}
        stubborn_tid = _rows['fuzz-stubborn']
        many_tids = [_rows[f'fuzz-many-{i}'] for i in range(10)]
        """
    )
    stubborn_tid, tids = fk.value("[stubborn_tid, many_tids]")
    view = f"many{uuid.uuid4().hex[:6]}"
    fk.send({"type": "stop", "scope": "thread", "tid": stubborn_tid, "click_id": f"{view}-1"})
    wait_until(lambda: fk.value("controller._stops.busy"), 10, what="the first stop")
    for n, tid in enumerate(tids, start=2):
        fk.send({"type": "stop", "scope": "thread", "tid": tid, "click_id": f"{view}-{n}"})
    last = f"{view}-{len(tids) + 1}"
    outcome = wait_until(
        lambda: (o := fk.state().get("outcome")) and last in o.get("click_ids", []) and o,
        10,
        what="the last click's outcome (refused)",
    )
    assert outcome["ok"] is False and outcome.get("refused") is True, outcome
    assert "waiting" in outcome["text"], outcome
    fk.run("_hold[0] = False; stubborn.join(5)\n%nbcoord config grace_period=0.5")
    _settled(fk)
    fk.run("nbcoord.stop_all()")


def test_a_flood_of_state_updates_logs_a_few_lines(fk: PanelKernel) -> None:
    log_from = len(fk.log_text())
    for n in range(30):
        fk.send({"state": {f"k{n}" + "x" * 5_000: 1}, "buffer_paths": []}, method="update")
    fk.run("pass")
    wait_until(lambda: "rejected a state update" in fk.log_text()[log_from:], 10, what="the refusal in the log")
    lines = [line for line in _log_lines(fk, log_from) if "rejected a state update" in line]
    assert len(lines) <= 5 and all(len(line) <= MAX_LOG_LINE for line in lines), len(lines)
