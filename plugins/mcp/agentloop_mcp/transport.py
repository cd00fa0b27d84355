"""How a connection reaches its MCP server, and the errors it reports.

`transport` opens the server's transport (a stdio process, SSE, or streamable HTTP) with a
read stream that marks the connection lost when it ends, mends or answers a reply the SDK
could not read (so the call it answers does not wait for ever), and keeps the first line a
server wrote that is not an MCP message; the helpers below tell apart a request that never
reached the server from one cut off mid-way.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import httpx2
import mcp.types as mcp_types
import pydantic
from agentloop import AgentloopError
from agentloop.logs import get_logger
from anyio.streams.memory import MemoryObjectSendStream
from mcp import StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import SessionMessage

from .config import MCPServer

__all__ = (
    "NOT_DELIVERED",
    "MCPAuthError",
    "MCPConnectError",
    "MCPRequestError",
    "connection_lost",
    "describe",
    "garbled",
    "no_back_channel",
    "not_delivered",
    "transport",
)

_log = get_logger()


class _ReportedByTheStream(logging.Filter):
    """Drops the SDK's record of a stdout line it could not parse, traceback and all.

    The SDK logs one per line a server writes that is not JSON-RPC; the read stream below
    mends the line or reports it, once per connection (`mcp.not_a_message`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to parse JSONRPC message")


logging.getLogger("mcp.client.stdio").addFilter(_ReportedByTheStream())

NOT_DELIVERED = "request not delivered"
"""Starts the message of a call that provably never reached the server (connect refused)."""


class MCPRequestError(AgentloopError):
    """A request to a server other than a tool call (resources, prompts) failed."""


class MCPAuthError(AgentloopError):
    """An OAuth login is needed, or failed (see `agentloop_mcp.auth`): says what to do."""


class MCPConnectError(AgentloopError):
    """An MCP server could not be started or reached when the tool source opened."""

    def __init__(self, message: str, *, server: str | None = None, reason: str = "") -> None:
        """`message` names the server; `server` and `reason` are kept for reports."""
        super().__init__(message)
        self.server = server
        """The server's name (None when several are meant)."""
        self.reason = reason or message
        """Why, without the server's name."""


@asynccontextmanager
async def transport(
    server: MCPServer, lost: anyio.Event, garbage: list[str]
) -> AsyncIterator[tuple[_WatchedStream, MemoryObjectSendStream[SessionMessage]]]:
    """The server's transport, with a read stream that reports when it ends."""
    if server.transport == "stdio":
        params = StdioServerParameters(
            command=str(server.command),
            args=list(server.args),
            env=dict(server.env) or None,
            cwd=server.cwd,
            # Bytes that are not UTF-8 (a string cut mid-character) become U+FFFD in
            # their line, rather than an error that ends the connection.
            encoding_error_handler="replace",
        )
        async with stdio_client(params, errlog=_errlog()) as (read, write):
            yield _WatchedStream(read, lost, garbage, server.name), write  # type: ignore[misc]
    elif server.transport == "sse":
        async with sse_client(
            str(server.url), headers=dict(server.headers), auth=_auth(server)
        ) as (read, write):
            yield _WatchedStream(read, lost, garbage, server.name), write
    else:
        async with (
            _HTTPClient(
                headers=dict(server.headers),
                timeout=httpx2.Timeout(30.0, read=300.0),
                auth=_auth(server),
            ) as http,
            streamable_http_client(str(server.url), http_client=http) as (read, write),
        ):
            yield _WatchedStream(read, lost, garbage, server.name), write  # type: ignore[misc]


def _auth(server: MCPServer) -> httpx2.Auth | None:
    """The OAuth provider of a server with `auth`, reading its stored tokens."""
    if server.auth is None:
        return None
    from .auth import oauth_provider  # the OAuth machinery only for servers that use it

    return oauth_provider(server)


def garbled(garbage: list[str]) -> str | None:
    """Why a connect failed, when the server wrote lines that are not MCP messages."""
    if not garbage:
        return None
    return (
        f"the server wrote something that is not an MCP message on its output ({garbage[0]}); "
        "a stdio server must write only JSON-RPC to stdout (logs go to stderr)"
    )


class _WatchedStream:
    """A transport's read stream that sets `lost` when it ends: how a dead process shows.

    It also keeps the first thing read that was not a message (a server printing logs on
    stdout) in `garbage`, to explain a failed connect.
    """

    def __init__(self, inner: Any, lost: anyio.Event, garbage: list[str], server: str) -> None:
        self._inner = inner
        self._server = server
        self._lost = lost
        self._garbage = garbage

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message, when the inner stream keeps one."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        """The next message; the end of the stream marks the connection lost."""
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost.set()
            raise
        if isinstance(item, Exception):
            mended = _mend(item, self._server)
            if mended is not None:
                return mended
        if isinstance(item, Exception) and not self._garbage:
            self._garbage.append(_first_line(item))
            _log.warning("mcp.not_a_message", mcp_server=self._server, error=self._garbage[0])
        return item

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _HTTPClient(httpx2.AsyncClient):
    """An HTTP client that answers a POST it could not even connect for with an MCP error.

    Without this, a refused connection surfaces as an exception that tears the transport
    down, and the call it carried could not be told apart from one cut off mid-way. As a
    JSON-RPC error the call fails on its own, marked as never delivered, so it can safely
    be sent again after the reconnect.
    """

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        """Send `request`; a refused POST becomes a 503 carrying a JSON-RPC error.

        A 401 or 403 without a JSON-RPC error of its own gets one that says so (the SDK
        would report "Server returned an error response").
        """
        try:
            response = await super().send(request, **kwargs)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            if request.method != "POST":
                raise
            body = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": mcp_types.CONNECTION_CLOSED,
                    "message": f"{NOT_DELIVERED}: {describe(exc)}",
                },
            }
            return httpx2.Response(503, json=body, request=request)
        kind = response.headers.get("content-type", "")
        if response.status_code not in _AUTH_REFUSED or kind.startswith("application/json"):
            return response
        await response.aclose()
        status = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        error = {
            "code": mcp_types.INVALID_REQUEST,
            "message": f"{status}: {_AUTH_REFUSED[response.status_code]}",
        }
        body = {"jsonrpc": "2.0", "id": None, "error": error}
        return httpx2.Response(response.status_code, json=body, request=request)


_AUTH_REFUSED = {
    401: "the server wants authorization, and the token is missing or wrong (give it in "
    'the server\'s "headers", e.g. "Authorization": "Bearer ${TOKEN}")',
    403: "the server refused the token given (wrong, expired, or without the permission)",
}


def not_delivered(error: MCPError) -> bool:
    """Whether a request provably never reached the server (it can be sent again)."""
    message = error.error.message
    if error.error.code == mcp_types.CONNECTION_CLOSED and message.startswith(NOT_DELIVERED):
        return True
    # A server that restarted does not know our session: it refused the call unread.
    return error.error.code == mcp_types.INVALID_REQUEST and message == "Session terminated"


def no_back_channel(error: MCPError) -> bool:
    """Whether a server refused a call because it could not ask the client a question."""
    if isinstance(error, NoBackChannelError):
        return True
    data = error.error
    return data.code == mcp_types.INVALID_REQUEST and "no back-channel" in data.message


def connection_lost(error: MCPError) -> bool:
    """Whether `error` says the connection is gone (the call may be retried after it)."""
    return error.error.code == mcp_types.CONNECTION_CLOSED or not_delivered(error)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: ours, when it is a real file."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    raise MCPConnectError("no stderr to give an MCP server process")


def _mend(exc: Exception, server: str) -> SessionMessage | None:
    """A message for a line the SDK could not read, when the line is JSON-RPC after all.

    A lone UTF-16 surrogate in a string (what a JavaScript server writes when it cuts a
    string mid-emoji) is valid JSON that the SDK's parser refuses: such strings get U+FFFD
    in its place. A reply that still cannot be read becomes an error reply to its request,
    so the call ends now instead of at its timeout. None: not JSON-RPC at all.
    """
    if not isinstance(exc, pydantic.ValidationError):
        return None
    found = [e.get("input") for e in exc.errors()]
    if not found or not isinstance(found[0], str):
        return None
    try:
        data = json.loads(found[0])
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        return None
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_python(_mended(data), by_name=False)
    except ValueError as error:
        if data.get("id") is None or not ("result" in data or "error" in data):
            return None
        reason = _first_line(error)
        _log.warning("mcp.unreadable_reply", mcp_server=server, id=data["id"], error=reason)
        failure = mcp_types.ErrorData(
            code=mcp_types.INTERNAL_ERROR,
            message=f"the server's reply could not be read ({reason})",
        )
        return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=data["id"], error=failure))
    _log.warning("mcp.reply_mended", mcp_server=server, reason="a lone UTF-16 surrogate")
    return SessionMessage(message)


def _mended(value: Any) -> Any:
    """`value` with each lone UTF-16 surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_mended(v) for v in value]
    if isinstance(value, dict):
        return {_mended(k): _mended(v) for k, v in value.items()}
    return value


def _first_line(exc: Exception) -> str:
    """A parse error in a few words: the line the server wrote, when pydantic kept it."""
    if isinstance(exc, pydantic.ValidationError):
        found = [e.get("input") for e in exc.errors()]
        if found and isinstance(found[0], str):
            return f"a line reading {found[0][:100]!r}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " / ".join(lines[:3]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def describe(exc: BaseException) -> str:
    """An exception in a few words (an exception group of one: its exception)."""
    inner = getattr(exc, "exceptions", None)  # an exception group (3.10 has no builtin name)
    if isinstance(inner, tuple) and len(inner) == 1 and isinstance(inner[0], BaseException):
        return describe(inner[0])
    if isinstance(exc, MCPError):
        return exc.error.message
    if isinstance(exc, MCPAuthError):
        return str(exc)  # written to be read as it is
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
