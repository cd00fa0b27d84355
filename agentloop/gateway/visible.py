"""What the client sees: one assistant message across every hidden round.

The message holds what the model wrote in every round of the run (text, thinking, server
tool blocks) and the client's own `tool_use` blocks, never the gateway's calls or their
results; its usage is summed over the rounds. `visible_message` builds it for a JSON
answer; `VisibleStream` turns the rounds' streamed events into one Anthropic SSE message,
with continuous block indices.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentloop._wire import compact_json, random_id
from agentloop.messages import ToolUseBlock
from agentloop.providers.base import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageStart,
    ModelResponse,
    StreamEvent,
)
from agentloop.result import RunResult

__all__ = (
    "PING",
    "VisibleStream",
    "message_sse",
    "sse",
    "visible_message",
    "visible_stop_reason",
    "visible_usage",
)

_SUMMED = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def sse(name: str, data: Any) -> bytes:
    """One server-sent event as the API writes it."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), compact_json(data))


PING = sse("ping", {"type": "ping"})
"""The keep-alive event."""


def visible_stop_reason(stop_reason: str) -> str:
    """The API stop reason for a run's stop reason.

    A run that reached the gateway's round limit has answered the model's calls but not
    heard back: the client gets `pause_turn`, the API's way to say "send it again to
    continue", and the stored history resumes from there.
    """
    return "pause_turn" if stop_reason == "max_rounds" else stop_reason


def visible_usage(responses: Sequence[ModelResponse]) -> dict[str, Any]:
    """The usage of the last response, with token counts summed over every response."""
    if not responses:
        return {"input_tokens": 0, "output_tokens": 0}
    last = dict(responses[-1].raw.get("usage") or {})
    if len(responses) == 1:
        return last
    for name in _SUMMED:
        total = 0
        seen = False
        for response in responses:
            value = (response.raw.get("usage") or {}).get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                total += value
                seen = True
        if seen:
            last[name] = total
    return last


def visible_message(
    responses: Sequence[ModelResponse], result: RunResult, *, reply_id: str | None
) -> dict[str, Any]:
    """The assistant message a JSON client gets for a run.

    Fields come from the last response (the first one's `id` unless `reply_id` is
    given); `content` is every round's blocks less the calls the gateway ran.
    """
    pending = {call.get("id") for call in result.pending}
    content: list[Any] = []
    for response in responses:
        for block in response.raw.get("content") or []:
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                if block.get("id") not in pending:
                    continue
            content.append(block)
    head = dict(responses[-1].raw) if responses else {"type": "message", "role": "assistant"}
    first_id = responses[0].raw.get("id") if responses else None
    return {
        **head,
        "id": reply_id or first_id or head.get("id"),
        "content": content,
        "stop_reason": visible_stop_reason(result.stop_reason),
        "usage": visible_usage(responses),
    }


