"""The activities of a `TemporalAgent`'s runs, on a worker: a model request, a tool call.

Each takes and returns JSON values, and beats (`activity.heartbeat`) at a third of the
heartbeat timeout, so that Temporal gives a dead worker's activity to another soon. A
provider error becomes an `ApplicationError` of its class's name, retried by Temporal (after
the API's `retry-after`) when retrying can help, and never when it cannot. In a streamed
run, an activity publishes its events to the run's workflow stream
(`agentloop.durable.streams`), tagged with the activity's attempt. The agent's
capabilities wrap the request and the call here, inside the activity, so what they do is
part of its recorded outcome; an agentloop error one raises fails the activity for good
and ends the run.
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
from agentloop.capabilities.base import Chain
from agentloop.context import RunContext, counted_apart
from agentloop.durable.streams import StepPublisher
from agentloop.durable.temporal.requests import full_request
from agentloop.durable.temporal.results import ERROR_FIELDS
from agentloop.durable.temporal.workflow import TOPIC
from agentloop.errors import AgentloopError, HistoryError, ProviderError
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

    agent: Agent[Any, Any]
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
    """Activity: send one request (`request_input`), return the response's JSON.

    In a streamed run, the response's events go to the workflow's stream as they come.
    """
    try:
        request = ModelRequest.from_dict(await full_request(data))
    except HistoryError as exc:
        raise _run_ended(exc) from exc
    context = _context(durable, data)
    capabilities = Chain(durable.agent.config.capabilities, context)

    async def ask(
        request: ModelRequest, on_event: Callable[[Any], Awaitable[None]] | None
    ) -> ModelResponse:
        async def base(request: ModelRequest, *, provider: Provider | None = None) -> ModelResponse:
            provider = provider or durable.provider
            if on_event is None or not isinstance(provider, StreamingProvider):
                return await provider.complete(request)
            return await provider.stream(request, on_event)

        # What a capability spends of its own rides on the response to the workflow.
        response, spent = await counted_apart(
            context, lambda ctx: capabilities.request(ctx, base)(request)
        )
        return response.with_spent(spent)

    async def send() -> ModelResponse:
        if not data.get("stream"):
            return await ask(request, None)
        async with _publisher(durable, data["round"], "model") as publisher:
            return await ask(request, publisher.model_event)

    try:
        response = await _heartbeating(durable.heartbeat_timeout, send)
    except ProviderError as exc:
        raise _application_error(exc) from exc
    except AgentloopError as exc:
        raise _run_ended(exc) from exc
    return response.to_json()


async def run_call(durable: ActivityOwner, data: dict[str, Any]) -> dict[str, Any]:
    """Activity: run one call through the agent's registry, return the result's JSON.

    In a streamed run, the call's progress and result go to the workflow's stream.
    """
    call = ToolCall(data["id"], data["name"], data["input"])
    round_ = data["round"]
    context = _context(durable, data)
    capabilities = Chain(durable.agent.config.capabilities, context)
    registry = durable.agent.registry

    async def run_here() -> ToolResult:
        # What a sub-run or a capability spends inside the call rides on its result.
        result, spent = await counted_apart(
            context, lambda ctx: registry.run_call_through(call, ctx, capabilities), call=call
        )
        return result.with_spent(spent)

    async def run() -> ToolResult:
        if not data.get("stream"):
            return await run_here()
        async with _publisher(durable, round_, f"tool:{call.id}") as publisher:
            with events_to(publisher.put):
                result = await run_here()
            publisher.put(ToolResultEvent.of(round_, sendable(result)))
        return result

    try:
        result = await _heartbeating(durable.heartbeat_timeout, run)
    except AgentloopError as exc:
        raise _run_ended(exc) from exc
    return result.to_json()


def _context(durable: ActivityOwner, data: dict[str, Any]) -> RunContext[Any]:
    """The context an activity's capabilities and tool get: the run's id and round."""
    config = durable.agent.config
    return RunContext(
        run_id=data["run_id"],
        round=data["round"],
        deps=durable.deps,
        model=config.model,
        provider=config.provider,
        limiter=durable.call_limiter(),
        timeout=config.tool_timeout,
        shared_limiter=config.tool_limiter,
        apart=True,
    )


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


def _run_ended(exc: AgentloopError) -> ApplicationError:
    """The activity's failure for an agentloop error a capability raised: never retried.

    The workflow raises it again as that error (`run_error`), which ends the run.
    """
    fields = {name: getattr(exc, name) for name in ERROR_FIELDS if hasattr(exc, name)}
    # The workflow knows the classes of `agentloop.errors`: a capability's own subclass
    # travels as the nearest of them.
    known = next(c for c in type(exc).__mro__ if getattr(errors, c.__name__, None) is c)
    return ApplicationError(str(exc), {"fields": fields}, type=known.__name__, non_retryable=True)
