"""Inside the workflow of a `TemporalAgent`'s runs: the agent's loop over activities.

`run_workflow` is the workflow's body: the agent's own loop (a `Run` from `Agent.start`,
driven as always) with `TemporalEffects`, whose two effects are the activities `model:{round}`
and `tool:{round}:{tool_use_id}`; then its waits for answers (the updates `answers` and
`external_results`), and its continuations as a new workflow run when the history grows
large. A turn's calls run in `WorkflowTasks`, plain asyncio tasks. Everything here must
decide the same way on a replay: it works from the recorded activity results only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState
from temporalio.converter import value_to_type
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState

from agentloop import errors
from agentloop.agent import Agent
from agentloop.approval import Approve, Decision, Deny
from agentloop.calls import ToolCall, ToolResult
from agentloop.durable.records import result_to_json
from agentloop.durable.streams import RunPublisher
from agentloop.durable.temporal.carry import carried_calls, carried_result, restored_calls
from agentloop.durable.temporal.requests import SentRequest, carried_request, request_input
from agentloop.durable.temporal.results import ERROR_FIELDS, error_of
from agentloop.effects import OnEvent, Send
from agentloop.errors import AgentloopError, ProviderError
from agentloop.messages import parse_history
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.result import RunResult, Usage
from agentloop.resume import plan
from agentloop.run import Run
from agentloop.state import PausedRun


class WorkflowOwner(Protocol):
    """What the workflow reads from the `TemporalAgent` whose runs it runs."""

    agent: Agent[Any, Any]
    name: str
    deps: Any
    workflow_name: str
    model_activity_name: str
    tool_activity_name: str
    model_timeout: timedelta
    tool_timeout: timedelta
    heartbeat_timeout: timedelta
    retry_policy: RetryPolicy

    def effects(self, publisher: RunPublisher | None = None) -> TemporalEffects:
        """A run's effects in the workflow (`publisher`: its events')."""
        ...

    def continue_now(self) -> bool:
        """Whether the workflow should continue as a new run before its next request."""
        ...


__all__ = (
    "TOPIC",
    "AgentWorkflow",
    "TemporalEffects",
    "WorkflowOwner",
    "WorkflowTasks",
    "decision_from_json",
    "decision_to_json",
    "run_workflow",
    "workflow_class",
)

TOPIC = "agentloop"
"""The topic of a run's events in its workflow's stream."""


async def run_workflow(
    durable: WorkflowOwner, flow: AgentWorkflow, data: dict[str, Any]
) -> dict[str, Any]:
    """The workflow's body: the loop, its waits for external results, its continuations."""
    run_id = workflow.info().workflow_id
    state = flow.state
    output_type = durable.agent.output_type
    emit = None
    if data.get("stream"):
        emit = flow.publisher(output_type, continued="carry" in data)
    begin = _beginning(data, run_id)
    # Each model request builds on the workflow run's last one, the first on the messages
    # the run carried in, across the waits for answers too (see `requests`).
    sent = carried_request(data)
    run: Run[Any] | None = None
    try:
        while True:
            effects = durable.effects(emit)
            effects.sent = sent
            run = durable.agent.start(
                **begin,
                deps=durable.deps,
                stream=emit is not None,
                on_event=emit,
                effects=effects,
                run_id=run_id,
            )
            try:
                async with run:
                    pass
            except _ContinueAsNew:
                carry = _carry(run.result, data)
                stream = None if emit is None else await flow.close_stream()
                workflow.continue_as_new(
                    {"carry": carry, "wait_for_external": data.get("wait_for_external")}
                    | {"stream": data.get("stream", False), "stream_state": stream}
                )
            result = run.result
            sent = effects.sent
            wait = data.get("wait_for_external")
            if result.state is None or not wait:
                return _returned(result, output_type)
            state.pending = {p["id"] for p in result.pending} | {
                a.tool_use_id for a in result.approvals
            }
            state.paused = result.state
            state.waiting = result_to_json(result, output_type)
            state.answers = None
            try:
                await workflow.wait_condition(
                    lambda: state.answers is not None, timeout=timedelta(seconds=wait)
                )
            except asyncio.TimeoutError:
                return _returned(result, output_type)
            state.pending = state.waiting = None
            assert state.answers is not None
            results, decisions = state.answers
            begin = {"state": result.state, "decisions": decisions, "results": results}
    except asyncio.CancelledError:
        if run is None or not run.done:
            raise
        # Cancelled mid-turn (its calls answered as cancelled), or while it waited for
        # answers: then it ends as it paused, its state kept for `Agent.resume`.
        cancelled = replace(run.result, stop_reason="cancelled")
        return _returned(cancelled, output_type)
    except AgentloopError as exc:
        partial = None if exc.result is None else _returned(exc.result, output_type)
        fields = {name: getattr(exc, name) for name in ERROR_FIELDS if hasattr(exc, name)}
        raise ApplicationError(
            str(exc),
            {"result": partial, "fields": fields},
            type=type(exc).__name__,
            non_retryable=True,
        ) from exc


