"""A run's events as the AI SDK's UI message stream chunks: the plain translation.

`UIMessageChunks` takes the events of `agent.start(...)` one at a time and returns the
chunks (`text-start`, `tool-input-delta`, `tool-approval-request`, `finish`, ...) of the
UI message stream protocol (`x-vercel-ai-ui-message-stream: v1`) that `useChat` from the
`ai` package reads. A round is a step; usage and cost ride in the message metadata; the
typed output is a `data-output` part, replaced as it grows; a tool's content for the user
is a `data-tool-user-content` part, a tool's log and a request's retry transient data
parts (`data-tool-log`, `data-request-retry`). `agentloop.ui.endpoints`
serves it; a service with its own server calls it directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_core import to_jsonable_python

from agentloop.events import (
    ApprovalRequested,
    Event,
    ModelResponded,
    ModelStreamEvent,
    OutputReady,
    PartialOutput,
    RequestRetry,
    RequestStarted,
    ResponseReplaced,
    RoundFinished,
    RunFinished,
    TextDelta,
    ThinkingDelta,
    ToolCallReady,
    ToolCallStarted,
    ToolInputDelta,
    ToolLog,
    ToolResultEvent,
    ToolUserContent,
)
from agentloop.messages import ToolUseBlock
from agentloop.pricing import add_costs, cost_of
from agentloop.result import RunResult, Usage

from .agui import usage_json

__all__ = ("STREAM_VERSION", "UIMessageChunks", "finish_reason")

STREAM_VERSION = "v1"
"""The `x-vercel-ai-ui-message-stream` header's value: the protocol these chunks follow."""

_Chunk = dict[str, Any]

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "refusal": "content-filter",
    "tool_use": "tool-calls",
    "approval_required": "tool-calls",
    "cancelled": "interrupted",
}


def finish_reason(stop_reason: str) -> str:
    """The `finish` chunk's `finishReason` for a run's `stop_reason`."""
    return _FINISH_REASONS.get(stop_reason, "other")


