"""The upstream side of the gateway: the Messages API the gateway forwards to.

Requests go out through `AnthropicProvider` over the SDK's `AsyncAnthropic`, one client
per upstream credential sharing one connection pool. The first model request of a client
request is sent once, without retries, so an upstream error reaches the client as it was
(its own retry logic reads it). The hidden rounds after it are retried
by the gateway, since the client cannot retry those on its own; an answer asking to wait
longer than the gateway's limit goes to the client as it is. A stream that stays silent
longer than the upstream timeout is given up. Every response is recorded, and while
streaming every event is reported to the gateway too. Token counts and model
listings go through the same clients and come back as the upstream answered them
(`Upstream.forward`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import anyio
import httpx2
import sniffio

from agentloop.errors import APIConnectionError, ConfigurationError, ProviderError
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import ModelRequest, ModelResponse, StreamEvent

__all__ = (
    "HIDDEN_ROUND_RETRIES",
    "RETRY_WAIT_LIMIT",
    "THREADS_BETA_PREFIX",
    "Forwarded",
    "Transport",
    "Upstream",
    "UpstreamProvider",
    "UpstreamTimeoutError",
    "forwarded_headers",
    "retry_headers",
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

OnEvent = Callable[[int, StreamEvent], Awaitable[None]]
"""Called with the round (from 0) and each streamed event."""


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

    def provider(self, credential: str) -> UpstreamProvider:
        """The provider of one client request sent upstream with `credential`."""
        return UpstreamProvider(
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
        headers = _read_by_clients(response.headers, also=("request-id",))
        headers["content-type"] = response.headers.get("content-type", "application/json")
        return Forwarded(response.status_code, content, headers)

    async def aclose(self) -> None:
        """Close the shared connection pool."""
        self._clients.clear()
        await self._base.close()


Transport = Literal["auto", "aiohttp", "httpx"]
"""The HTTP client under the SDK's clients: aiohttp or httpx (both as the SDK makes them)."""