def _beginning(data: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What the workflow's first run starts from (`Agent.start`'s arguments).

    A workflow continued as new starts from the state the last one carried over: a run
    between two rounds.
    """
    carry = data.get("carry")
    if carry is None:
        return {
            "prompt": data.get("prompt"),
            "history": data.get("history"),
            "external_tools": data.get("external_tools", ()),
        }
    # A run between two rounds: no turn waits, so it is given as a `PausedRun` with no
    # pending calls, which the run continues as it stands.
    between_rounds = PausedRun(
        run_id=run_id,
        rounds=carry["rounds"],
        usage=Usage(**carry["usage"]),
        messages=parse_history(carry["messages"]),
        finished=[],
        pending=[],
        tool_calls=restored_calls(carry["messages"], carry["tool_calls"]),
        container=carry["container"],
        external=carry["external"],
        cost=carry["cost"],
        models=carry.get("models", ()),
    )
    return {"state": between_rounds}


class TemporalEffects:
    """A run's effects inside its workflow: each one an activity (see `agentloop.effects`)."""

    def __init__(self, durable: WorkflowOwner, publisher: RunPublisher | None = None) -> None:
        """Effects of `durable`'s workflow; `publisher` publishes the events of a streamed run."""
        self.durable = durable
        self.publisher = publisher
        self.requests = 0
        """Model requests made through these effects (in this workflow run)."""
        self.sent: SentRequest | None = None
        """The last of them, which the next one's input builds on (`request_input`)."""

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
            whole = request.to_dict()
            given = request_input(whole, self.sent)
            self.sent = (f"model:{round_}", whole["messages"])
            data = await workflow.execute_activity(
                durable.model_activity_name,
                {"run_id": workflow.info().workflow_id, "round": round_, "stream": streams} | given,
                activity_id=f"model:{round_}",
                start_to_close_timeout=durable.model_timeout,
                heartbeat_timeout=durable.heartbeat_timeout,
                retry_policy=durable.retry_policy,
            )
        except ActivityError as exc:
            raise _model_error(exc) from exc
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
        handle = workflow.start_activity(
            durable.tool_activity_name,
            {"run_id": run_id, "round": round_, "id": call.id, "name": call.name}
            | {"input": call.input, "stream": self.publisher is not None},
            activity_id=f"tool:{round_}:{call.id}",
            start_to_close_timeout=durable.tool_timeout,
            heartbeat_timeout=durable.heartbeat_timeout,
            retry_policy=durable.retry_policy,
            # Asked to stop, the activity is waited for: it may finish all the same.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            try:
                # Shielded: the run's cancellation reaches the activity only as below.
                data = await asyncio.shield(handle)
            except asyncio.CancelledError:
                # The run is cancelled. A result that came in with the cancellation stands:
                # let what has come in be processed, stop the activity only if it still
                # runs, and take how it ends (a call that finishes meanwhile keeps its
                # result; it is answered as cancelled only if the cancellation stopped it).
                await workflow.wait_condition(lambda: True)
                if not handle.done():
                    handle.cancel()
                data = await handle
        except ActivityError as exc:
            if (
                isinstance(exc.cause, CancelledError)
                or exc.retry_state == RetryState.CANCEL_REQUESTED
            ):
                raise asyncio.CancelledError from exc  # stopped: the call has no result
            ended = _run_error(exc)
            if ended is not None:
                raise ended from exc  # a capability ended the run inside the activity
            raise
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

    durable: WorkflowOwner

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
        """The run: see `run_workflow` (each subclass marks it `workflow.run`)."""
        return await run_workflow(self.durable, self, data)

    def publisher(self, output_type: Any, *, continued: bool) -> RunPublisher:
        """The publisher of the run's own events, to the workflow's stream."""
        topic = self.stream.topic(TOPIC)

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


def workflow_class(durable: WorkflowOwner) -> type[AgentWorkflow]:
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


def _returned(result: RunResult[Any], output_type: Any) -> dict[str, Any]:
    """The workflow's result for the run's `result` (`result_of` reads it back)."""
    return carried_result(result_to_json(result, output_type))


def _carry(result: RunResult[Any], data: dict[str, Any]) -> dict[str, Any]:
    """What the next workflow run needs to go on from `result` (a round boundary)."""
    return {
        "messages": result.messages,
        "rounds": result.rounds - 1,  # the round about to start has not been sent
        "usage": asdict(result.usage),
        "tool_calls": carried_calls(result.messages, result.tool_calls),
        "container": result.container,
        "external": data["carry"]["external"] if "carry" in data else data["external_tools"],
        "cost": result.cost,
        "models": result.models,
    }


def _run_error(exc: ActivityError) -> AgentloopError | None:
    """The agentloop error, other than a provider's, a capability raised in the activity."""
    cause = exc.cause
    if not isinstance(cause, ApplicationError):
        return None
    error = error_of(cause)
    return None if isinstance(error, ProviderError) else error


def _model_error(exc: ActivityError) -> AgentloopError:
    """The error a failed model activity stands for, as the loop knows it.

    A provider's, or the agentloop error a capability ended the run with.
    """
    ended = _run_error(exc)
    if ended is not None:
        return ended
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
