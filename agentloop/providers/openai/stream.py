"""A streamed chat completion put together chunk by chunk, reported as block events.

The provider feeds it each decoded `chat.completion.chunk`; it reports `BlockStart`,
`BlockDelta` and `BlockStop` as blocks open and close, and returns the whole response.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop import errors
from agentloop.messages import ContentBlock, TextBlock, ThinkingBlock, ToolUseBlock
from agentloop.providers.base import BlockDelta, BlockStart, BlockStop, ModelResponse, StreamEvent

from .compat import ChatCompat, new_id
from .response import NO_NAME_MESSAGE, UNCOUNTED, call_input, stop_reason, usage

__all__ = ("ChatStreamAssembler",)


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

    Text and reasoning arrive as deltas of one open block each (a text block opens at
    its first character that is not whitespace: an answer of whitespace only has no text
    block, as `parse_completion` reads it); tool calls arrive as
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
        self.space = ""  # whitespace before any text block opens
        self.calls: list[_Call] = []
        self.call_errors: dict[str, str] = {}
        self.finish_reason: str | None = None
        self.usage = UNCOUNTED  # until a chunk carries usage (if the server sends any)
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
            self.usage = usage(chunk["usage"])
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
            stop_reason=stop_reason(self.finish_reason, bool(self.calls)),
            usage=self.usage,
            id=self.id,
            model=self.model,
            call_errors=dict(self.call_errors),
        )

    # -- text and reasoning

    async def _text(self, kind: str, value: str) -> None:
        if self.text is None or self.text[1] != kind:
            if kind == "text" and not (self.space + value).strip():
                self.space += value  # a text block opens at its first visible character
                return
            leading = self.space if kind == "text" else ""
            await self._close_text()
            value = leading + value
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
        self.space = ""  # whitespace that opened no text block is left out, as in JSON
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
            call_id = new_id(self.compat, self.used)
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
        value, error = call_input("".join(call.arguments))
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
