"""The Chat Completions provider: a `ModelRequest` sent through the official `AsyncOpenAI` client.

For Ollama, vLLM, llama.cpp's server, LM Studio and OpenAI itself. agentloop's block history
stays the source of truth: each request converts it to Chat Completions messages (each
message once, then kept with it), and each response comes back as blocks. What servers do
differently is a `ChatCompat` of flags, with a named preset per server.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import string
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import httpx2

from agentloop import errors
from agentloop.messages import (
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from agentloop.result import Usage
from agentloop.tools import ToolDefinition

from .base import BlockDelta, BlockStart, BlockStop, ModelRequest, ModelResponse, StreamEvent

if TYPE_CHECKING:
    import openai

__all__ = (
    "ERROR_PREFIX",
    "PRESETS",
    "ChatCompat",
    "ChatStreamAssembler",
    "OpenAIChatProvider",
    "parse_completion",
    "preset",
    "provider_from_options",
    "to_chat_messages",
    "wire_id",
)

ERROR_PREFIX = "Error: "
"""What an `is_error` tool result's text starts with on the wire: the format has no flag."""

_EXTRA = "agentloop-runner[openai]"


def _sdk() -> Any:
    """The `openai` package, or one clear error saying which extra installs it."""
    try:
        import openai
    except ImportError as exc:
        raise errors.ConfigurationError(
            f"OpenAIChatProvider needs the `openai` package: pip install '{_EXTRA}'"
        ) from exc
    return openai


# --------------------------------------------------------------------------- quirks


@dataclass(frozen=True, kw_only=True)
class ChatCompat:
    """What a Chat Completions server expects and sends, where servers differ.

    Use a preset by name (`compat="ollama"`), or adjust one:
    `dataclasses.replace(PRESETS["vllm"], tool_call_id_length=9)`.
    """

    server: str = "the server"
    """The server's name, for error messages ("is Ollama running?")."""
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """The request field that carries `max_tokens` (OpenAI's newer models refuse
    `max_tokens`; many local servers know only `max_tokens`)."""
    whole_tool_calls: bool = False
    """The server streams each tool call whole, in one chunk (and may reuse or leave out
    its `index`): each call is complete, and started, as soon as it arrives."""
    tool_call_id_length: int | None = None
    """Tool-call ids must be exactly this many letters and digits (Mistral templates want
    9). Ids in the history are mapped to that shape, the same way in every request, and
    ids agentloop makes up have it."""
    tool_choices: frozenset[str] = frozenset({"auto", "none", "required", "function"})
    """The `tool_choice` values the server accepts (`function` is the named-tool form); a
    request asking for another leaves `tool_choice` out, so the server's default applies."""
    single_system: bool = False
    """The server takes one system message only: a system prompt of several blocks is
    sent as one message, its texts joined by blank lines."""
    stream_usage: bool = True
    """Ask for token usage in streamed responses (`stream_options.include_usage`)."""
    send_reasoning: bool = False
    """Send reasoning text the server returned (unsigned thinking blocks) back with its
    assistant message as `reasoning_content`, for servers that want it; by default it
    stays in agentloop's history only."""


PRESETS: Mapping[str, ChatCompat] = {
    "openai": ChatCompat(server="the OpenAI API", max_tokens_field="max_completion_tokens"),
    "ollama": ChatCompat(server="Ollama", whole_tool_calls=True, single_system=True),
    "vllm": ChatCompat(server="the vLLM server", single_system=True),
    "llamacpp": ChatCompat(
        server="llama.cpp's server",
        single_system=True,
        tool_choices=frozenset({"auto", "none", "required"}),
    ),
}
"""The named presets: `compat="openai" | "ollama" | "vllm" | "llamacpp"`."""


def _compat(value: str | ChatCompat | None, base_url: str) -> ChatCompat:
    if isinstance(value, ChatCompat):
        return value
    if value is None:
        return PRESETS["openai"] if "api.openai.com" in base_url else ChatCompat()
    if value not in PRESETS:
        raise errors.ConfigurationError(
            f"unknown compat preset {value!r}; use one of {', '.join(PRESETS)} or a ChatCompat"
        )
    return PRESETS[value]


# --------------------------------------------------------------------------- the provider


