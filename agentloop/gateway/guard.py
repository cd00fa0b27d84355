"""Connection limits in front of the gateway: no client holds a connection it does not use.

uvicorn waits for a request's head as long as its client trickles it, and any address may
open as many connections as it likes. `agentloop serve` puts a `Guard` around uvicorn's
HTTP protocol and around the app: a request's head must arrive within `head_timeout`
seconds (of the connection, or of the end of the previous answer on it), its body within
`body_timeout` seconds of its head, and one address holds at most `per_address`
connections. The protocol knows the connection, the app knows where a request starts and
its answer ends; they meet by the client's address and port, which both see.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import anyio

from agentloop._wire import compact_json, random_id
from agentloop.logs import get_logger

from .defaults import BODY_TIMEOUT, CONNECTIONS_PER_ADDRESS, HEAD_TIMEOUT
from .errors import error_body

__all__ = ("ConnectionLimits", "Guard")

_log = get_logger()

Peer = tuple[str, int]
ASGIApp = Any


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections it holds."""

    head_timeout: float = HEAD_TIMEOUT
    """Seconds a request's head (request line and headers) may take to arrive, counted
    from the connection or from the end of the previous answer on it; then the
    connection is answered `408` and closed."""
    body_timeout: float = BODY_TIMEOUT
    """Seconds a request's body may take to arrive once its head has; then it is
    answered `408` and the connection closed."""
    per_address: int = CONNECTIONS_PER_ADDRESS
    """Connections one client address may hold open at once (0: no limit); one more is
    answered `429` and closed."""


def _raw_answer(status: int, reason: str, kind: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer with the API's error body, closing the connection."""
    body = compact_json(error_body(kind, message, random_id("req_")))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class Guard:
    """The limits of `ConnectionLimits`, kept across uvicorn's protocol and the app."""

    def __init__(self, limits: ConnectionLimits) -> None:
        """A guard keeping `limits`."""
        self.limits = limits
        self.open: Counter[str] = Counter()
        """Connections open, by client address."""
        self.connections: dict[Peer, _GuardedConnection] = {}
        """Open connections by client address and port (as the app's `scope["client"]`)."""

    def protocol(self, inner: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        """A protocol class for uvicorn (`Config(http=...)`) guarding `inner`'s connections."""
        attributes = {"guard": self, "inner": inner}
        return cast(
            "type[asyncio.Protocol]", type("GuardedHTTP", (_GuardedConnection,), attributes)
        )

    def app(self, app: ASGIApp) -> ASGIApp:
        """`app`, each request's head and answer told to its connection, its body timed."""

        async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
            client = scope.get("client")
            connection = self.connections.get((client[0], client[1])) if client else None
            if scope["type"] != "http" or connection is None:
                await app(scope, receive, send)
                return
            connection.head_arrived()
            try:
                body = await self._body(receive)
                if body is None:
                    message = (
                        f"the request's body did not arrive within "
                        f"{self.limits.body_timeout:g} seconds"
                    )
                    await _answer_timeout(send, message)
                    _log.warning("gateway.slow_request", client=client, part="body")
                    return
                await app(scope, _replay(body, receive), send)
            finally:
                connection.answered()

        return guarded

    async def _body(self, receive: Any) -> list[dict[str, Any]] | None:
        """The request's body messages, or None when they took too long."""
        messages: list[dict[str, Any]] = []
        with anyio.move_on_after(self.limits.body_timeout):
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request" or not message.get("more_body"):
                    return messages
        return None


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    """A `receive` giving `messages` first, then what `receive` gives."""
    waiting = list(messages)

    async def replayed() -> Any:
        if waiting:
            return waiting.pop(0)
        return await receive()

    return replayed


async def _answer_timeout(send: Any, message: str) -> None:
    request_id = random_id("req_")
    body = compact_json(error_body("invalid_request_error", message, request_id))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"request-id", request_id.encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 408, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _GuardedConnection(asyncio.Protocol):
    """One connection: `inner` (uvicorn's protocol) with a deadline on each request head.

    A subclass made by `Guard.protocol` sets `guard` and `inner`.
    """

    guard: Guard
    inner: type[asyncio.Protocol]

    def __init__(self, **options: Any) -> None:
        self.protocol = self.inner(**options)
        self.transport: Any = None
        """The connection's transport (asyncio's, or uvloop's, which is not a subclass)."""
        self.peer: Peer | None = None
        self.refused = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:  # (not on a Unix socket)
            self.peer = (str(peer[0]), int(peer[1]))
            address, limit = self.peer[0], self.guard.limits.per_address
            if limit and self.guard.open[address] >= limit:
                _log.warning("gateway.too_many_connections", address=address, limit=limit)
                message = f"more than {limit} connections at once from this address"
                self.transport.write(
                    _raw_answer(429, "Too Many Requests", "rate_limit_error", message)
                )
                self.refused = True
                transport.close()
                return
            self.guard.open[address] += 1
            self.guard.connections[self.peer] = self
        self.protocol.connection_made(transport)
        self.answered()

    def answered(self) -> None:
        """The answer to a request has been sent: the next head is due in time."""
        self._cancel()
        timeout = self.guard.limits.head_timeout
        if math.isfinite(timeout):
            self.timer = asyncio.get_running_loop().call_later(timeout, self._too_slow)

    def head_arrived(self) -> None:
        """A request's head is in: the app has it."""
        self._cancel()

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        if self.transport is None or self.transport.is_closing():
            return
        _log.warning("gateway.slow_request", client=self.peer, part="head")
        limit = self.guard.limits.head_timeout
        message = f"the request's head did not arrive within {limit:g} seconds"
        self.transport.write(_raw_answer(408, "Request Timeout", "invalid_request_error", message))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            self.protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.protocol.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self.refused:
            return
        if self.peer is not None:
            address = self.peer[0]
            self.guard.open[address] -= 1
            if not self.guard.open[address]:
                del self.guard.open[address]
            if self.guard.connections.get(self.peer) is self:
                del self.guard.connections[self.peer]
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()
