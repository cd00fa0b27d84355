"""Chat Completions answers: a scripted Messages API answer as a completion or chunks.

`completion_of` builds the `chat.completion` body for a whole message; `chat_chunks` the
`chat.completion.chunk`s a server streams for its events. `ChatQuirks` acts out what
real servers do differently. Pure functions: `chat_server.ChatCompletionsServer` serves
them.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ("ChatQuirks", "Chunk", "chat_chunks", "completion_of")


@dataclass(frozen=True)
class ChatQuirks:
    """How a server answers differently from OpenAI (see `ChatCompletionsServer`)."""

    whole_tool_calls: bool = False
    ids: Literal["first", "every", "none"] = "first"
    id_length: int | None = None
    tool_choices: frozenset[str] | None = None
    single_system: bool = False
    refuse_fields: frozenset[str] = frozenset()
    finish_reason_with_tools: str = "tool_calls"
    reasoning_field: str = "reasoning_content"
    strict: bool = False
    tools_need_choice: bool = False
    response_formats: frozenset[str] | None = None
    stream_usage: bool = True
    refusal_status: int = 400


# --------------------------------------------------------------------------- blocks -> chat

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "refusal": "content_filter",
}


def _finish_reason(message: Mapping[str, Any], quirks: ChatQuirks) -> str:
    reason = message.get("stop_reason")
    if reason == "tool_use":
        return quirks.finish_reason_with_tools
    if reason is None:
        return "stop"
    return _FINISH.get(str(reason), str(reason))


def _usage(message: Mapping[str, Any]) -> dict[str, Any]:
    usage = message.get("usage") or {}
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = (
        int(usage.get("input_tokens") or 0)
        + cached
        + int(usage.get("cache_creation_input_tokens") or 0)
    )
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_of(message: Mapping[str, Any], quirks: ChatQuirks | None = None) -> dict[str, Any]:
    """The `chat.completion` body for a scripted Messages API answer."""
    quirks = quirks or ChatQuirks()
    content = message.get("content") or []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    reasoning = "".join(b.get("thinking", "") for b in content if b.get("type") == "thinking")
    calls = []
    for block in content:
        if block.get("type") != "tool_use":
            continue
        call: dict[str, Any] = {
            "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))},
        }
        if quirks.ids != "none":
            call = {"id": block["id"], **call}
        calls.append(call)
    chat: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        chat[quirks.reasoning_field] = reasoning
    if calls:
        chat["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model", "scripted"),
        "choices": [
            {"index": 0, "message": chat, "finish_reason": _finish_reason(message, quirks)}
        ],
        "usage": _usage(message),
    }


Chunk = dict[str, Any] | str
"""A streamed chunk (`chat.completion.chunk`), or the closing `[DONE]`."""


def chat_chunks(
    events: Sequence[tuple[float, str, Any]],
    message: Mapping[str, Any],
    quirks: ChatQuirks | None = None,
    *,
    usage: bool = False,
) -> list[tuple[float, Chunk]]:
    """The chunks a Chat Completions server streams for a message's Messages API events.

    `events` are `(seconds to wait before it, event name, data)`; an event that has no
    chunk of its own passes its pause on to the next chunk. Usage comes in a chunk of its
    own before `[DONE]` when `usage` is asked for.
    """
    quirks = quirks or ChatQuirks()
    head = {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": message.get("model", "scripted"),
    }
    out: list[tuple[float, Chunk]] = []
    carried = 0.0
    calls: dict[int, int] = {}  # block index -> call index
    ids: dict[int, str] = {}  # block index -> call id
    whole: dict[int, dict[str, Any]] = {}  # block index -> the call being gathered

    def emit(pause: float, delta: Mapping[str, Any] | None, **extra: Any) -> None:
        nonlocal carried
        chunk: dict[str, Any] = {**head, **extra}
        if delta is not None:
            chunk["choices"] = [{"index": 0, "delta": dict(delta), "finish_reason": None}]
        out.append((carried + pause, chunk))
        carried = 0.0

    def call_part(index: int, **fields: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": calls[index], **fields}]}

    for pause, name, data in events:
        if name == "message_start":
            emit(pause, {"role": "assistant", "content": ""})
        elif name == "content_block_start" and data["content_block"].get("type") == "tool_use":
            block = data["content_block"]
            calls[data["index"]] = len(calls)
            ids[data["index"]] = block["id"]
            if quirks.whole_tool_calls:
                whole[data["index"]] = {"id": block["id"], "name": block["name"], "arguments": []}
                carried += pause
                continue
            fields: dict[str, Any] = {"type": "function"}
            if quirks.ids != "none":
                fields["id"] = block["id"]
            fields["function"] = {"name": block["name"], "arguments": ""}
            emit(pause, call_part(data["index"], **fields))
        elif name == "content_block_delta":
            delta = data["delta"]
            kind = delta.get("type")
            if kind == "text_delta":
                emit(pause, {"content": delta["text"]})
            elif kind == "thinking_delta":
                emit(pause, {quirks.reasoning_field: delta["thinking"]})
            elif kind == "input_json_delta" and data["index"] in calls and delta["partial_json"]:
                if data["index"] in whole:
                    whole[data["index"]]["arguments"].append(delta["partial_json"])
                    carried += pause
                    continue
                fields = {"function": {"arguments": delta["partial_json"]}}
                if quirks.ids == "every":
                    fields["id"] = ids[data["index"]]
                emit(pause, call_part(data["index"], **fields))
            else:
                carried += pause
        elif name == "content_block_stop" and data["index"] in whole:
            gathered = whole.pop(data["index"])
            fields = {"type": "function"}
            if quirks.ids != "none":
                fields["id"] = gathered["id"]
            fields["function"] = {
                "name": gathered["name"],
                "arguments": "".join(gathered["arguments"]) or "{}",
            }
            # Servers that send calls whole number every one of them 0.
            emit(pause, {"tool_calls": [{"index": 0, **fields}]})
        elif name == "message_delta":
            finish = _finish_reason({"stop_reason": data["delta"].get("stop_reason")}, quirks)
            chunk = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            out.append((carried + pause, chunk))
            carried = 0.0
        elif name == "message_stop":
            if usage:
                emit(pause, None, choices=[], usage=_usage(message))
            out.append((0.0, "[DONE]"))
        else:
            carried += pause
    return out