class OpenAIChatProvider:
    """Sends requests to a Chat Completions endpoint with `AsyncOpenAI`.

    ```python
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url="http://localhost:11434/v1", api_key="ollama")
    agent = Agent(model="qwen3:8b", provider=OpenAIChatProvider(client, compat="ollama"))
    ```

    The client is the user's: its base URL, key, retries and timeouts apply. Request
    fields map as `chat.completions.create` maps them; `Agent(params=...)` go into the
    body as they are (`temperature`, `seed`, ...), with `extra_headers`, `extra_query`,
    `extra_body` and `timeout` as request options. `thinking`, `metadata` and `container`
    are Messages API fields and are not sent.
    """

    name = "openai"
    """The provider's name in traces (`gen_ai.provider.name`)."""

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        compat: str | ChatCompat | None = None,
        stream: bool = False,
        **client_options: Any,
    ) -> None:
        """Create a provider.

        Args:
            client: The `openai.AsyncOpenAI` to use; by default one is made from
                `client_options` and the environment (`OPENAI_API_KEY`,
                `OPENAI_BASE_URL`).
            compat: A preset name (`"openai"`, `"ollama"`, `"vllm"`, `"llamacpp"`) or a
                `ChatCompat`; by default `"openai"` for api.openai.com and the plain
                format (no quirks) for any other server.
            stream: Receive each response as a stream and return the assembled
                message, instead of one JSON body.
            **client_options: Passed to `AsyncOpenAI(...)` when no client is given.

        Raises:
            ConfigurationError: the `openai` package is not installed (install the
                `openai` extra), `client` is not an `AsyncOpenAI`, or `compat` names no
                preset.
        """
        sdk = _sdk()
        if client is None:
            client = sdk.AsyncOpenAI(**client_options)
        elif not isinstance(client, sdk.AsyncOpenAI):
            raise errors.ConfigurationError(
                f"client must be an openai.AsyncOpenAI, not {type(client).__name__}"
            )
        self.client: openai.AsyncOpenAI = client
        self.base_url = str(client.base_url).rstrip("/")
        """Where requests go, for error messages."""
        self.compat = _compat(compat, self.base_url)
        self.streaming = stream
        """Whether `complete()` receives responses as a stream too."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the response; API failures raise `ProviderError`s."""
        if self.streaming:
            return await self.stream(request, _ignore)
        sdk = _sdk()
        content, options = _request_parts(request, self.compat, stream=False)
        try:
            response = await self.client.post(
                "/chat/completions", cast_to=httpx2.Response, content=content, options=options
            )
            raw = await response.aread()
        except sdk.APIError as exc:
            raise self._translate(exc, request) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the server's answer is not valid JSON: {exc}"
            ) from exc
        return parse_completion(body, self.compat, _taken_ids(request.messages, self.compat))

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request`, reporting each block as it arrives.

        A tool call's `BlockStop` is reported once its arguments are complete: when the
        next call's first chunk or the finish chunk arrives (at once with
        `ChatCompat.whole_tool_calls`), so the loop starts it while the rest streams. A
        call cut off by `finish_reason: "length"` is reported incomplete and never runs.
        """
        sdk = _sdk()
        content, options = _request_parts(request, self.compat, stream=True)
        assembler = ChatStreamAssembler(
            on_event, compat=self.compat, taken=_taken_ids(request.messages, self.compat)
        )
        # The SDK hands the response back unread (its retries and errors still apply);
        # its events are read here, and every reader is closed when the stream ends,
        # whichever event loop runs it.
        options["headers"][_RAW_RESPONSE] = "stream"
        try:
            response = await self.client.post(
                "/chat/completions", cast_to=httpx2.Response, content=content, options=options
            )
            try:
                await _read_events(response, assembler)
            finally:
                await response.aclose()
        except sdk.APIError as exc:
            raise self._translate(exc, request) from exc
        except httpx2.TransportError as exc:
            raise _connection_lost(exc) from exc
        except ValueError as exc:
            raise errors.InvalidResponseError(
                f"the server's stream carried invalid JSON: {exc}"
            ) from exc
        return await assembler.finish()

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
        # The SDK keeps the inner `error` object as the body; the mapping reads the whole.
        wrapped = {"error": body} if isinstance(body, Mapping) else body
        error = errors.api_error(
            status,
            wrapped,
            message=str(getattr(exc, "message", "") or exc),
            request_id=getattr(exc, "request_id", None),
        )
        if status == 404:
            hint = f" (is the model {request.model!r} served at {self.base_url}?)"
            error = type(error)(
                f"{error}{hint}",
                status_code=error.status_code,
                request_id=error.request_id,
                body=error.body,
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


_RAW_RESPONSE = "X-Stainless-Raw-Response"
"""The `openai` SDK's request header for "return the HTTP response unread"."""


async def _read_events(response: httpx2.Response, assembler: ChatStreamAssembler) -> None:
    """Feed each server-sent event's JSON to `assembler`, up to `[DONE]`.

    The body is read to its end even after `[DONE]` (servers end it there), so the
    HTTP client's readers finish rather than being left for the garbage collector.
    """
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
            await assembler.feed(json.loads(payload))
    if data and "\n".join(data).strip() != "[DONE]":  # a last event without its blank line
        await assembler.feed(json.loads("\n".join(data)))


def _connection_lost(exc: Exception) -> errors.APIConnectionError:
    return errors.APIConnectionError(f"the connection to the server broke mid-response: {exc!r}")


async def _ignore(event: StreamEvent) -> None:
    return None


# --------------------------------------------------------------------------- the request


def _request_parts(request: ModelRequest, compat: ChatCompat, *, stream: bool) -> tuple[bytes, Any]:
    """The body (JSON bytes) and the SDK request options of a request.

    `extra_headers`, `extra_query`, `extra_body` and `timeout` are request options, as
    `chat.completions.create` takes them; every other parameter is a body field.
    """
    fields: dict[str, Any] = dict(request.params)
    headers: dict[str, str] = {"content-type": "application/json"}
    headers.update(fields.pop("extra_headers", None) or {})
    options: dict[str, Any] = {"headers": headers, "security": {"bearer_auth": True}}
    query = fields.pop("extra_query", None)
    if query:
        options["params"] = dict(query)
    if "timeout" in fields:
        options["timeout"] = fields.pop("timeout")
    extra = fields.pop("extra_body", None) or {}
    fields["model"] = request.model
    fields[compat.max_tokens_field] = request.max_tokens
    tools = [_tool(t) for t in request.tools]
    if tools:
        fields["tools"] = tools
        choice = _tool_choice(request.tool_choice, compat)
        if choice is not None:
            fields["tool_choice"] = choice
        if (request.tool_choice or {}).get("disable_parallel_tool_use"):
            fields["parallel_tool_calls"] = False
    if request.stop_sequences:
        fields["stop"] = list(request.stop_sequences)
    if stream:
        fields["stream"] = True
        if compat.stream_usage:
            fields["stream_options"] = {"include_usage": True}
    fields.update(extra)
    head = _dumps(fields)
    system = [_dumps(m) for m in _system_messages(request.system, compat)]
    messages = b",".join([*system, *_chat_json(request.messages, compat)])
    body = b'{"messages":[' + messages + (b"]," + head[1:] if len(head) > 2 else b"]}")
    return body, options


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # lone surrogates: escaped, which UTF-8 can carry
        return json.dumps(value, separators=(",", ":")).encode()


def _tool(definition: ToolDefinition | Mapping[str, Any]) -> dict[str, Any]:
    """A `tools[]` entry: a function tool."""
    name: Any
    description: Any
    schema: Any
    if isinstance(definition, ToolDefinition):
        name, description, schema = (
            definition.name,
            definition.description,
            definition.input_schema,
        )
    else:
        if definition.get("type") == "function" and "function" in definition:
            return dict(definition)  # already in this format
        name = definition.get("name")
        description = definition.get("description") or ""
        schema = definition.get("input_schema")
        if not isinstance(schema, Mapping):
            raise errors.ConfigurationError(
                f"tool {name!r} has no input_schema: the Chat Completions format has "
                "function tools only (server tools of the Messages API cannot be sent)"
            )
    function: dict[str, Any] = {"name": name, "parameters": dict(schema)}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any] | None, compat: ChatCompat) -> Any:
    """The `tool_choice` for a Messages API one, or None to leave it out."""
    if not choice:
        return None
    kind = choice.get("type")
    value: Any
    if kind == "auto":
        value, name = "auto", "auto"
    elif kind == "any":
        value, name = "required", "required"
    elif kind == "none":
        value, name = "none", "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        value, name = {"type": "function", "function": {"name": choice["name"]}}, "function"
    else:
        return None
    return value if name in compat.tool_choices else None


def _system_messages(
    system: str | Sequence[Mapping[str, Any]] | None, compat: ChatCompat
) -> list[dict[str, Any]]:
    if not system:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    texts = [str(b.get("text", "")) for b in system if b.get("text")]
    if compat.single_system:
        return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []
    return [{"role": "system", "content": text} for text in texts]


# --------------------------------------------------------------------------- history -> chat


@dataclass(frozen=True)
class _Converted:
    """One history message in the Chat Completions format (kept with the message)."""

    messages: tuple[dict[str, Any], ...]
    """The chat messages it becomes: `tool` messages first, then any user or assistant one."""
    json: tuple[bytes, ...]
    """Each of `messages` as JSON bytes."""
    call_ids: tuple[str, ...] = ()
    """For an assistant message: its tool-call ids on the wire, in order."""
    result_ids: tuple[str, ...] = ()
    """For a user message: the tool-call ids its `tool` messages answer, in order."""
    history_ids: tuple[str, ...] = ()
    """The tool_use ids of an assistant message as agentloop holds them."""


def _converter(compat: ChatCompat) -> Callable[[Message], _Converted]:
    def convert(message: Message) -> _Converted:
        if message.role == "assistant":
            converted = _assistant(message, compat)
        else:
            converted = _user(message, compat)
        return _Converted(
            converted[0],
            tuple(_dumps(m) for m in converted[0]),
            call_ids=converted[1],
            result_ids=converted[2],
            history_ids=tuple(u.id for u in message.tool_uses),
        )

    return convert


_CONVERTERS: dict[ChatCompat, Callable[[Message], _Converted]] = {}


def _convert(message: Message, compat: ChatCompat) -> _Converted:
    """`message` in the Chat Completions format for `compat`, converted once per message."""
    convert = _CONVERTERS.get(compat)
    if convert is None:
        convert = _CONVERTERS.setdefault(compat, _converter(compat))
    return message.converted(("chat-completions", compat), convert)


def _chat_json(messages: Sequence[Message], compat: ChatCompat) -> list[bytes]:
    """The JSON of every chat message a history becomes, ready to join into a body.

    Each message is converted once (then kept with it); putting the body together joins
    bytes, except where the format needs two history messages to become one: tool
    results answered out of call order are put in order, and consecutive assistant
    messages (a paused turn and its continuation) become one message.
    """
    out: list[bytes] = []
    last: dict[str, Any] | None = None  # the previous chat message, when it is an assistant's
    calls: tuple[str, ...] = ()
    for message in messages:
        converted = _convert(message, compat)
        if not converted.messages:
            continue
        if message.role == "assistant":
            if last is not None:  # consecutive assistant messages: one chat message
                last = _merge_assistant(last, converted.messages[0])
                out[-1] = _dumps(last)
            else:
                last = converted.messages[0]
                out.append(converted.json[0])
            calls = tuple(c["id"] for c in last.get("tool_calls", ()))
            continue
        last = None
        parts = list(converted.json)
        results = converted.result_ids
        if results and results != calls[: len(results)]:
            order = {cid: i for i, cid in enumerate(calls)}
            ranked = sorted(range(len(results)), key=lambda i: order.get(results[i], len(order)))
            parts = [parts[i] for i in ranked] + parts[len(results) :]
        out.extend(parts)
        calls = ()
    return out


def _merge_assistant(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    merged = dict(first)
    text = (first.get("content") or "") + (second.get("content") or "")
    merged["content"] = text or None
    tool_calls = [*first.get("tool_calls", ()), *second.get("tool_calls", ())]
    if tool_calls:
        merged["tool_calls"] = tool_calls
    if "reasoning_content" in second:
        merged["reasoning_content"] = first.get("reasoning_content", "") + str(
            second["reasoning_content"]
        )
    return merged


def to_chat_messages(
    messages: Sequence[Message],
    *,
    system: str | Sequence[Mapping[str, Any]] | None = None,
    compat: ChatCompat | str | None = None,
) -> list[dict[str, Any]]:
    """A block history as the Chat Completions `messages` a request would carry.

    The conversion the provider applies to every request, for inspection and tests:
    `system` first; an assistant message's text and `tool_use` blocks become one message
    with `content` and `tool_calls`; each `tool_result` becomes a `tool` message, in call
    order, before the user text that follows it; an `is_error` result's text starts with
    `ERROR_PREFIX`; images in a tool result move to a user message after the `tool`
    messages; thinking, redacted thinking and server-tool blocks are left out.

    Raises:
        HistoryError: a user message holds a block the format cannot carry.
    """
    resolved = _compat(compat, "") if not isinstance(compat, ChatCompat) else compat
    joined = b",".join(
        [*map(_dumps, _system_messages(system, resolved)), *_chat_json(messages, resolved)]
    )
    value: list[dict[str, Any]] = json.loads(b"[" + joined + b"]")
    return value


def _assistant(
    message: Message, compat: ChatCompat
) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...], tuple[str, ...]]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            arguments = block.input if isinstance(block.input, dict) else {}
            calls.append(
                {
                    "id": wire_id(block.id, compat),
                    "type": "function",
                    "function": {
                        "name": block.name,
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        elif isinstance(block, ThinkingBlock) and block.unsigned:
            reasoning.append(block.thinking)
        # Signed and redacted thinking, server tools and their results are another
        # vendor's: they stay in the history and are never sent here.
    content = "".join(text)
    if not content and not calls:
        return (), (), ()
    chat: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning and compat.send_reasoning:
        chat["reasoning_content"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    return (chat,), tuple(c["id"] for c in calls), ()


def _user(
    message: Message, compat: ChatCompat
) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...], tuple[str, ...]]:
    if isinstance(message.content, str):
        return ({"role": "user", "content": message.content},), (), ()
    tools: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for position, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock):
            call_id = wire_id(block.tool_use_id, compat)
            text, images = _result_parts(block, position)
            if images:
                text += f"\n[{len(images)} image(s) of this result follow in the next message]"
                moved.append({"type": "text", "text": f"Image(s) from tool call {call_id}:"})
                moved.extend(images)
            content = ERROR_PREFIX + text if block.is_error else text
            tools.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            part = _part(block, f"content.{position}")
            if part is not None:
                parts.append(part)
    user = [*moved, *parts]
    chat = list(tools)
    if len(user) == 1 and user[0]["type"] == "text":
        chat.append({"role": "user", "content": user[0]["text"]})
    elif user:
        chat.append({"role": "user", "content": user})
    return tuple(chat), (), tuple(t["tool_call_id"] for t in tools)


def _result_parts(block: ToolResultBlock, position: int) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text, and its images as user content parts."""
    if isinstance(block.content, str):
        return block.content, []
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for k, inner in enumerate(block.content):
        if isinstance(inner, ImageBlock):
            image = _part(inner, f"content.{position}.content.{k}")
            if image is not None:
                images.append(image)
        elif isinstance(inner, TextBlock):
            texts.append(inner.text)
        elif isinstance(inner, DocumentBlock) and inner.source.get("type") == "text":
            texts.append(str(inner.source.get("data", "")))
        else:
            texts.append(f"[{inner.type}]")
    return "\n".join(texts), images


def _part(block: ContentBlock, path: str) -> dict[str, Any] | None:
    """A user content part for a block; None for a block the format leaves out."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        source = block.source
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
            return {"type": "image_url", "image_url": {"url": url}}
        if source.get("type") == "url":
            return {"type": "image_url", "image_url": {"url": str(source.get("url", ""))}}
    elif isinstance(block, DocumentBlock):
        source = block.source
        if source.get("type") == "text":
            return {"type": "text", "text": str(source.get("data", ""))}
        if source.get("type") == "base64":
            media = source.get("media_type", "application/pdf")
            data = f"data:{media};base64,{source.get('data', '')}"
            title = (block.__pydantic_extra__ or {}).get("title") or "document.pdf"
            return {"type": "file", "file": {"filename": str(title), "file_data": data}}
        if source.get("type") == "file":
            return {"type": "file", "file": {"file_id": str(source.get("file_id", ""))}}
    elif isinstance(block, ThinkingBlock):
        return None
    kind = getattr(block, "type", type(block).__name__)
    detail = f" with a {block.source.get('type')!r} source" if hasattr(block, "source") else ""
    raise errors.HistoryError(
        f"a {kind!r} block{detail} cannot be sent in the Chat Completions format",
        path=path,
    )


_ID_ALPHABET = string.ascii_letters + string.digits


def wire_id(history_id: str, compat: ChatCompat) -> str:
    """The tool-call id sent for a history id: itself, unless the server wants short ids.

    With `tool_call_id_length`, an id of the wrong shape is mapped to one of the right
    shape by a hash, the same way in every request, so a call and its result still match.
    """
    length = compat.tool_call_id_length
    if length is None or (len(history_id) == length and history_id.isalnum()):
        return history_id
    digest = int.from_bytes(hashlib.sha256(history_id.encode()).digest(), "big")
    chars = []
    for _ in range(length):
        digest, k = divmod(digest, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[k])
    return "".join(chars)


def _new_id(compat: ChatCompat, taken: set[str]) -> str:
    """A fresh tool-call id, in the server's shape, unlike any in `taken`."""
    while True:
        if compat.tool_call_id_length is None:
            candidate = "call_" + secrets.token_hex(12)
        else:
            candidate = "".join(
                secrets.choice(_ID_ALPHABET) for _ in range(compat.tool_call_id_length)
            )
        if candidate not in taken:
            return candidate


def _taken_ids(messages: Iterable[Message], compat: ChatCompat) -> set[str]:
    """Every tool_use id of the history: a response must not repeat one."""
    taken: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            taken.update(_convert(message, compat).history_ids)
    return taken


# --------------------------------------------------------------------------- chat -> blocks


_FINISH = {
    "stop": "end_turn",
    "tool_calls": "end_turn",  # without calls: nothing to run
    "function_call": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _stop_reason(finish: Any, has_calls: bool) -> str:
    """The stop reason for a `finish_reason`, which is not trusted about tool calls.

    Servers report `stop` with tool calls present: calls present make a tool turn,
    unless the response was cut off (`length`) or filtered (`content_filter`).
    """
    if finish in ("length", "content_filter"):
        return _FINISH[finish]
    if has_calls:
        return "tool_use"
    if not isinstance(finish, str) or not finish:
        return "end_turn"
    return _FINISH.get(finish, finish)


def _usage(usage: Any) -> Usage:
    """`Usage` from a Chat Completions `usage` (prompt tokens include cached ones)."""
    if not isinstance(usage, Mapping):
        return Usage(requests=1)
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    cached = min(cached, prompt)
    return Usage(
        input_tokens=prompt - cached,
        output_tokens=_count(usage.get("completion_tokens")),
        cache_read_input_tokens=cached,
        requests=1,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _arguments(raw: Any) -> tuple[Any, str | None]:
    """A call's input from its `arguments`, and why it must not run (None if it may).

    Arguments are a JSON string; some servers send an object. No arguments at all mean
    an empty object. Valid JSON that is not an object is kept (the loop answers it).
    """
    if isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, str):
        return raw, None
    try:
        return json.loads(raw), None
    except ValueError as exc:
        shown = raw if len(raw) <= 200 else raw[:197] + "..."
        return {}, (
            f"Not run: the arguments of this call were not valid JSON ({exc}): {shown}. "
            "Call the tool again with a JSON object of arguments."
        )


NO_NAME_MESSAGE = "Not run: this call named no tool. Call a tool by its name."


def parse_completion(
    body: Any, compat: ChatCompat | None = None, taken: set[str] | None = None
) -> ModelResponse:
    """A Chat Completions response body (`chat.completion`) as a `ModelResponse`.

    Reasoning text (`reasoning_content` or `reasoning`) becomes a thinking block without
    a signature; text becomes a text block; each tool call a `tool_use` block. A call
    whose id is missing, empty or already used (in `taken` or earlier in the response)
    gets a fresh one; a call whose arguments are not valid JSON is marked in
    `call_errors`, so it is answered without running.

    Raises:
        ProviderError: the body is an error object.
        InvalidResponseError: the body is not a chat completion.
    """
    compat = compat or ChatCompat()
    used = set(taken or ())
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        raise errors.api_error(None, dict(body))
    choices = body.get("choices") if isinstance(body, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        shown = json.dumps(body, default=repr)[:300]
        raise errors.InvalidResponseError(f"the server's answer is not a chat completion: {shown}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        message = {}
    blocks: list[ContentBlock] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        blocks.append(ThinkingBlock(thinking=reasoning))
    text = _text(message.get("content")) or _text(message.get("refusal"))
    if text:
        blocks.append(TextBlock(text=text))
    raw_calls = message.get("tool_calls")
    calls = [c for c in raw_calls if isinstance(c, Mapping)] if isinstance(raw_calls, list) else []
    finish = choice.get("finish_reason")
    call_errors: dict[str, str] = {}
    for n, call in enumerate(calls):
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in used:
            call_id = _new_id(compat, used)
        used.add(call_id)
        name = function.get("name")
        value, error = _arguments(function.get("arguments"))
        blocks.append(
            ToolUseBlock(id=call_id, name=name if isinstance(name, str) else "", input=value)
        )
        cut = finish == "length" and n == len(calls) - 1  # the loop says why it won't run
        if not isinstance(name, str) or not name:
            call_errors[call_id] = NO_NAME_MESSAGE
        elif error is not None and not cut:
            call_errors[call_id] = error
    return ModelResponse(
        content=blocks,
        stop_reason=_stop_reason(finish, bool(calls)),
        usage=_usage(body.get("usage")),
        id=str(body.get("id") or ""),
        model=str(body.get("model") or ""),
        raw=body,
        call_errors=call_errors,
    )


def _text(content: Any) -> str:
    """Text of a `content` (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


@dataclass
class _Call:
    """A tool call while its chunks arrive."""

    slot: int
    """Its block index in the response."""
    key: Any
    """What later chunks of it are recognised by (their `index`)."""
    server_id: str | None = None
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    started: bool = False
    closed: bool = False


class ChatStreamAssembler:
    """Puts a streamed chat completion together, reporting block events as it goes.

    Text and reasoning arrive as deltas of one open block each; tool calls arrive as
    fragments keyed by `index`, with the id and name taken from whichever chunk carries
    them (a new id at an index already in use starts a new call, as servers that reuse
    index 0 send them). A call is announced (`BlockStart`) once its id and name are
    known, and closed (`BlockStop`) when the next call's first chunk or the finish chunk
    arrives, or at once when the server sends calls whole.
    """

    def __init__(
        self,
        on_event: Callable[[StreamEvent], Awaitable[None]],
        *,
        compat: ChatCompat | None = None,
        taken: set[str] | None = None,
    ) -> None:
        """Assemble a stream, reporting events to `on_event`; `taken` are ids in use."""
        self.on_event = on_event
        self.compat = compat or ChatCompat()
        self.used = set(taken or ())
        self.blocks: dict[int, ContentBlock] = {}
        self.slots = 0
        self.text: tuple[int, str, list[str]] | None = None  # open text/thinking block
        self.calls: list[_Call] = []
        self.call_errors: dict[str, str] = {}
        self.finish_reason: str | None = None
        self.usage = Usage(requests=1)
        self.id = ""
        self.model = ""

    async def feed(self, chunk: Any) -> None:
        """Take one decoded chunk (`chat.completion.chunk`)."""
        if not isinstance(chunk, Mapping):
            raise errors.InvalidResponseError(f"the server's stream carried {chunk!r}"[:300])
        if isinstance(chunk.get("error"), Mapping):
            raise errors.api_error(None, dict(chunk))
        self.id = self.id or str(chunk.get("id") or "")
        self.model = self.model or str(chunk.get("model") or "")
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, Mapping) else {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                await self._text("thinking", reasoning)
            if isinstance(delta.get("content"), str) and delta["content"]:
                await self._text("text", delta["content"])
            tool_calls = delta.get("tool_calls")
            for position, part in enumerate(tool_calls if isinstance(tool_calls, list) else ()):
                if isinstance(part, Mapping):
                    await self._tool_part(part, position)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self.finish_reason = finish
                # Calls first: a call that was waiting for this chunk starts at once.
                await self._close_calls(cut=finish == "length")
                await self._close_text()

    async def finish(self) -> ModelResponse:
        """The whole response, once the stream has ended.

        Raises:
            APIConnectionError: the stream ended before its finish chunk.
        """
        if self.finish_reason is None:
            raise errors.APIConnectionError(
                "the server's stream ended before its finish_reason: the response is incomplete"
            )
        content = [self.blocks[i] for i in sorted(self.blocks)]
        return ModelResponse(
            content=content,
            stop_reason=_stop_reason(self.finish_reason, bool(self.calls)),
            usage=self.usage,
            id=self.id,
            model=self.model,
            call_errors=dict(self.call_errors),
        )

    # -- text and reasoning

    async def _text(self, kind: str, value: str) -> None:
        if self.text is None or self.text[1] != kind:
            await self._close_text()
            slot = self._slot()
            self.text = (slot, kind, [])
            start: ContentBlock = (
                TextBlock(text="") if kind == "text" else ThinkingBlock(thinking="")
            )
            await self.on_event(BlockStart(slot, start))
        slot, _, pieces = self.text
        pieces.append(value)
        await self.on_event(BlockDelta(slot, kind, value))

    async def _close_text(self) -> None:
        if self.text is None:
            return
        slot, kind, pieces = self.text
        self.text = None
        whole = "".join(pieces)
        block: ContentBlock = (
            TextBlock(text=whole) if kind == "text" else ThinkingBlock(thinking=whole)
        )
        self.blocks[slot] = block
        await self.on_event(BlockStop(slot, block))

    # -- tool calls

    async def _tool_part(self, part: Mapping[str, Any], position: int) -> None:
        function = part.get("function")
        function = function if isinstance(function, Mapping) else {}
        server_id = part.get("id") if isinstance(part.get("id"), str) and part.get("id") else None
        name = function.get("name") if isinstance(function.get("name"), str) else None
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments, ensure_ascii=False)
        index = part.get("index")
        key = index if isinstance(index, int) and not isinstance(index, bool) else None
        call = None if self.compat.whole_tool_calls else self._call_for(key, server_id)
        if call is None:
            await self._close_text()
            await self._close_calls(cut=False)
            call = _Call(self._slot(), key if key is not None else ("position", position))
            self.calls.append(call)
        if server_id and call.server_id is None:
            call.server_id = server_id
        if name and not call.name:
            call.name = name
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)
            if call.started:
                await self.on_event(BlockDelta(call.slot, "input_json", arguments))
        if not call.started and call.server_id and call.name:
            await self._start(call)
        if self.compat.whole_tool_calls:
            await self._close(call, cut=False)

    def _call_for(self, key: Any, server_id: str | None) -> _Call | None:
        """The open call a tool-call chunk continues, or None when it starts a new one."""
        open_calls = [c for c in self.calls if not c.closed]
        if key is None:  # no index: it continues the latest call unless it names a new id
            call = open_calls[-1] if open_calls else None
        else:
            call = next((c for c in open_calls if c.key == key), None)
        if call is not None and server_id and call.server_id and server_id != call.server_id:
            return None  # a new call reusing the index
        return call

    async def _start(self, call: _Call) -> None:
        call.started = True
        call_id = call.server_id
        if not call_id or call_id in self.used:
            call_id = _new_id(self.compat, self.used)
        self.used.add(call_id)
        call.id = call_id
        await self.on_event(
            BlockStart(call.slot, ToolUseBlock(id=call_id, name=call.name or "", input={}))
        )
        raw = "".join(call.arguments)
        if raw:
            await self.on_event(BlockDelta(call.slot, "input_json", raw))

    async def _close(self, call: _Call, *, cut: bool) -> None:
        if call.closed:
            return
        if not call.started:
            await self._start(call)
        call.closed = True
        assert call.id is not None  # set by _start
        value, error = _arguments("".join(call.arguments))
        block = ToolUseBlock(id=call.id, name=call.name or "", input=value)
        self.blocks[call.slot] = block
        if not call.name:
            self.call_errors[call.id] = NO_NAME_MESSAGE
        elif error is not None and not cut:
            self.call_errors[call.id] = error
        await self.on_event(
            BlockStop(call.slot, block, not cut and error is None and bool(call.name))
        )

    async def _close_calls(self, *, cut: bool) -> None:
        for call in self.calls:
            await self._close(call, cut=cut)

    def _slot(self) -> int:
        slot = self.slots
        self.slots += 1
        return slot


def preset(name: str, **changes: Any) -> ChatCompat:
    """A named preset with some flags changed: `preset("vllm", tool_call_id_length=9)`."""
    return replace(_compat(name, ""), **changes)
