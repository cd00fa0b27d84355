"""A run's events as AG-UI events: the plain translation, without any server.

`AGUIEvents` takes the events of `agent.start(...)` (agentloop/events.py) one at a time
and returns the AG-UI events (protocol 1.0, wire-form dicts) that show them: text and
reasoning messages, each tool call with its own id (parallel calls interleave), results,
state snapshots with the usage and cost so far and the typed output as it grows, and
`RUN_FINISHED` with an interrupt per call waiting for approval; progress, a tool's
content for the user, a tool's log and a request's retry are `CUSTOM` events.
`agentloop.ui.endpoints` serves it over HTTP; a service with its own server calls it
directly.
"""

from __future__ import annotations

import json
import time
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
    ResponseReplaced,
    RoundFinished,
    RunFinished,
    StepRestarted,
    TextDelta,
    ThinkingDelta,
    ToolCallReady,
    ToolCallStarted,
    ToolInputDelta,
    ToolLog,
    ToolProgress,
    ToolResultEvent,
    ToolUserContent,
)
from agentloop.messages import ToolUseBlock
from agentloop.pricing import add_costs, cost_of
from agentloop.result import RunResult, Usage

__all__ = ("PROTOCOL_VERSION", "AGUIEvents", "token_usage", "usage_json")

PROTOCOL_VERSION = "1.0"
"""The AG-UI protocol version these events follow."""

APPROVAL_REASON = "tool_approval"
"""The `reason` of the interrupt of a call waiting for approval."""

_AGUIEvent = dict[str, Any]


