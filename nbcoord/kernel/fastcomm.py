"""Panel commands handled off the kernel's main thread.

A widget click reaches the kernel as a ``comm_msg`` on the shell channel, and the kernel
handles shell messages on its main thread: while a cell runs (``time.sleep``, a
TensorFlow ``sess.run`` blocked on an empty queue, a Python loop), a Stop click waits
until the cell ends, which may be never. This module gives the panel a second, fast
route for its own commands, chosen from what the running kernel offers:

``"shell-channel"`` (ipykernel >= 7)
    The kernel reads the shell socket on its "Shell channel" thread and only then
    routes each message to the main thread. We wrap the callback of that socket's
    stream: a message that is a ``comm_msg`` for a registered comm id, with
    ``data.method == "custom"`` and an allowed ``content.type``, is copied to our worker
    thread; every message, ours included, then goes on to the callback that was there,
    untouched. The front end needs to do nothing special. One exception bounds a flood:
    past ``FLOOD_PER_S`` commands taken in one second, the copies of the ones taken are
    not passed on (the main thread would only drop them as duplicates, after about
    0.7 ms of the kernel's own handling each).
``"control"`` (ipykernel 6, or 7 when the shell-channel internals are not found)
    Only the control channel is read off the main thread. We add a ``comm_msg`` entry
    to ``kernel.control_handlers`` that accepts only registered comm ids; the front end
    must send its click on the control channel as well (see the panel's module).
``"none"``
    Nothing fits (no kernel, an in-process kernel, unknown internals). Clicks are then
    handled late, by the widget's ordinary handler. ``FastRoute.reason`` says why.

In every case the ordinary shell message still reaches the widget's own handler when
the main thread is free, so a command can arrive twice: the handler must be idempotent
(the panel deduplicates by ``click_id``).

The handler runs on one worker thread owned by the route, named ``nbcoord-fastcomm``,
never on the kernel's channel threads (:mod:`._fastcomm_worker`: a bounded queue, in which
equal clicks join the one queued last, so that a flood fills nothing). On the shell
channel thread a message costs a byte test, a signature check (the kernel's own rules:
unsigned, forged and replayed messages are not ours) and the parsing of its header and
content; the dates in headers, which the route never reads, are not parsed. Nothing
from a message is evaluated; malformed messages are ignored (logged at debug level);
nothing raises into the kernel's threads.
Nothing in-process can act while the main thread holds the GIL inside a C call that
does not release it; the route then runs when the GIL is released.
"""

from __future__ import annotations

import copy
import hmac
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, Literal

from nbcoord.core.internals import set_zmq_recv_callback, zmq_recv_callback
from nbcoord.core.log import RateLimited
from nbcoord.kernel.fastcomm_worker import WORKER_THREAD_NAME, Handler, JoinedHandler, Worker

__all__ = ["WORKER_THREAD_NAME", "FastRoute", "Handler", "JoinedHandler", "RouteKind", "install"]

logger = logging.getLogger("nbcoord")

RouteKind = Literal["shell-channel", "control", "none"]

DEFAULT_TYPES: Final = frozenset({"stop"})
_DELIM: Final = b"<IDS|MSG>"
# Comm ids that JSON writes verbatim, so that a byte search can pre-filter content.
_PLAIN_ID: Final = re.compile(r"[A-Za-z0-9_.:-]+")

_log_flood = RateLimited(logging.WARNING, burst=1, window=60.0)
#: Panel commands a second above which the shell-channel route keeps their copies from the main thread.
FLOOD_PER_S: Final = 20
_logged_once: set[str] = set()
_logged_once_lock = threading.Lock()


def _log_once(level: int, message: str) -> None:
    with _logged_once_lock:
        if message in _logged_once:
            return
        _logged_once.add(message)
    logger.log(level, message)