def _pool(transport: Transport) -> httpx2.AsyncClient:
    """The SDK's HTTP client for `transport`, with a hook noting rate-limit headers.

    The hook keeps each answer's rate-limit headers for the client request that asked
    (see `UpstreamProvider.answer_headers`): a streamed answer's status and headers go to
    the client when its first event does, before the `ModelResponse` (and its `headers`)
    exists. aiohttp parses and writes HTTP in C: two to
    three tenths of a millisecond less CPU per upstream request than httpx. It runs on
    asyncio only.
    """
    hooks: dict[str, list[Any]] = {"response": [_note_answer]}
    if transport != "httpx":
        if sniffio.current_async_library() != "asyncio":
            problem = "aiohttp runs on asyncio only"
        else:
            try:
                return anthropic.DefaultAioHttpClient(event_hooks=hooks)
            except RuntimeError as exc:  # the SDK's answer when aiohttp is not installed
                problem = str(exc)
        if transport == "aiohttp":
            raise ConfigurationError(f"the aiohttp upstream transport: {problem}")
    return anthropic.DefaultAsyncHttpxClient(event_hooks=hooks)


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
    """The provider of one client request: records each response, reports streamed events."""

    def __init__(
        self,
        provider: AnthropicProvider,
        on_event: OnEvent | None = None,
        *,
        idle_timeout: float = _SDK_TIMEOUT,
        retry_wait_limit: float = RETRY_WAIT_LIMIT,
    ) -> None:
        """Send every model request with `provider` (whose client does not retry).

        Hidden rounds are retried
        (`HIDDEN_ROUND_RETRIES`) unless the upstream asks to wait more than
        `retry_wait_limit` seconds; a stream silent for `idle_timeout` seconds fails.
        """
        self.provider = provider
        self.on_event = on_event
        self.idle_timeout = idle_timeout
        self.retry_wait_limit = retry_wait_limit
        self.responses: list[ModelResponse] = []
        self.error_headers: dict[str, str] = {}
        """Headers of the last upstream error answer that clients' retry logic reads."""
        self.answer_headers: dict[str, str] = {}
        """The headers clients read (rate limits) of the last successful upstream answer,
        for the client's answer."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` as one JSON request."""
        return await self._ask(lambda: self.provider.complete(request), lambda: True)

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`, reporting each event to the gateway, then to the run."""
        round_ = len(self.responses)
        heard = False

        async def send() -> ModelResponse:
            with anyio.CancelScope() as idle:
                idle.deadline = anyio.current_time() + self.idle_timeout

                async def tee(event: StreamEvent) -> None:
                    nonlocal heard
                    heard = True
                    idle.deadline = anyio.current_time() + self.idle_timeout
                    if self.on_event is not None:  # read each time: it may be turned off
                        await self.on_event(round_, event)
                    await on_event(event)

                return await self.provider.stream(request, tee)
            raise UpstreamTimeoutError(
                f"the upstream stream sent nothing for {self.idle_timeout:g} seconds"
            )

        return await self._ask(send, lambda: not heard)

    async def _ask(
        self, send: Callable[[], Awaitable[ModelResponse]], repeatable: Callable[[], bool]
    ) -> ModelResponse:
        """`send()`, retried in hidden rounds while `repeatable()` and the upstream allows."""
        hidden = bool(self.responses)
        attempt = 0
        while True:
            token = _ASKING.set(self)
            try:
                response = await send()
            except ProviderError as exc:
                self.error_headers = {**retry_headers(exc), **_read_by_clients(exc.headers)}
                wait = _retry_wait(exc, self.error_headers, attempt)
                retry = hidden and attempt < HIDDEN_ROUND_RETRIES and repeatable()
                if not retry or wait is None or wait > self.retry_wait_limit:
                    raise
            else:
                self.responses.append(response)
                if response.headers:  # else the pool's hook noted them (`_note_answer`)
                    self.answer_headers = _read_by_clients(response.headers)
                return response
            finally:
                _ASKING.reset(token)
            attempt += 1
            await anyio.sleep(wait)


class UpstreamTimeoutError(APIConnectionError):
    """An upstream stream went silent for longer than the upstream timeout."""


def _retry_wait(exc: ProviderError, headers: Mapping[str, str], attempt: int) -> float | None:
    """Seconds to wait before retrying after `exc`, or None when it is not worth retrying.

    As the SDK decides: `x-should-retry` first, then the status (408, 409, 429, 5xx, or
    no answer at all); the wait is the answer's `retry-after-ms` / `retry-after` when
    given, else a backoff of 0.5 s doubling per attempt, at most 8 s.
    """
    should = headers.get("x-should-retry")
    status = exc.status_code
    if should == "false":
        return None
    if should != "true" and not (
        status in (408, 409, 429)
        or (status is not None and status >= 500)
        or (status is None and isinstance(exc, APIConnectionError))
    ):
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            asked = float(headers.get(name, "")) * scale
        except ValueError:
            continue
        if asked >= 0:
            return asked
    return min(0.5 * 2.0**attempt, 8.0)


_RETRY_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry"})

_ASKING: ContextVar[UpstreamProvider | None] = ContextVar("agentloop_gateway_asking", default=None)
"""The provider whose model request is being sent in this context."""


async def _note_answer(response: httpx2.Response) -> None:
    """Keep a successful answer's rate-limit headers for the provider that asked."""
    provider = _ASKING.get()
    if provider is not None and response.status_code < 300:
        provider.answer_headers = _read_by_clients(response.headers)


@dataclass(frozen=True)
class Forwarded:
    """An upstream answer passed through as it came.

    Its status, its body and the headers clients read (`request-id`, `retry-after`,
    the rate limits).
    """

    status: int
    content: bytes
    headers: dict[str, str]


def _read_by_clients(headers: Mapping[str, str], *, also: Iterable[str] = ()) -> dict[str, str]:
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


def retry_headers(exc: ProviderError) -> dict[str, str]:
    """The headers of an upstream error answer that clients' retry logic reads."""
    response = getattr(exc.__cause__, "response", None)
    headers = getattr(response, "headers", None)
    return {} if headers is None else _read_by_clients(headers)
