"""The Anthropic provider: a `ModelRequest` sent with the official `AsyncAnthropic` client.

Or with any asynchronous platform client of the SDK (Bedrock, Vertex AI, ...), which sends
the same call on its platform's paths with its own credentials.

The agent hands it each round's request; it calls `client.messages.create` (or
`client.beta.messages.create` when `betas` are given) through `with_raw_response`, so the
response is read as the JSON the API sent (every block verbatim) and its headers are kept.
The request's prompt-caching choice (`ModelRequest.cache`) becomes cache breakpoints on
what is sent (`caching.with_breakpoints`).

Two jobs are done here rather than by an SDK call, each because the call cannot do it:

- A streamed response is put together from `create(stream=True)`'s events, not with the
  `messages.stream()` helper, which re-parses a tool's whole partial input JSON on every
  delta (quadratic in the size of the input); here each input is parsed once, when its
  block closes.
- The SDK writes its JSON as UTF-8, which cannot carry lone surrogates (text the API
  itself sends as JSON escapes, e.g. in a tool's input). A request holding one is sent as
  JSON with escapes through the client's documented `post()`, with the same body,
  headers and options `create` would use. Bedrock and Vertex AI rebuild a request from
  its JSON, so with them such a request is refused, typed, before anything is sent.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import cache
from typing import Any, TypeAlias

import anthropic
import httpx2
from opentelemetry import propagate, trace

from agentloop import errors
from agentloop.checks import check_seconds

from .anthropic_stream import StreamedMessage
from .base import ModelRequest, ModelResponse, StreamEvent
from .caching import with_breakpoints
from .retrying import NotRetried, send_with_retries

__all__ = ("AnthropicProvider", "api_output_schema", "translate_error")

_PATH = "/v1/messages"

AsyncAnthropicClient: TypeAlias = (
    anthropic.AsyncAnthropic
    | anthropic.AsyncAnthropicAWS
    | anthropic.AsyncAnthropicBedrock
    | anthropic.AsyncAnthropicBedrockMantle
    | anthropic.AsyncAnthropicFoundry
    | anthropic.AsyncAnthropicGoogleCloud
    | anthropic.AsyncAnthropicVertex
)
"""The SDK's asynchronous clients: the first-party API's and the cloud platforms'."""

_PLATFORM_CLIENTS = (
    anthropic.AsyncAnthropicAWS,
    anthropic.AsyncAnthropicBedrock,
    anthropic.AsyncAnthropicBedrockMantle,
    anthropic.AsyncAnthropicFoundry,
    anthropic.AsyncAnthropicGoogleCloud,
    anthropic.AsyncAnthropicVertex,
)
"""Clients that authenticate on their cloud's terms (AWS SigV4 or a Bedrock key, a Google
token, a Foundry key or Azure token): the SDK resolves or refuses those credentials."""

_REBUILT_REQUESTS = (anthropic.AsyncAnthropicBedrock, anthropic.AsyncAnthropicVertex)
"""Platform clients that rebuild a `/v1/messages` request from its JSON (model into the
path, their own API version into the body), so they cannot send the bytes `_post_escaped`
gives them."""

_SYNC_CLIENTS = (
    anthropic.Anthropic,
    anthropic.AnthropicAWS,
    anthropic.AnthropicBedrock,
    anthropic.AnthropicBedrockMantle,
    anthropic.AnthropicFoundry,
    anthropic.AnthropicGoogleCloud,
    anthropic.AnthropicVertex,
)
"""The SDK's synchronous clients, which a provider awaiting its requests cannot use."""


