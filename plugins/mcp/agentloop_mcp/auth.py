"""OAuth for MCP servers reached over HTTP: the login, and the tokens kept on disk.

`transport` gives the HTTP client of a server with `auth` the mcp SDK's OAuth provider
built here (discovery, client registration, PKCE, refresh), fed from a token file of the
server's own. A run never asks a person: without a usable token it fails with a line
saying to run `agentloop mcp login SERVER`, which is `login` below: it prints the
authorization URL (and offers the browser) and takes the code on a page on 127.0.0.1.
"""

from __future__ import annotations

import html
import json
import logging
import os
import sys
import time
import webbrowser
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import httpx2
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import ValidationError

from .config import MCPOAuth, MCPServer, _safe_name
from .transport import MCPAuthError, describe

__all__ = (
    "LOGIN_TIMEOUT",
    "TOKENS_ENV_VAR",
    "MCPAuthError",
    "TokenFile",
    "login",
    "logout",
    "oauth_provider",
    "token_path",
)

TOKENS_ENV_VAR = "AGENTLOOP_MCP_TOKENS"
"""The directory of the token files; `$XDG_CONFIG_HOME/agentloop/mcp-tokens` when unset."""

LOGIN_TIMEOUT = 300.0
"""Seconds `login` waits for the browser to come back with the authorization code."""

_EARLY = 60.0
"""Seconds before a stored access token expires that it is refreshed instead of sent."""

Browser = Callable[[str], Awaitable[None]]
"""Shows a person the authorization URL (a terminal prints it and opens a browser)."""


class _ReportedByUs(logging.Filter):
    """Drops the SDK's traceback of a flow stopped by `MCPAuthError`, which says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, MCPAuthError)


logging.getLogger("mcp.client.auth.oauth2").addFilter(_ReportedByUs())


def token_path(server: MCPServer) -> Path:
    """The file that keeps `server`'s tokens and client registration."""
    chosen = os.environ.get(TOKENS_ENV_VAR, "").strip()
    if chosen:
        folder = Path(chosen).expanduser()
    else:
        base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        folder = Path(base) / "agentloop" / "mcp-tokens"
    return folder / f"{_safe_name(server.name)}.json"


