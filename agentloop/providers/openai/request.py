"""History -> Chat Completions: the messages and arguments of `chat.completions.create`.

agentloop's block history stays the source of truth; each message is converted once (and
kept with it), and each request's `create()` arguments are put together from those.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop import errors
from agentloop._wire import compact_json
from agentloop.calls import ToolDefinition
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
from agentloop.providers.base import ModelRequest

from .compat import ChatCompat, resolve, wire_id

__all__ = ("ERROR_PREFIX", "chat_arguments", "response_format", "taken_ids", "to_chat_messages")

ERROR_PREFIX = "Error: "
"""What an `is_error` tool result's text starts with on the wire: the format has no flag."""


def chat_arguments(
    request: ModelRequest, compat: ChatCompat, *, accepted: Collection[str], stream: bool
) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` (which takes `accepted`).

    The request's fields map to the format's; `params` are applied last and win (their
    `tools` are added after the agent's). Names `create()` does not list go into
    `extra_body`, which a given `extra_body` then updates.
    """
    fields: dict[str, Any] = {"model": request.model, compat.max_tokens_field: request.max_tokens}
    tools = [_tool(t) for t in request.tools]
    if tools:
        fields["tools"] = tools
        choice = _tool_choice(request.tool_choice, compat, tools)
        if choice is not None:
            fields["tool_choice"] = choice
        if (request.tool_choice or {}).get("disable_parallel_tool_use"):
            fields["parallel_tool_calls"] = False
    if request.stop_sequences:
        fields["stop"] = list(request.stop_sequences)
    if request.output_format is not None:
        fields["response_format"] = response_format(request.output_format, compat)
    if stream:
        fields["stream"] = True
        if compat.stream_usage:
            fields["stream_options"] = {"include_usage": True}
    for name, value in request.params.items():
        if name == "tools" and value:
            fields["tools"] = [*fields.get("tools", ()), *(_tool(t) for t in value)]
        else:
            fields[name] = value
    arguments: dict[str, Any] = {}
    extra_body: dict[str, Any] = {}
    for name, value in fields.items():
        (arguments if name in accepted else extra_body)[name] = value
    extra_body.update(arguments.pop("extra_body", None) or {})
    if extra_body:
        arguments["extra_body"] = extra_body
    arguments["messages"] = [
        *_system_messages(request.system, compat),
        *_chat_messages(request.messages, compat),
    ]
    return arguments


def response_format(
    output_format: Mapping[str, Any], compat: ChatCompat | None = None
) -> dict[str, Any]:
    """The `response_format` asking for JSON of an output schema.

    Every object is closed (`additionalProperties: false`). The format is `json_schema`,
    `strict` when every object also requires all its properties, as OpenAI's strict mode
    demands (a field with a default is optional, so such a schema is sent without
    `strict`); for a server that takes the schema in a `json_object` format instead
    (`ChatCompat.json_object_schema` without `json_schema`), it is that.
    """
    schema = _closed(output_format["schema"])
    if compat is not None and compat.json_object_schema and not compat.json_schema:
        return {"type": "json_object", "schema": schema}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": str(output_format.get("name") or "output"),
            "schema": schema,
            "strict": _all_required(schema),
        },
    }


def _closed(node: Any) -> Any:
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    closed = {k: v if k in ("enum", "const", "default") else _closed(v) for k, v in node.items()}
    if closed.get("type") == "object":
        closed["additionalProperties"] = False
    return closed


def _all_required(node: Any) -> bool:
    if isinstance(node, list):
        return all(_all_required(item) for item in node)
    if not isinstance(node, Mapping):
        return True
    if node.get("type") == "object":
        if set(node.get("properties") or {}) - set(node.get("required") or []):
            return False
    return all(_all_required(v) for k, v in node.items() if k not in ("enum", "const", "default"))


def to_chat_messages(
    messages: Sequence[Message],
    *,
    system: str | Sequence[Mapping[str, Any]] | None = None,
    compat: ChatCompat | str | None = None,
) -> list[dict[str, Any]]:
    """A block history as the Chat Completions `messages` a request would carry.

    The conversion the provider applies to every request, for inspection and tests:
    `system` first; an assistant message's text and `tool_use` blocks become one message
    with `content` (a string, `""` beside calls only) and `tool_calls`; each
    `tool_result` becomes a `tool` message, in call order, before the user text that
    follows it; a user message's texts are one string, joined by blank lines, unless it
    holds an image or a file (then a list of parts); an `is_error` result's text starts
    with `ERROR_PREFIX`; images in a tool result move to a user message after the `tool`
    messages; a message of role `system` inside the conversation stays a system message
    in its place (its text), or becomes user text for a server that takes one system
    message only (`ChatCompat.single_system`); thinking, redacted thinking and
    server-tool blocks are left out.

    Raises:
        HistoryError: a user message holds a block the format cannot carry.
    """
    resolved = resolve(compat)
    chat = [*_system_messages(system, resolved), *_chat_messages(messages, resolved)]
    value: list[dict[str, Any]] = json.loads(compact_json(chat))  # a copy of the cached forms
    return value


def taken_ids(messages: Iterable[Message], compat: ChatCompat) -> set[str]:
    """Every tool_use id of the history: a response must not repeat one."""
    taken: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            taken.update(_convert(message, compat).history_ids)
    return taken


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


@dataclass(frozen=True)
class _Converted:
    """One history message in the Chat Completions format (kept with the message)."""

    messages: tuple[dict[str, Any], ...]
    """The chat messages it becomes: `tool` messages first, then any user or assistant one."""
    result_ids: tuple[str, ...] = ()
    """For a user message: the tool-call ids its `tool` messages answer, in order."""
    history_ids: tuple[str, ...] = ()
    """The tool_use ids of an assistant message as agentloop holds them."""


def _converter(compat: ChatCompat) -> Callable[[Message], _Converted]:
    def convert(message: Message) -> _Converted:
        results: tuple[str, ...] = ()
        if message.role == "assistant":
            chat = _assistant(message, compat)
        elif message.role == "system" and not compat.single_system:
            chat = _system(message)
        else:
            chat, results = _user(message, compat)
        history_ids = tuple(u.id for u in message.tool_uses)
        return _Converted(chat, result_ids=results, history_ids=history_ids)

    return convert


_CONVERTERS: dict[ChatCompat, Callable[[Message], _Converted]] = {}


def _convert(message: Message, compat: ChatCompat) -> _Converted:
    """`message` in the Chat Completions format for `compat`, converted once per message."""
    convert = _CONVERTERS.get(compat)
    if convert is None:
        convert = _CONVERTERS.setdefault(compat, _converter(compat))
    return message.converted(("chat-completions", compat), convert)


def _chat_messages(messages: Sequence[Message], compat: ChatCompat) -> list[dict[str, Any]]:
    """Every chat message a history becomes.

    Each message is converted once (then kept with it); only where the format needs two
    history messages to become one is anything rebuilt: tool results answered out of
    call order are put in order, and consecutive assistant messages (a paused turn and
    its continuation) become one message.
    """
    out: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None  # the previous chat message, when it is an assistant's
    calls: tuple[str, ...] = ()
    for message in messages:
        converted = _convert(message, compat)
        if not converted.messages:
            continue
        if message.role == "assistant":
            if last is not None:  # consecutive assistant messages: one chat message
                last = out[-1] = _merge_assistant(last, converted.messages[0])
            else:
                last = converted.messages[0]
                out.append(last)
            calls = tuple(c["id"] for c in last.get("tool_calls", ()))
            continue
        last = None
        parts = list(converted.messages)
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
    merged["content"] = first["content"] + second["content"]
    tool_calls = [*first.get("tool_calls", ()), *second.get("tool_calls", ())]
    if tool_calls:
        merged["tool_calls"] = tool_calls
    if "reasoning_content" in second:
        merged["reasoning_content"] = first.get("reasoning_content", "") + str(
            second["reasoning_content"]
        )
    return merged


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


def _tool_choice(
    choice: Mapping[str, Any] | None, compat: ChatCompat, tools: Sequence[Mapping[str, Any]]
) -> Any:
    """The `tool_choice` for a Messages API one, or None to leave it out."""
    kind = (choice or {}).get("type")
    name = (choice or {}).get("name")
    if kind == "any" and "required" not in compat.tool_choices and len(tools) == 1:
        kind, name = "tool", tools[0]["function"]["name"]  # the one tool it must call
    value: Any = None
    form = None
    if kind in ("auto", "none"):
        value = form = kind
    elif kind == "any":
        value = form = "required"
    elif kind == "tool" and isinstance(name, str):
        value, form = {"type": "function", "function": {"name": name}}, "function"
    if form in compat.tool_choices:
        return value
    return compat.default_tool_choice


def _assistant(message: Message, compat: ChatCompat) -> tuple[dict[str, Any], ...]:
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
        return ()
    # "" rather than null beside tool calls: chat templates add `content` to a string,
    # and fail on null (llama-cpp-python answers 500); every server takes "".
    chat: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning and compat.send_reasoning:
        chat["reasoning_content"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    return (chat,)


def _system(message: Message) -> tuple[dict[str, Any], ...]:
    """A system message inside the conversation, kept in its place as the format allows."""
    if isinstance(message.content, str):
        return ({"role": "system", "content": message.content},)
    texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text]
    return ({"role": "system", "content": "\n\n".join(texts)},) if texts else ()


def _user(
    message: Message, compat: ChatCompat
) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...]]:
    """The chat messages of a user message, and the call ids its `tool` messages answer."""
    if isinstance(message.content, str):
        return ({"role": "user", "content": message.content},), ()
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
    if user and all(p["type"] == "text" for p in user):
        # One string, not a list of text parts: chat templates add `content` to a string,
        # so only a message holding an image or a file is sent as parts.
        chat.append({"role": "user", "content": "\n\n".join(p["text"] for p in user)})
    elif user:
        chat.append({"role": "user", "content": user})
    return tuple(chat), tuple(t["tool_call_id"] for t in tools)


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
