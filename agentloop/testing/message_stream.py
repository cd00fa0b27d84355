"""The server-sent events the Messages API streams for a message, built from the message.

The scripted servers (`MessagesServer`, and `Paced` messages) stream what a script holds
as the API would: this turns one whole wire message into its SSE events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ("message_events",)


def message_events(message: Mapping[str, Any], *, chunk: int = 16) -> list[tuple[str, Any]]:
    """The SSE events, as `(event name, data)` pairs, that the API would stream for `message`.

    Text, thinking and tool input arrive as deltas of at most `chunk` characters; a
    `compaction` block's summary arrives in one `compaction_delta`; other blocks arrive
    whole in their `content_block_start`.
    """
    usage = dict(message.get("usage") or {})
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": start})]
    content = message.get("content") or []
    if isinstance(content, str):  # a stream always carries blocks
        content = [{"type": "text", "text": content}]
    for index, block in enumerate(content):
        head, deltas = _block_parts(block, chunk)
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": head},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
    }
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _chunks(value: str, size: int) -> Iterator[str]:
    for start in range(0, len(value), size):
        yield value[start : start + size]


def _block_parts(block: Mapping[str, Any], chunk: int) -> tuple[dict[str, Any], list[Any]]:
    """A block's `content_block_start` form and the deltas that complete it."""
    kind = block.get("type")
    if kind == "text":
        deltas = [{"type": "text_delta", "text": t} for t in _chunks(block["text"], chunk)]
        return {**block, "text": ""}, deltas
    if kind in ("tool_use", "server_tool_use"):
        value = block.get("input", {})
        raw = "" if value == {} else json.dumps(value)
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [{"type": "input_json_delta", "partial_json": p} for p in _chunks(raw, chunk)]
        return {**block, "input": {}}, deltas
    if kind == "thinking":
        deltas = [
            {"type": "thinking_delta", "thinking": t} for t in _chunks(block["thinking"], chunk)
        ]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {**block, "thinking": "", "signature": ""}, deltas
    if kind == "compaction":
        fields = ("content", "encrypted_content")
        delta = {"type": "compaction_delta", **{k: block[k] for k in fields if k in block}}
        return {**{k: v for k, v in block.items() if k not in fields}, "content": None}, [delta]
    return dict(block), []