class TokenFile:
    """The SDK's `TokenStorage` as one JSON file per server, readable by its owner only.

    The file holds the tokens, when the access token expires (a time, so it still means
    something in the next process) and the client registration. It belongs to one URL: a
    server moved elsewhere starts afresh. Written whole to a new file created with mode
    0600, then moved over the old one, so a reader never sees half a file.
    """

    def __init__(self, path: Path, server_url: str, client: MCPOAuth) -> None:
        """Keep `server_url`'s tokens in `path`; `client` may name a registered client."""
        self.path = path
        self._url = server_url
        self._client = client

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}  # none yet, or not JSON (cut short, edited): a login writes it afresh
        except OSError as exc:
            raise MCPAuthError(f"cannot read the OAuth tokens in {self.path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("server_url") != self._url:
            return {}
        return data

    def _write(self, **changes: Any) -> None:
        data = {**self._read(), **changes, "server_url": self._url}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fresh.unlink(missing_ok=True)
        descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=1)
        fresh.replace(self.path)

    def expires_at(self) -> float | None:
        """When the stored access token expires (seconds since the epoch); None: unknown."""
        value = self._read().get("expires_at")
        return float(value) if isinstance(value, (int, float)) else None

    async def get_tokens(self) -> OAuthToken | None:
        """The stored tokens, if any."""
        found = self._read().get("tokens")
        try:
            return None if found is None else OAuthToken.model_validate(found)
        except ValidationError:
            return None  # an unreadable entry is as good as none: log in again

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep new tokens, with the time their access token expires."""
        expires = None if tokens.expires_in is None else time.time() + tokens.expires_in
        self._write(tokens=tokens.model_dump(mode="json"), expires_at=expires)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The client registered with the authorization server (or the configured one)."""
        if self._client.client_id is not None:
            return OAuthClientInformationFull(
                client_id=self._client.client_id,
                client_secret=self._client.client_secret,
                redirect_uris=[self._client.redirect_uri],  # type: ignore[list-item]
                token_endpoint_auth_method="client_secret_post"
                if self._client.client_secret
                else "none",
            )
        found = self._read().get("client_info")
        try:
            client = None if found is None else OAuthClientInformationFull.model_validate(found)
        except ValidationError:
            return None
        redirects = [str(uri) for uri in (client.redirect_uris or [])] if client else []
        if self._client.redirect_uri not in redirects:
            return None  # registered for another callback port: register again
        return client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep the client registration made with the authorization server."""
        self._write(client_info=client_info.model_dump(mode="json", exclude_none=True))


def oauth_provider(server: MCPServer, callback: _Callback | None = None) -> OAuthClientProvider:
    """The SDK's OAuth provider (an `httpx2.Auth`) for `server`, with its token file.

    Args:
        server: A server with `auth` set.
        callback: The login's page on 127.0.0.1 and the person's browser; None (a run):
            a login that is needed fails with `MCPAuthError` saying how to log in.
    """
    assert server.auth is not None, "oauth_provider needs a server with auth"
    storage = TokenFile(token_path(server), str(server.url), server.auth)
    asker = callback or _NoOne(server)
    provider = OAuthClientProvider(
        server_url=str(server.url),
        client_metadata=OAuthClientMetadata(
            redirect_uris=[server.auth.redirect_uri],  # type: ignore[list-item]
            client_name=server.auth.client_name,
            grant_types=["authorization_code", "refresh_token"],
            scope=" ".join(server.auth.scopes) or None,
        ),
        storage=storage,
        redirect_handler=asker.show,
        callback_handler=asker.result,
    )
    # The provider loads the tokens itself but not when they expire, which only this file
    # knows across processes: without it an expired token is sent rather than refreshed.
    # A token about to expire is refreshed now, rather than refused mid-way.
    expires = storage.expires_at()
    provider.context.token_expiry_time = None if expires is None else expires - _EARLY
    return provider


async def login(server: MCPServer, browser: Browser | None = None) -> None:
    """Log in to `server` now: authorize in the browser, keep the tokens in its file.

    A stored token that still works (or can be refreshed) is kept without asking.

    Args:
        server: A server with `auth` set.
        browser: Shows the authorization URL to a person (it may return at once, or once
            the browser is done); by default the URL is printed on stderr and offered to
            the system's browser.

    Raises:
        MCPAuthError: the server has no `auth`, or the login failed (the message says why).
    """
    if server.auth is None:
        raise MCPAuthError(f"MCP server '{server.name}' is not configured for OAuth (auth)")
    # Any request the server protects starts the flow; `initialize` is one every MCP
    # server answers, and what it answers after the login does not matter here.
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "agentloop", "version": "login"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream", **server.headers}
    # The legacy SSE transport's endpoint is its event stream: a GET, left once answered.
    method, body = ("GET", None) if server.transport == "sse" else ("POST", hello)
    callback = _Callback(server.auth.callback_port, browser or _terminal_browser)
    try:
        async with (
            callback.listening(),
            httpx2.AsyncClient(auth=oauth_provider(server, callback), timeout=30.0) as http,
            http.stream(method, str(server.url), json=body, headers=headers) as response,
        ):
            status = response.status_code
    except MCPAuthError:
        raise
    except Exception as exc:
        raise MCPAuthError(
            f"OAuth login to MCP server '{server.name}' failed: {describe(exc)}"
        ) from exc
    if status in (401, 403):
        raise MCPAuthError(
            f"MCP server '{server.name}' still refuses the new token (HTTP {status})"
        )
    if status >= 400:
        raise MCPAuthError(
            f"OAuth login to MCP server '{server.name}' failed: it answered HTTP {status} "
            f"to {method} {server.url}"
        )


def logout(server: MCPServer) -> bool:
    """Forget `server`'s tokens and client registration; whether there were any."""
    path = token_path(server)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


