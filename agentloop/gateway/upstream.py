"""The upstream side of the gateway: the Messages API the gateway forwards to.

Requests go out through `AnthropicProvider` over the SDK's `AsyncAnthropic`, one client
per upstream credential sharing one connection pool. The first model request of a client
request is sent once, without retries, so an upstream error reaches the client as it was
(its own retry logic reads it). The hidden rounds after it are retried
by the gateway, since the client cannot retry those on its own; an answer asking to wait
longer than the gateway's limit goes to the client as it is. A stream that stays silent
longer than the upstream timeout is given up. The gateway learns of responses and their
headers from the run's own events, as any user of `run_stream` does. Token counts and
model listings go through the same clients and come back as the upstream answered them
(`Upstream.forward`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import anyio
import httpx2
import sniffio

from agentloop.errors import APIConnectionError, ConfigurationError, ProviderError
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import ModelRequest, ModelResponse, StreamEvent, retry_after

__all__ = (
    "HIDDEN_ROUND_RETRIES",
    "RETRY_WAIT_LIMIT",
    "THREADS_BETA_PREFIX",
    "Forwarded",
    "StreamingUpstreamProvider",
    "Transport",
    "Upstream",
    "UpstreamProvider",
    "UpstreamTimeoutError",
    "client_headers",
    "forwarded_headers",
)

HIDDEN_ROUND_RETRIES = 2
"""Retries of the model requests of hidden rounds (the first one has none)."""

_SDK_TIMEOUT = 600.0
"""The SDK's default timeout, in seconds."""

RETRY_WAIT_LIMIT = 10.0
"""The longest `retry-after` a hidden round waits for (beyond it, the error goes to the
client with its `retry-after`, for its own retry logic)."""

THREADS_BETA_PREFIX = "message-threads-"
"""The `anthropic-beta` value a client sends for message threads, which the gateway
serves itself and keeps from the upstream."""

_DROPPED_HEADERS = frozenset({"anthropic-beta"})


class Upstream:
    """The clients for one upstream URL, one pair per credential (cached)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = None,
        cache: int = 256,
        transport: Transport = "auto",
        retry_wait_limit: float = RETRY_WAIT_LIMIT,
    ) -> None:
        """Clients for `base_url`; at most `cache` credentials keep their clients.

        `timeout` is the SDK's timeout for each upstream request (its default when None;
        `math.inf` for none) and the longest silence within an upstream stream;
        `retry_wait_limit` the longest `retry-after` a hidden round waits for.

        Made inside the event loop that will use them: `transport` "auto" picks the
        SDK's aiohttp client on asyncio when aiohttp is installed (`anthropic[aiohttp]`,
        which the gateway extra brings), else its httpx client.

        Raises:
            ConfigurationError: `transport` is "aiohttp" and that cannot work here.
        """
        options: dict[str, Any] = {"base_url": base_url, "max_retries": 0}
        if timeout is not None:
            options["timeout"] = None if math.isinf(timeout) else timeout
        self.idle_timeout = _SDK_TIMEOUT if timeout is None else timeout
        """Longest silence between two events of an upstream stream."""
        self.retry_wait_limit = retry_wait_limit
        self.http = _pool(transport)
        """The connection pool every client shares."""
        # The base client never sends its own placeholder credential: every request
        # goes through a copy carrying the credential chosen for it.
        self._base = anthropic.AsyncAnthropic(api_key="unset", http_client=self.http, **options)
        self._clients: OrderedDict[str, AnthropicProvider] = OrderedDict()
        self._cache = cache

    def provider(self, credential: str, *, stream: bool) -> UpstreamProvider:
        """The provider of one client request sent upstream with `credential`.

        With `stream`, it streams every model request (the agent streams through it
        when the run does); else it sends each one as JSON.
        """
        kind = StreamingUpstreamProvider if stream else UpstreamProvider
        return kind(
            self.client_provider(credential),
            idle_timeout=self.idle_timeout,
            retry_wait_limit=self.retry_wait_limit,
        )

    def client_provider(self, credential: str) -> AnthropicProvider:
        """The provider (over a client without retries) for `credential`."""
        provider = self._clients.get(credential)
        if provider is None:
            provider = AnthropicProvider(self._base.with_options(api_key=credential))
            self._clients[credential] = provider
            while len(self._clients) > self._cache:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(credential)
        return provider

    async def forward(
        self,
        credential: str,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Forwarded:
        """Send one request upstream as it is (no retries) and return its answer.

        An error answer is returned too, unchanged, for the client to read; only a
        request that got no answer raises (`agentloop.errors.APIConnectionError`).
        """
        client = self.client_provider(credential).client
        options: Any = {"headers": dict(headers or {}), "params": dict(query or {})}
        try:
            if method == "GET":
                response = await client.get(path, cast_to=httpx2.Response, options=options)
            else:
                response = await client.post(
                    path, cast_to=httpx2.Response, body=body, options=options
                )
            content = await response.aread()
        except anthropic.APIStatusError as exc:
            response = exc.response
            content = await response.aread()
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            raise APIConnectionError(f"could not reach the upstream: {exc}") from exc
        headers = client_headers(response.headers, also=("request-id",))
        headers["content-type"] = response.headers.get("content-type", "application/json")
        return Forwarded(response.status_code, content, headers)

    async def aclose(self) -> None:
        """Close the shared connection pool."""
        self._clients.clear()
        await self._base.close()


Transport = Literal["auto", "aiohttp", "httpx"]
"""The HTTP client under the SDK's clients: aiohttp or httpx (both as the SDK makes them)."""