class UIMessageChunks:
    """Translates one run's events into UI message stream chunks (one assistant message).

    ```python
    chunks = UIMessageChunks(message_id=run_id)
    out = chunks.start()
    async with agent.start(prompt) as run:
        async for event in run:
            out += chunks(event)
    ```
    A failure becomes an `error` chunk and a `finish` (`error`); every text and
    reasoning part opened is ended first.
    """

    def __init__(
        self,
        *,
        message_id: str | None = None,
        announced: Iterable[str] = (),
        answered: dict[str, bool] | None = None,
    ) -> None:
        """The translation of a run shown as one assistant message.

        Args:
            message_id: The assistant message's id; None continues the page's last
                assistant message (a resumed run).
            announced: Tool calls the page already shows (a resumed run's paused calls).
            answered: For a resumed run, whether each decided call was approved: a denied
                one ends as `tool-output-denied`.
        """
        self.message_id = message_id
        self._announced = set(announced)
        self._started: set[str] = set()
        self._answered = answered or {}
        self._text: tuple[int, int, str] | None = None
        self._reasoning: tuple[int, int, str] | None = None
        self._step_open = False
        self._usage = Usage()
        self._cost: float | None = None
        self._model = ""

    def start(self) -> list[_Chunk]:
        """The opening `start` chunk."""
        chunk: _Chunk = {"type": "start"}
        if self.message_id is not None:
            chunk["messageId"] = self.message_id
        return [chunk]

    def __call__(self, event: Event) -> list[_Chunk]:
        """The chunks that show `event` (none for events a page has no use for)."""
        if isinstance(event, ModelStreamEvent):
            return []  # the raw stream, of which the deltas below are the readable part
        if isinstance(event, TextDelta):
            return self._delta("text", event.round, event.index, event.text)
        if isinstance(event, ThinkingDelta):
            return self._delta("reasoning", event.round, event.index, event.thinking)
        out = self._end_parts()
        if isinstance(event, RequestStarted):
            out += self._end_step()
            self._step_open = True
            out.append({"type": "start-step"})
        elif isinstance(event, ToolCallStarted):
            self._started.add(event.tool_use_id)
            out.append(
                {
                    "type": "tool-input-start",
                    "toolCallId": event.tool_use_id,
                    "toolName": event.name,
                }
            )
        elif isinstance(event, ToolInputDelta) and event.tool_use_id in self._started:
            out.append(
                {
                    "type": "tool-input-delta",
                    "toolCallId": event.tool_use_id,
                    "inputTextDelta": event.partial_json,
                }
            )
        elif isinstance(event, ToolCallReady | ApprovalRequested):
            out += self._input(event.tool_use_id, event.name, event.input)
            if isinstance(event, ApprovalRequested):
                chunk = {"type": "tool-approval-request", "approvalId": event.tool_use_id}
                chunk["toolCallId"] = event.tool_use_id
                if event.reason:
                    chunk["reason"] = event.reason
                out.append(chunk)
        elif isinstance(event, ModelResponded):
            response = event.response
            self._model = response.sent_to[0] if response.sent_to else response.model
            for block in response.content:
                if isinstance(block, ToolUseBlock) and block.id in self._started:
                    out += self._input(block.id, block.name, block.input)
        elif isinstance(event, ToolResultEvent):
            out += self._output(event)
        elif isinstance(event, ResponseReplaced):
            self._started.clear()
            out.append({"type": "reset-step"})
        elif isinstance(event, RoundFinished):
            self._usage += event.usage
            if self._model:
                self._cost = add_costs(self._cost, cost_of(self._model, event.usage))
            out.append({"type": "message-metadata", "messageMetadata": self._metadata()})
        elif isinstance(event, PartialOutput | OutputReady):
            data = to_jsonable_python(event.output, fallback=str)
            out.append({"type": "data-output", "id": "output", "data": data})
        elif isinstance(event, ToolUserContent):
            data = to_jsonable_python(event)
            out.append({"type": "data-tool-user-content", "id": event.tool_use_id, "data": data})
        elif isinstance(event, ToolLog | RequestRetry):
            # A notice of the moment, not part of the message kept in the chat.
            kind = "data-tool-log" if isinstance(event, ToolLog) else "data-request-retry"
            out.append({"type": kind, "data": to_jsonable_python(event), "transient": True})
        elif isinstance(event, RunFinished):
            out += self.finish(event.result)
        return out

    def finish(self, result: RunResult[Any]) -> list[_Chunk]:
        """The closing chunks of a run that ended with `result`."""
        out = self._end_parts() + self._end_step()
        self._usage, self._cost = result.usage, result.cost
        metadata = {**self._metadata(), "stopReason": result.stop_reason}
        out.append(
            {
                "type": "finish",
                "finishReason": finish_reason(result.stop_reason),
                "messageMetadata": metadata,
            }
        )
        return out

    def error(self, exc: BaseException) -> list[_Chunk]:
        """The closing chunks of a run that failed with `exc`."""
        out = self._end_parts() + self._end_step()
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        out.append({"type": "error", "errorText": text})
        out.append({"type": "finish", "finishReason": "error"})
        return out

    # -- the parts

    def _delta(self, kind: str, round_: int, index: int, text: str) -> list[_Chunk]:
        current = self._text if kind == "text" else self._reasoning
        out: list[_Chunk] = []
        if current is None or current[:2] != (round_, index):
            out += self._end_parts()
            part_id = f"{kind}-{round_}-{index}"
            current = (round_, index, part_id)
            if kind == "text":
                self._text = current
            else:
                self._reasoning = current
            out.append({"type": f"{kind}-start", "id": part_id})
        out.append({"type": f"{kind}-delta", "id": current[2], "delta": text})
        return out

    def _end_parts(self) -> list[_Chunk]:
        out: list[_Chunk] = []
        if self._text is not None:
            out.append({"type": "text-end", "id": self._text[2]})
            self._text = None
        if self._reasoning is not None:
            out.append({"type": "reasoning-end", "id": self._reasoning[2]})
            self._reasoning = None
        return out

    def _end_step(self) -> list[_Chunk]:
        if not self._step_open:
            return []
        self._step_open = False
        return [{"type": "finish-step"}]

    def _input(self, call_id: str, name: str, input: Any) -> list[_Chunk]:
        if call_id in self._announced:
            return []
        self._announced.add(call_id)
        return [
            {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": name,
                "input": to_jsonable_python(input, fallback=str),
            }
        ]

    def _output(self, event: ToolResultEvent) -> list[_Chunk]:
        call_id = event.tool_use_id
        out: list[_Chunk] = []
        if call_id not in self._announced and call_id not in self._started:
            # answered before its input was shown (refused before it ran): show it first
            out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": event.name})
        self._announced.add(call_id)
        if self._answered.get(call_id) is False:
            out.append({"type": "tool-output-denied", "toolCallId": call_id})
        elif event.is_error:
            out.append(
                {"type": "tool-output-error", "toolCallId": call_id, "errorText": event.output}
            )
        else:
            out.append(
                {"type": "tool-output-available", "toolCallId": call_id, "output": event.output}
            )
        return out

    def _metadata(self) -> dict[str, Any]:
        return {"usage": usage_json(self._usage), "costUsd": self._cost}