class FastRoute:
    """The installed route; returned by :func:`install`.

    Attributes
    ----------
    kind : {"shell-channel", "control", "none"}
        The route in use. The panel tells its front end this value: ``"control"``
        means the click must also be sent on the control channel.
    reason : str or None
        Why no fast route is available (``kind == "none"``), else None.
    """

    def __init__(self, kind: RouteKind, reason: str | None, types: Collection[str]) -> None:
        self.kind: RouteKind = kind
        self.reason = reason
        self._types = frozenset(types)
        # Copy-on-write: channel threads read the attribute without a lock.
        self._comm_ids: frozenset[str] = frozenset()
        self._comm_id_bytes: tuple[bytes, ...] | None = ()  # None: an id that JSON may escape, no byte test
        self._lock = threading.Lock()  # guards writes of _comm_ids and _undo
        self._active = False
        self._undo: Callable[[], None] | None = None
        self._worker: Worker | None = None
        # The flood counter: touched by the shell channel thread only.
        self._window_start = 0.0
        self._window_count = 0
        #: Whether a cell runs now (the panel sets it): the control route then keeps the kernel's status busy.
        self.cell_running: Callable[[], bool] = lambda: False
        #: Called on the worker thread once the commands that came together are handled (the panel then sends the
        #: acknowledgement it held back in a flood); returns in how many seconds to call it again (None: not before
        #: the next command).
        self.on_idle: Callable[[], float | None] = lambda: None

    def __repr__(self) -> str:
        return f"<FastRoute {self}>"

    def __str__(self) -> str:
        if self.kind == "none":
            return f"fast route unavailable: {self.reason}"
        return f"fast route: {self.kind}"

    def add_comm(self, comm_id: str) -> None:
        """Accept commands addressed to ``comm_id`` (a widget's ``comm.comm_id``)."""
        with self._lock:
            self._set_comm_ids(self._comm_ids | {comm_id})

    def remove_comm(self, comm_id: str) -> None:
        """Stop accepting commands for ``comm_id``; unknown ids are ignored."""
        with self._lock:
            self._set_comm_ids(self._comm_ids - {comm_id})

    def _set_comm_ids(self, ids: frozenset[str]) -> None:
        plain = all(_PLAIN_ID.fullmatch(i) for i in ids)
        self._comm_id_bytes = tuple(i.encode() for i in ids) if plain else None
        self._comm_ids = ids

    def uninstall(self) -> None:
        """Undo what :func:`install` changed and stop the worker. Idempotent."""
        with self._lock:
            self._active = False
            undo, self._undo = self._undo, None
            worker, self._worker = self._worker, None
        if undo is not None:
            try:
                undo()
            except Exception:
                logger.exception("nbcoord fast route: uninstall failed")
        if worker is not None:
            worker.stop()

    # -- called on kernel channel threads: must never raise -------------------------

    def _might_match(self, raw_content: bytes) -> bool:
        """Cheap byte test, so that big widget messages are not parsed twice."""
        ids = self._comm_id_bytes
        if ids is None:
            return True
        return any(i in raw_content for i in ids)

    def _offer(self, content: object, *, private: bool = False) -> bool:
        """Hand ``content`` (a comm_msg's content) to the worker if it is ours; True when the worker took it.

        ``private``: nobody else holds ``content`` (it was unpacked for this route alone), so it is not copied.
        """
        if not self._active or not isinstance(content, Mapping):
            return False
        comm_id = content.get("comm_id")
        if not isinstance(comm_id, str) or comm_id not in self._comm_ids:
            return False  # another widget's message: not ours to judge
        command = _command(content.get("data"), self._types, copy_it=not private)
        if command is None:
            logger.debug("nbcoord fast route: ignored a message for comm %s", comm_id)
            return False
        worker = self._worker
        return worker is not None and worker.submit(comm_id, command)

    def wake(self) -> bool:
        """Have the worker run :attr:`on_idle` soon (an acknowledgement held back on the main thread is due a moment
        later); False where this route has no worker."""
        worker = self._worker
        if worker is None:
            return False
        worker.wake()
        return True

    def _flooded(self) -> bool:
        """Count one command taken; True once more than ``FLOOD_PER_S`` were taken within the current second."""
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_count = now, 0
        self._window_count += 1
        if self._window_count <= FLOOD_PER_S:
            return False
        if self._window_count == FLOOD_PER_S + 1:
            _log_flood("nbcoord fast route: more than %d panel commands a second; their shell copies are answered "
                       "here and not passed to the main thread, which stays free for cells", FLOOD_PER_S)
        return True


def _command(data: object, types: frozenset[str], *, copy_it: bool = True) -> dict[str, Any] | None:
    """Return the custom content if it is an allowed command (a private copy unless ``copy_it`` is false)."""
    if not isinstance(data, Mapping) or data.get("method") != "custom":
        return None
    content = data.get("content")
    if not isinstance(content, dict):
        return None
    kind = content.get("type")
    if not isinstance(kind, str) or kind not in types:
        return None
    if not copy_it:
        return content
    try:
        return copy.deepcopy(content)
    except RecursionError:
        return None


# -- ipykernel >= 7: the shell channel thread ------------------------------------------


