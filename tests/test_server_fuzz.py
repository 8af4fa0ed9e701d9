"""Hostile HTTP against the server extension: a real Jupyter server with real kernels, malformed requests to every
nbcoord route (issue 22, "Hostile input, second round").

One server for the module (``server_support``), run with ``ServerApp.authenticate_prometheus=False`` (the open
metrics of finding 10), with two kernels, both with nbcoord loaded:

healthy   its notebook path holds a right-to-left override and other invisible characters (``BIDI_PATH``)
skewed    its summary function is patched through a cell to answer off-schema (``"zombies": "many"``,
          ``threads_by_state`` a string of 100,000 characters), as a kernel with another or a patched nbcoord would

What the requests try (a fixed seed, a bounded number of requests; every request to 127.0.0.1):

- stop bodies: not JSON, not UTF-8, empty, not an object, nested 1,000 and 40,000 levels deep, over 64 KiB, 1,500
  unknown keys, keys with control and bidi characters, the control channel's own ``schema``/``action`` keys, a
  wrong type for every field, NaN, 1e400, a ``grace`` and a ``cell`` of 401 digits;
- kernel ids that are not UUIDs: CR/LF (a forged ``Set-Cookie`` log line), NUL, U+202E, ``..``, 300 characters, and an
  unknown UUID;
- every route with every method, without credentials, with a wrong token, with the login cookie but no XSRF token,
  and a seeded stream of random JSON values as bodies;
- a kernel whose summary is off-schema, while the others are listed;
- a thread whose name is 100,000 characters, stopped through the API;
- the open metrics, scraped with and without credentials.

Asserted throughout: no 500 from any route; every malformed request answered 400 (404 for a kernel id, 403 without
credentials or XSRF token, 405 for a method a route has not) with a JSON message that names the problem, at most
``MAX_MESSAGE`` characters; every echoed value cut to its stated length (``nbcoord.server._text``); no raw control or
bidi character in any response's bytes, nor in any line of the server's log.
"""

from __future__ import annotations

import json
import random
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_support import browser  # noqa: F401  (the session's Chromium)
from prometheus_client.parser import text_string_to_metric_families
from server_support import Attached, FleetServer, fleet_server_running

from nbcoord.server._text import ECHO_CHARS, ECHO_NAMES, NAME_CHARS

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]
SEED = 22
#: Random requests of the seeded stream.
RANDOM_REQUESTS = 120
#: The longest error message any route may answer (a sentence and a few cut names).
MAX_MESSAGE = 600
BIDI_PATH = "invoice\u202egnp.exe\u2066\u200b.ipynb"
#: Controls (but tab and newline, which only separate lines), C1 controls, bidi and zero-width format characters.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
SKEW = """\
import nbcoord.kernel.control as _nbc_control
_nbc_original_summary = _nbc_control.build_summary
def _nbc_skewed(snapshot, version):
    summary = _nbc_original_summary(snapshot, version)
    summary["zombies"] = "many"
    summary["threads_by_state"] = "5" * 100_000
    return summary
_nbc_control.build_summary = _nbc_skewed
"""
LONG_NAME = """\
import threading, time, nbcoord
def _cooperative():
    while not nbcoord.should_stop():
        time.sleep(0.01)
threading.Thread(target=_cooperative, name="\\u202e" + "n" * 100_000, daemon=True).start()
"""


@dataclass
class Fuzz:
    server: FleetServer
    kernels: dict[str, Attached]
    ids: dict[str, str]

    def stop_path(self, name: str = "healthy") -> str:
        return f"/nbcoord/api/kernels/{self.ids[name]}/stop"


@pytest.fixture(scope="module")
def fuzz() -> Iterator[Fuzz]:
    with fleet_server_running("--ServerApp.authenticate_prometheus=False") as server:
        paths = {"healthy": BIDI_PATH, "skewed": "skewed.ipynb"}
        ids = {name: server.start(path) for name, path in paths.items()}
        kernels = {name: server.attach(kernel_id) for name, kernel_id in ids.items()}
        for kernel in kernels.values():
            kernel.run("%load_ext nbcoord")
        kernels["skewed"].run(SKEW)
        yield Fuzz(server, kernels, ids)


# ------------------------------------------------------------------------------------------------------ checks
def no_raw(data: bytes | str, what: str) -> None:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    found = RAW.search(text)
    assert found is None, f"raw {found.group()!r} in {what}: {text[max(0, found.start() - 80):found.end() + 80]!r}"


