"""Durable runs on DBOS: each model request and each tool call is a step of a workflow.

`DurableAgent` wraps an `Agent`. A run is a DBOS workflow whose id is the run's id: the
agent's own loop drives it, and its two effects (`agentloop.effects`) are DBOS steps whose
outputs are the JSON forms of the response and of the tool result. When the process dies,
`DBOS.launch()` in the next one recovers the workflow: the loop runs again from the start,
every recorded step hands back its output without running, and the run goes on from the
first step that was not recorded. Only that step runs again, possibly for a second time
(it may have done its work just before the crash): a tool with an effect on the world
makes it under `RunContext.idempotency_key`.

DBOS numbers a workflow's steps in the order they are called: the calls of one turn
reach `Effects.tool` in `tool_use` order before any await (see `agentloop.effects`), so
parallel calls keep their numbers on every replay.

`DurableAgent.cancel` asks the run to stop rather than cancelling its workflow: DBOS
refuses to record a step that ends after its workflow was cancelled, so a call under way
would do its work and still be answered as cancelled. The steps look at the request
themselves (a workflow attribute: the model step before its request, the calls of a turn
once for them all) and record where the run stopped; the workflow then
ends with `stop_reason="cancelled"` as its recorded result.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, replace
from datetime import timedelta
from functools import partial
from typing import Any, Generic

from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync
from dbos import error as dbos_errors

from agentloop.agent import Agent
from agentloop.approval import Decision
from agentloop.calls import ToolCall, ToolDefinition, ToolResult, sendable
from agentloop.durable.dbos_fleet import APPLICATION_VERSION, Lease, check_version, launch
from agentloop.durable.dbos_workflow import (
    NOT_SENT,
    STOP_ATTRIBUTE,
    STOP_MESSAGE,
    Execution,
    Mailbox,
    Replay,
    Steps,
    Stop,
    StopCheck,
    Writer,
    no_workflow_id,
    results_topic,
    status_row,
    stop_requested,
    stream_key,
    waiting_event,
)
from agentloop.durable.records import capped, result_from_json
from agentloop.durable.streams import DurableStream, read_events
from agentloop.effects import Send
from agentloop.errors import (
    AgentloopError,
    ConfigurationError,
    DecisionError,
    RecoveryLimitExceeded,
)
from agentloop.events import ToolResultEvent
from agentloop.history import History
from agentloop.limits import UsageLimits
from agentloop.logs import get_logger
from agentloop.messages import ContentBlock, Message
from agentloop.progress import events_to
from agentloop.result import OutputT, RunResult
from agentloop.resume import plan
from agentloop.runstate import CANCELLED_MESSAGE

__all__ = ("APPLICATION_VERSION", "DurableAgent", "Lease", "launch")


_POLL_SECONDS = 0.1
"""How often a caller attached to a run another process executes looks for its result."""

_STREAM_POLL_SECONDS = 0.05
"""How often a reader of a run's events looks for more (on SQLite; Postgres notifies)."""

_log = get_logger()


def _check_run_id(run_id: object) -> None:
    """A run id names one workflow: a string, not blank (DBOS refuses one), or None (a new id)."""
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise ConfigurationError(f"run_id must be a string that is not blank, not {run_id!r}")