def _as_bytes(part: object) -> bytes:
    if isinstance(part, bytes):
        return part
    raw = getattr(part, "bytes", None)  # zmq.Frame
    if isinstance(raw, bytes):
        return raw
    if isinstance(part, (bytearray, memoryview)):
        return bytes(part)
    raise TypeError(type(part).__name__)


def _peek_shell(route: FastRoute, session: Any, frames: list[Any]) -> bytes | None:
    """Find an accepted command in one raw shell message, leaving it untouched; when the worker took it, return
    the message's signature (empty where the session signs nothing)."""
    start = next(i for i, frame in enumerate(frames) if _as_bytes(frame) == _DELIM) + 1
    if len(frames) < start + 5:
        return None
    header = _as_bytes(frames[start + 1])
    if b"comm_msg" not in header:
        return None  # almost every message stops here, after copying a small header
    content = _as_bytes(frames[start + 4])
    if not route._might_match(content):
        return None
    signature = _as_bytes(frames[start])
    signed = [header, _as_bytes(frames[start + 2]), _as_bytes(frames[start + 3]), content]
    if not _authentic(session, signature, signed):
        return None
    parsed = session.unpack(header)
    if not isinstance(parsed, Mapping) or parsed.get("msg_type") != "comm_msg":
        return None
    return signature if route._offer(session.unpack(content), private=True) else None


def _authentic(session: Any, signature: bytes, signed: list[bytes]) -> bool:
    """The signature checks of the kernel's own ``Session.deserialize``, without recording the signature (so the
    kernel still delivers this message to the widget) and without parsing the dates of headers this route never
    reads: an unsigned, forged or replayed message is not ours."""
    if session.auth is None:
        return True
    if not signature or signature in session.digest_history:
        return False
    return hmac.compare_digest(signature, session.sign(signed))


def _install_shell_channel(kernel: object, route: FastRoute) -> str | None:
    """Wrap the shell stream's callback; return why not, or None once installed."""
    thread = getattr(kernel, "shell_channel_thread", None)
    if not isinstance(thread, threading.Thread):
        return "no shell channel thread (ipykernel < 7)"
    if not thread.is_alive():
        return "the shell channel thread is not running"
    stream = getattr(kernel, "shell_stream", None)
    original = zmq_recv_callback(stream)
    if stream is None or not callable(original):
        return "the shell stream has no receive callback (kernel not started yet)"
    if getattr(stream, "io_loop", None) is not getattr(thread, "io_loop", object()):
        return "the shell stream is not read on the shell channel thread"
    session = getattr(kernel, "session", None)
    if not all(callable(getattr(session, name, None)) for name in ("sign", "unpack")) or not all(
        hasattr(session, name) for name in ("auth", "digest_history")
    ):
        return "the kernel session cannot check signatures"
    digests: set[bytes] = session.digest_history  # type: ignore[union-attr]  # (checked just above)

    def on_shell_message(frames: list[Any]) -> Any:
        if route._active:
            try:
                signature = _peek_shell(route, session, frames)
            except Exception:
                logger.debug("nbcoord fast route: unreadable shell message", exc_info=True)
                signature = None
            if signature is not None and route._flooded():
                # In a flood, the ordinary copy of a command this route has taken would only be dropped as a
                # duplicate, after costing the main thread the kernel's own handling of a message (about 0.7 ms):
                # it is answered here instead. Below the rate, every message goes on as it came. Its signature
                # is recorded as the kernel's own reading would have (the kernel trims the set), so that a
                # replay of it is refused by both routes.
                if signature:
                    digests.add(signature)
                return None
        return original(frames)

    def undo() -> None:
        if zmq_recv_callback(stream) is on_shell_message:
            set_zmq_recv_callback(stream, original)
        else:  # someone wrapped us since: stay in place as a pure pass-through
            logger.info("nbcoord fast route: shell callback was re-wrapped; left inert")

    # One attribute store, atomic under the GIL: the next message read uses the wrapper.
    set_zmq_recv_callback(stream, on_shell_message)
    route._undo = undo
    return None


# -- ipykernel 6 (and fallback): the control thread ------------------------------------


