"""The Anthropic provider: a `ModelRequest` sent through the official `AsyncAnthropic` client.

The client is the user's (base_url, retries, headers, timeouts stay theirs). Responses are
read as the JSON the API sent, so blocks keep every field verbatim; SDK exceptions become
typed agentloop errors with the SDK exception as `__cause__`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import anyio
import httpx2
from opentelemetry import propagate, trace
from pydantic import TypeAdapter

from agentloop import errors
from agentloop.messages import ContentBlock

from .base import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageStart,
    ModelRequest,
    ModelResponse,
    StreamEvent,
)

__all__ = ("AnthropicProvider",)


class AnthropicProvider:
    """Sends requests to the Anthropic Messages API with `AsyncAnthropic`.

    Request parameters map to the wire as `messages.create` maps them (with `betas`, as
    `beta.messages.create` does); every other field, such as `temperature`, goes into
    the body as it is.
    """

    name = "anthropic"
    """The provider's name in traces (`gen_ai.provider.name`)."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic | None = None,
        *,
        stream: bool = False,
        **client_options: Any,
    ) -> None:
        """Create a provider.

        Args:
            client: The client to use; by default one is made from `client_options` and
                the environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
            stream: Receive each response as a stream (`messages.stream`) and return the
                accumulated message, instead of one JSON body.
            **client_options: Passed to `AsyncAnthropic(...)` when no client is given.
        """
        self.client = client if client is not None else anthropic.AsyncAnthropic(**client_options)
        self.streaming = stream
        """Whether `complete()` receives responses as a stream too."""
        self._route: _Route | None = None

    def _check_credentials(self) -> None:
        client = self.client
        headers = {k.lower() for k in getattr(client, "_custom_headers", {}) or {}}
        if (
            client.api_key
            or client.auth_token
            or getattr(client, "credentials", None) is not None
            or "x-api-key" in headers
            or "authorization" in headers
        ):
            return
        raise errors.MissingAPIKeyError(
            "No Anthropic API key: set ANTHROPIC_API_KEY, or pass "
            "client=AsyncAnthropic(api_key=...). (No request was sent.)"
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the response; API failures raise `ProviderError`s."""
        if self.streaming:
            return await self.stream(request, _ignore)
        self._check_credentials()
        content, options = _request_parts(request, stream=False)
        try:
            # The body goes to the SDK as ready JSON bytes: its retries, authentication,
            # headers and errors all apply, but it need not copy and serialise the whole
            # history again on every request.
            response = await self.client.post(
                "/v1/messages", cast_to=httpx2.Response, content=content, options=options
            )
            raw = await response.aread()
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        return _answer(raw)

    async def complete_once(
        self, request: ModelRequest, http_client: httpx2.AsyncClient
    ) -> ModelResponse:
        """Send `request` once over `http_client`, the client's own connection pool.

        For a proxy whose caller retries the request itself, such as the gateway's
        first upstream request. It is one JSON request (also for a provider made with
        `stream=True`); its body, credential and headers are those a JSON `complete()`
        sends, made without the SDK's per-request machinery: there is no retry and no
        SDK span, and it costs about a third of a millisecond less CPU. A client with a
        credentials provider, or one that is not an `AsyncAnthropic`, is sent through
        the SDK as `complete()` does, which retries as that client is set up to.
        """
        client = self.client
        direct = type(client) is anthropic.AsyncAnthropic
        if not direct or getattr(client, "credentials", None) is not None:
            return await self.complete(request)
        self._check_credentials()
        content, options = _request_parts(request, stream=False)
        route = self._route
        if route is None or route.client is not client or route.http_client is not http_client:
            route = self._route = _Route(client, http_client)
        try:
            response = await http_client.send(route.request(content, options))
        except httpx2.TransportError as exc:
            raise errors.APIConnectionError(
                f"could not reach the Anthropic API: {exc!r}", request_id=None, body=None
            ) from exc
        raw = response.content
        if response.status_code >= 400:
            try:
                response.raise_for_status()
            except httpx2.HTTPStatusError as exc:  # the cause, carrying the response's headers
                raise _answer_error(response) from exc
        return _answer(raw)

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request` with `messages.stream`, reporting each block as it arrives.

        The SDK retries a failed response status itself. An overloaded or server error
        that arrives *inside* the stream before any content block is retried here, with
        exponential backoff (or the `retry-after` the response carried), at most
        `client.max_retries` times; nothing already delivered is ever delivered twice.
        """
        self._check_credentials()
        content, options = _request_parts(request, stream=True)
        attempt = 0
        while True:
            state = _StreamState()
            try:
                return await self._stream_once(content, options, on_event, state)
            except anthropic.APIError as exc:
                error = _translate(exc)
                # Opening the stream was already retried by the SDK; only an error inside
                # an open stream, before any content, is retried here.
                retryable = state.opened and not state.delivered
                if not (retryable and isinstance(error, _RETRYABLE_MID_STREAM)):
                    raise error from exc
                if attempt >= self.client.max_retries:
                    raise error from exc
                attempt += 1
                backoff = min(0.5 * 2 ** (attempt - 1), 8.0) * (1 - 0.25 * random.random())
                delay = _retry_after(exc) or backoff
            except httpx2.TransportError as exc:
                raise _connection_lost(exc) from exc
            except ValueError as exc:
                raise errors.InvalidResponseError(
                    f"the API's stream carried invalid JSON: {exc}"
                ) from exc
            await anyio.sleep(delay)

    async def _stream_once(
        self,
        content: bytes,
        options: Any,
        on_event: Callable[[StreamEvent], Awaitable[None]],
        state: _StreamState,
    ) -> ModelResponse:
        stream = await self.client.post(
            "/v1/messages",
            cast_to=anthropic.types.Message,
            content=content,
            options=options,
            stream=True,
            stream_cls=anthropic.AsyncStream[anthropic.types.RawMessageStreamEvent],
        )
        state.opened = True
        message = _Message()
        async with stream:
            async for sdk_event in stream:
                event: Any = sdk_event  # narrowed by `type` below, which mypy cannot follow
                kind = event.type
                if kind == "message_start":
                    message.start(_wire(event.message))
                    await on_event(MessageStart(_wire(event.message)))
                elif kind == "content_block_start":
                    state.delivered = True
                    block = _wire(event.content_block)
                    message.blocks[event.index] = block
                    await on_event(BlockStart(event.index, _BLOCK.validate_python(block)))
                elif kind == "content_block_delta":
                    name, value = message.add_delta(event.index, _wire(event.delta))
                    await on_event(BlockDelta(event.index, name, value))
                elif kind == "content_block_stop":
                    block, whole = message.close_block(event.index)
                    await on_event(BlockStop(event.index, _BLOCK.validate_python(block), whole))
                elif kind == "message_delta":
                    message.finish(_wire(event.delta), _wire(event.usage))
                elif kind == "message_stop":
                    state.stopped = True
        if not state.stopped:
            raise errors.APIConnectionError(
                "the API's stream ended before `message_stop`: the response is incomplete"
            )
        return ModelResponse.from_wire(message.body())


class _Message:
    """A streamed message, put together from its events as the API describes them.

    Tool input arrives as JSON fragments and is parsed once, when its block closes (with
    Python's own parser, which reads every escape the API may send).
    """

    def __init__(self) -> None:
        self.head: dict[str, Any] = {"type": "message", "role": "assistant"}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}

    def start(self, message: dict[str, Any]) -> None:
        self.head = {**message, "content": []}

    def add_delta(self, index: int, delta: dict[str, Any]) -> tuple[str, str]:
        """Apply a delta to its block; return its `BlockDelta` kind and value."""
        block = self.blocks.setdefault(index, {})
        kind = str(delta.get("type", "")).removesuffix("_delta")
        if kind == "text":
            value = str(delta.get("text", ""))
            block["text"] = block.get("text", "") + value
        elif kind == "input_json":
            value = str(delta.get("partial_json", ""))
            self.json.setdefault(index, []).append(value)
        elif kind == "thinking":
            value = str(delta.get("thinking", ""))
            block["thinking"] = block.get("thinking", "") + value
        elif kind == "signature":
            value = str(delta.get("signature", ""))
            block["signature"] = value
        elif kind == "citations":
            block.setdefault("citations", []).append(delta.get("citation"))
            value = json.dumps(delta)
        else:  # a delta this version does not know: reported, the block left as it is
            value = json.dumps(delta)
        return kind, value

    def close_block(self, index: int) -> tuple[dict[str, Any], bool]:
        """The finished block, and whether its tool input (if any) arrived whole."""
        block = self.blocks.setdefault(index, {})
        raw = "".join(self.json.pop(index, []))
        if not raw.strip():
            return block, True
        try:
            value = json.loads(raw)
        except ValueError:
            return block, False  # cut off: the block keeps the input it started with
        block["input"] = value
        return block, isinstance(value, dict)

    def finish(self, delta: dict[str, Any], usage: dict[str, Any]) -> None:
        self.head.update({k: v for k, v in delta.items() if v is not None or k in self.head})
        counts = dict(self.head.get("usage") or {})
        counts.update({k: v for k, v in usage.items() if v is not None})
        self.head["usage"] = counts

    def body(self) -> dict[str, Any]:
        return {**self.head, "content": [self.blocks[i] for i in sorted(self.blocks)]}


