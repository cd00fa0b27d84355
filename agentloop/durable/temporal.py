"""Durable runs on Temporal: the agent's loop as a workflow, each effect an activity.

`TemporalAgent(agent)` makes a workflow that runs the agent's own loop (`Agent._prepare`,
then the loop as always) with its two effects (`agentloop.effects`) performed as
activities: `model:{round}` sends one request, `tool:{round}:{tool_use_id}` runs one call
through the worker's registry. Temporal records each activity's JSON result; a worker that
replays the workflow after a crash gets those results back instead of performing the
effects again, and the loop rebuilds the same history. The run's id is the workflow id.

The workflow runs outside Temporal's sandbox (`sandboxed=False`): the sandbox re-imports a
workflow's module for every run, which a workflow made per agent cannot survive. The loop
is deterministic without it: it decides from values only, and the run's id is given.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

import anyio
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python
from temporalio import activity, workflow
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.workflow_streams import (
    WorkflowStream,
    WorkflowStreamClient,
    WorkflowStreamItem,
    WorkflowStreamState,
)
from temporalio.converter import value_to_type
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.worker import Worker

from agentloop import Agent, errors
from agentloop.approval import Approve, Decision, Deny
from agentloop.durable.streams import DurableStream, RunPublisher, StepPublisher, read_events
from agentloop.effects import OnEvent, Send
from agentloop.errors import AgentloopError, DecisionError, ProviderError
from agentloop.events import ToolResultEvent
from agentloop.progress import events_to
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import (
    ModelRequest,
    ModelResponse,
    Provider,
    StreamingProvider,
    retry_after,
)
from agentloop.providers.openai import OpenAIChatProvider
from agentloop.registry import ExecutionContext
from agentloop.result import ApprovalRequest, RunResult, ToolCallRecord, Usage
from agentloop.resume import plan
from agentloop.run import RunState
from agentloop.state import PausedRun
from agentloop.tools import ToolCall, ToolResult, sendable

__all__ = (
    "DurableAgent",
    "TemporalAgent",
    "TemporalEffects",
    "WorkflowTasks",
    "decision_from_json",
    "decision_to_json",
    "main",
    "result_of",
    "without_sdk_retries",
)

_T = TypeVar("_T")

RETRIED = (
    errors.RateLimitError,
    errors.OverloadedError,
    errors.ServerError,
    errors.APIConnectionError,
)
"""Provider errors an activity is retried for (after `retry-after`, when the API says)."""

DEFAULT_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
)
"""Retries of every activity: unlimited, from 1 s doubling up to 1 min between attempts."""


class TemporalAgent:
    """An agent whose runs are Temporal workflows (see the module).

    ```python
    durable = TemporalAgent(agent)
    worker = Worker(client, task_queue="agents", **durable.worker_options())
    result = await durable.run(client, "Weather in Paris?", run_id="order-42")
    ```

    The worker holds the agent: the activities use its provider (with the SDK's own
    retries turned off: Temporal retries instead) and its tools, with its concurrency cap
    (per worker) and timeouts. Workers and clients build the same `TemporalAgent` (same
    `name`), usually by importing one module.
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        name: str | None = None,
        task_queue: str = "agentloop",
        deps: Any = None,
        model_timeout: timedelta = timedelta(minutes=10),
        tool_timeout: timedelta | None = None,
        heartbeat_timeout: timedelta = timedelta(seconds=30),
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        max_history_bytes: int = 4_000_000,
        stream_batch_interval: timedelta = timedelta(milliseconds=100),
    ) -> None:
        """Make the workflow and activities of `agent`'s runs.

        Args:
            agent: The agent whose loop the workflow runs.
            name: The workflow's name (`agentloop.{name}`) and its activities' prefix;
                by default the agent's `name`.
            task_queue: The task queue runs are started on, unless `run()` names another.
            deps: The runs' `RunContext.deps`: an object of the worker's, never sent to
                Temporal, given to the tools (in the activities) and to approval rules,
                output validators and history processors (in the workflow).
            model_timeout: Start-to-close timeout of one model request activity.
            tool_timeout: Start-to-close timeout of one tool call activity; by default
                the agent's `tool_timeout` plus a minute (the call's own timeout is
                applied inside the activity, and a call that runs out is a result).
            heartbeat_timeout: How long an activity may go without a heartbeat before
                Temporal gives it to another worker (activities beat at a third of it).
            retry_policy: Retries of the activities; errors that retrying cannot fix
                (authentication, credit, a bad request) are never retried.
            max_history_bytes: When the workflow's history passes this size (or Temporal
                suggests it), the run continues as a new workflow run, carrying its state.
            stream_batch_interval: How long an activity of a streamed run (`run_stream`)
                gathers its events before it sends them to the workflow's stream (each
                batch is one signal in the workflow's history).
        """
        self.agent = agent
        self.name = name or agent.name
        self.task_queue = task_queue
        self.deps = deps
        self.model_timeout = model_timeout
        seconds = agent.tool_timeout if math.isfinite(agent.tool_timeout) else 3600.0
        self.tool_timeout = tool_timeout or timedelta(seconds=seconds + 60)
        self.heartbeat_timeout = heartbeat_timeout
        self.retry_policy = retry_policy
        self.max_history_bytes = max_history_bytes
        self.stream_batch_interval = stream_batch_interval
        self.workflow_name = f"agentloop.{self.name}"
        self.model_activity_name = f"agentloop.{self.name}.model"
        self.tool_activity_name = f"agentloop.{self.name}.tool"
        self.provider = without_sdk_retries(agent.provider)
        """The provider the model activity sends requests with."""
        self.workflow = _workflow_class(self)

        async def model(data: dict[str, Any]) -> dict[str, Any]:
            return await self.model_activity(data)

        async def tool(data: dict[str, Any]) -> dict[str, Any]:
            return await self.tool_activity(data)

        self._activities = (
            activity.defn(name=self.model_activity_name)(model),
            activity.defn(name=self.tool_activity_name)(tool),
        )
        self._limiter: anyio.CapacityLimiter | None = None

    # -- the worker side

    def worker_options(self) -> dict[str, Any]:
        """`workflows` and `activities` for a `temporalio.worker.Worker` of your own."""
        return {
            "workflows": [self.workflow],
            "activities": list(self._activities),
        }

    def worker(self, client: Client, *, task_queue: str | None = None, **options: Any) -> Worker:
        """A `Worker` for this agent's runs on `task_queue` (`options` go to `Worker`)."""
        return Worker(
            client, task_queue=task_queue or self.task_queue, **self.worker_options(), **options
        )

    async def model_activity(self, data: dict[str, Any]) -> dict[str, Any]:
        """Activity: send one request (`ModelRequest.to_dict`), return the response's JSON.

        In a streamed run, the response's events go to the workflow's stream as they come.
        """
        request = ModelRequest.from_dict(data["request"])
        provider = self.provider

        async def send() -> ModelResponse:
            if not data.get("stream") or not isinstance(provider, StreamingProvider):
                return await provider.complete(request)
            async with self._publisher(data["round"], "model") as publisher:
                return await provider.stream(request, publisher.model_event)

        try:
            response = await _heartbeating(self.heartbeat_timeout, send)
        except ProviderError as exc:
            raise _application_error(exc) from exc
        return response.to_json()

    async def tool_activity(self, data: dict[str, Any]) -> dict[str, Any]:
        """Activity: run one call through the agent's registry, return the result's JSON.

        In a streamed run, the call's progress and result go to the workflow's stream.
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.agent.tool_concurrency)
        call = ToolCall(data["id"], data["name"], data["input"])
        round_ = data["round"]
        context = ExecutionContext(
            data["run_id"],
            round_,
            self._limiter,
            self.agent.tool_timeout,
            self.deps,
            self.agent.tool_limiter,
        )

        async def run() -> ToolResult:
            if not data.get("stream"):
                return await self.agent.registry.run_call(call, context)
            async with self._publisher(round_, f"tool:{call.id}") as publisher:
                with events_to(publisher.put):
                    result = await self.agent.registry.run_call(call, context)
                publisher.put(ToolResultEvent.of(round_, sendable(result)))
            return result

        result = await _heartbeating(self.heartbeat_timeout, run)
        return result.to_json()

    @asynccontextmanager
    async def _publisher(self, round_: int, step: str) -> AsyncIterator[StepPublisher]:
        """Where an activity publishes its events: its workflow's stream, batched."""
        stream = WorkflowStreamClient.from_within_activity(
            batch_interval=self.stream_batch_interval
        )
        topic = stream.topic(_TOPIC)

        async def write(item: dict[str, Any]) -> None:
            topic.publish(item)

        async with stream, StepPublisher(write, round_, step, activity.info().attempt) as publisher:
            yield publisher

    # -- the workflow side

    def effects(self, publisher: RunPublisher | None = None) -> TemporalEffects:
        """The effects of a run inside the workflow: activities (`publisher`: its events')."""
        return TemporalEffects(self, publisher)

    async def run_workflow(self, flow: AgentWorkflow, data: dict[str, Any]) -> dict[str, Any]:
        """The workflow's body: the loop, its waits for external results, its continuations."""
        run_id = workflow.info().workflow_id
        state = flow.state
        emit = None
        if data.get("stream"):
            emit = flow.publisher(self.agent.output_type, continued="carry" in data)
        run: RunState | None = None
        try:
            run, drive = await self._start(data, run_id, emit)
            while True:
                try:
                    result = await drive(emit)
                except _ContinueAsNew:
                    carry = _carry(run, data)
                    stream = None if emit is None else await flow.close_stream()
                    workflow.continue_as_new(
                        {"carry": carry, "wait_for_external": data.get("wait_for_external")}
                        | {"stream": data.get("stream", False), "stream_state": stream}
                    )
                wait = data.get("wait_for_external")
                if result.state is None or not wait:
                    return result_to_json(result)
                state.pending = {p["id"] for p in result.pending} | {
                    a.tool_use_id for a in result.approvals
                }
                state.paused = result.state
                state.waiting = result_to_json(result)
                state.answers = None
                try:
                    await workflow.wait_condition(
                        lambda: state.answers is not None, timeout=timedelta(seconds=wait)
                    )
                except asyncio.TimeoutError:
                    return result_to_json(result)
                state.pending = state.waiting = None
                assert state.answers is not None
                results, decisions = state.answers
                run = self.agent._resumed_run(result.state, decisions, results, self.deps)
                run.perform_with(self.effects(emit), run_id)
                drive = _driver(self.agent, run)
        except asyncio.CancelledError:
            if run is None or run.outcome is None:
                raise
            # Cancelled mid-turn (its calls answered as cancelled), or while it waited for
            # answers: then it ends as it paused, its state kept for `Agent.resume`.
            return result_to_json(replace(run.outcome, stop_reason="cancelled"))
        except AgentloopError as exc:
            partial = None if exc.result is None else result_to_json(exc.result)
            fields = {name: getattr(exc, name) for name in _ERROR_FIELDS if hasattr(exc, name)}
            raise ApplicationError(
                str(exc),
                {"result": partial, "fields": fields},
                type=type(exc).__name__,
                non_retryable=True,
            ) from exc

    async def _start(
        self, data: dict[str, Any], run_id: str, emit: RunPublisher | None
    ) -> tuple[RunState, Callable[[Any], Awaitable[RunResult[Any]]]]:
        carry = data.get("carry")
        if carry is None:
            run, drive = await self.agent._prepare(
                data.get("prompt"),
                data.get("history"),
                self.deps,
                data.get("external_tools", ()),
                None,
            )
        else:
            run, drive = await self.agent._prepare(
                None, carry["messages"], self.deps, carry["external"], None
            )
            run.restore(
                PausedRun(
                    run_id=run_id,
                    rounds=carry["rounds"],
                    usage=Usage(**carry["usage"]),
                    messages=list(run.history.messages),
                    finished=[],
                    pending=[],
                    tool_calls=[ToolCallRecord(**c) for c in carry["tool_calls"]],
                    container=carry["container"],
                    external=carry["external"],
                    cost=carry["cost"],
                )
            )
        run.perform_with(self.effects(emit), run_id)
        return run, drive

    def continue_now(self) -> bool:
        """Whether the workflow should continue as a new run before its next request."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_size() > self.max_history_bytes
        )

    # -- the client side

    async def start(
        self,
        client: Client,
        prompt: str | None = None,
        *,
        run_id: str,
        history: Sequence[Mapping[str, Any]] | None = None,
        external_tools: Sequence[Mapping[str, Any]] = (),
        wait_for_external: timedelta | None = None,
        task_queue: str | None = None,
        stream: bool = False,
    ) -> WorkflowHandle[Any, Any]:
        """Start the run `run_id`, or get the handle of the run of that id started before.

        A run id is used once: asking again, even after the run finished, attaches to
        that run rather than starting a second one. With `stream`, the run publishes its
        events (see `run_stream`).
        """
        data = {
            "stream": stream,
            "prompt": prompt,
            "history": None if history is None else list(history),
            "external_tools": [dict(t) for t in external_tools],
            "wait_for_external": None
            if wait_for_external is None
            else wait_for_external.total_seconds(),
        }
        try:
            return await client.start_workflow(
                self.workflow_name,
                data,
                id=run_id,
                task_queue=task_queue or self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )
        except WorkflowAlreadyStartedError:
            return client.get_workflow_handle(run_id)

    async def run(
        self,
        client: Client,
        prompt: str | None = None,
        *,
        run_id: str,
        history: Sequence[Mapping[str, Any]] | None = None,
        external_tools: Sequence[Mapping[str, Any]] = (),
        wait_for_external: timedelta | None = None,
        task_queue: str | None = None,
    ) -> RunResult[Any]:
        """Start (or attach to) the run `run_id` and wait for its result.

        Raises:
            AgentloopError: the run failed as `Agent.run` would have (the same class,
                e.g. `AuthenticationError`), with the partial result as `.result`.
        """
        handle = await self.start(
            client,
            prompt,
            run_id=run_id,
            history=history,
            external_tools=external_tools,
            wait_for_external=wait_for_external,
            task_queue=task_queue,
        )
        return await result_of(handle, self.agent.output_type)

    async def waiting(self, client: Client, run_id: str) -> RunResult[Any] | None:
        """The paused result of the run `run_id` while it waits for answers, else None.

        Its `pending` and `approvals` say what it waits for (`run(wait_for_external=...)`).
        """
        data = await client.get_workflow_handle(run_id).query("waiting")
        return None if data is None else result_from_json(data, self.agent.output_type)

    async def send_results(
        self,
        client: Client,
        run_id: str,
        results: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
    ) -> None:
        """Answer the calls the run `run_id` waits for: external results, approval decisions.

        The workflow checks the answers as `Agent.resume` checks them (exactly the waiting
        ids, each with an answer of its kind) before it takes them.

        Raises:
            DecisionError: the run is not waiting, or the answers do not fit the waiting
                calls; nothing was taken, the run goes on waiting.
        """
        answers = {
            "results": dict(results or {}),
            "decisions": {id_: decision_to_json(d) for id_, d in (decisions or {}).items()},
        }
        try:
            await client.get_workflow_handle(run_id).execute_update("answers", answers)
        except WorkflowUpdateFailedError as exc:
            raise DecisionError(str(exc.cause or exc)) from exc

    @asynccontextmanager
    async def run_stream(
        self,
        client: Client,
        prompt: str | None = None,
        *,
        run_id: str,
        history: Sequence[Mapping[str, Any]] | None = None,
        external_tools: Sequence[Mapping[str, Any]] = (),
        wait_for_external: timedelta | None = None,
        task_queue: str | None = None,
    ) -> AsyncIterator[DurableStream[Any]]:
        """Start (or attach to) the run `run_id`, with its events as they are published.

        ```python
        async with durable.run_stream(client, "Weather in Paris?", run_id="w-1") as stream:
            async for event in stream:
                ...
        print(stream.result.text)
        ```

        The events come through the workflow's stream (`temporalio.contrib.
        workflow_streams`), published by the workflow and by its activities wherever
        they run (see `agentloop.durable.streams` for what they are). Attaching to a run
        reads its events from the first (from its latest continuation, when it has
        continued as a new run). Leaving the block stops reading; the run goes on.

        Raises:
            AgentloopError: iterating, after the events, when the run failed (as `run`).
        """
        handle = await self.start(
            client,
            prompt,
            run_id=run_id,
            history=history,
            external_tools=external_tools,
            wait_for_external=wait_for_external,
            task_queue=task_queue,
            stream=True,
        )
        subscription = WorkflowStreamClient.create(client, run_id).subscribe(
            _TOPIC, poll_cooldown=_POLL_COOLDOWN
        )
        events = read_events(_data(subscription), self.agent.output_type)
        try:
            yield DurableStream(run_id, events, partial(result_of, handle, self.agent.output_type))
        finally:
            await events.aclose()
            await subscription.aclose()  # type: ignore[attr-defined]


DurableAgent = TemporalAgent
"""The same class, under the name each durable engine's module gives its agent."""


async def result_of(handle: WorkflowHandle[Any, Any], output_type: Any = str) -> RunResult[Any]:
    """The result of a run's workflow; its failure raised as the agentloop error it was.

    `output_type` is the agent's (`Agent.output_type`): the output is read back as one.
    """
    try:
        data = await handle.result()
    except WorkflowFailureError as exc:
        cause = exc.cause
        if not isinstance(cause, ApplicationError):
            raise
        error_class = getattr(errors, cause.type or "", None)
        if not (isinstance(error_class, type) and issubclass(error_class, AgentloopError)):
            raise
        details = cause.details[0] if cause.details else {}
        details = details if isinstance(details, dict) else {}
        error = error_class(cause.message, **details.get("fields", {}))
        partial = details.get("result")
        error.result = None if partial is None else result_from_json(partial, output_type)
        raise error from exc
    return result_from_json(data, output_type)


_ERROR_FIELDS = ("status_code", "request_id", "body", "headers", "limit", "bound", "value", "sent")
"""The attributes of an agentloop error that travel with a failed workflow (JSON values)."""


class TemporalEffects:
    """A run's effects inside its workflow: each one an activity (see `agentloop.effects`)."""

    def __init__(self, durable: TemporalAgent, publisher: RunPublisher | None = None) -> None:
        """Effects of `durable`'s workflow; `publisher` publishes the events of a streamed run."""
        self.durable = durable
        self.publisher = publisher
        self.requests = 0
        """Model requests made through these effects (in this workflow run)."""

    async def model(
        self,
        request: ModelRequest,
        round_: int,
        send: Send,
        stream: OnEvent | None,
    ) -> ModelResponse:
        """The response, from the activity `model:{round_}`."""
        # Each workflow run sends one request at least: a run whose carried state alone is
        # past the limit still gets on, rather than continuing as new again and again.
        if self.requests > 0 and self.durable.continue_now():
            raise _ContinueAsNew
        self.requests += 1
        durable = self.durable
        try:
            # The activity streams to the run's stream, never to the turn: its calls start
            # after the response, as they do when the recorded response is replayed.
            streams = stream is not None and self.publisher is not None
            data = await workflow.execute_activity(
                durable.model_activity_name,
                {"request": request.to_dict(), "round": round_, "stream": streams},
                activity_id=f"model:{round_}",
                start_to_close_timeout=durable.model_timeout,
                heartbeat_timeout=durable.heartbeat_timeout,
                retry_policy=durable.retry_policy,
            )
        except ActivityError as exc:
            raise _provider_error(exc) from exc
        return ModelResponse.from_json(data)

    async def tool(
        self,
        call: ToolCall,
        round_: int,
        run: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """The result, from the activity `tool:{round_}:{call.id}`."""
        durable = self.durable
        if call.name not in durable.agent.registry:
            # A final-result call (the run's output validates it, here in the workflow)
            # or a name no tool has: nothing to perform, and the answer is the same on
            # every replay.
            return await run()
        run_id = workflow.info().workflow_id
        if self.publisher is not None:
            self.publisher.stepped.add(call.id)
        data = await workflow.execute_activity(
            durable.tool_activity_name,
            {"run_id": run_id, "round": round_, "id": call.id, "name": call.name}
            | {"input": call.input, "stream": self.publisher is not None},
            activity_id=f"tool:{round_}:{call.id}",
            start_to_close_timeout=durable.tool_timeout,
            heartbeat_timeout=durable.heartbeat_timeout,
            retry_policy=durable.retry_policy,
        )
        return ToolResult.from_json(data)

    def task_group(self) -> WorkflowTasks:
        """The calls of a turn run as plain asyncio tasks (see `agentloop.effects`)."""
        return WorkflowTasks()


class WorkflowTasks:
    """A turn's calls inside a workflow: asyncio tasks, cancelled once, gathered.

    An anyio task group would livelock Temporal's workflow event loop when cancelled
    while its calls await their activities (see `agentloop.effects`); asyncio's own
    cancellation is delivered once, and Temporal then cancels each activity.
    """

    def __init__(self) -> None:
        """No tasks yet."""
        self.tasks: list[asyncio.Future[Any]] = []

    async def __aenter__(self) -> WorkflowTasks:
        return self

    def start_soon(self, function: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `function(*args)` in a task (the tasks start in this order)."""
        self.tasks.append(asyncio.ensure_future(function(*args)))

    def cancel(self) -> None:
        """Cancel every task."""
        for task in self.tasks:
            task.cancel()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        if exc_info[1] is not None:
            self.cancel()
        # A cancellation of this task while it waits cancels the calls' tasks (once).
        outcomes = await asyncio.gather(*self.tasks, return_exceptions=True)  # noqa: TID251
        if exc_info[1] is None:
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, asyncio.CancelledError
                ):
                    raise outcome
        return None


class _ContinueAsNew(Exception):
    """Raised before a request when the workflow's history has grown too large."""


@dataclass
class _WorkflowState:
    """What the workflow's update handler shares with its body."""

    pending: set[str] | None = None
    """The ids of the calls the run waits for (None: it waits for none)."""
    paused: dict[str, Any] | None = None
    """The waiting run's state (`RunResult.state`)."""
    waiting: dict[str, Any] | None = None
    """The waiting run's paused result, as JSON (the `waiting` query's answer)."""
    answers: tuple[dict[str, Any], dict[str, Decision]] | None = None
    """The results and decisions an update gave, once it did."""


class AgentWorkflow:
    """The workflow of a `TemporalAgent`'s runs; each agent has a subclass (`durable` set)."""

    durable: TemporalAgent

    @workflow.init
    def __init__(self: AgentWorkflow, data: dict[str, Any]) -> None:
        """A run's workflow, and its stream of events (as its last run left it, if any).

        (Temporal wants the parameters of `__init__` and of `run` alike, `self` included.)
        """
        self.state = _WorkflowState()
        carried = data.get("stream_state")
        stream_state = None if carried is None else value_to_type(WorkflowStreamState, carried)
        self.stream = WorkflowStream(stream_state)
        self.stream_start = 0 if stream_state is None else stream_state.base_offset
        """Where the events of this workflow run begin in the stream."""

    async def run(self, data: dict[str, Any]) -> dict[str, Any]:
        """The run: see `TemporalAgent.run_workflow` (each subclass marks it `workflow.run`)."""
        return await self.durable.run_workflow(self, data)

    def publisher(self, output_type: Any, *, continued: bool) -> RunPublisher:
        """The publisher of the run's own events, to the workflow's stream."""
        topic = self.stream.topic(_TOPIC)

        async def write(item: dict[str, Any]) -> None:
            topic.publish(item)

        return RunPublisher(write, output_type, continued=continued)

    async def close_stream(self) -> WorkflowStreamState:
        """The stream as the next workflow run takes it over (see `run_workflow`).

        Readers waiting get what there is, and the next run carries this run's events (not
        those of earlier runs): a reader that has not caught up with them when the run
        continues reads them from the next, where the stream goes on with the same offsets.
        """
        self.stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        self.stream.truncate(self.stream_start)
        return replace(self.stream.get_state(), publishers={})

    @workflow.update(name="external_results")
    async def external_results(self, results: dict[str, Any]) -> None:
        """The results of the external calls the run waits for, by `tool_use` id."""
        self.state.answers = (results, {})

    @external_results.validator
    def check_external_results(self, results: dict[str, Any]) -> None:
        """Refuse results that do not answer exactly the calls waiting."""
        self._check(results, {})

    @workflow.update(name="answers")
    async def answers(self, answers: dict[str, Any]) -> None:
        """Results (`"results"`) and approval decisions (`"decisions"`, `decision_to_json`)."""
        self.state.answers = (answers.get("results") or {}, _decisions(answers))

    @answers.validator
    def check_answers(self, answers: dict[str, Any]) -> None:
        """Refuse answers that do not answer exactly the calls waiting, each in its kind."""
        try:
            decisions = _decisions(answers)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"decisions must be decision_to_json values: {exc}") from exc
        self._check(answers.get("results") or {}, decisions)

    def _check(self, results: dict[str, Any], decisions: dict[str, Decision]) -> None:
        pending = self.state.pending
        if pending is None:
            raise ValueError("the run waits for no results or decisions")
        if set(results) | set(decisions) != pending:
            answered = sorted(set(results) | set(decisions))
            raise ValueError(f"the answers must be for exactly {sorted(pending)}, not {answered}")
        try:  # the checks `Agent.resume` makes (results that are not tool results, ...)
            plan(self.state.paused, decisions, results, self.durable.agent.registry)
        except AgentloopError as exc:
            raise ValueError(str(exc)) from exc

    @workflow.query(name="waiting")
    def waiting(self) -> dict[str, Any] | None:
        """The paused result of the run while it waits for answers, else None."""
        return self.state.waiting


def decision_to_json(decision: Decision) -> dict[str, Any]:
    """An approval decision as JSON values: `{"approve": input or None}`, `{"deny": reason}`."""
    if isinstance(decision, Approve):
        return {"approve": decision.input}
    return {"deny": decision.reason}


def decision_from_json(data: Mapping[str, Any]) -> Decision:
    """The decision `decision_to_json` wrote.

    Raises:
        ValueError: `data` is not a decision.
    """
    if set(data) == {"approve"}:
        return Approve(data["approve"])
    if set(data) == {"deny"} and isinstance(data["deny"], str):
        return Deny(data["deny"])
    raise ValueError(f"not a decision: {data!r}"[:200])


def _decisions(answers: Mapping[str, Any]) -> dict[str, Decision]:
    return {id_: decision_from_json(d) for id_, d in (answers.get("decisions") or {}).items()}


def _workflow_class(durable: TemporalAgent) -> type[AgentWorkflow]:
    """The workflow class of `durable`'s runs."""
    name = f"AgentWorkflow_{durable.name.replace('.', '_')}"

    async def run(self: AgentWorkflow, data: dict[str, Any]) -> dict[str, Any]:
        return await AgentWorkflow.run(self, data)

    # Temporal finds a workflow class by its name, so its run method must not look local.
    run.__qualname__ = f"{name}.run"
    namespace = {"durable": durable, "run": workflow.run(run), "__module__": __name__}
    return workflow.defn(name=durable.workflow_name, sandboxed=False)(
        type(name, (AgentWorkflow,), namespace)
    )


_TOPIC = "agentloop"
"""The topic of a run's events in its workflow's stream."""

_POLL_COOLDOWN = timedelta(milliseconds=50)
"""The least time between two polls of a reader that has caught up with the stream."""


async def _data(items: AsyncIterator[WorkflowStreamItem[Any]]) -> AsyncIterator[Any]:
    async for item in items:
        yield item.data


def _driver(agent: Agent[Any], run: RunState) -> Callable[[Any], Awaitable[RunResult[Any]]]:
    async def drive(emit: Any) -> RunResult[Any]:
        return await agent._drive(run, emit)

    return drive


def _carry(run: RunState, data: dict[str, Any]) -> dict[str, Any]:
    """What the next workflow run needs to go on with `run` (a round boundary)."""
    return {
        "messages": run.history.dump(),
        "rounds": run.rounds - 1,  # the round about to start has not been sent
        "usage": asdict(run.usage),
        "tool_calls": [asdict(c) for c in run.calls],
        "container": run.container,
        "external": data["carry"]["external"] if "carry" in data else data["external_tools"],
        "cost": run.cost,
    }


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


def _provider_error(exc: ActivityError) -> ProviderError:
    """The provider error a failed model activity stands for, as the loop knows it."""
    cause = exc.cause
    if isinstance(cause, ApplicationError):
        error_class = getattr(errors, cause.type or "", None)
        if not (isinstance(error_class, type) and issubclass(error_class, ProviderError)):
            error_class = ProviderError
        details = cause.details[0] if cause.details else {}
        details = details if isinstance(details, dict) else {}
        return error_class(
            cause.message,
            status_code=details.get("status_code"),
            body=details.get("body"),
            headers=details.get("headers"),
        )
    return errors.APIConnectionError(f"the model request did not complete: {exc.cause or exc}")


def without_sdk_retries(provider: Provider) -> Provider:
    """`provider` with the SDK client's own retries off (Temporal retries activities)."""
    if isinstance(provider, AnthropicProvider):
        return AnthropicProvider(
            provider.client.with_options(max_retries=0),
            stream=provider.streaming,
            max_retry_wait=provider.max_retry_wait,
        )
    if isinstance(provider, OpenAIChatProvider):
        return OpenAIChatProvider(
            provider.client.with_options(max_retries=0),
            compat=provider.compat,
            stream=provider.streaming,
        )
    return provider


# -- results as JSON


def result_to_json(result: RunResult[Any]) -> dict[str, Any]:
    """A run's result as plain JSON values (the workflow's result)."""
    data = asdict(result)
    data["output"] = to_jsonable_python(result.output)
    return data


def result_from_json(data: Mapping[str, Any], output_type: Any = str) -> RunResult[Any]:
    """The result `result_to_json` wrote, its output read back as `output_type`."""
    output = data["output"]
    if output is not None and output_type is not str:
        output = TypeAdapter(output_type).validate_python(output)
    return RunResult(
        **{
            **data,
            "tool_calls": [ToolCallRecord(**c) for c in data["tool_calls"]],
            "usage": Usage(**data["usage"]),
            "approvals": [ApprovalRequest(**a) for a in data["approvals"]],
            "output": output,
        }
    )


# -- the worker command


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m agentloop.durable.temporal worker module:durable_agent --address ...`."""
    parser = argparse.ArgumentParser(prog="python -m agentloop.durable.temporal")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run a worker for a TemporalAgent's runs")
    worker.add_argument("target", help="module:attribute naming a TemporalAgent")
    worker.add_argument("--address", default="localhost:7233", help="Temporal server HOST:PORT")
    worker.add_argument("--namespace", default="default")
    worker.add_argument("--task-queue", default=None, help="default: the agent's task queue")
    worker.add_argument(
        "--max-cached-workflows",
        type=int,
        default=None,
        help="workflows kept in memory between tasks (0: replay each task from history)",
    )
    args = parser.parse_args(argv)
    module_name, _, attribute = args.target.partition(":")
    durable = getattr(importlib.import_module(module_name), attribute or "durable_agent")
    if not isinstance(durable, TemporalAgent):
        parser.error(f"{args.target} is a {type(durable).__name__}, not a TemporalAgent")
    options = {}
    if args.max_cached_workflows is not None:
        options["max_cached_workflows"] = args.max_cached_workflows

    async def serve() -> None:
        client = await Client.connect(args.address, namespace=args.namespace)
        await durable.worker(client, task_queue=args.task_queue, **options).run()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    # Run as a script, this file is `__main__`: the worker's agent module imports the
    # module proper, whose `TemporalAgent` is the class to check against.
    from agentloop.durable.temporal import main as _main

    _main()