def _install_control(kernel: object, route: FastRoute) -> str | None:
    """Add a ``comm_msg`` control handler; return why not, or None once installed."""
    handlers = getattr(kernel, "control_handlers", None)
    if not isinstance(handlers, dict):
        return "the kernel has no control handlers"
    thread = getattr(kernel, "control_thread", None)
    if not isinstance(thread, threading.Thread) or not thread.is_alive():
        return "the control channel is handled on the main thread"
    had_previous = "comm_msg" in handlers
    previous = handlers.get("comm_msg")

    def on_control_comm_msg(stream: Any, idents: Any, msg: Any) -> Any:
        if route._active:
            try:
                if route._offer(msg.get("content") if isinstance(msg, Mapping) else None) and route.cell_running():
                    _untracked_idle(kernel, idents, msg)
            except Exception:
                logger.debug("nbcoord fast route: unreadable control message", exc_info=True)
        if callable(previous):
            return previous(stream, idents, msg)
        return None

    def undo() -> None:
        if handlers.get("comm_msg") is not on_control_comm_msg:
            logger.info("nbcoord fast route: control handler was replaced; left inert")
        elif had_previous:
            handlers["comm_msg"] = previous
        else:
            del handlers["comm_msg"]

    handlers["comm_msg"] = on_control_comm_msg
    route._undo = undo
    return None


#: A parent message type that JupyterLab and jupyter_server leave out of the kernel's status (it is in the default
#: ``untracked_message_types`` of both).
UNTRACKED_PARENT = "comm_info_request"


def _untracked_idle(kernel: object, idents: Any, msg: Mapping[str, Any]) -> None:
    """While a cell runs, make the "idle" that ipykernel 6 publishes after this control message untracked.

    ipykernel publishes busy, then idle, around every control message, with that message as parent; JupyterLab
    takes any tracked status for the kernel's, so the click's "idle" would show an idle kernel while the cell still
    runs. The parent keeps its msg_id (the sender's future still ends), and its msg_type becomes untracked.
    Through the kernel's public ``set_parent``; where that is missing, the status stays as ipykernel sends it.
    """
    set_parent = getattr(kernel, "set_parent", None)
    header = msg.get("header")
    if not callable(set_parent) or not isinstance(header, Mapping):
        _log_once(logging.INFO, "nbcoord fast route: the kernel has no set_parent; its status reads idle after a "
                  "click on the control channel while a cell runs")
        return
    set_parent(idents, {**msg, "header": {**header, "msg_type": UNTRACKED_PARENT}}, channel="control")


_Installer = Callable[[object, FastRoute], "str | None"]


def install(
    kernel: object,
    handler: Handler,
    *,
    types: Collection[str] = DEFAULT_TYPES,
    joined: JoinedHandler | None = None,
) -> FastRoute:
    """Install the fastest route the kernel offers for the panel's commands.

    Parameters
    ----------
    kernel : object
        The running ipykernel ``Kernel`` (``get_ipython().kernel``); None or anything
        else gives a route of kind ``"none"``.
    handler : callable
        ``handler(comm_id, content)``, called on the route's worker thread for each
        accepted command; ``content`` is the custom message's content, a private copy.
    types : collection of str
        Accepted values of ``content["type"]``.
    joined : callable, optional
        ``joined(comm_id, content, click_ids)``: with it, a command that comes while an equal one (but for its
        ``click_id`` and ``clicked_at``, every other value a plain one) is the last to wait for the worker joins
        that one, and reaches the worker as one of ``click_ids`` (None: every command is queued on its own).

    Returns
    -------
    FastRoute
        Register comm ids with ``add_comm``; ``uninstall`` restores the kernel.
    """
    reasons = []
    installers: tuple[tuple[RouteKind, _Installer], ...] = (
        ("shell-channel", _install_shell_channel),
        ("control", _install_control),
    )
    for kind, install_route in installers:
        route = FastRoute(kind, None, types)
        why = _try_install(kernel, route, install_route, handler, joined)
        if why is None:
            return route
        reasons.append(f"{kind}: {why}")
    route = FastRoute("none", "; ".join(reasons), types)
    _log_once(logging.WARNING, f"nbcoord: {route}; Stop acts when the running cell ends")
    return route


def _try_install(
    kernel: object, route: FastRoute, install_route: _Installer, handler: Handler, joined: JoinedHandler | None
) -> str | None:
    """Install one route and start its worker; return why not, or None."""
    with route._lock:
        try:
            why = install_route(kernel, route)
        except Exception as error:  # internals that look right but are not
            logger.debug("nbcoord fast route: %s install failed", route.kind, exc_info=True)
            return f"{type(error).__name__}: {error}"
        if why is not None:
            return why

        def idle() -> float | None:
            return route.on_idle()  # read when called: the panel sets it after install

        route._worker = Worker(handler, idle, joined)
        try:
            route._worker.start()
        except RuntimeError as error:  # "can't start new thread"
            logger.debug("nbcoord fast route: no worker thread", exc_info=True)
            route._worker = None
            if route._undo is not None:
                route._undo()
                route._undo = None
            return f"no worker thread: {error}"
        route._active = True
        return None