def _wire(value: Any) -> dict[str, Any]:
    """An SDK model as the JSON the API sent (unset fields left out)."""
    if isinstance(value, dict):
        return value
    return dict(value.to_dict(mode="json", warnings=False)) if value is not None else {}


def _answer(raw: bytes) -> ModelResponse:
    """The response a successful JSON answer holds."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise errors.InvalidResponseError(f"the API's answer is not valid JSON: {exc}") from exc
    return ModelResponse.from_wire(body)


class _Route:
    """Where and how `complete_once` sends: the client's URL, headers and timeout, made once."""

    def __init__(self, client: anthropic.AsyncAnthropic, http_client: httpx2.AsyncClient) -> None:
        self.client = client
        self.http_client = http_client
        base = client.base_url  # always ends with "/"
        self.url = base.copy_with(raw_path=base.raw_path + b"v1/messages")
        self.query = dict(http_client.params.items())
        self.query.update((k, str(v)) for k, v in client.default_query.items())
        # The pool's own headers, then the client's, as `http_client.build_request` layers them.
        self.headers = {k.lower(): v for k, v in http_client.headers.items()}
        self.headers.update(
            (k.lower(), v) for k, v in client.default_headers.items() if isinstance(v, str)
        )
        self.timeout = httpx2.Timeout(client.timeout).as_dict()

    def request(self, content: bytes, options: dict[str, Any]) -> httpx2.Request:
        """The HTTP request `client.post` would send for `options`, without its retry count."""
        headers = dict(self.headers)
        for name, value in options["headers"].items():
            if isinstance(value, str):
                headers[name.lower()] = value
            else:  # `anthropic.Omit`: the header is left out
                headers.pop(name.lower(), None)
        url = self.url
        query = {**self.query, **options.get("params", {})}
        if query:
            url = url.copy_merge_params(query)
        timeout = self.timeout
        if "timeout" in options:
            timeout = httpx2.Timeout(options["timeout"]).as_dict()
        return httpx2.Request(
            "POST", url, headers=headers, content=content, extensions={"timeout": timeout}
        )