class AGUIEvents:
    """Translates one run's events into AG-UI events.

    ```python
    events = AGUIEvents(thread_id, run_id)
    out = events.start()
    async with agent.start(prompt) as run:
        async for event in run:
            out += events(event)
    ```
    A failure of the run becomes `RUN_ERROR` (`error`); a run cut short ends with
    `cancelled`. Every message and tool call opened is closed before the run's last
    event, as the protocol requires.
    """

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        *,
        announced: Iterable[str] = (),
        answered: dict[str, bool] | None = None,
    ) -> None:
        """The translation of the run `run_id` of the conversation `thread_id`.

        Args:
            thread_id: The AG-UI thread the run belongs to.
            run_id: The AG-UI run id (the input's `runId`).
            announced: Tool calls an earlier run of the thread already showed (a resumed
                run reports its paused calls again; they are not opened twice).
            answered: For a resumed run, whether each decided call was approved.
        """
        self.thread_id = thread_id
        self.run_id = run_id
        self._announced = set(announced)
        self._open_tools: set[str] = set()
        self._text: tuple[int, int, str] | None = None  # (round, index, message id)
        self._thinking: tuple[int, int, str] | None = None
        self._waiting: list[ApprovalRequested] = []
        self._usage = Usage()
        self._cost: float | None = None
        self._model = ""
        self._output: Any = None
        self._answered = answered or {}

    # -- what the run says

    def start(self) -> list[_AGUIEvent]:
        """The opening `RUN_STARTED`."""
        return [
            _event(
                "RUN_STARTED",
                threadId=self.thread_id,
                runId=self.run_id,
                protocolVersion=PROTOCOL_VERSION,
            )
        ]

    def __call__(self, event: Event) -> list[_AGUIEvent]:
        """The AG-UI events that show `event` (none for events a page has no use for)."""
        if isinstance(event, ModelStreamEvent):
            return []  # the raw stream, of which the deltas below are the readable part
        if isinstance(event, TextDelta):
            return self._text_delta(event)
        if isinstance(event, ThinkingDelta):
            return self._thinking_delta(event)
        out = self._close_text() + self._close_thinking()
        if isinstance(event, ToolCallStarted):
            self._announced.add(event.tool_use_id)
            self._open_tools.add(event.tool_use_id)
            out.append(
                _event(
                    "TOOL_CALL_START",
                    toolCallId=event.tool_use_id,
                    toolCallName=event.name,
                    parentMessageId=self._message_id(event.round),
                )
            )
        elif isinstance(event, ToolInputDelta) and event.tool_use_id in self._open_tools:
            out.append(
                _event("TOOL_CALL_ARGS", toolCallId=event.tool_use_id, delta=event.partial_json)
            )
        elif isinstance(event, ToolCallReady | ApprovalRequested):
            out += self._call(event.round, event.tool_use_id, event.name, event.input)
            if isinstance(event, ApprovalRequested):
                self._waiting.append(event)
                out.append(_custom("approval_requested", _approval_json(event)))
        elif isinstance(event, ModelResponded):
            self._model = (
                event.response.sent_to[0] if event.response.sent_to else event.response.model
            )
            for block in event.response.content:
                if isinstance(block, ToolUseBlock):
                    out += self._call(event.round, block.id, block.name, block.input)
        elif isinstance(event, ToolProgress | ToolUserContent | ToolLog | RequestRetry):
            out.append(_custom(_CUSTOM[type(event)], to_jsonable_python(event)))
        elif isinstance(event, ToolResultEvent):
            out += self._close_tool(event.tool_use_id)
            out.append(
                _event(
                    "TOOL_CALL_RESULT",
                    messageId=f"{event.tool_use_id}-result",
                    toolCallId=event.tool_use_id,
                    content=event.output,
                    role="tool",
                    metadata={
                        "isError": event.is_error,
                        "durationSeconds": round(event.duration, 6),
                        **self._decision(event.tool_use_id),
                    },
                )
            )
        elif isinstance(event, RoundFinished):
            self._usage += event.usage
            if self._model:
                self._cost = add_costs(self._cost, cost_of(self._model, event.usage))
            out.append(self._snapshot())
        elif isinstance(event, PartialOutput | OutputReady):
            self._output = to_jsonable_python(event.output, fallback=str)
            out.append(self._snapshot())
        elif isinstance(event, ResponseReplaced | StepRestarted):
            name = "response_replaced" if isinstance(event, ResponseReplaced) else "step_restarted"
            out.append(_custom(name, to_jsonable_python(event)))
        elif isinstance(event, RunFinished):
            out += self.finish(event.result)
        return out

    def finish(self, result: RunResult[Any]) -> list[_AGUIEvent]:
        """The closing events of a run that ended with `result` (cancelled included)."""
        out = self._close_all()
        self._usage, self._cost = result.usage, result.cost
        out.append(self._snapshot())
        outcome: dict[str, Any] = {"type": "success"}
        if result.stop_reason == "cancelled":
            outcome = {"type": "cancelled"}
        elif result.approvals:
            interrupts = [
                {
                    "id": a.tool_use_id,
                    "reason": APPROVAL_REASON,
                    "message": a.reason or f"{a.name} needs approval",
                    "toolCallId": a.tool_use_id,
                    "metadata": {"toolName": a.name, "input": a.input},
                }
                for a in result.approvals
            ]
            outcome = {"type": "interrupt", "interrupts": interrupts}
        elif result.pending:
            outcome["pendingToolCallIds"] = [str(call["id"]) for call in result.pending]
        finished = _event(
            "RUN_FINISHED",
            threadId=self.thread_id,
            runId=self.run_id,
            outcome=outcome,
            usage=token_usage(result),
            metadata={"stopReason": result.stop_reason, "costUsd": result.cost},
        )
        if result.stop_reason not in ("cancelled", "approval_required", "tool_use"):
            finished["result"] = to_jsonable_python(result.output, fallback=str)
        out.append(finished)
        return out

    def error(self, exc: BaseException) -> list[_AGUIEvent]:
        """The closing events of a run that failed with `exc`: open parts closed, `RUN_ERROR`."""
        out = self._close_all()
        code = type(exc).__name__
        out.append(_event("RUN_ERROR", message=str(exc) or code, code=code))
        return out

    # -- the parts

    def _message_id(self, round_: int) -> str:
        return f"{self.run_id}-{round_}"

    def _text_delta(self, event: TextDelta) -> list[_AGUIEvent]:
        out = self._close_thinking()
        if self._text is None or self._text[:2] != (event.round, event.index):
            out += self._close_text()
            message_id = self._message_id(event.round)
            if event.index:
                message_id += f"-{event.index}"
            self._text = (event.round, event.index, message_id)
            out.append(_event("TEXT_MESSAGE_START", messageId=message_id, role="assistant"))
        out.append(_event("TEXT_MESSAGE_CONTENT", messageId=self._text[2], delta=event.text))
        return out

    def _thinking_delta(self, event: ThinkingDelta) -> list[_AGUIEvent]:
        out = self._close_text()
        if self._thinking is None or self._thinking[:2] != (event.round, event.index):
            out += self._close_thinking()
            message_id = f"{self._message_id(event.round)}-thinking-{event.index}"
            self._thinking = (event.round, event.index, message_id)
            out.append(_event("REASONING_START", messageId=message_id))
            out.append(_event("REASONING_MESSAGE_START", messageId=message_id, role="reasoning"))
        out.append(
            _event("REASONING_MESSAGE_CONTENT", messageId=self._thinking[2], delta=event.thinking)
        )
        return out

    def _call(self, round_: int, call_id: str, name: str, input: Any) -> list[_AGUIEvent]:
        """A whole call not shown yet (no streamed start), or the end of one being shown."""
        if call_id in self._open_tools:
            return self._close_tool(call_id)
        if call_id in self._announced:
            return []
        self._announced.add(call_id)
        return [
            _event(
                "TOOL_CALL_START",
                toolCallId=call_id,
                toolCallName=name,
                parentMessageId=self._message_id(round_),
            ),
            _event("TOOL_CALL_ARGS", toolCallId=call_id, delta=json.dumps(input)),
            _event("TOOL_CALL_END", toolCallId=call_id),
        ]

    def _close_tool(self, call_id: str) -> list[_AGUIEvent]:
        if call_id not in self._open_tools:
            return []
        self._open_tools.discard(call_id)
        return [_event("TOOL_CALL_END", toolCallId=call_id)]

    def _close_text(self) -> list[_AGUIEvent]:
        if self._text is None:
            return []
        message_id, self._text = self._text[2], None
        return [_event("TEXT_MESSAGE_END", messageId=message_id)]

    def _close_thinking(self) -> list[_AGUIEvent]:
        if self._thinking is None:
            return []
        message_id, self._thinking = self._thinking[2], None
        return [
            _event("REASONING_MESSAGE_END", messageId=message_id),
            _event("REASONING_END", messageId=message_id),
        ]

    def _close_all(self) -> list[_AGUIEvent]:
        out = self._close_text() + self._close_thinking()
        for call_id in sorted(self._open_tools):
            out += self._close_tool(call_id)
        return out

    def _decision(self, call_id: str) -> dict[str, Any]:
        if call_id not in self._answered:
            return {}
        return {"approved": self._answered[call_id]}

    def _snapshot(self) -> _AGUIEvent:
        state = {
            "usage": usage_json(self._usage),
            "costUsd": self._cost,
            "output": self._output,
            "waiting": [_approval_json(a) for a in self._waiting],
        }
        return _event("STATE_SNAPSHOT", snapshot=state)