async def _terminal_browser(url: str) -> None:
    print(f"Open this URL to authorize agentloop:\n\n    {url}\n", file=sys.stderr, flush=True)
    # A text browser runs until the person quits it: in a thread, so the callback page
    # is served meanwhile.
    await anyio.to_thread.run_sync(_open_browser, url, abandon_on_cancel=True)


def _open_browser(url: str) -> None:
    try:
        webbrowser.open(url)
    except webbrowser.Error:
        pass  # no browser here: the printed URL is enough


class _NoOne:
    """A run's side of the login: nobody to ask, so it says how to log in."""

    def __init__(self, server: MCPServer) -> None:
        self._name = server.name

    async def show(self, url: str) -> None:
        raise MCPAuthError(
            "it needs an OAuth login (no usable token is stored): "
            f"run `agentloop mcp login {self._name}`"
        )

    async def result(self) -> AuthorizationCodeResult:
        raise AssertionError("show() refused the login")  # pragma: no cover


class _Callback:
    """The page on 127.0.0.1 the browser is sent back to with the authorization code."""

    def __init__(self, port: int, browser: Browser) -> None:
        self._port = port
        self._browser = browser
        self._found: dict[str, list[str]] | None = None
        self._done = anyio.Event()

    @asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        """Serve the page while the block runs (the browser may come back at any time)."""
        try:
            listener = await anyio.create_tcp_listener(
                local_host="127.0.0.1", local_port=self._port
            )
        except OSError as exc:
            raise MCPAuthError(
                f"cannot listen for the OAuth callback on 127.0.0.1:{self._port} ({exc}); "
                "set another callback_port in the server's auth"
            ) from exc
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, self._answer)
            yield
            group.cancel_scope.cancel()

    async def show(self, url: str) -> None:
        """Show the person the authorization URL."""
        await self._browser(url)

    async def result(self) -> AuthorizationCodeResult:
        """The code (and state) the browser brought back."""
        with anyio.move_on_after(LOGIN_TIMEOUT):
            await self._done.wait()
        query = self._found
        if query is None:
            raise MCPAuthError(f"no OAuth callback from the browser within {LOGIN_TIMEOUT:g} s")
        if "error" in query:
            why = query.get("error_description", query["error"])[0]
            raise MCPAuthError(f"the authorization server refused the login: {why}")
        return AuthorizationCodeResult(
            code=query["code"][0],
            state=query.get("state", [None])[0],
            iss=query.get("iss", [None])[0],
        )

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            query = await _request_query(stream)
            if query is None or not ("code" in query or "error" in query) or self._done.is_set():
                await _respond(stream, 404, "Not the OAuth callback this login waits for.")
                return
            self._found = query
            self._done.set()
            if "code" in query:
                await _respond(stream, 200, "Logged in: you can close this page.")
            else:
                await _respond(stream, 400, f"Login refused: {query['error'][0]}")


async def _request_query(stream: anyio.abc.SocketStream) -> dict[str, list[str]] | None:
    """The query of a `GET /callback?...` request; None for any other request."""
    head = b""
    with anyio.move_on_after(10):
        try:
            while b"\r\n\r\n" not in head and len(head) < 16384:
                head += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return None
    method, _, rest = head.partition(b"\r\n")[0].decode("latin-1").partition(" ")
    target = urlsplit(rest.rpartition(" ")[0])
    if method != "GET" or target.path != "/callback":
        return None
    return parse_qs(target.query)


async def _respond(stream: anyio.abc.SocketStream, status: int, text: str) -> None:
    body = f"<!doctype html><title>agentloop</title><p>{html.escape(text)}</p>".encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    await stream.send(head.encode() + body)
