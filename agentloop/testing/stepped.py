"""An in-process streaming provider: scripted messages delivered block event by block event.

`SteppedProvider` lets a test see and steer a streamed run without HTTP: a hook awaited
after every event can hold the stream at an exact point (to prove a tool started before
the message ended) or make it fail there.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from pydantic import TypeAdapter

from agentloop.messages import ContentBlock
from agentloop.providers.base import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ModelRequest,
    ModelResponse,
    StreamEvent,
)

from .scripted import ScriptedModel

__all__ = ("SteppedProvider",)

_BLOCK = TypeAdapter(ContentBlock)
Hook = Callable[[int, StreamEvent], Awaitable[None]]


class SteppedProvider:
    """A `StreamingProvider` that streams each scripted message as block events.

    Text arrives in two deltas, tool input JSON in two fragments, other blocks whole.
    After each event, `hook(n, event)` is awaited (n counts events from 1), and every
    event is a checkpoint, so cancellation can land between any two events.
    """

    def __init__(
        self, script: Any, hook: Hook | None = None, *, truncate_last_input: bool = False
    ) -> None:
        """Stream answers from `script` (as `ScriptedModel` takes it).

        Args:
            script: A script or a `ScriptedModel`.
            hook: Awaited after every event with its number and the event.
            truncate_last_input: Cut the input JSON of a tool_use that ends a message
                short, as a response stopped by `max_tokens` would.
        """
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
        self.hook = hook
        self.truncate_last_input = truncate_last_input
        self.events_sent = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The whole response, streamed internally."""
        return await self.stream(request, _ignore)

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Deliver the scripted answer to `request` event by event."""
        message = self.model.respond(request.to_wire())
        if not isinstance(message, dict):
            raise TypeError("SteppedProvider scripts hold messages, not raw HTTP answers")
        content = message["content"]
        for index, raw in enumerate(content):
            block = _BLOCK.validate_python(raw)
            for event in self._events(index, raw, block, last=index == len(content) - 1):
                await on_event(event)
                self.events_sent += 1
                if self.hook is not None:
                    await self.hook(self.events_sent, event)
                await anyio.lowlevel.checkpoint()
        return ModelResponse.from_wire(message)

    def _events(
        self, index: int, raw: dict[str, Any], block: Any, last: bool
    ) -> Sequence[StreamEvent]:
        kind = raw["type"]
        if kind == "text":
            start = _BLOCK.validate_python({**raw, "text": ""})
            half = len(raw["text"]) // 2
            return [
                BlockStart(index, start),
                BlockDelta(index, "text", raw["text"][:half]),
                BlockDelta(index, "text", raw["text"][half:]),
                BlockStop(index, block),
            ]
        if kind == "tool_use":
            start = _BLOCK.validate_python({**raw, "input": {}})
            text = json.dumps(raw["input"]) if raw["input"] else ""
            complete = not (last and self.truncate_last_input)
            pieces = (
                [text[: len(text) // 2], text[len(text) // 2 :]]
                if complete
                else [text[: len(text) // 2]]
            )
            return [
                BlockStart(index, start),
                *[BlockDelta(index, "input_json", p) for p in pieces],
                BlockStop(index, block, complete),
            ]
        return [BlockStart(index, block), BlockStop(index, block)]


async def _ignore(event: StreamEvent) -> None:
    return None
