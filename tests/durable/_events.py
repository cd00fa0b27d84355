"""Comparing the events of two runs: a plain streamed run's and a durable one's."""

from __future__ import annotations

from typing import Any

from agentloop.events import (
    Event,
    ModelResponded,
    ModelStreamEvent,
    RunFinished,
    RunStarted,
    StepRestarted,
    TextDelta,
    ThinkingDelta,
    ToolCallReady,
    ToolCallStarted,
    ToolInputDelta,
    ToolLog,
    ToolProgress,
    ToolResultEvent,
)
from agentloop.providers.base import MessageStart

STREAMED = (ModelStreamEvent, TextDelta, ThinkingDelta, ToolCallStarted, ToolInputDelta)


def without_eager(events: list[Event]) -> list[Any]:
    """The events of a plain stream as a durable run publishes them: no call starts early.

    The calls of a response that were ready (not those handed back to the caller, nor
    those whose input was bad) are ready once the response is in, with `eager=False`;
    the rest is as it was.
    """
    ready = {e.tool_use_id for e in events if isinstance(e, ToolCallReady)}
    responded = {
        u.id for e in events if isinstance(e, ModelResponded) for u in e.response.tool_uses
    }
    shown = []
    for event in events:
        if isinstance(event, ToolCallReady) and event.tool_use_id in responded:
            continue
        shown.append(event)
        if isinstance(event, ModelResponded):
            shown += [
                ToolCallReady(event.round, u.id, u.name, u.input, False)
                for u in event.response.tool_uses
                if u.id in ready
            ]
    return shown


def by_kind(events: list[Any]) -> list[Any]:
    """What must be equal whatever order parallel calls finish in: their results by id."""
    results = sorted((e for e in events if isinstance(e, ToolResultEvent)), key=str)
    progress = sorted((e for e in events if isinstance(e, (ToolProgress, ToolLog))), key=str)
    rest = [e for e in events if not isinstance(e, (ToolResultEvent, ToolProgress, ToolLog))]
    return [comparable(e) for e in rest] + [comparable(e) for e in results + progress]


def comparable(event: Any) -> Any:
    """`event` without what differs between two equal runs (ids, headers, durations)."""
    if isinstance(event, ModelStreamEvent) and isinstance(event.event, MessageStart):
        return ("message_start", event.round)
    if isinstance(event, ModelResponded):
        response = event.response
        return ("responded", response.content, response.stop_reason, response.usage)
    if isinstance(event, RunStarted):
        return RunStarted("")
    if isinstance(event, ToolResultEvent):
        return (event.tool_use_id, event.output, event.is_error)
    if isinstance(event, RunFinished):
        return ("finished", event.result.messages, event.result.usage, event.result.text)
    return event


def around_the_restart(events: list[Any]) -> tuple[list[Any], list[Any]]:
    """The events before and after the one `StepRestarted`: round 1's model request's.

    Before it, only the run's start, round 1's request and what its first attempt streamed.
    """
    restarts = [e for e in events if isinstance(e, StepRestarted)]
    assert restarts == [StepRestarted(1, None, 2)]
    cut = events.index(restarts[0])
    before, after = events[:cut], events[cut + 1 :]
    assert [type(e).__name__ for e in before if not isinstance(e, STREAMED)] == [
        "RunStarted",
        "RequestStarted",
    ]
    return before, after