class VisibleStream:
    """Turns the streamed events of every round into the client's one SSE message.

    Feed it each `(round, event)`; it returns the SSE bytes to send (possibly none). The
    gateway's own `tool_use` blocks (any call of a tool the client did not declare) are
    never sent; the indices of the blocks that are sent run on across rounds.
    """

    def __init__(
        self, client_tools: Collection[str], *, reply_id: str | None, model: str = ""
    ) -> None:
        """A stream for a request declaring `client_tools`; `reply_id` replaces the id.

        `model` (the model asked for) names the message when the upstream sends a block
        before its `message_start`: the client still gets `message_start` first.
        """
        self.client_tools = client_tools
        self.reply_id = reply_id
        self.model = model
        self.started = False
        self._next = 0
        self._index: dict[tuple[int, int], int | None] = {}

    def feed(self, round_: int, event: StreamEvent) -> bytes:
        """The SSE bytes for one upstream event."""
        if not self.started and not isinstance(event, MessageStart):
            stand_in = {
                "id": self.reply_id or random_id("msg_"),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
            return self.feed(round_, MessageStart(stand_in)) + self.feed(round_, event)
        if isinstance(event, MessageStart):
            if self.started:
                return b""
            self.started = True
            head = {
                **event.message,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
            }
            if self.reply_id:
                head["id"] = self.reply_id
            return sse("message_start", {"type": "message_start", "message": head})
        if isinstance(event, BlockStart):
            block = event.block
            hidden = isinstance(block, ToolUseBlock) and block.name not in self.client_tools
            index = None if hidden else self._next
            self._index[(round_, event.index)] = index
            if index is None:
                return b""
            self._next += 1
            start = {
                "type": "content_block_start",
                "index": index,
                "content_block": block.to_wire(),
            }
            return sse("content_block_start", start)
        index = self._index.get((round_, event.index))
        if isinstance(event, BlockDelta):
            if index is None:
                return b""
            delta = {"type": "content_block_delta", "index": index, "delta": _delta(event)}
            return sse("content_block_delta", delta)
        if isinstance(event, BlockStop):
            if index is None:
                return PING if isinstance(event.block, ToolUseBlock) else b""
            return sse("content_block_stop", {"type": "content_block_stop", "index": index})
        return b""

    def finish(self, responses: Sequence[ModelResponse], result: RunResult) -> bytes:
        """`message_delta` (stop reason, summed usage) and `message_stop`."""
        last = responses[-1].raw if responses else {}
        delta: dict[str, Any] = {
            "stop_reason": visible_stop_reason(result.stop_reason),
            "stop_sequence": last.get("stop_sequence"),
        }
        if last.get("container") is not None:
            delta["container"] = last["container"]
        usage = visible_usage(responses)
        return sse(
            "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
        ) + sse("message_stop", {"type": "message_stop"})


def message_sse(message: Mapping[str, Any]) -> bytes:
    """A whole message as the SSE events a streamed answer of it would be.

    Each block starts empty and gets its text, thinking, signature, citations or input
    as one delta; a block of another type starts whole. Used when the answer exists
    before it is streamed (a request that attaches to an existing durable run).
    """
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    out = [sse("message_start", {"type": "message_start", "message": head})]
    for index, block in enumerate(message.get("content") or []):
        start, deltas = _opened(block)
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        for part in deltas:
            out.append(
                sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": part},
                )
            )
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
    }
    if message.get("container") is not None:
        delta["container"] = message["container"]
    usage = message.get("usage") or {}
    out.append(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    out.append(sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _opened(block: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A block's `content_block_start` value and the deltas that complete it."""
    if not isinstance(block, Mapping):
        return block, []
    kind = block.get("type")
    if kind == "text":
        deltas: list[dict[str, Any]] = [
            {"type": "citations_delta", "citation": c} for c in block.get("citations") or []
        ]
        if block.get("text"):
            deltas.insert(0, {"type": "text_delta", "text": block["text"]})
        start = {**block, "text": ""}
        if "citations" in block:
            start["citations"] = [] if block["citations"] is not None else None
        return start, deltas
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {**block, "thinking": "", "signature": ""}, deltas
    if kind in ("tool_use", "server_tool_use", "mcp_tool_use") and "input" in block:
        partial = compact_json(block["input"]).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": partial}]
    return block, []


def _delta(event: BlockDelta) -> dict[str, Any]:
    """The wire delta a `BlockDelta` came from."""
    if event.kind == "text":
        return {"type": "text_delta", "text": event.value}
    if event.kind == "input_json":
        return {"type": "input_json_delta", "partial_json": event.value}
    if event.kind == "thinking":
        return {"type": "thinking_delta", "thinking": event.value}
    if event.kind == "signature":
        return {"type": "signature_delta", "signature": event.value}
    try:  # any other delta is reported as its JSON
        value = json.loads(event.value)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    return {"type": f"{event.kind}_delta", "value": event.value}