def _pool(transport: Transport) -> httpx2.AsyncClient:
    """The SDK's HTTP client for `transport`.

    aiohttp parses and writes HTTP in C: two to three tenths of a millisecond less CPU
    per upstream request than httpx. It runs on asyncio only.
    """
    if transport != "httpx":
        if sniffio.current_async_library() != "asyncio":
            problem = "aiohttp runs on asyncio only"
        else:
            try:
                return anthropic.DefaultAioHttpClient()
            except RuntimeError as exc:  # the SDK's answer when aiohttp is not installed
                problem = str(exc)
        if transport == "aiohttp":
            raise ConfigurationError(f"the aiohttp upstream transport: {problem}")
    return anthropic.DefaultAsyncHttpxClient()


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The API headers (`anthropic-*`) of a client request, to send upstream unchanged.

    The message-threads beta is left out: the gateway serves threads itself and sends
    the upstream whole histories.
    """
    out = {
        k: v for k, v in headers.items() if k.startswith("anthropic-") and k not in _DROPPED_HEADERS
    }
    betas = headers.get("anthropic-beta")
    if betas is not None:
        kept = [b.strip() for b in betas.split(",") if b.strip()]
        kept = [b for b in kept if not b.startswith(THREADS_BETA_PREFIX)]
        if kept:
            out["anthropic-beta"] = ",".join(kept)
    return out


class UpstreamProvider:
    """The provider of one client request: its first model request as the client sent it.

    Hidden rounds (every request after the first) are retried (`HIDDEN_ROUND_RETRIES`)
    unless the upstream asks to wait more than `retry_wait_limit` seconds. Its only
    state is how many requests it has sent, which tells the first from the hidden ones.
    """

    def __init__(
        self,
        provider: AnthropicProvider,
        *,
        idle_timeout: float = _SDK_TIMEOUT,
        retry_wait_limit: float = RETRY_WAIT_LIMIT,
    ) -> None:
        """Send every model request with `provider` (whose client does not retry).

        A stream silent for `idle_timeout` seconds fails (`StreamingUpstreamProvider`).
        """
        self.provider = provider
        self.idle_timeout = idle_timeout
        self.retry_wait_limit = retry_wait_limit
        self._sent = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` as one JSON request."""
        return await self._ask(lambda: self.provider.complete(request), lambda: True)

    async def _ask(
        self, send: Callable[[], Awaitable[ModelResponse]], repeatable: Callable[[], bool]
    ) -> ModelResponse:
        """`send()`, retried in hidden rounds while `repeatable()` and the upstream allows."""
        hidden = self._sent > 0
        self._sent += 1
        attempt = 0
        while True:
            try:
                return await send()
            except ProviderError as exc:
                wait = _retry_wait(exc, attempt)
                retry = hidden and attempt < HIDDEN_ROUND_RETRIES and repeatable()
                if not retry or wait is None or wait > self.retry_wait_limit:
                    raise
            attempt += 1
            await anyio.sleep(wait)


class StreamingUpstreamProvider(UpstreamProvider):
    """An `UpstreamProvider` that streams: the agent streams through it when the run does."""

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`; a hidden round is retried only before its first event."""
        heard = False

        async def send() -> ModelResponse:
            with anyio.CancelScope() as idle:
                idle.deadline = anyio.current_time() + self.idle_timeout

                async def report(event: StreamEvent) -> None:
                    nonlocal heard
                    heard = True
                    idle.deadline = anyio.current_time() + self.idle_timeout
                    await on_event(event)

                return await self.provider.stream(request, report)
            raise UpstreamTimeoutError(
                f"the upstream stream sent nothing for {self.idle_timeout:g} seconds"
            )

        return await self._ask(send, lambda: not heard)


class UpstreamTimeoutError(APIConnectionError):
    """An upstream stream went silent for longer than the upstream timeout."""


def _retry_wait(exc: ProviderError, attempt: int) -> float | None:
    """Seconds to wait before retrying after `exc`, or None when it is not worth retrying.

    As the SDK decides: `x-should-retry` first, then the status (408, 409, 429, 5xx, or
    no answer at all); the wait is the answer's `retry-after-ms` / `retry-after` when
    given, else a backoff of 0.5 s doubling per attempt, at most 8 s.
    """
    should = exc.headers.get("x-should-retry")
    status = exc.status_code
    if should == "false":
        return None
    if should != "true" and not (
        status in (408, 409, 429)
        or (status is not None and status >= 500)
        or (status is None and isinstance(exc, APIConnectionError))
    ):
        return None
    asked = retry_after(exc.headers)
    return min(0.5 * 2.0**attempt, 8.0) if asked is None else asked


_RETRY_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry"})


@dataclass(frozen=True)
class Forwarded:
    """An upstream answer passed through as it came.

    Its status, its body and the headers clients read (`request-id`, `retry-after`,
    the rate limits).
    """

    status: int
    content: bytes
    headers: dict[str, str]


def client_headers(headers: Mapping[str, str], *, also: Iterable[str] = ()) -> dict[str, str]:
    """The headers of an upstream answer that clients read, names in lower case.

    Those are the retry advice and the rate limits, and the names in `also`.
    """
    extra = frozenset(also)
    return {
        name: v
        for k, v in headers.items()
        if (name := k.lower()) in _RETRY_HEADERS
        or name in extra
        or name.startswith("anthropic-ratelimit-")
    }
