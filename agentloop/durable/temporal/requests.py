"""A model activity's input: the request, its conversation sent once per workflow run.

Temporal records every activity's input, so sending each request whole (the conversation
so far) would make a workflow run's history grow with the square of its rounds. The
workflow (`TemporalEffects.model`) sends each request as a `delta`: how many messages it
shares with the request before it (for a workflow run's first, with the messages the run
carried in when it continued as new), and the messages after those; only the first
request of a workflow's first run goes whole. The activity (`send_request`) rebuilds the
request from its workflow run's own record, the run's input and the inputs of the model
activities scheduled before it, read from Temporal: any worker can, and no worker keeps
anything between activities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import activity

from agentloop.errors import HistoryError

__all__ = ("CARRIED", "SentRequest", "carried_request", "full_request", "request_input")

SentRequest = tuple[str, list[Any]]
"""The activity id of a workflow run's last model request and that request's messages."""

CARRIED = "carried"
"""What a workflow run's first request builds on: the messages its input carried."""


def carried_request(data: dict[str, Any]) -> SentRequest | None:
    """What the first request of the workflow run whose input is `data` builds on, if any."""
    carry = data.get("carry")
    return None if carry is None else (CARRIED, carry["messages"])


def request_input(request: dict[str, Any], before: SentRequest | None) -> dict[str, Any]:
    """The part of a model activity's input that gives `request` (`ModelRequest.to_dict`).

    Args:
        request: The request to send.
        before: The workflow run's previous model request, or the messages it carried
            in (`carried_request`); None for the first request of a workflow.

    Returns:
        `{"request": request}` when nothing is before it, else `{"delta":
        {"after": activity id, "keep": shared messages, "request": with the rest}}`.
        Only the messages are cut: a capability may change any message of a request
        (a cache marker that moves on), so what is shared is counted, not assumed.
    """
    if before is None:
        return {"request": request}
    after, sent = before
    messages = request["messages"]
    keep = 0
    for old, new in zip(sent, messages, strict=False):
        if old != new:
            break
        keep += 1
    rest = request | {"messages": messages[keep:]}
    return {"delta": {"after": after, "keep": keep, "request": rest}}


async def full_request(data: dict[str, Any]) -> dict[str, Any]:
    """The whole request a model activity's input (`request_input`) stands for.

    Raises:
        HistoryError: The workflow run's record does not hold the requests the delta
            builds on (never for inputs `request_input` made in that workflow run).
    """
    if "request" in data:
        return dict(data["request"])
    delta = data["delta"]
    sent = await _messages_sent(delta["after"])
    whole: dict[str, Any] = delta["request"] | {"messages": _next(sent, delta["after"], data)}
    return whole


async def _messages_sent(until: str) -> list[Any]:
    """The messages of the model request `until` of this activity's workflow run.

    Rebuilt from the run's input (the messages it carried in) and the inputs of its model
    activities as Temporal recorded them, in the order they were scheduled: each delta
    builds on the request just before it.
    """
    info = activity.info()
    client = activity.client()
    handle = client.get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
    messages: list[Any] | None = None
    last: str | None = None
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            started = event.workflow_execution_started_event_attributes
            [data] = await client.data_converter.decode(started.input.payloads)
            carried = carried_request(data)
            if carried is not None:
                last, messages = carried
                if last == until:
                    return messages
            continue
        if not event.HasField("activity_task_scheduled_event_attributes"):
            continue
        scheduled = event.activity_task_scheduled_event_attributes
        if scheduled.activity_type.name != info.activity_type:
            continue
        [data] = await client.data_converter.decode(scheduled.input.payloads)
        messages = _next(messages, last, data)
        last = scheduled.activity_id
        if last == until:
            return messages
    raise HistoryError(f"the workflow run recorded no model request {until!r} to build on")


def _next(messages: Sequence[Any] | None, last: str | None, data: dict[str, Any]) -> list[Any]:
    """The messages of the recorded input `data`, the run's previous request's `messages`."""
    if "request" in data:
        return list(data["request"]["messages"])
    delta = data["delta"]
    if messages is None or delta["after"] != last:
        raise HistoryError(
            f"a recorded model request builds on {delta['after']!r}, not on the request "
            f"recorded before it ({last!r})"
        )
    return [*messages[: delta["keep"]], *delta["request"]["messages"]]