class AnthropicProvider:
    """Sends requests to the Anthropic Messages API with `AsyncAnthropic`.

    Or with any of the SDK's asynchronous platform clients (Bedrock, Bedrock Mantle,
    Vertex AI, Foundry, Claude Platform on AWS or Google Cloud): each sends the same
    request on its platform's paths, with its platform's credentials.

    Request fields map to `messages.create`'s parameters (with `betas`, to
    `beta.messages.create`'s); a field `create()` does not list, such as `temperature`,
    goes into the body through `extra_body`.
    """

    name = "anthropic"
    """The provider's name in traces (`gen_ai.provider.name`)."""
    native_output = True
    """The Messages API has structured output (`output_config.format`): an agent's
    `output_mode="auto"` uses it."""

    def __init__(
        self,
        client: AsyncAnthropicClient | None = None,
        *,
        stream: bool = False,
        max_retry_wait: float = 60.0,
        retry_delay: float = 0.5,
        **client_options: Any,
    ) -> None:
        """Create a provider.

        Args:
            client: The client to use: `AsyncAnthropic` or one of the SDK's asynchronous
                platform clients (`AsyncAnthropicBedrock`, `AsyncAnthropicVertex`, ...);
                by default an `AsyncAnthropic` made from `client_options` and the
                environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
            stream: Receive each response as a stream and return the accumulated
                message, instead of one JSON body.
            max_retry_wait: The longest `retry-after` (seconds) worth waiting for: an
                error answer asking for more is raised at once, with its headers, rather
                than retried.
            retry_delay: The first backoff (seconds) before a retry when the API names no
                wait; it doubles with each retry, up to 8 s (the SDK's shape).
            **client_options: Passed to `AsyncAnthropic(...)` when no client is given.

        Raises:
            ConfigurationError: `client` is one of the SDK's synchronous clients, or
                `max_retry_wait` or `retry_delay` is not a number of seconds > 0.
        """
        if isinstance(client, _SYNC_CLIENTS):
            name = type(client).__name__
            raise errors.ConfigurationError(
                f"{name} is the SDK's synchronous client, and agentloop awaits its "
                f"requests: pass anthropic.Async{name}(...) instead"
            )
        self.client = client if client is not None else anthropic.AsyncAnthropic(**client_options)
        self.streaming = stream
        """Whether `complete()` receives responses as a stream too."""
        self.max_retry_wait = check_seconds("max_retry_wait", max_retry_wait)
        """The longest `retry-after` the retries wait for."""
        self.retry_delay = check_seconds("retry_delay", retry_delay)
        """The first backoff between two attempts when the API names no wait."""
        # The user's client without the SDK's hidden retries: `send_with_retries` does
        # them, as often as `client.max_retries` says, and tells each one.
        self._client = self.client.with_options(max_retries=0)

    def _check_credentials(self) -> None:
        """Raise `MissingAPIKeyError` before sending when the client has no credentials.

        Only the first-party client is checked: a platform client authenticates on its
        cloud's terms, and the SDK resolves (or refuses) those credentials itself.
        """
        client = self.client
        if isinstance(client, _PLATFORM_CLIENTS):
            return
        headers = {k.lower() for k, v in client.default_headers.items() if isinstance(v, str)}
        if (
            client.api_key
            or client.auth_token
            or client.credentials is not None
            or "x-api-key" in headers
            or "authorization" in headers
        ):
            return
        raise errors.MissingAPIKeyError(
            "No Anthropic API key: set ANTHROPIC_API_KEY, or pass "
            "client=AsyncAnthropic(api_key=...). (No request was sent.)"
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the response; API failures raise `ProviderError`s.

        Retried as often as the client's `max_retries` says (`send_with_retries`), up
        to `max_retry_wait` per wait, each retry a `RequestRetry` event.
        """
        if self.streaming:
            return await self.stream(request, _ignore)
        self._check_credentials()
        request = with_breakpoints(request)
        messages, arguments = _arguments(self._client, request, stream=False)
        return await self._with_retries(lambda: self._complete_once(request, messages, arguments))

    async def _complete_once(
        self, request: ModelRequest, messages: Any, arguments: dict[str, Any]
    ) -> ModelResponse:
        """One attempt at `complete()`."""
        try:
            try:
                raw = await messages.with_raw_response.create(**arguments)
                headers, body = raw.headers, await raw.read()
            except UnicodeEncodeError:  # lone surrogates: see the module docstring
                response = await self._post_escaped(request, arguments, stream=False)
                headers, body = response.headers, await response.aread()
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        except anthropic.AnthropicError as exc:
            raise self._refused(exc) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        try:
            decoded = json.loads(body)
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the API's answer is not valid JSON: {exc}", headers=_lower(headers)
            ) from exc
        return _with_headers(ModelResponse.from_wire(decoded), headers)

    async def count_tokens(self, request: ModelRequest) -> int:
        """The input tokens `request` would use, by the API's `count_tokens` endpoint.

        Sends the request's fields that `messages.count_tokens` (or the beta one) takes,
        with the cache breakpoints a sent request gets; API failures raise
        `ProviderError`s.
        """
        self._check_credentials()
        request = with_breakpoints(request)
        messages, arguments = _arguments(self._client, request, stream=False)
        accepted = frozenset(inspect.signature(messages.count_tokens).parameters)
        arguments = {k: v for k, v in arguments.items() if k in accepted and k != "extra_body"}

        async def count() -> int:
            try:
                counted = await messages.count_tokens(**arguments)
            except anthropic.APIError as exc:
                raise _translate(exc) from exc
            except anthropic.AnthropicError as exc:  # e.g. Bedrock, which cannot count tokens
                raise self._refused(exc) from exc
            except httpx2.TransportError as exc:
                raise _connection_lost(exc) from exc
            return int(counted.input_tokens)

        return await send_with_retries(
            count,
            max_retries=self.client.max_retries,
            max_wait=self.max_retry_wait,
            first_delay=self.retry_delay,
        )

    def batch_entry(self, request: ModelRequest) -> tuple[dict[str, Any], list[str]]:
        """`request` as the `params` of a message batch's entry, and the betas it needs.

        The body `complete()` would send (cache breakpoints and all), for
        `messages.batches.create` (or the beta one, given the betas).
        """
        _, arguments = _arguments(self._client, with_breakpoints(request), stream=False)
        params = {k: v for k, v in arguments.items() if k not in _NOT_BODY}
        params.update(arguments.get("extra_body") or {})
        params["messages"] = arguments["messages"]
        return params, list(arguments.get("betas") or ())

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`, reporting each block as it arrives.

        A failed attempt is retried as `complete()`'s are (a failed status, a refused
        connection, or an overloaded, rate-limit or server error inside the stream), but
        only before any content block arrived: nothing already delivered is ever
        delivered twice.
        """
        self._check_credentials()
        request = with_breakpoints(request)
        messages, arguments = _arguments(self._client, request, stream=True)
        return await self._with_retries(
            lambda: self._stream_once(request, messages, arguments, on_event)
        )

    async def _with_retries(self, attempt: Callable[[], Awaitable[ModelResponse]]) -> ModelResponse:
        """`attempt()`, retried as the client's `max_retries` and `max_retry_wait` allow."""
        return await send_with_retries(
            attempt,
            max_retries=self.client.max_retries,
            max_wait=self.max_retry_wait,
            first_delay=self.retry_delay,
        )

    async def _stream_once(
        self,
        request: ModelRequest,
        messages: Any,
        arguments: dict[str, Any],
        on_event: Callable[[StreamEvent], Awaitable[None]],
    ) -> ModelResponse:
        """One streamed attempt; an error after a block arrived is wrapped `NotRetried`."""
        delivered = False
        try:
            try:
                raw = await messages.with_raw_response.create(**arguments)
                headers, events = raw.headers, await raw.parse()
            except UnicodeEncodeError:  # lone surrogates: see the module docstring
                events = await self._post_escaped(request, arguments, stream=True)
                headers = events.response.headers
            message = StreamedMessage(_lower(headers))
            async with events:
                async for sdk_event in events:
                    event: Any = sdk_event  # narrowed by `type` below, which mypy cannot follow
                    delivered = delivered or event.type == "content_block_start"
                    await message.add(event, on_event)
        except anthropic.APIError as exc:
            error = _translate(exc)
            error.__cause__ = exc
            raise (NotRetried(error) if delivered else error) from exc
        except anthropic.AnthropicError as exc:
            raise self._refused(exc) from exc
        except httpx2.TransportError as exc:
            lost = _connection_lost(exc)
            lost.__cause__ = exc
            raise (NotRetried(lost) if delivered else lost) from exc
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the API's stream carried invalid JSON: {exc}"
            ) from exc
        if not message.stopped:
            cut = errors.APIConnectionError(
                "the API's stream ended before `message_stop`: the response is incomplete",
                headers=_lower(headers),
            )
            raise NotRetried(cut) if delivered else cut
        return replace(ModelResponse.from_wire(message.body()), headers=message.headers)

    async def _post_escaped(
        self, request: ModelRequest, arguments: Mapping[str, Any], *, stream: bool
    ) -> Any:
        """Send what `create(**arguments)` would, as JSON with escapes, with `post()`.

        Raises:
            BadRequestError: the client rebuilds requests from their JSON (Bedrock,
                Vertex AI), so it cannot send these bytes; nothing was sent.
        """
        if isinstance(self.client, _REBUILT_REQUESTS):
            raise errors.BadRequestError(
                f"{type(self.client).__name__} cannot send this request: it holds a lone "
                "surrogate (text that is not valid Unicode, e.g. a file name decoded with "
                "os.fsdecode), and this client rebuilds each request from JSON the SDK "
                "writes as UTF-8. AsyncAnthropic and the other platform clients send it "
                "escaped. (No request was sent.)"
            )
        fields = {k: v for k, v in arguments.items() if k not in _NOT_BODY}
        fields.update(arguments.get("extra_body") or {})
        headers = {h: _header(arguments[p]) for p, h in _HEADERS.items() if p in arguments}
        options: Any = {"headers": {**headers, **arguments.get("extra_headers", {})}}
        if arguments.get("extra_query"):
            options["params"] = arguments["extra_query"]
        if "timeout" in arguments:
            options["timeout"] = arguments["timeout"]
        content = request.to_json(fields)
        if not stream:
            return await self._client.post(
                _PATH, cast_to=httpx2.Response, content=content, options=options
            )
        return await self._client.post(
            _PATH,
            cast_to=anthropic.types.Message,
            content=content,
            options=options,
            stream=True,
            stream_cls=anthropic.AsyncStream[anthropic.types.RawMessageStreamEvent],
        )

    def _refused(self, exc: anthropic.AnthropicError) -> errors.ConfigurationError:
        """The error for a request the SDK refused to build: a setup it cannot send with."""
        return errors.ConfigurationError(
            f"{type(self.client).__name__} refused the request before sending it: {exc}"
        )


