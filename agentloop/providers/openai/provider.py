"""The Chat Completions provider: a `ModelRequest` sent with the official `AsyncOpenAI` client.

It calls `chat.completions.create` through `with_raw_response` (the JSON body read as the
server sent it, headers kept) or `with_streaming_response` (a `MessageStart` carrying the
response headers with the first chunk, then the chunks fed to `ChatStreamAssembler`); the
SDK's authentication, retries and errors apply.

Two jobs are done beside `create`, because it cannot do them:

- A stream's events are read here from the SDK's streaming response (`data:` lines up to
  `[DONE]`), not with the SDK's `AsyncStream`: that stops at `[DONE]` leaving its inner
  async generators unfinished, which trio reports as a `ResourceWarning` when they are
  collected mid-run (`test_streaming.py`'s trio runs show it). Here the body is read to
  its end, so every reader finishes, whichever event loop runs it.
- The SDK writes its JSON as UTF-8, which cannot carry lone surrogates (text a server may
  send back as JSON escapes). A request holding one is sent as JSON with escapes through
  the client's documented `post()`, with the same body, headers and options.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx2

from agentloop import errors
from agentloop._wire import compact_json
from agentloop.checks import check_seconds
from agentloop.providers.base import MessageStart, ModelRequest, ModelResponse, StreamEvent
from agentloop.providers.retrying import NotRetried, send_with_retries

from .compat import ChatCompat, resolve
from .request import chat_arguments, taken_ids
from .response import parse_completion
from .stream import ChatStreamAssembler

if TYPE_CHECKING:
    import openai

__all__ = ("OpenAIChatProvider", "provider_from_options")

_EXTRA = "agentloop-runner[openai]"
_PATH = "/chat/completions"
_OPTIONS = ("extra_headers", "extra_query", "extra_body", "timeout")


def _sdk() -> Any:
    """The `openai` package, or one clear error saying which extra installs it."""
    try:
        import openai
    except ImportError as exc:
        raise errors.ConfigurationError(
            f"OpenAIChatProvider needs the `openai` package: pip install '{_EXTRA}'"
        ) from exc
    return openai


class OpenAIChatProvider:
    """Sends requests to a Chat Completions endpoint with `AsyncOpenAI`.

    ```python
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url="http://localhost:11434/v1", api_key="ollama")
    agent = Agent(model="qwen3:8b", provider=OpenAIChatProvider(client, compat="ollama"))
    ```

    The client is the user's: its base URL, key, retries and timeouts apply. Request
    fields map to `chat.completions.create`'s parameters; `Agent(params=...)` are applied
    last (`temperature`, `seed`, ...; a name `create()` does not list goes through
    `extra_body`), with `extra_headers`, `extra_query`, `extra_body` and `timeout` as
    request options. `thinking`, `metadata` and `container` are Messages API fields and
    are not sent.
    """

    name = "openai"
    """The provider's name in traces (`gen_ai.provider.name`)."""

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        compat: str | ChatCompat | None = None,
        stream: bool = False,
        retry_delay: float = 0.5,
        **client_options: Any,
    ) -> None:
        """Create a provider.

        Args:
            client: The `openai.AsyncOpenAI` to use; by default one is made from
                `client_options` and the environment (`OPENAI_API_KEY`,
                `OPENAI_BASE_URL`).
            compat: A preset name (`"openai"`, `"ollama"`, `"vllm"`, `"llamacpp"`,
                `"llama-cpp-python"`) or a `ChatCompat`; by default `"openai"` for
                api.openai.com and the plain format (no quirks) for any other server.
            stream: Receive each response as a stream and return the assembled
                message, instead of one JSON body.
            retry_delay: The first backoff (seconds) before a retry when the server
                names no wait; it doubles with each retry, up to 8 s (the SDK's shape).
            **client_options: Passed to `AsyncOpenAI(...)` when no client is given.

        Raises:
            ConfigurationError: the `openai` package is not installed (install the
                `openai` extra), `client` is not an `AsyncOpenAI`, `compat` names no
                preset, or `retry_delay` is not a number of seconds > 0.
        """
        sdk = _sdk()
        if client is None:
            client = sdk.AsyncOpenAI(**client_options)
        elif not isinstance(client, sdk.AsyncOpenAI):
            raise errors.ConfigurationError(
                f"client must be an openai.AsyncOpenAI, not {type(client).__name__}"
            )
        self.client: openai.AsyncOpenAI = client
        # The user's client without the SDK's hidden retries: `send_with_retries` does
        # them, as often as `client.max_retries` says, and tells each one.
        self._client = client.with_options(max_retries=0)
        self.retry_delay = check_seconds("retry_delay", retry_delay)
        """The first backoff between two attempts when the server names no wait."""
        self.base_url = str(client.base_url).rstrip("/")
        """Where requests go, for error messages."""
        self.compat = resolve(compat, self.base_url)
        self.streaming = stream
        """Whether `complete()` receives responses as a stream too."""
        self._accepted = frozenset(inspect.signature(client.chat.completions.create).parameters)

    @property
    def native_output(self) -> bool:
        """Whether typed output may use `response_format` (a schema the server holds to).

        True with the compat's `json_schema` or `json_object_schema`.
        """
        return self.compat.json_schema or self.compat.json_object_schema

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the response; API failures raise `ProviderError`s.

        Retried as often as the client's `max_retries` says (`send_with_retries`, as the
        SDK would: its backoff, a `retry-after` up to 60 s), each retry a `RequestRetry`
        event.
        """
        if self.streaming:
            return await self.stream(request, _ignore)
        arguments = self._arguments(request, stream=False)
        return await self._with_retries(lambda: self._complete_once(request, arguments))

    async def _complete_once(
        self, request: ModelRequest, arguments: dict[str, Any]
    ) -> ModelResponse:
        """One attempt at `complete()`."""
        sdk = _sdk()
        try:
            try:
                raw = await self._client.chat.completions.with_raw_response.create(**arguments)
                headers, content = raw.headers, raw.content
            except UnicodeEncodeError:  # lone surrogates: see the module docstring
                response = await self._post_escaped(arguments, stream=False)
                headers, content = response.headers, await response.aread()
        except sdk.APIError as exc:
            raise self._translate(exc, request) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        try:
            body = json.loads(content)
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the server's answer is not valid JSON: {exc}", headers=_lower(headers)
            ) from exc
        response = parse_completion(body, self.compat, taken_ids(request.messages, self.compat))
        return replace(response, headers=_lower(headers))

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`, reporting each block as it arrives.

        A tool call's `BlockStop` is reported once its arguments are complete: when the
        next call's first chunk or the finish chunk arrives (at once with
        `ChatCompat.whole_tool_calls`), so the loop starts it while the rest streams. A
        call cut off by `finish_reason: "length"` is reported incomplete and never runs.
        A failed attempt is retried as `complete()`'s are, but only before its first
        event: nothing already delivered is ever delivered twice.
        """
        arguments = self._arguments(request, stream=True)
        return await self._with_retries(lambda: self._stream_once(request, arguments, on_event))

    async def _stream_once(
        self,
        request: ModelRequest,
        arguments: dict[str, Any],
        on_event: Callable[[StreamEvent], Awaitable[None]],
    ) -> ModelResponse:
        """One streamed attempt; its failure after an event is wrapped `NotRetried`."""
        delivered = False

        async def watched(event: StreamEvent) -> None:
            nonlocal delivered
            delivered = True
            await on_event(event)

        try:
            return await self._stream_attempt(request, arguments, watched)
        except errors.ProviderError as exc:
            if delivered:
                raise NotRetried(exc) from exc.__cause__
            raise

    async def _with_retries(self, attempt: Callable[[], Awaitable[ModelResponse]]) -> ModelResponse:
        """`attempt()`, retried as the client's `max_retries` allows."""
        return await send_with_retries(
            attempt, max_retries=self.client.max_retries, first_delay=self.retry_delay
        )

    async def _stream_attempt(
        self,
        request: ModelRequest,
        arguments: dict[str, Any],
        on_event: Callable[[StreamEvent], Awaitable[None]],
    ) -> ModelResponse:
        sdk = _sdk()
        assembler = ChatStreamAssembler(
            on_event, compat=self.compat, taken=taken_ids(request.messages, self.compat)
        )
        headers: Any = None
        try:
            try:
                create = self._client.chat.completions.with_streaming_response.create
                async with create(**arguments) as response:
                    headers = response.headers
                    await _read_events(response.http_response, assembler, on_event)
            except UnicodeEncodeError:  # lone surrogates: see the module docstring
                if headers is not None:
                    raise  # from reading, not from sending: not the SDK's to fix
                events = await self._post_escaped(arguments, stream=True)
                headers = events.response.headers
                async with events:
                    await _read_events(events.response, assembler, on_event)
        except sdk.APIError as exc:
            raise self._translate(exc, request) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the server's stream carried invalid JSON: {exc}"
            ) from exc
        return replace(await assembler.finish(), headers=_lower(headers))

    def _arguments(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return chat_arguments(request, self.compat, accepted=self._accepted, stream=stream)

    async def _post_escaped(self, arguments: Mapping[str, Any], *, stream: bool) -> Any:
        """Send what `create(**arguments)` would, as JSON with escapes, with `post()`."""
        body = {k: v for k, v in arguments.items() if k not in _OPTIONS}
        body.update(arguments.get("extra_body") or {})
        options: Any = {
            "headers": dict(arguments.get("extra_headers") or {}),
            "security": {"bearer_auth": True},
        }
        if arguments.get("extra_query"):
            options["params"] = arguments["extra_query"]
        if "timeout" in arguments:
            options["timeout"] = arguments["timeout"]
        sdk = _sdk()
        if not stream:
            return await self._client.post(
                _PATH, cast_to=httpx2.Response, content=compact_json(body), options=options
            )
        return await self._client.post(
            _PATH,
            cast_to=sdk.types.chat.ChatCompletionChunk,
            content=compact_json(body),
            options=options,
            stream=True,
            stream_cls=sdk.AsyncStream[sdk.types.chat.ChatCompletionChunk],
        )

    def _translate(self, exc: Exception, request: ModelRequest) -> errors.ProviderError:
        """The agentloop error for an SDK error (through the shared wire mapping)."""
        sdk = _sdk()
        if isinstance(exc, sdk.APITimeoutError):
            return errors.APIConnectionError(
                f"the request to {self.base_url} timed out (the client's timeout)"
            )
        if isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc
            return errors.APIConnectionError(
                f"could not reach {self.base_url} ({cause}): is {self.compat.server} running?"
            )
        status = getattr(exc, "status_code", None)
        body = getattr(exc, "body", None)
        response = getattr(exc, "response", None)
        # The SDK keeps the inner `error` object as the body; the mapping reads the whole.
        wrapped = {"error": body} if isinstance(body, Mapping) else body
        error = errors.api_error(
            status,
            wrapped,
            message=str(getattr(exc, "message", "") or exc),
            request_id=getattr(exc, "request_id", None),
            headers=_lower(response.headers) if response is not None else None,
        )
        if status == 404:
            hint = f" (is the model {request.model!r} served at {self.base_url}?)"
            error = type(error)(
                f"{error}{hint}",
                status_code=error.status_code,
                request_id=error.request_id,
                body=error.body,
                headers=error.headers,
            )
        return error


def provider_from_options(
    base_url: str | None = None,
    api_key: str | None = None,
    compat: str | None = None,
    *,
    stream: bool = False,
) -> OpenAIChatProvider:
    """A provider from command-line style options (`--base-url`, `--api-key`, `--compat`).

    The key defaults to `OPENAI_API_KEY`; a server other than api.openai.com needs none
    (local servers ignore it), so a placeholder is sent there.

    Raises:
        ConfigurationError: the `openai` extra is not installed or `compat` is unknown.
        MissingAPIKeyError: no key for api.openai.com.
    """
    sdk = _sdk()
    url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        if "api.openai.com" in url:
            raise errors.MissingAPIKeyError(
                "No OpenAI API key: set OPENAI_API_KEY or pass --api-key. (No request was sent.)"
            )
        key = "not-needed"
    client = sdk.AsyncOpenAI(base_url=url, api_key=key)
    return OpenAIChatProvider(client, compat=compat, stream=stream)


async def _read_events(
    response: httpx2.Response,
    assembler: ChatStreamAssembler,
    on_event: Callable[[StreamEvent], Awaitable[None]],
) -> None:
    """Feed each server-sent event's JSON to `assembler`, up to `[DONE]`.

    The first chunk that is not an error is announced to `on_event` as a `MessageStart`
    (its id and model, and the response's headers) before it is fed. The body is read to
    its end even after `[DONE]` (servers end it there), so the HTTP client's readers
    finish rather than being left for the garbage collector.
    """
    started = False

    async def feed(chunk: Any) -> None:
        nonlocal started
        failed = isinstance(chunk, Mapping) and isinstance(chunk.get("error"), Mapping)
        if not started and isinstance(chunk, Mapping) and not failed:
            started = True
            await on_event(MessageStart(_head(chunk), headers=_lower(response.headers)))
        await assembler.feed(chunk)

    data: list[str] = []
    done = False
    async for line in response.aiter_lines():
        if done:
            continue
        if line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
            continue
        if line or not data:
            continue  # another field (event:, id:, a comment), or nothing to dispatch
        payload, data = "\n".join(data), []
        if payload.strip() == "[DONE]":
            done = True
        else:
            await feed(json.loads(payload))
    if data and "\n".join(data).strip() != "[DONE]":  # a last event without its blank line
        await feed(json.loads("\n".join(data)))


def _head(chunk: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API message head for a chat stream's first chunk."""
    return {
        "id": str(chunk.get("id") or ""),
        "type": "message",
        "role": "assistant",
        "model": str(chunk.get("model") or ""),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _lower(headers: Any) -> dict[str, str]:
    """HTTP headers as a dict with lower-case names."""
    return {str(k).lower(): str(v) for k, v in headers.items()}


def _connection_lost(exc: Exception) -> errors.APIConnectionError:
    return errors.APIConnectionError(f"the connection to the server broke mid-response: {exc!r}")


async def _ignore(event: StreamEvent) -> None:
    return None
