"""The extension's HTTP handlers: the page, its module, the JSON API, the stop and the Prometheus metrics.

Security is the server's own: every handler derives from jupyter_server's ``JupyterHandler`` / ``APIHandler`` and
carries ``@web.authenticated`` and ``@authorized`` on the resource ``kernels`` (read to look, write to stop), so the
server's token, cookies, XSRF check and authorizer apply (JupyterHub's single-user servers plug theirs in there).
The metrics handler follows the server's own ``/metrics``: it asks for authentication unless the server is run with
``ServerApp.authenticate_prometheus = False``.

Two choices here, against harm:

- The JSON API's GETs and the metrics do not count as user activity (``_track_activity = False``, as the server's
  own ``/api/status``): a dashboard or a scraper must not keep an idle server from being culled. A stop does count.
- A cross-origin request that jupyter_server refuses with 404 (its Origin check for API handlers) is answered 403:
  the same check, the status that says what happened.
- With ``ServerApp.authenticate_prometheus = False``, a scrape that is not authenticated gets totals over the
  kernels only (as the server's own ``/metrics``): kernel ids and notebook paths are labels only for an
  authenticated scrape, or where ``NBCoordServer.unauthenticated_kernel_labels`` says so.

Hostile requests: a kernel id in a URL must have a kernel id's shape (else 404, the id not echoed), a stop body is
checked field by field (:mod:`nbcoord.server._body`: 400, one sentence naming the field), and every error message
is passed to tornado as an argument of ``"%s"``, escaped and cut (:mod:`nbcoord.server._text`): it is logged by
tornado as one line, never parsed as a format string.
"""

from __future__ import annotations

import hashlib
import html
import inspect
import json
from pathlib import Path
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from tornado import web

from nbcoord.server._body import BadRequest, check_kernel_id, parse_flag, parse_stop_body
from nbcoord.server._fleet import Fleet, FleetError
from nbcoord.server._metrics import FleetCollector
from nbcoord.server._text import TEXT_CHARS, shown

_Method = TypeVar("_Method")

try:  # jupyter_server >= 2.13 refuses handlers that do not say whether they need a user
    from jupyter_server.auth.decorator import allow_unauthenticated
except ImportError:  # older servers have no such check: the metrics handler decides by itself, below

    def allow_unauthenticated(method: _Method) -> _Method:  # type: ignore[misc]  # the same, for old servers
        return method


AUTH_RESOURCE = "kernels"
#: The settings key under which the extension keeps its fleet and options.
SETTINGS_KEY = "nbcoord_server"


def refuse(status: int, message: str) -> web.HTTPError:
    """An HTTP error whose message (cut and escaped) is an argument, never a format string: tornado logs
    ``log_message % args`` (a "%" in a value would break that line) and ``write_error`` answers it."""
    return web.HTTPError(status, "%s", shown(message, TEXT_CHARS))


def module_path() -> Path:
    """The page's ES module: inside the wheel at ``nbcoord/static``, in a checkout at ``js/``."""
    packaged = Path(__file__).resolve().parent.parent / "static" / "fleet.js"
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "js" / "fleet.js"


class _Mixin:
    """What every handler of the extension shares."""

    auth_resource = AUTH_RESOURCE
    settings: dict[str, Any]

    @property
    def fleet(self) -> Fleet:
        fleet: Fleet = self.settings[SETTINGS_KEY]["fleet"]
        return fleet

    @property
    def nbcoord_options(self) -> dict[str, Any]:
        options: dict[str, Any] = self.settings[SETTINGS_KEY]
        return options


class _Api(_Mixin, APIHandler):
    async def prepare(self) -> None:  # type: ignore[override]  # as APIHandler.prepare
        try:
            await super().prepare()
        except web.HTTPError as error:
            if error.status_code == 404 and not self.check_origin():
                raise web.HTTPError(403, "cross-origin request refused") from error
            raise

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """APIHandler's JSON error, with the message as written: tornado doubles each "%" of a message given
        without arguments (``%load_ext`` would read ``%%load_ext``)."""
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(error, web.HTTPError) or not error.log_message:
            super().write_error(status_code, **kwargs)
            return
        message = error.log_message % error.args if error.args else error.log_message.replace("%%", "%")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message, "reason": error.reason}))

    def write_json(self, value: object) -> None:
        self.set_header("Content-Type", "application/json")
        # ensure_ascii (the default, said here because it matters): a path or name with a control or bidi character
        # travels as its \\u escape, never as the raw character, in every byte the API sends.
        self.finish(json.dumps(value, ensure_ascii=True))


