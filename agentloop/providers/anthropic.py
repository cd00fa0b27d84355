"""The Anthropic provider: a `ModelRequest` sent through the official `AsyncAnthropic` client.

The client is the user's (base_url, retries, headers, timeouts stay theirs). Responses are
read as the JSON the API sent, so blocks keep every field verbatim; SDK exceptions become
typed agentloop errors with the SDK exception as `__cause__`.
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anthropic
import anyio
import httpx2
from pydantic import TypeAdapter

from agentloop import errors
from agentloop.messages import ContentBlock

from .base import BlockDelta, BlockStart, BlockStop, ModelRequest, ModelResponse, StreamEvent

__all__ = ("AnthropicProvider",)

_CREATE_PARAMS = frozenset(
    inspect.signature(anthropic.resources.messages.AsyncMessages.create).parameters
) - {"self"}


class AnthropicProvider:
    """Sends requests to the Anthropic Messages API with `AsyncAnthropic`.

    Request fields that `messages.create` does not take as parameters (for example
    `temperature` in SDK 2.x) are sent through `extra_body`.
    """

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
        fields = request.to_wire(messages=False)
        options = _request_options(fields)
        try:
            # The body goes to the SDK as ready JSON bytes: its retries, authentication,
            # headers and errors all apply, but it need not copy and serialise the whole
            # history again on every request.
            response = await self.client.post(
                "/v1/messages",
                cast_to=httpx2.Response,
                content=request.to_json(fields),
                options=options,
            )
            body = json.loads(await response.aread())
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        except ValueError as exc:
            raise errors.InvalidResponseError(f"the API's answer is not valid JSON: {exc}") from exc
        if not isinstance(body, Mapping):
            raise errors.InvalidResponseError(f"unexpected response body: {body!r}"[:300])
        return ModelResponse.from_wire(body)

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
        params = _sdk_params(request.to_wire())
        attempt = 0
        while True:
            state = _StreamState()
            try:
                return await self._stream_once(params, on_event, state)
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
        params: dict[str, Any],
        on_event: Callable[[StreamEvent], Awaitable[None]],
        state: _StreamState,
    ) -> ModelResponse:
        async with self.client.messages.stream(**params) as stream:
            state.opened = True
            async for sdk_event in stream:
                event: Any = sdk_event  # narrowed by `type` below, which mypy cannot follow
                kind = event.type
                if kind == "message_stop":
                    state.stopped = True
                elif kind == "content_block_start":
                    state.delivered = True
                    await on_event(BlockStart(event.index, _block(event.content_block)))
                elif kind == "content_block_delta":
                    delta = event.delta
                    name, value = _delta(delta)
                    if name == "input_json":
                        state.partial_json.setdefault(event.index, []).append(value)
                    await on_event(BlockDelta(event.index, name, value))
                elif kind == "content_block_stop":
                    block = _block(event.content_block)
                    raw = "".join(state.partial_json.pop(event.index, []))
                    await on_event(BlockStop(event.index, block, _complete_json(raw)))
            if not state.stopped:
                raise errors.APIConnectionError(
                    "the API's stream ended before `message_stop`: the response is incomplete"
                )
            message = await stream.get_final_message()
        return ModelResponse.from_wire(message.to_dict(mode="json", warnings=False))


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
        self.partial_json: dict[int, list[str]] = {}


_RETRYABLE_MID_STREAM = (errors.OverloadedError, errors.ServerError, errors.RateLimitError)


async def _ignore(event: StreamEvent) -> None:
    return None


_BLOCK = TypeAdapter(ContentBlock)


def _block(sdk_block: Any) -> ContentBlock:
    return _BLOCK.validate_python(sdk_block.to_dict(mode="json", warnings=False))


def _delta(delta: Any) -> tuple[str, str]:
    kind = str(delta.type)
    if kind == "text_delta":
        return "text", str(delta.text)
    if kind == "thinking_delta":
        return "thinking", str(delta.thinking)
    if kind == "input_json_delta":
        return "input_json", str(delta.partial_json)
    if kind == "signature_delta":
        return "signature", str(delta.signature)
    return kind.removesuffix("_delta"), json.dumps(delta.to_dict(mode="json", warnings=False))


def _complete_json(raw: str) -> bool:
    """Whether streamed tool input is whole: empty (no arguments) or one JSON object."""
    if not raw.strip():
        return True
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


def _request_options(fields: dict[str, Any]) -> Any:
    """Move the SDK's request options out of the body fields (in place); return them."""
    headers = {"content-type": "application/json", **(fields.pop("extra_headers", None) or {})}
    options: dict[str, Any] = {"headers": headers}
    if "extra_query" in fields:
        options["params"] = fields.pop("extra_query")
    if "timeout" in fields:
        options["timeout"] = fields.pop("timeout")
    fields.update(fields.pop("extra_body", None) or {})
    return options


def _sdk_params(body: dict[str, Any]) -> dict[str, Any]:
    extra = {k: body.pop(k) for k in list(body) if k not in _CREATE_PARAMS}
    if extra:
        body["extra_body"] = {**extra, **(body.get("extra_body") or {})}
    return body


def _translate(exc: anthropic.APIError) -> errors.ProviderError:
    """The agentloop error for an SDK error."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status_code", None)
    request_id = getattr(exc, "request_id", None)
    detail = _error_message(body) or str(exc)
    kind = _error_type(body)
    cls: type[errors.ProviderError]
    if isinstance(exc, anthropic.APIConnectionError):
        cls = errors.APIConnectionError
        detail = f"could not reach the Anthropic API: {exc}"
        kind = ""  # no answer, so no error type to show
    elif "credit balance" in detail.lower() or kind == "billing_error" or status == 402:
        cls = errors.CreditBalanceError
        detail = f"credit balance exhausted: {detail}"
    elif status in (401, 403):
        cls = errors.AuthenticationError
    elif status == 429:
        cls = errors.RateLimitError
    elif status == 529 or kind == "overloaded_error":
        cls = errors.OverloadedError
    elif status is not None and 400 <= status < 500:
        cls = errors.BadRequestError
    elif status is not None and status >= 500:
        cls = errors.ServerError
    else:
        cls = errors.ProviderError
    if status == 200:  # an `error` event inside a stream whose response said 200
        status = None
    prefix = f"{status} {kind}: " if status else f"{kind}: " if kind else ""
    return cls(f"{prefix}{detail}", status_code=status, request_id=request_id, body=body)


def _error_message(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
    return ""


def _error_type(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("type"), str):
            return str(error["type"])
    return "error"
