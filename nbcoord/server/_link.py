"""One control-channel connection to one kernel, shared by every request the server makes to it.

Each kernel gets one client (jupyter_client's ``AsyncKernelClient`` with only its control channel started, on the
kernel manager's own zmq context and session) and one reader task that routes each reply to the request it answers,
by the request's ``msg_id``. Requests to one kernel may overlap (a stop runs while the page asks for a summary);
replies that come after their request gave up are dropped. A link lives as long as its kernel; the fleet closes it
when the kernel goes away.

Requests are written and replies read through pyzmq's asyncio socket only (see :meth:`KernelLink.request` and
``_read``): jupyter_client's ``Session.send`` and ``get_msg`` each bypass pyzmq's asyncio event handling in a way that
can leave a link deaf for good (a reply waiting in the socket that nothing wakes up for). It happened in about one
test run in five, always after a kernel had been busy in native code, before this module did its own reads and writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger("nbcoord.server")

Reply = dict[str, Any]


def _log_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("nbcoord: a control request could not be sent: %s", sent.exception())


class LinkClosed(Exception):
    """The link was closed while a request waited."""


class KernelLink:
    """A control-channel client to one kernel; see the module docstring."""

    def __init__(self, kernel_manager: Any) -> None:
        context = getattr(kernel_manager, "context", None)
        extra = {"context": context} if context is not None else {}
        self._client: Any = kernel_manager.client(**extra)
        self._client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
        self._socket: Any = self._client.control_channel.socket
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._reader = asyncio.ensure_future(self._read())
        self.closed = False

    def request(self, msg_type: str, content: dict[str, Any]) -> tuple[str, asyncio.Future[Reply]]:
        """Send a request; returns its msg_id and the future of its reply."""
        if self.closed:
            raise LinkClosed("the link to this kernel is closed")
        session = self._client.session
        message = session.msg(msg_type, content)
        msg_id = str(message["header"]["msg_id"])
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        # Through the asyncio socket itself, not Session.send: that writes through a synchronous shadow of the
        # socket, which can consume the wake-up (zmq's descriptor is edge-triggered) of the reader's pending recv,
        # after which no reply reaches the reader again.
        sent = self._socket.send_multipart(session.serialize(message))
        sent.add_done_callback(_log_send_failure)
        return msg_id, future

    def forget(self, *msg_ids: str) -> None:
        """Stop waiting for these replies (they are dropped if they come)."""
        for msg_id in msg_ids:
            future = self._waiting.pop(msg_id, None)
            if future is not None and not future.done():
                future.cancel()

    async def _read(self) -> None:
        # recv_multipart on the asyncio socket, not the channel's get_msg (which waits in socket.poll()): pyzmq's
        # asyncio send and recv share one event handler that re-checks the socket's events after each, so neither
        # misses the other's wake-up.
        session = self._client.session
        while True:
            frames = await self._socket.recv_multipart()
            try:
                _idents, parts = session.feed_identities(frames)
                reply = session.deserialize(parts)
            except Exception:  # an unreadable or unsigned message: never the end of the link
                log.debug("nbcoord: unreadable control reply", exc_info=True)
                continue
            parent = (reply.get("parent_header") or {}).get("msg_id")
            future = self._waiting.pop(str(parent), None)
            if future is not None and not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        """Cancel the reader, fail the requests that wait, close the sockets. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(LinkClosed("the link to this kernel was closed"))
        self._waiting.clear()
        try:
            self._client.stop_channels()
        except Exception:
            log.debug("nbcoord: closing a control link failed", exc_info=True)