class KernelsHandler(_Api):
    """``GET /nbcoord/api/kernels[?recent=1]``: every kernel, one view (schema in :mod:`nbcoord.server._model`);
    with ``recent=1``, a view collected less than a second ago will do (periodic polls of many pages share it)."""

    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            recent = parse_flag("recent", self.get_query_arguments("recent"))
        except BadRequest as error:
            raise refuse(error.status, error.message) from None
        self.write_json(await self.fleet.view(recent=recent))


class StopHandler(_Api):
    """``POST /nbcoord/api/kernels/<id>/stop``: that kernel's one bounded stop; answers its report."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        try:
            check_kernel_id(kernel_id)
            if kernel_id not in self.kernel_manager:
                raise BadRequest(f"no kernel {kernel_id} on this server", status=404)
            request = parse_stop_body(self.request.body or b"")
        except BadRequest as error:
            raise refuse(error.status, error.message) from None
        try:
            result = await self.fleet.stop(kernel_id, request)
        except FleetError as error:
            raise refuse(error.status, error.message) from None
        self.write_json(result)


class StacksHandler(_Api):
    """``GET /nbcoord/api/kernels/<id>/stacks[?native=1]``: that kernel's threads, read from outside (served while
    the kernel cannot answer; see :mod:`nbcoord.server._stacks`)."""

    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        try:
            check_kernel_id(kernel_id)
            if kernel_id not in self.kernel_manager:
                raise BadRequest(f"no kernel {kernel_id} on this server", status=404)
            native = parse_flag("native", self.get_query_arguments("native"))
        except BadRequest as error:
            raise refuse(error.status, error.message) from None
        self.write_json(await self.nbcoord_options["stacks"].read(kernel_id, native=native))


class MetricsHandler(_Mixin, JupyterHandler):
    """``GET /nbcoord/metrics``: Prometheus's text format (or OpenMetrics, as the scraper asks), per scrape."""

    @allow_unauthenticated  # decided below, as the server's own /metrics decides
    async def get(self) -> None:
        authenticated = await self._authorized()
        if self.settings.get("authenticate_prometheus", True) and not authenticated:
            raise web.HTTPError(403)
        # Open metrics (authenticate_prometheus=False) are totals, unless the scrape is authenticated anyway or the
        # server's owner said that kernel ids and notebook paths may be seen by whoever reaches this URL.
        per_kernel = authenticated or bool(self.nbcoord_options.get("unauthenticated_kernel_labels", False))
        view = await self.fleet.view()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector(view, per_kernel=per_kernel))
        encoder, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        self.set_header("Content-Type", content_type)
        self.finish(encoder(registry))

    async def _authorized(self) -> bool:
        """Whether the request is authenticated and may read the kernels."""
        if not self.logged_in:
            return False
        allowed = self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        return bool(allowed)


class PageHandler(_Mixin, JupyterHandler):
    """``GET /nbcoord/``: the page; everything on it is drawn by ``fleet.js`` from the JSON API.

    ``HEAD /nbcoord/`` answers 200 and nothing else: the in-kernel panel asks it to decide whether to show its link
    to this page (the server may not have the extension).
    """

    @web.authenticated
    @authorized
    async def head(self) -> None:
        self.finish()

    @web.authenticated
    @authorized
    async def get(self) -> None:
        base = self.base_url
        source = module_path().read_bytes()
        version = hashlib.sha256(source).hexdigest()[:12]
        _ = self.xsrf_token  # sets the _xsrf cookie that the page's POSTs send back
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            PAGE.format(
                base=html.escape(base, quote=True),
                module=html.escape(url_path_join(base, "nbcoord", "static", f"fleet.js?v={version}"), quote=True),
                interval=html.escape(str(self.nbcoord_options["page_interval"]), quote=True),
            )
        )


class ModuleHandler(_Mixin, JupyterHandler):
    """``GET /nbcoord/static/fleet.js``: the page's ES module."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Content-Type", "text/javascript; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.finish(module_path().read_bytes())


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nbcoord: kernels</title>
</head>
<body>
<main id="nbcoord-fleet" data-base-url="{base}" data-interval="{interval}">Loading the kernels of this server…</main>
<script type="module" src="{module}"></script>
</body>
</html>
"""


def handlers() -> list[tuple[str, type[Any]]]:
    """The URL patterns (without the server's base URL, which the extension app prepends)."""
    return [
        (r"/nbcoord/?", PageHandler),
        (r"/nbcoord/static/fleet\.js", ModuleHandler),
        (r"/nbcoord/api/kernels", KernelsHandler),
        (r"/nbcoord/api/kernels/([^/]+)/stop", StopHandler),
        (r"/nbcoord/api/kernels/([^/]+)/stacks", StacksHandler),
        (r"/nbcoord/metrics", MetricsHandler),
    ]
