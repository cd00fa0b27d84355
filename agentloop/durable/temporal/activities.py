"""The activities of a `TemporalAgent`'s runs, on a worker: a model request, a tool call.

Each takes and returns JSON values, and beats (`activity.heartbeat`) at a third of the
heartbeat timeout, so that Temporal gives a dead worker's activity to another soon. A
provider error becomes an `ApplicationError` of its class's name, retried by Temporal (after
the API's `retry-after`) when retrying can help, and never when it cannot. In a streamed
run, an activity publishes its events to the run's workflow stream
(`agentloop.durable.streams`), tagged with the activity's attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import anyio
from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError

from agentloop import errors
from agentloop.agent import Agent
from agentloop.calls import ToolCall, ToolResult, sendable
from agentloop.context import RunContext
from agentloop.durable.streams import StepPublisher
from agentloop.durable.temporal.workflow import TOPIC
from agentloop.errors import ProviderError
from agentloop.events import ToolResultEvent
from agentloop.progress import events_to
from agentloop.providers import without_sdk_retries
from agentloop.providers.base import (
    ModelRequest,
    ModelResponse,
    Provider,
    StreamingProvider,
    retry_after,
)


class ActivityOwner(Protocol):
    """What the activities read from the `TemporalAgent` a worker holds."""

    agent: Agent[Any]
    provider: Provider
    deps: Any
    heartbeat_timeout: timedelta
    stream_batch_interval: timedelta

    def call_limiter(self) -> anyio.CapacityLimiter:
        """The cap on the tool calls this worker runs at once."""
        ...


__all__ = ("RETRIED", "ActivityOwner", "run_call", "send_request", "without_sdk_retries")

_T = TypeVar("_T")

RETRIED = (
    errors.RateLimitError,
    errors.OverloadedError,
    errors.ServerError,
    errors.APIConnectionError,
)
"""Provider errors an activity is retried for (after `retry-after`, when the API says)."""


async def send_request(durable: ActivityOwner, data: dict[str, Any]) -> dict[str, Any]:
    """Activity: send one request (`ModelRequest.to_dict`), return the response's JSON.

    In a streamed run, the response's events go to the workflow's stream as they come.
    """
    request = ModelRequest.from_dict(data["request"])
    provider = durable.provider

    async def send() -> ModelResponse:
        if not data.get("stream") or not isinstance(provider, StreamingProvider):
            return await provider.complete(request)
        async with _publisher(durable, data["round"], "model") as publisher:
            return await provider.stream(request, publisher.model_event)

    try:
        response = await _heartbeating(durable.heartbeat_timeout, send)
    except ProviderError as exc:
        raise _application_error(exc) from exc
    return response.to_json()


async def run_call(durable: ActivityOwner, data: dict[str, Any]) -> dict[str, Any]:
    """Activity: run one call through the agent's registry, return the result's JSON.

    In a streamed run, the call's progress and result go to the workflow's stream.
    """
    call = ToolCall(data["id"], data["name"], data["input"])
    round_ = data["round"]
    config = durable.agent.config
    context = RunContext(
        run_id=data["run_id"],
        round=round_,
        deps=durable.deps,
        model=config.model,
        provider=config.provider,
        limiter=durable.call_limiter(),
        timeout=config.tool_timeout,
        shared_limiter=config.tool_limiter,
    )

    async def run() -> ToolResult:
        if not data.get("stream"):
            return await durable.agent.registry.run_call(call, context)
        async with _publisher(durable, round_, f"tool:{call.id}") as publisher:
            with events_to(publisher.put):
                result = await durable.agent.registry.run_call(call, context)
            publisher.put(ToolResultEvent.of(round_, sendable(result)))
        return result

    result = await _heartbeating(durable.heartbeat_timeout, run)
    return result.to_json()


@asynccontextmanager
async def _publisher(
    durable: ActivityOwner, round_: int, step: str
) -> AsyncIterator[StepPublisher]:
    """Where an activity publishes its events: its workflow's stream, batched."""
    stream = WorkflowStreamClient.from_within_activity(batch_interval=durable.stream_batch_interval)
    topic = stream.topic(TOPIC)

    async def write(item: dict[str, Any]) -> None:
        topic.publish(item)

    async with stream, StepPublisher(write, round_, step, activity.info().attempt) as publisher:
        yield publisher


async def _heartbeating(every: timedelta, work: Callable[[], Awaitable[_T]]) -> _T:
    """`await work()` while telling Temporal, every third of `every`, that it goes on."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await anyio.sleep(every.total_seconds() / 3)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(beat)
        try:
            outcome = await work()
        except Exception as exc:
            failure = exc  # raised below, as itself rather than in an exception group
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return outcome


def _application_error(exc: ProviderError) -> ApplicationError:
    """The activity's failure for a provider error: retried, or not, as it deserves."""
    retried = isinstance(exc, RETRIED)
    wait = retry_after(exc.headers) if retried else None
    return ApplicationError(
        str(exc),
        {"status_code": exc.status_code, "headers": dict(exc.headers), "body": exc.body},
        type=type(exc).__name__,
        non_retryable=not retried,
        next_retry_delay=None if wait is None else timedelta(seconds=wait),
    )