class DurableAgent(Generic[OutputT]):
    """An `Agent` whose runs are DBOS workflows: a crash never loses a run.

    Construct it at import time, before `DBOS.launch()`: it registers the workflow
    `agentloop.<name>.run` and the steps `agentloop.<name>.model` and
    `agentloop.<name>.tool`, and `DBOS.launch()` can recover only the workflows
    registered by then. Every process that runs or recovers these runs constructs it
    with an agent configured the same way (tools, model, limits) and the same name.

    ```python
    agent = Agent(client=AsyncAnthropic(), tools=[charge_card], name="billing")
    durable = DurableAgent(agent)
    DBOS(config={"name": "billing", "system_database_url": "sqlite:///billing.sqlite"})
    DBOS.launch()
    result = await durable.run("Charge order 42", run_id="order-42")
    ```
    """

    def __init__(
        self,
        agent: Agent[Any, OutputT],
        *,
        name: str | None = None,
        deps_factory: Callable[[Any], Any] | None = None,
        max_result_bytes: int | None = 1_000_000,
        max_recovery_attempts: int = 100,
    ) -> None:
        """Wrap `agent` and register its workflow and steps with DBOS.

        Args:
            agent: The agent whose loop the runs follow.
            name: The name in the workflow's and steps' names; by default `agent.name`.
                Two durable agents of one application need different names.
            deps_factory: Makes a run's `deps` from the value given to `run(deps=...)`,
                in the process executing the run, each time it starts or is recovered.
                That value is recorded with the workflow's input, so it must be JSON
                values; the factory turns it into live objects (clients, connections).
                Without a factory, tools get the recorded value itself.
            max_result_bytes: The most content of one tool result a run records (UTF-8
                bytes): a larger result is cut to fit, with a note to the model saying
                so (see `agentloop.durable.records.capped`). DBOS keeps a result in the
                call's step, again in the run's result, and a streamed run twice more.
                None records every result whole.
            max_recovery_attempts: How many times DBOS may recover a run whose process
                died before it finished (0: never). The next time, DBOS gives up on it:
                the run is left as it is, and waiting for it raises
                `RecoveryLimitExceeded`.

        Raises:
            ConfigurationError: `agent` is not an `Agent`, `name` is empty, or a limit is
                out of its range.
        """
        if not isinstance(agent, Agent):
            raise ConfigurationError(f"DurableAgent wraps an Agent, not {type(agent).__name__}")
        name = agent.name if name is None else name
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a DurableAgent needs a non-empty name")
        if deps_factory is not None and not callable(deps_factory):
            raise ConfigurationError("deps_factory must be a function")
        if max_result_bytes is not None and (
            type(max_result_bytes) is not int or max_result_bytes <= 0
        ):
            raise ConfigurationError(
                f"max_result_bytes must be a positive int or None, not {max_result_bytes!r}"
            )
        if type(max_recovery_attempts) is not int or max_recovery_attempts < 0:
            raise ConfigurationError(
                f"max_recovery_attempts must be an int, 0 or more, not {max_recovery_attempts!r}"
            )
        self.agent = agent
        self.name = name
        self.deps_factory = deps_factory
        self.max_result_bytes = max_result_bytes
        self.max_recovery_attempts = max_recovery_attempts
        self.workflow_name = f"agentloop.{name}.run"
        """The DBOS workflow each run is."""
        self.model_step_name = f"agentloop.{name}.model"
        """The DBOS step of each model request."""
        self.tool_step_name = f"agentloop.{name}.tool"
        """The DBOS step of each tool call."""

        async def model_step(
            send: Send, round_: int, writer: Writer | None, sent: set[int]
        ) -> dict[str, Any]:
            if await stop_requested():
                return NOT_SENT
            sent.add(round_)  # this process sent it: the response is not a recorded one
            if writer is None:  # the run does not stream
                return (await send(None)).to_json()
            async with await writer.publisher(round_, "model") as publisher:
                response = await send(publisher.model_event)
            return response.to_json()

        async def tool_step(
            run: Callable[[], Awaitable[ToolResult]],
            round_: int,
            writer: Writer | None,
            call: ToolCall,
            unknown: bool,
            check: StopCheck,
        ) -> dict[str, Any]:
            # The calls of a turn share one read; stopped, the run ends before its next request.
            stopped = await check.stopped()
            if unknown and not stopped:
                # The response calling it was recorded by a process whose agent had the
                # tool: the agent changed between a crash and this recovery.
                _log.warning(
                    "durable.unknown_tool",
                    run_id=DBOS.workflow_id,
                    round=round_,
                    tool_use_id=call.id,
                    tool=call.name,
                    known=sorted(self.agent.registry.names),
                )

            async def outcome() -> ToolResult:
                if stopped:
                    return ToolResult.error(call, CANCELLED_MESSAGE, ran=False)
                return capped(await run(), self.max_result_bytes)

            if writer is None:
                return (await outcome()).to_json()
            async with await writer.publisher(round_, f"tool:{call.id}") as publisher:
                with events_to(publisher.put):
                    result = await outcome()
                publisher.put(ToolResultEvent.of(round_, sendable(result)))
            return result.to_json()

        async def workflow(request: dict[str, Any]) -> dict[str, Any]:
            run_id = DBOS.workflow_id
            assert run_id is not None  # DBOS runs this function as a workflow only
            stop = Stop()
            steps = Steps(self, run_id, request.get("stream", False), request["output_type"], stop)
            execution = Execution(self, request, steps, Mailbox(run_id), steps.publisher, stop)
            return await execution.result(run_id)

        self._model_step = DBOS.step(name=self.model_step_name)(model_step)
        self._tool_step = DBOS.step(name=self.tool_step_name)(tool_step)
        self._workflow = DBOS.workflow(
            name=self.workflow_name, max_recovery_attempts=max_recovery_attempts
        )(workflow)

    async def run(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        run_id: str | None = None,
        history: Sequence[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
        wait_for_external: timedelta | None = None,
    ) -> RunResult[Any]:
        """Run durably, as `Agent.run` does, or attach to the run `run_id` if it exists.

        Outside a workflow, the run is the workflow `run_id`: started here when it does
        not exist yet; when it does, the arguments are ignored and the call returns its
        result (recorded, or when the run that another call or process executes ends).
        Inside a DBOS workflow of your own, the run's steps are steps of that workflow
        (it checkpoints there), and `run_id` defaults to that workflow's id: give each
        run of one workflow its own `run_id`.

        Args:
            prompt: The new user input, as for `Agent.run`.
            run_id: The run's id: the workflow's id and the prefix of every
                `RunContext.idempotency_key`. A new one when None (outside a workflow).
            history: Earlier messages, as for `Agent.run`.
            deps: The run's `deps` (JSON values, recorded; see `deps_factory`). Inside
                your own workflow they are passed as they are, unrecorded.
            external_tools: As for `Agent.run`.
            usage_limits: As for `Agent.run`.
            output_type: As for `Agent.run` (recorded by DBOS's serializer: a type
                importable by its module and name).
            wait_for_external: When the run hands calls back (`stop_reason` "tool_use"
                or "approval_required"), wait this long for `send_results`, durably
                (across restarts), then go on with the same run. At the end of the
                wait, the run ends as it paused (its `state` kept for `Agent.resume`).

        Returns:
            The run's `RunResult`, as `Agent.run` returns it. A run cancelled with
            `cancel` (or `DBOS.cancel_workflow`) returns `stop_reason="cancelled"` and
            the history up to its last recorded step, every `tool_use` answered.

        Raises:
            ConfigurationError: an argument that cannot be recorded or used.
            HistoryError: as for `Agent.run`.
            ProviderError, ToolCallFailed, UsageLimitExceeded, OutputValidationError:
                as for `Agent.run`, recorded as the workflow's error.
            RecoveryLimitExceeded: DBOS gave up on the run (see `max_recovery_attempts`).
        """
        _check_run_id(run_id)
        if prompt is None and history is None and run_id is not None:
            return await self.result(run_id, output_type=output_type)
        request = self._request(
            prompt, history, deps, external_tools, usage_limits, output_type, wait_for_external
        )
        parent = DBOS.workflow_id
        if parent is not None:
            inline_id = parent if run_id is None else run_id
            stop = Stop()
            steps = Steps(self, inline_id, False, output_type, stop)
            execution = Execution(self, request, steps, Mailbox(inline_id), None, stop)
            return self._decode(await execution.result(inline_id), output_type)
        handle = await self._start(request, run_id)
        return await self._result_of(handle, output_type)

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        run_id: str | None = None,
        history: Sequence[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
        wait_for_external: timedelta | None = None,
    ) -> AsyncIterator[DurableStream[Any]]:
        """Run durably as `run` does, with the run's events as they are published.

        ```python
        async with durable.run_stream("Charge order 42", run_id="order-42") as stream:
            async for event in stream:
                ...
        print(stream.result.text)
        ```

        The events come through a DBOS stream of the run's workflow, from whichever
        process executes it (see `agentloop.durable.streams` for what they are). With
        `run_id` of a run that exists and no prompt or history, this attaches to that
        run and reads its events from the first. Leaving the block stops reading; the
        run goes on (`cancel` stops it).

        The arguments are those of `run`. Call it outside a workflow.

        Raises:
            ConfigurationError: inside a workflow, or as `run` raises it.
        """
        if DBOS.workflow_id is not None:
            raise ConfigurationError("run_stream starts a workflow: call it outside one")
        _check_run_id(run_id)
        if prompt is None and history is None and run_id is not None:
            handle, output_type = await self._existing(run_id, output_type)
        else:
            request = self._request(
                prompt, history, deps, external_tools, usage_limits, output_type, wait_for_external
            )
            handle = await self._start(request | {"stream": True}, run_id)
        run_id = handle.get_workflow_id()
        items = DBOS.read_stream_async(
            run_id, stream_key(run_id), polling_interval_sec=_STREAM_POLL_SECONDS
        )
        events = read_events(items, self._output_type(output_type))
        try:
            yield DurableStream(run_id, events, partial(self._result_of, handle, output_type))
        finally:
            await events.aclose()
            await items.aclose()

    def _request(
        self,
        prompt: str | Sequence[ContentBlock] | None,
        history: Sequence[Message | Mapping[str, Any]] | None,
        deps: Any,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]],
        usage_limits: UsageLimits | None,
        output_type: Any,
        wait_for_external: timedelta | None,
    ) -> dict[str, Any]:
        """The workflow's input: the run's arguments as values DBOS records."""
        if wait_for_external is not None and (
            not isinstance(wait_for_external, timedelta) or wait_for_external <= timedelta(0)
        ):
            raise ConfigurationError("wait_for_external must be a positive timedelta")
        if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
            raise ConfigurationError(
                f"usage_limits must be a UsageLimits, not {type(usage_limits).__name__}"
            )
        return {
            "messages": History.start(history, prompt).dump(),
            "external_tools": [
                t.to_wire() if isinstance(t, ToolDefinition) else dict(t) for t in external_tools
            ],
            "usage_limits": None if usage_limits is None else asdict(usage_limits),
            "output_type": output_type,
            "wait": None if wait_for_external is None else wait_for_external.total_seconds(),
            "deps": deps,
        }

    async def _start(
        self, request: dict[str, Any], run_id: str | None
    ) -> WorkflowHandleAsync[dict[str, Any]]:
        """Start the run's workflow (or get the one of that id)."""
        try:
            json.dumps(request["deps"])
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"deps are recorded with the run, so they must be JSON values ({exc}); "
                "make live objects with DurableAgent(deps_factory=...)"
            ) from exc
        if run_id is not None and (existing := await self._attached(run_id)) is not None:
            return existing
        with SetWorkflowID(run_id) if run_id is not None else no_workflow_id():
            try:
                return await DBOS.start_workflow_async(self._workflow, request)
            except dbos_errors.MaxRecoveryAttemptsExceededError as exc:
                raise await self._given_up(exc.workflow_id) from exc

    async def _attached(self, run_id: str) -> WorkflowHandleAsync[dict[str, Any]] | None:
        """The handle of the run `run_id` if it exists, checked against this version.

        Attaching through `retrieve_workflow_async` rather than starting again: a start
        of a run DBOS recovered (through its queue) makes DBOS warn that the run is in
        another queue, once per attached run.
        """
        status = await status_row(run_id)
        if status is None:
            return None
        check_version(run_id, status)
        handle: WorkflowHandleAsync[dict[str, Any]] = await DBOS.retrieve_workflow_async(run_id)
        return handle

    async def result(self, run_id: str, *, output_type: Any = None) -> RunResult[Any]:
        """The result of the run `run_id`, waiting for it if it is under way.

        `run(run_id=...)` without a prompt or history is the same. `output_type`: by
        default the one the run was started with.

        Raises:
            ConfigurationError: there is no run `run_id`.
            ProviderError, ToolCallFailed, ...: the run's error, as `run` raises it.
        """
        handle, output_type = await self._existing(run_id, output_type)
        return await self._result_of(handle, output_type)

    async def _existing(
        self, run_id: str, output_type: Any
    ) -> tuple[WorkflowHandleAsync[dict[str, Any]], Any]:
        """The handle of the run `run_id`, and its output type (`output_type`, or its own)."""
        status = await DBOS.get_workflow_status_async(run_id)
        if status is None or status.input is None:
            raise ConfigurationError(f"there is no run {run_id!r}")
        check_version(run_id, status)
        if output_type is None:
            output_type = status.input["args"][0]["output_type"]
        handle: WorkflowHandleAsync[dict[str, Any]] = await DBOS.retrieve_workflow_async(run_id)
        return handle, output_type

    async def _result_of(
        self, handle: WorkflowHandleAsync[dict[str, Any]], output_type: Any
    ) -> RunResult[Any]:
        try:
            data = await handle.get_result(polling_interval_sec=_POLL_SECONDS)
        except dbos_errors.DBOSAwaitedWorkflowCancelledError:
            return await self.cancelled_result(handle.get_workflow_id())
        except dbos_errors.DBOSAwaitedWorkflowMaxRecoveryAttemptsExceeded as exc:
            raise await self._given_up(handle.get_workflow_id()) from exc
        return self._decode(data, output_type)

    async def _given_up(self, run_id: str) -> RecoveryLimitExceeded:
        """The error of a run DBOS gave up on, with what its recorded steps hold."""
        error = RecoveryLimitExceeded(
            f"run {run_id!r} did not finish: its process died each time it ran, and DBOS "
            f"gives up after {self.max_recovery_attempts} recoveries (DurableAgent's "
            "max_recovery_attempts). Find what kills it (a crashing tool, memory), then call "
            f"DBOS.resume_workflow({run_id!r}) to run it again from its last recorded step.",
            run_id=run_id,
            max_recovery_attempts=self.max_recovery_attempts,
        )
        try:
            partial = await self.cancelled_result(run_id)
        except AgentloopError:  # a record this agent cannot replay: the error says enough
            return error
        error.result = replace(partial, stop_reason="error")
        return error

    async def send_results(
        self,
        run_id: str,
        results: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        workflow_id: str | None = None,
    ) -> None:
        """Answer the calls a run waits for (`run(..., wait_for_external=...)`).

        The answers are checked as `Agent.resume` checks them, before they are sent:
        exactly the waiting ids, each with an answer of its kind.

        Args:
            run_id: The waiting run.
            results: For every call of an external tool, by tool_use id: what the tool
                returned (JSON values), a `tool_result` block, as for `Agent.resume`.
            decisions: `Approve()` / `Deny(...)` for every call waiting for approval.
            workflow_id: The workflow the run is in, when it is not the run itself
                (a run inside a workflow of your own).

        Raises:
            DecisionError: the run is not waiting, or the answers do not fit the
                waiting calls; nothing was sent, the run goes on waiting.
        """
        waiting = await self.waiting(run_id, workflow_id=workflow_id)
        if waiting is None or waiting.state is None:
            raise DecisionError(f"run {run_id!r} is not waiting for results")
        try:
            json.dumps(dict(results or {}))
        except (TypeError, ValueError) as exc:
            raise DecisionError(f"results must be JSON values: {exc}") from exc
        plan(waiting.state, decisions, results, self.agent.registry)
        answer = {"results": dict(results or {}), "decisions": dict(decisions or {})}
        await DBOS.send_async(workflow_id or run_id, answer, topic=results_topic(run_id))

    async def waiting(
        self, run_id: str, *, wait_seconds: float = 0.0, workflow_id: str | None = None
    ) -> RunResult[Any] | None:
        """The paused result of a run that waits for `send_results` now, else None.

        Its `pending` and `approvals` say what the run waits for. `wait_seconds`: seconds to
        wait for a run that has not waited yet to start waiting.
        """
        key = waiting_event(run_id)
        data = await DBOS.get_event_async(workflow_id or run_id, key, wait_seconds)
        return None if data is None else result_from_json(data)

    async def cancel(self, run_id: str) -> None:
        """Ask the run `run_id` to stop; whoever awaits it gets `stop_reason="cancelled"`.

        The steps under way finish and their results are recorded (the calls' real
        results); a call that has not started is answered as cancelled without running,
        no model request is sent after it, and a run waiting for `send_results` stops
        waiting. The run ends at once if it is waiting, else when its steps under way
        end. A run that no process executes stops when DBOS recovers it.

        `DBOS.cancel_workflow(run_id)` stops the workflow at once instead, but DBOS then
        records no step that ends after it: a call under way does its work and is still
        answered as cancelled.

        Raises:
            ConfigurationError: there is no run `run_id`.
        """
        if await status_row(run_id) is None:
            raise ConfigurationError(f"there is no run {run_id!r}")
        await DBOS.update_workflow_attributes_async(run_id, {STOP_ATTRIBUTE: True}, merge=True)
        await DBOS.send_async(run_id, STOP_MESSAGE, topic=results_topic(run_id))

    async def cancelled_result(self, run_id: str) -> RunResult[Any]:
        """The result of a cancelled run: its recorded steps replayed, `stop_reason="cancelled"`.

        Nothing is performed: the history is rebuilt from the recorded outputs and
        ends where they end, every `tool_use` answered (those without a recorded
        result as cancelled).
        """
        status = await DBOS.get_workflow_status_async(run_id)
        if status is None or status.input is None:
            raise ConfigurationError(f"no run {run_id!r} in DBOS")
        request = status.input["args"][0]
        steps = await DBOS.list_workflow_steps_async(run_id)
        names = {self.model_step_name, self.tool_step_name, "DBOS.recv"}
        recorded = deque(
            (s["function_name"], s["output"], s["error"])
            for s in sorted(steps, key=lambda s: s["function_id"])
            if s["function_name"] in names
        )
        stop = Stop()
        replay = Replay(self, recorded, stop)
        data = await Execution(self, request, replay, replay, None, stop).result(run_id)
        data["stop_reason"] = "cancelled"
        return self._decode(data, request["output_type"])

    # -- helpers

    def _decode(self, data: Mapping[str, Any], output_type: Any) -> RunResult[Any]:
        return result_from_json(data, self._output_type(output_type))

    def _output_type(self, output_type: Any) -> Any:
        return self.agent.output_type if output_type is None else output_type

    def _deps(self, value: Any) -> Any:
        return value if self.deps_factory is None else self.deps_factory(value)
