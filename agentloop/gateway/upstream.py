"""The upstream side of the gateway: the Messages API the gateway forwards to.

Requests go out through `AnthropicProvider` over the SDK's `AsyncAnthropic`, one client
per upstream credential sharing one connection pool. The first model request of a client
request is sent once, without retries, so an upstream error reaches the client as it was
(its own retry logic reads it); as JSON it goes straight over the pool, with the SDK's
headers and credential but not its per-request machinery (the passthrough case, where
the gateway's cost is most of the added latency). The hidden rounds after it are retried
by the SDK, since the client cannot retry those on its own. Every response is recorded,
and while streaming every event is reported to the gateway too. Token counts and model
listings go through the same clients and come back as the upstream answered them
(`Upstream.forward`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import httpx2
import sniffio

from agentloop.errors import APIConnectionError, ConfigurationError, ProviderError
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import ModelRequest, ModelResponse, StreamEvent

__all__ = (
    "HIDDEN_ROUND_RETRIES",
    "THREADS_BETA_PREFIX",
    "Forwarded",
    "Transport",
    "Upstream",
    "UpstreamProvider",
    "forwarded_headers",
    "retry_headers",
)

HIDDEN_ROUND_RETRIES = 2
"""SDK retries of the model requests of hidden rounds (the first one has none)."""

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
    ) -> None:
        """Clients for `base_url`; at most `cache` credentials keep their clients.

        Made inside the event loop that will use them: `transport` "auto" picks the
        SDK's aiohttp client on asyncio when aiohttp is installed (`anthropic[aiohttp]`,
        which the gateway extra brings), else its httpx client.

        Raises:
            ConfigurationError: `transport` is "aiohttp" and that cannot work here.
        """
        options: dict[str, Any] = {"base_url": base_url, "max_retries": 0}
        if timeout is not None:
            options["timeout"] = timeout
        self.http = _pool(transport)
        """The connection pool every client shares."""
        # The base client never sends its own placeholder credential: every request
        # goes through a copy carrying the credential chosen for it.
        self._base = anthropic.AsyncAnthropic(api_key="unset", http_client=self.http, **options)
        self._clients: OrderedDict[str, tuple[AnthropicProvider, AnthropicProvider]] = OrderedDict()
        self._cache = cache

    def provider(self, credential: str) -> UpstreamProvider:
        """The provider of one client request sent upstream with `credential`."""
        first, later = self.providers(credential)
        return UpstreamProvider(first, later, http_client=self.http)

    def providers(self, credential: str) -> tuple[AnthropicProvider, AnthropicProvider]:
        """The providers for `credential`: without retries, and with them."""
        pair = self._clients.get(credential)
        if pair is None:
            first = self._base.with_options(api_key=credential, max_retries=0)
            later = first.with_options(max_retries=HIDDEN_ROUND_RETRIES)
            pair = (AnthropicProvider(first), AnthropicProvider(later))
            self._clients[credential] = pair
            while len(self._clients) > self._cache:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(credential)
        return pair

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
        client = self.providers(credential)[0].client
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
    (see `UpstreamProvider.answer_headers`). aiohttp parses and writes HTTP in C: two to
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
        first: AnthropicProvider,
        later: AnthropicProvider,
        on_event: OnEvent | None = None,
        *,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        """Send the first request with `first`, later ones with `later`.

        With `http_client` (the pool `first`'s client uses), a first JSON request goes
        straight over it (`AnthropicProvider.complete_once`).
        """
        self.first = first
        self.later = later
        self.http_client = http_client
        self.on_event = on_event
        self.responses: list[ModelResponse] = []
        self.error_headers: dict[str, str] = {}
        """Headers of the last upstream error answer that clients' retry logic reads."""
        self.answer_headers: dict[str, str] = {}
        """The headers clients read (rate limits) of the last successful upstream answer,
        for the client's answer."""

    def _provider(self) -> AnthropicProvider:
        return self.later if self.responses else self.first

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` as one JSON request."""
        token = _ASKING.set(self)
        try:
            if self.responses or self.http_client is None:
                response = await self._provider().complete(request)
            else:
                response = await self.first.complete_once(request, self.http_client)
        except ProviderError as exc:
            self.error_headers = retry_headers(exc)
            raise
        finally:
            _ASKING.reset(token)
        self.responses.append(response)
        return response

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`, reporting each event to the gateway, then to the run."""
        round_ = len(self.responses)
        report = self.on_event

        async def tee(event: StreamEvent) -> None:
            if report is not None:
                await report(round_, event)
            await on_event(event)

        token = _ASKING.set(self)
        try:
            response = await self._provider().stream(request, tee)
        except ProviderError as exc:
            self.error_headers = retry_headers(exc)
            raise
        finally:
            _ASKING.reset(token)
        self.responses.append(response)
        return response


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