def refused(
    server: FleetServer, method: str, path: str, *, status: int | tuple[int, ...] = 400, words: str = "", **kw: Any
) -> str:
    """A request that must be refused with ``status`` and a JSON message containing ``words``; returns it."""
    got, headers, raw = server.request(method, path, **kw)
    wanted = status if isinstance(status, tuple) else (status,)
    assert got in wanted, (method, path, got, raw[:500])
    no_raw(raw, f"the answer to {method} {path}")
    assert headers.get("Content-Type", "").startswith("application/json"), headers
    message = str(json.loads(raw)["message"])
    assert len(message) <= MAX_MESSAGE, f"{len(message)} characters: {message[:200]}..."
    assert words in message, message
    return message


def log_lines(server: FleetServer) -> list[str]:
    return server.log.read_bytes().decode("utf-8", "replace").split("\n")


# ------------------------------------------------------------------------------------------- finding 4: off-schema
def test_an_off_schema_kernel_is_shown_as_such_and_the_others_stay(fuzz: Fuzz) -> None:
    server = fuzz.server
    for _ in range(3):
        status, _headers, raw = server.request("GET", "/nbcoord/api/kernels")
        assert status == 200, raw[:500]
        no_raw(raw, "the view")
    view = json.loads(raw)
    healthy, skewed = server.row(fuzz.ids["healthy"], view), server.row(fuzz.ids["skewed"], view)
    assert healthy["status"] == "ok", healthy
    assert healthy["path"] == BIDI_PATH, "the JSON carries the path as data (its bytes are \\u escapes)"
    assert skewed["status"] == "error"
    assert skewed["nbcoord"] is None
    assert "off-schema" in skewed["error"] and '"threads_by_state"' in skewed["error"], skewed["error"]
    assert len(skewed["error"]) <= MAX_MESSAGE, "the value is cut short"
    assert "5" * (ECHO_CHARS + 1) not in skewed["error"], skewed["error"]
    assert skewed["pid"] and skewed["rss"], "what the server sees from outside is still there"

    status, _headers, body = server.request("GET", "/nbcoord/metrics")
    assert status == 200, body[:500]
    ids = {s.labels.get("kernel_id") for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert fuzz.ids["healthy"] in ids and fuzz.ids["skewed"] in ids
    logged = [line for line in log_lines(server) if "off-schema" in line and fuzz.ids["skewed"] in line]
    assert len(logged) == 1, logged


# ------------------------------------------------------------------------- findings 5, 8, 11: the stop's body
DEEP = b"[" * 1000 + b"]" * 1000
BODIES: list[tuple[str, bytes, str]] = [
    ("not JSON", b"{bad", "the body must be JSON"),
    ("not UTF-8", b"\xff\xfe{}", "the body must be JSON"),
    ("empty", b"", "must be a JSON object"),
    ("null", b"null", "must be a JSON object"),
    ("a list", b"[]", "must be a JSON object"),
    ("a string", b'"all"', "must be a JSON object"),
    ("nested 1,000 deep", DEEP, "nested too deeply"),
    ("nested 1,000 deep in a field", b'{"scope": ' + DEEP + b"}", "nested too deeply"),
    ("nested 40,000 deep", b"[" * 40_000 + b"]" * 40_000, "at most 65,536 bytes"),
    ("over 64 KiB", json.dumps({"scope": "all", "cell": None, "pad": "x" * 70_000}).encode(), "65,536 bytes"),
    ("grace of 401 digits", b'{"scope": "all", "grace": 1' + b"0" * 400 + b"}", '"grace" is too large'),
    ("grace of 5,000 digits", b'{"scope": "all", "grace": 1' + b"0" * 5000 + b"}", '"grace" is too large'),
    ("cell of 401 digits", b'{"scope": "cell", "cell": 1' + b"0" * 400 + b"}", '"cell" is too large'),
    ("grace 1e400", b'{"scope": "all", "grace": 1e400}', '"grace" must be a number'),
    ("grace NaN", b'{"scope": "all", "grace": NaN}', '"grace" must be a number'),
    ("grace -Infinity", b'{"scope": "all", "grace": -Infinity}', '"grace" must be a number'),
    ("grace 10**20", b'{"scope": "all", "grace": 100000000000000000000}', '"grace" must be between'),
    ("grace -1", b'{"scope": "all", "grace": -1}', '"grace" must be between'),
    ("grace a string", b'{"scope": "all", "grace": "1"}', '"grace" must be a number'),
    ("grace a list", b'{"scope": "all", "grace": [1]}', '"grace" must be a number'),
    ("grace true", b'{"scope": "all", "grace": true}', '"grace" must be a number'),
    ("scope missing", b"{}", '"scope" must be one of'),
    ("scope a number", b'{"scope": 1}', '"scope" must be one of'),
    ("scope null", b'{"scope": null}', '"scope" must be one of'),
    ("scope an object", b'{"scope": {"all": 1}}', '"scope" must be one of'),
    ("scope unknown", b'{"scope": "everything"}', '"scope" must be one of'),
    ("cell a string", b'{"scope": "cell", "cell": "3"}', '"cell" must be'),
    ("cell a float", b'{"scope": "cell", "cell": 1.5}', '"cell" must be'),
    ("cell true", b'{"scope": "cell", "cell": true}', '"cell" must be'),
    ("cell negative", b'{"scope": "cell", "cell": -1}', '"cell" must be'),
    ("cell without scope cell", b'{"scope": "all", "cell": 3}', '"cell" is only allowed'),
    ("force a number", b'{"scope": "all", "force": 1}', '"force" must be true or false'),
    ("force a string", b'{"scope": "all", "force": "yes"}', '"force" must be true or false'),
    ("force null", b'{"scope": "all", "force": null}', '"force" must be true or false'),
    ("the channel's action", b'{"action": "summary"}', "unknown field(s): action"),
    ("the channel's schema", b'{"schema": 1, "scope": "all"}', "unknown field(s): schema"),
    ("an unknown cell", b'{"scope": "cell", "cell": 99999}', "no cell [99999]"),
]


@pytest.mark.parametrize(("body", "words"), [(b, w) for _, b, w in BODIES], ids=[i for i, _, _ in BODIES])
def test_a_malformed_stop_body_is_400_naming_the_problem(fuzz: Fuzz, body: bytes, words: str) -> None:
    refused(fuzz.server, "POST", fuzz.stop_path(), raw=body, words=words)


def test_unknown_keys_are_listed_cut_to_a_few_names_and_a_count(fuzz: Fuzz) -> None:
    keys = {"L" * 100: 1} | {f"k{i:04d}" + "x" * 20: 1 for i in range(1499)}
    message = refused(fuzz.server, "POST", fuzz.stop_path(), raw=json.dumps(keys).encode(), words="unknown field(s)")
    assert f"and {1500 - ECHO_NAMES:,} more" in message, message
    listed = message.split(": ", 1)[1].split(" and ", 1)[0].split(", ")
    assert len(listed) == ECHO_NAMES and all(len(name) <= ECHO_CHARS for name in listed), listed

    hostile = {"\u202eevil\r\nSet-Cookie: pwn=1": 1, "scope": "all"}
    message = refused(fuzz.server, "POST", fuzz.stop_path(), raw=json.dumps(hostile).encode(), words="unknown")
    assert "\\u202eevil\\r\\nSet-Cookie" in message or "\\u202eevil\\x0d\\x0aSet-Cookie" in message, message


def test_a_long_thread_name_is_cut_in_the_stop_report(fuzz: Fuzz) -> None:
    fuzz.kernels["healthy"].run(LONG_NAME)
    status, _headers, raw = fuzz.server.request("POST", fuzz.stop_path(), raw=b'{"scope": "all", "grace": 5}')
    assert status == 200, raw[:500]
    no_raw(raw, "the stop's answer")
    assert len(raw) < 20_000, f"{len(raw):,} bytes"
    names = [row["name"] for row in json.loads(raw)["report"]["stopped"]]
    assert len(names) == 1 and names[0].startswith("\u202ennn"), names
    assert len(names[0]) <= NAME_CHARS, len(names[0])


# ----------------------------------------------------------------------------------------- finding 9: kernel ids
@pytest.mark.parametrize(
    "kernel_id",
    ["x%0d%0aSet-Cookie:%20pwn=1", "x%00y", "%E2%80%AEexe.png", "..", "a" * 300, "not-a-kernel",
     "0000-0000-0000-0000-%0a000", "00000000-0000-0000-0000-000000000000"],
)  # fmt: skip
def test_a_kernel_id_that_is_not_a_kernels_is_404_and_never_echoed_raw(fuzz: Fuzz, kernel_id: str) -> None:
    words = "no kernel" if kernel_id.startswith("00000000") else "not a kernel id"
    message = refused(fuzz.server, "POST", f"/nbcoord/api/kernels/{kernel_id}/stop", raw=b'{"scope": "all"}',
                      status=404, words=words)  # fmt: skip
    assert "pwn" not in message and len(message) <= 120, message


# ------------------------------------------------------------------------------------ finding 10: open metrics
def test_open_metrics_carry_no_kernel_ids_or_paths_unless_the_scrape_is_authenticated(fuzz: Fuzz) -> None:
    # The skewed kernel answers the schema for this test: what is checked here is the labels, not finding 4.
    fuzz.kernels["skewed"].run("_nbc_control.build_summary = _nbc_original_summary")
    try:
        check_open_metrics(fuzz)
    finally:
        fuzz.kernels["skewed"].run(SKEW)


def check_open_metrics(fuzz: Fuzz) -> None:
    server = fuzz.server
    status, _headers, body = server.request("GET", "/nbcoord/metrics", token=False)
    assert status == 200, body[:500]
    no_raw(body, "the open metrics")
    text = body.decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert not {"kernel_id", "notebook", "queue"} & {label for s in samples for label in s.labels}
    for secret in (*fuzz.ids.values(), "invoice", "skewed.ipynb"):
        assert secret not in text
    totals = {s.name: s.value for s in samples if not s.labels}
    assert totals["nbcoord_kernels_rss_bytes"] > 0
    assert {s.labels["status"]: s.value for s in samples if s.name == "nbcoord_kernels"}["ok"] == 2

    status, _headers, body = server.request("GET", "/nbcoord/metrics")  # with the token: per kernel
    assert status == 200
    no_raw(body, "the authenticated metrics")
    labels = [s.labels for f in text_string_to_metric_families(body.decode()) for s in f.samples]
    notebooks = {label["notebook"] for label in labels if label.get("kernel_id") == fuzz.ids["healthy"]}
    assert notebooks == {"invoice\\u202egnp.exe\\u2066\\u200b.ipynb"}, notebooks


# ---------------------------------------------------------------------------------------- credentials, methods
def test_missing_credentials_and_xsrf_are_refused(fuzz: Fuzz) -> None:
    server = fuzz.server
    body = b'{"scope": "all"}'
    for method, path, raw in (("GET", "/nbcoord/api/kernels", None), ("POST", fuzz.stop_path(), body)):
        refused(server, method, path, raw=raw, token=False, status=403)
        refused(server, method, path, raw=raw, token=False, status=403, headers={"Authorization": "token wrong"})
    cookies = server.login_cookies()
    cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
    same_origin = {"Cookie": cookie, "Origin": server.url, "Referer": f"{server.url}/nbcoord/"}
    refused(server, "POST", fuzz.stop_path(), raw=body, token=False, headers=same_origin, status=403)
    foreign = {**same_origin, "Origin": "http://evil.example", "X-XSRFToken": cookies["_xsrf"]}
    refused(server, "POST", fuzz.stop_path(), raw=body, token=False, headers=foreign, status=403)
    for path in ("/nbcoord/", "/nbcoord/static/fleet.js"):
        status, _headers, raw = server.request("GET", path, token=False, follow=False)
        assert status in (302, 403), (path, status)
        no_raw(raw, path)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of a random type; containers at most three deep."""
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 30, 31, 2**31, 2**63, 10**25, rng.randrange(-100, 100)])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, 29.999, float(rng.randrange(40))])
    if kind in (4, 5, 6):
        return "".join(rng.choice(["all", "zombies", "cell", "\u202e", "\x00", "\r\n", "%s", "x" * 50, "ü"])
                       for _ in range(rng.randrange(4)))  # fmt: skip
    if kind in (7, 8):
        keys = ["scope", "cell", "grace", "force", "action", "schema", "\u2066k", "x"]
        return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_a_seeded_stream_of_random_requests_never_gets_a_500(fuzz: Fuzz) -> None:
    server = fuzz.server
    rng = random.Random(SEED)
    unknown_uuid = "00000000-0000-0000-0000-000000000000"
    seen: dict[int, int] = {}
    for index in range(RANDOM_REQUESTS):
        kernel_id = rng.choice([fuzz.ids["healthy"], fuzz.ids["skewed"], unknown_uuid, "x%0Ay", "%E2%80%AE"])
        path = rng.choice([f"/nbcoord/api/kernels/{kernel_id}/stop"] * 4 + ["/nbcoord/api/kernels", "/nbcoord/metrics",
                           "/nbcoord/", "/nbcoord/static/fleet.js"])  # fmt: skip
        method = rng.choice(["POST"] * 4 + ["GET", "PUT", "DELETE", "PATCH"])
        value = random_value(rng)
        if isinstance(value, dict) and rng.random() < 0.5:
            value.setdefault("scope", rng.choice(["all", "zombies", "cell"]))
            if "grace" in value and not isinstance(value["grace"], (int, float)):
                value["grace"] = 0.1  # a valid stop waits at most this long
        raw = json.dumps(value).encode() if method in ("POST", "PUT", "PATCH") else None
        status, _headers, body = server.request(method, path, raw=raw, timeout=60)
        seen[status] = seen.get(status, 0) + 1
        what = f"request {index}: {method} {path} {raw[:200] if raw else b''!r}"
        assert status < 500, f"{what} -> {status} {body[:300]!r}"
        no_raw(body, what)
        if status >= 400 and path.startswith("/nbcoord/api/"):
            message = json.loads(body)["message"]
            assert message and len(message) <= MAX_MESSAGE, (what, message)
    assert seen.get(400, 0) >= 10 and seen.get(404, 0) >= 5 and seen.get(405, 0) >= 5, seen


# ---------------------------------------------------------------------------------------- the page (finding 6)
HOSTILE_STRINGS = [
    BIDI_PATH, "\u202eevil-rtl", "a\r\nb\tc\x00d\x1b[31m", "\u2067x\u2069\u200d\ufeff\u00ad", "\U0001f600",
]


@pytest.mark.browser
def test_the_page_shows_control_and_bidi_characters_escaped_as_the_panel_does(fuzz: Fuzz, browser: Any) -> None:  # noqa: F811
    server = fuzz.server
    context = browser.new_context()
    page = context.new_page()
    panel_source = (REPO / "js" / "panel.js").read_text()
    # panel.js, served from the page's own origin (a module import must be same-origin or CORS): both helpers run in
    # the same real page.
    page.route("**/nbcoord-test/panel.js",
               lambda route: route.fulfill(body=panel_source, content_type="text/javascript"))  # fmt: skip
    try:
        page.goto(f"{server.url}/nbcoord/?token={urllib.parse.quote(server.token)}")
        differences = page.evaluate(
            """async (hostile) => {
              const src = document.querySelector("script[type=module]").src;  // the module instance the page runs
              const fleet = await import(src);
              const panel = await import("/nbcoord-test/panel.js");
              if (typeof fleet.safe !== "function") return ["fleet.js has no safe()"];
              const found = [];
              const inputs = [...hostile, null, undefined, 42];
              for (let code = 0; code < 0x10000; code++) inputs.push(String.fromCharCode(code));
              for (const value of inputs) {
                for (const lines of [false, true]) {
                  const a = fleet.safe(value, lines), b = panel.safe(value, lines);
                  if (a !== b && found.length < 20) found.push([String(value), lines, a, b]);
                }
              }
              return found;
            }""",
            HOSTILE_STRINGS,
        )
        assert differences == [], differences

        row = page.locator(f"tr[data-kernel-id='{fuzz.ids['healthy']}']")
        row.wait_for(timeout=20000)
        path = row.locator(".nbf-path")
        assert path.text_content() == "invoice\\u202egnp.exe\\u2066\\u200b.ipynb"
        assert path.get_attribute("title") == "invoice\\u202egnp.exe\\u2066\\u200b.ipynb"
        no_raw(page.evaluate("document.getElementById('nbcoord-fleet').textContent"), "the page's text")
        skewed = page.locator(f"tr[data-kernel-id='{fuzz.ids['skewed']}']")
        assert "off-schema" in (skewed.text_content() or "")
    finally:
        context.close()


# ------------------------------------------------------------------------------------------------ the server log
def test_no_server_log_line_holds_a_raw_control_or_bidi_character(fuzz: Fuzz) -> None:
    # Runs last in the module: everything above has been logged by now.
    server = fuzz.server
    refused(server, "POST", "/nbcoord/api/kernels/x%0d%0aSet-Cookie:%20pwn=1/stop", raw=b"{}", status=404)
    lines = log_lines(server)
    assert not [line for line in lines if line.startswith("Set-Cookie")], "a forged log line"
    for number, line in enumerate(lines, 1):
        no_raw(line, f"line {number} of the server's log")
