"""`TemporalAgent`: an agent whose runs are Temporal workflows, and the client's side of them.

It holds what its workers need (the workflow class, the two activities, the agent with its
provider and tools) and what a client calls: `start`, `run`, `run_stream`, `waiting`,
`send_results`. Workers and clients build the same `TemporalAgent`, usually by importing
one module.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from typing import Any

import anyio
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.workflow_streams import WorkflowStreamClient, WorkflowStreamItem
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.worker import Worker

from agentloop.agent import Agent
from agentloop.approval import Decision
from agentloop.durable.records import result_from_json
from agentloop.durable.streams import DurableStream, RunPublisher, read_events
from agentloop.durable.temporal.activities import run_call, send_request, without_sdk_retries
from agentloop.durable.temporal.results import result_of
from agentloop.durable.temporal.workflow import (
    TOPIC,
    TemporalEffects,
    decision_to_json,
    workflow_class,
)
from agentloop.errors import ConfigurationError, DecisionError
from agentloop.result import RunResult

__all__ = ("DEFAULT_RETRY_POLICY", "DurableAgent", "TemporalAgent")

DEFAULT_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
)
"""Retries of every activity: unlimited, from 1 s doubling up to 1 min between attempts."""

_POLL_COOLDOWN = timedelta(milliseconds=50)
"""The least time between two polls of a reader that has caught up with the stream."""


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
        agent: Agent[Any, Any],
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
        seconds = agent.config.tool_timeout if math.isfinite(agent.config.tool_timeout) else 3600.0
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
        self.workflow = workflow_class(self)

        async def model(data: dict[str, Any]) -> dict[str, Any]:
            return await send_request(self, data)

        async def tool(data: dict[str, Any]) -> dict[str, Any]:
            return await run_call(self, data)

        self._activities = (
            activity.defn(name=self.model_activity_name)(model),
            activity.defn(name=self.tool_activity_name)(tool),
        )
        self._limiter: anyio.CapacityLimiter | None = None

    # -- the worker side

    def call_limiter(self) -> anyio.CapacityLimiter:
        """The cap on the tool calls this worker runs at once (the agent's `tool_concurrency`)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.agent.config.tool_concurrency)
        return self._limiter

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

    # -- the workflow side

    def effects(self, publisher: RunPublisher | None = None) -> TemporalEffects:
        """The effects of a run inside the workflow: activities (`publisher`: its events')."""
        return TemporalEffects(self, publisher)

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
        workflow_options: Mapping[str, Any] | None = None,
    ) -> WorkflowHandle[Any, Any]:
        """Start the run `run_id`, or get the handle of the run of that id started before.

        A run id is used once: asking again, even after the run finished, attaches to
        that run rather than starting a second one. With `stream`, the run publishes its
        events (see `run_stream`). `workflow_options` go to `Client.start_workflow` when
        this call starts the run (`task_timeout`, `execution_timeout`, `memo`,
        `search_attributes`, ...); the id, the task queue and the id policies are this
        method's own.

        Raises:
            ConfigurationError: `workflow_options` names something `start_workflow` does
                not take, or one of the arguments this method sets itself.
        """
        options = _start_options(workflow_options)
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
                **options,
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
        workflow_options: Mapping[str, Any] | None = None,
    ) -> RunResult[Any]:
        """Start (or attach to) the run `run_id` and wait for its result.

        `workflow_options` go to `Client.start_workflow`, as for `start`.

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
            workflow_options=workflow_options,
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
        workflow_options: Mapping[str, Any] | None = None,
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
        `workflow_options` go to `Client.start_workflow`, as for `start`.

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
            workflow_options=workflow_options,
        )
        subscription = WorkflowStreamClient.create(client, run_id).subscribe(
            TOPIC, poll_cooldown=_POLL_COOLDOWN
        )
        events = read_events(_data(subscription), self.agent.output_type)
        try:
            yield DurableStream(run_id, events, partial(result_of, handle, self.agent.output_type))
        finally:
            await events.aclose()
            await subscription.aclose()  # type: ignore[attr-defined]


DurableAgent = TemporalAgent
"""The same class, under the name each durable engine's module gives its agent."""


_OWN_START_OPTIONS = frozenset(
    {"self", "workflow", "arg", "args", "id", "task_queue", "id_reuse_policy", "id_conflict_policy"}
)


def _start_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`options` for `Client.start_workflow`, refused when it does not take one of them."""
    options = dict(options or {})
    taken = set(inspect.signature(Client.start_workflow).parameters) - _OWN_START_OPTIONS
    wrong = sorted(set(options) - taken)
    if wrong:
        own = sorted(set(wrong) & _OWN_START_OPTIONS)
        why = "set by agentloop itself" if own == wrong else "not options of start_workflow"
        raise ConfigurationError(f"workflow_options: {', '.join(wrong)}: {why}")
    return options


async def _data(items: AsyncIterator[WorkflowStreamItem[Any]]) -> AsyncIterator[Any]:
    async for item in items:
        yield item.data
