"""A streamed Anthropic message put together from the SDK's stream events.

`AnthropicProvider.stream` hands each event of `create(stream=True)` to a
`StreamedMessage`, which reports it as a neutral `StreamEvent` and keeps the message whole
for the final `ModelResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import TypeAdapter

from agentloop.messages import ContentBlock

from .base import BlockDelta, BlockStart, BlockStop, MessageStart, StreamEvent

__all__ = ("StreamedMessage", "wire")

_BLOCK = TypeAdapter(ContentBlock)


def wire(value: Any) -> dict[str, Any]:
    """An SDK model as the JSON the API sent (unset fields left out)."""
    if isinstance(value, dict):
        return value
    return dict(value.to_dict(mode="json", warnings=False)) if value is not None else {}


class StreamedMessage:
    """A streamed message, put together from its events as the API describes them.

    Tool input arrives as JSON fragments and is parsed once, when its block closes (with
    Python's own parser, which reads every escape the API may send).
    """

    def __init__(self, headers: Mapping[str, str]) -> None:
        """A message whose HTTP response carried `headers` (lower-cased)."""
        self.headers = headers
        self.head: dict[str, Any] = {"type": "message", "role": "assistant"}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}
        self.stopped = False
        """`message_stop` arrived: the response is whole."""

    async def add(self, event: Any, on_event: Callable[[StreamEvent], Awaitable[None]]) -> None:
        """Take one SDK stream event, reporting it to `on_event` as a neutral event."""
        kind = event.type
        if kind == "message_start":
            self.head = {**wire(event.message), "content": []}
            await on_event(MessageStart(wire(event.message), headers=self.headers))
        elif kind == "content_block_start":
            block = wire(event.content_block)
            self.blocks[event.index] = block
            await on_event(BlockStart(event.index, _BLOCK.validate_python(block)))
        elif kind == "content_block_delta":
            name, value = self.add_delta(event.index, wire(event.delta))
            await on_event(BlockDelta(event.index, name, value))
        elif kind == "content_block_stop":
            block, whole = self.close_block(event.index)
            await on_event(BlockStop(event.index, _BLOCK.validate_python(block), whole))
        elif kind == "message_delta":
            self.finish(wire(event.delta), wire(event.usage))
        elif kind == "message_stop":
            self.stopped = True

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
        elif kind == "compaction":  # server-side compaction: its summary, in one piece
            for key in ("content", "encrypted_content"):
                if delta.get(key) is not None:
                    block[key] = (block.get(key) or "") + str(delta[key])
            value = json.dumps(delta)
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
        """Take `message_delta`'s stop reason and final usage."""
        self.head.update({k: v for k, v in delta.items() if v is not None or k in self.head})
        counts = dict(self.head.get("usage") or {})
        counts.update({k: v for k, v in usage.items() if v is not None})
        self.head["usage"] = counts

    def body(self) -> dict[str, Any]:
        """The message as the JSON a non-streamed response would carry."""
        return {**self.head, "content": [self.blocks[i] for i in sorted(self.blocks)]}