def _answer_error(response: httpx2.Response) -> errors.ProviderError:
    """The agentloop error for an error answer read without the SDK (same wire mapping)."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    return errors.api_error(
        response.status_code,
        body,
        message=response.text or response.reason_phrase,
        request_id=response.headers.get("request-id"),
    )


def _connection_lost(exc: Exception) -> errors.APIConnectionError:
    return errors.APIConnectionError(f"the connection to the API broke mid-response: {exc!r}")


def _retry_after(exc: anthropic.APIError) -> float | None:
    """Seconds the API asked to wait (`retry-after`), bounded, or None."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return min(max(float(value), 0.0), 60.0) if value is not None else None
    except ValueError:
        return None


class _StreamState:
    """What one streaming attempt has seen so far."""

    def __init__(self) -> None:
        self.opened = False
        """The HTTP response arrived and the stream is being read."""
        self.delivered = False
        """A content block was reported to the caller."""
        self.stopped = False
        """`message_stop` arrived: the response is whole."""


_RETRYABLE_MID_STREAM = (errors.OverloadedError, errors.ServerError, errors.RateLimitError)


async def _ignore(event: StreamEvent) -> None:
    return None


_BLOCK = TypeAdapter(ContentBlock)


_HEADER_PARAMS = {
    "betas": "anthropic-beta",
    "user_profile_id": "anthropic-user-profile-id",
    "workspace_id": "anthropic-workspace-id",
}
"""Parameters of `messages.create` / `beta.messages.create` that the SDK sends as headers."""


def _request_parts(request: ModelRequest, *, stream: bool) -> tuple[bytes, Any]:
    """The body (JSON bytes) and the SDK request options of a request.

    The one mapping of the SDK's request parameters, for both the JSON and the streamed
    path, done as `messages.create` does it: `extra_headers`, `extra_query`,
    `extra_body` and `timeout` are request options, not body fields; `betas` (as
    `beta.messages.create` takes it) and the other header parameters become headers.
    """
    fields = request.to_wire(messages=False)
    headers: dict[str, str] = {"content-type": "application/json"}
    query: dict[str, Any] = {}
    for name, header in _HEADER_PARAMS.items():
        value = fields.pop(name, None)
        if value is None:
            continue
        if name == "betas":
            value = ",".join(str(v) for v in ([value] if isinstance(value, str) else value))
        headers[header] = str(value)
    if trace.get_current_span().get_span_context().is_valid:
        propagate.inject(headers)  # W3C trace context: the upstream continues this trace
    headers.update(fields.pop("extra_headers", None) or {})
    query.update(fields.pop("extra_query", None) or {})
    options: dict[str, Any] = {
        "headers": headers,
        # The SDK's own span of the call (when its tracing is on), nested in agentloop's
        # `chat` span: the transport's view (URL, status, request id, retries).
        "span_name": "anthropic.messages.create",
        "span_route": "/v1/messages",
        "span_attributes": {"gen_ai.request.model": request.model},
    }
    if query:
        options["params"] = query
    if "timeout" in fields:
        options["timeout"] = fields.pop("timeout")
    fields.update(fields.pop("extra_body", None) or {})
    if stream:
        fields["stream"] = True
    return request.to_json(fields), options


def _translate(exc: anthropic.APIError) -> errors.ProviderError:
    """The agentloop error for an SDK error (through the shared wire mapping)."""
    if isinstance(exc, anthropic.APIConnectionError):
        return errors.APIConnectionError(
            f"could not reach the Anthropic API: {exc}", request_id=None, body=None
        )
    status = getattr(exc, "status_code", None)
    if status == 200:  # an `error` event inside a stream whose response said 200
        status = None
    return errors.api_error(
        status,
        getattr(exc, "body", None),
        message=str(exc),
        request_id=getattr(exc, "request_id", None),
    )