def token_usage(result: RunResult[Any]) -> list[dict[str, Any]]:
    """The run's usage as AG-UI `TokenUsage` entries (input totals include cache tokens)."""
    usage = result.usage
    if not usage.requests:
        return []
    entry = {"provider": "anthropic", **_token_counts(usage)}
    if result.models:
        entry["model"] = result.models[-1]
    return [entry]


def usage_json(usage: Usage) -> dict[str, Any]:
    """A usage's counts in the camelCase form both adapters send to pages."""
    return {**_token_counts(usage), "requests": usage.requests}


def _token_counts(usage: Usage) -> dict[str, int]:
    cached = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return {
        "inputTokens": usage.input_tokens + cached,
        "outputTokens": usage.output_tokens,
        "totalTokens": usage.input_tokens + cached + usage.output_tokens,
        "cachedInputTokens": usage.cache_read_input_tokens,
        "cacheWriteInputTokens": usage.cache_creation_input_tokens,
    }


def _approval_json(event: ApprovalRequested) -> dict[str, Any]:
    return {
        "toolCallId": event.tool_use_id,
        "toolName": event.name,
        "input": to_jsonable_python(event.input, fallback=str),
        "reason": event.reason,
    }


_CUSTOM = {
    ToolProgress: "tool_progress",
    ToolUserContent: "tool_user_content",
    ToolLog: "tool_log",
    RequestRetry: "request_retry",
}
"""The events shown as `CUSTOM` ones named `agentloop.<name>`, their fields the value."""


def _custom(name: str, value: Any) -> _AGUIEvent:
    return _event("CUSTOM", name=f"agentloop.{name}", value=value)


def _event(type_: str, **fields: Any) -> _AGUIEvent:
    return {"type": type_, "timestamp": int(time.time() * 1000), **fields}