_HEADERS = {
    "betas": "anthropic-beta",
    "user_profile_id": "anthropic-user-profile-id",
    "workspace_id": "anthropic-workspace-id",
}
"""Parameters of `create()` that the SDK sends as headers (for `_post_escaped`)."""

_NOT_BODY = {
    *_HEADERS,
    "messages",
    "extra_headers",
    "extra_query",
    "extra_body",
    "timeout",
}


@cache
def _parameters(resource: Any) -> frozenset[str]:
    """The names `create()` of a messages resource (`messages` or `beta.messages`) takes."""
    return frozenset(inspect.signature(resource.create).parameters) - {"self"}


def _arguments(
    client: AsyncAnthropicClient, request: ModelRequest, *, stream: bool
) -> tuple[Any, dict[str, Any]]:
    """The messages resource to call and the keyword arguments of its `create()`.

    Fields `create()` lists are its arguments; the others go into `extra_body` (which a
    given `extra_body` then updates). The W3C trace context goes into `extra_headers`
    (which the given ones then update), so the upstream continues the run's trace.
    """
    fields = api_output_schema(request.to_wire())
    betas = fields.pop("betas", None)
    messages: Any = client.beta.messages if betas else client.messages
    accepted = _parameters(messages.__class__)
    arguments: dict[str, Any] = {"betas": betas} if betas else {}
    extra_body: dict[str, Any] = {}
    for name, value in fields.items():
        if name in accepted:
            arguments[name] = value
        else:  # not a parameter of this SDK's create(), e.g. temperature in 2.x
            extra_body[name] = value
    extra_body.update(arguments.pop("extra_body", None) or {})
    if extra_body:
        arguments["extra_body"] = extra_body
    headers: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        propagate.inject(headers)
    headers.update(arguments.get("extra_headers") or {})
    if headers:
        arguments["extra_headers"] = headers
    if stream:
        arguments["stream"] = True
    elif "timeout" not in arguments:
        # The client's own timeout, as create() uses it, stated so the SDK does not
        # refuse a large `max_tokens` without streaming: that choice is the caller's.
        arguments["timeout"] = client.timeout
    return messages, arguments


def api_output_schema(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its `output_config.format` schema rewritten as the API accepts it.

    The SDK's public `transform_schema` does it (the rewrite `messages.parse` applies):
    each object closed with `additionalProperties: false`, constraints the API does not
    take (`minimum`, `maxLength`, ...) moved into the description.

    Raises:
        ConfigurationError: the schema has a part the API cannot take (one without a
            type, as a field typed `Any` has).
    """
    form = (body.get("output_config") or {}).get("format")
    if not isinstance(form, Mapping) or not isinstance(form.get("schema"), Mapping):
        return body
    try:
        schema = anthropic.transform_schema(dict(form["schema"]))
    except ValueError as exc:
        raise errors.ConfigurationError(
            f"the output schema cannot be sent as structured output ({exc}); use output_mode='tool'"
        ) from exc
    config = {**body["output_config"], "format": {**form, "schema": schema}}
    return {**body, "output_config": config}


def _header(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _lower(headers: Any) -> dict[str, str]:
    """HTTP headers as a dict with lower-case names."""
    return {str(k).lower(): str(v) for k, v in headers.items()}


def _with_headers(response: ModelResponse, headers: Any) -> ModelResponse:
    return replace(response, headers=_lower(headers))


def _connection_lost(exc: Exception) -> errors.APIConnectionError:
    return errors.APIConnectionError(f"the connection to the API broke mid-response: {exc!r}")


async def _ignore(event: StreamEvent) -> None:
    return None


def _translate(exc: anthropic.APIError) -> errors.ProviderError:
    """The agentloop error for an SDK error (through the shared wire mapping)."""
    if isinstance(exc, anthropic.APIConnectionError):
        return errors.APIConnectionError(
            f"could not reach the Anthropic API: {exc}", request_id=None, body=None
        )
    status = getattr(exc, "status_code", None)
    if status == 200:  # an `error` event inside a stream whose response said 200
        status = None
    response = getattr(exc, "response", None)
    return errors.api_error(
        status,
        getattr(exc, "body", None),
        message=str(exc),
        request_id=getattr(exc, "request_id", None),
        headers=_lower(response.headers) if response is not None else None,
    )


def translate_error(exc: anthropic.APIError) -> errors.ProviderError:
    """The agentloop error for an SDK error of a call other than a message request.

    A file upload, for one: the same mapping the provider's requests use.
    """
    return _translate(exc)
