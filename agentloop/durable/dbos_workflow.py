"""The body and steps of a DBOS durable run's workflow (see `agentloop.durable.dbos`).

`DurableAgent` registers the workflow and its steps; what one execution of the workflow
does lives here: `Execution` drives the run through `Steps` (each effect a DBOS step) or,
for a run read back from its record, `Replay`; `Stop` ends it where it was asked to stop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn, Protocol

import anyio
from dbos import DBOS, WorkflowStatus

from agentloop.agent import Agent
from agentloop.calls import ToolCall, ToolDefinition, ToolResult
from agentloop.durable.records import result_to_json
from agentloop.durable.streams import RunPublisher, StepPublisher
from agentloop.effects import OnEvent, Send
from agentloop.errors import ConfigurationError, ResumeError
from agentloop.events import RunFinished
from agentloop.limits import UsageLimits
from agentloop.logs import get_logger
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.result import RunResult
from agentloop.resume import plan
from agentloop.run import Run

_log = get_logger()

STOP_ATTRIBUTE = "agentloop.stop"
"""The workflow attribute `cancel` sets, which the run's steps look at."""

STOP_MESSAGE = {"stop": True}
"""What `cancel` sends a run that waits for answers, instead of answers."""

NOT_SENT = {"agentloop": "stopped"}
"""A model step's record when the run was asked to stop before it: no request was sent."""


class DurableAgent(Protocol):
    """What a workflow's execution uses of its `agentloop.durable.dbos.DurableAgent`."""

    agent: Agent[Any, Any]
    model_step_name: str
    tool_step_name: str

    def _model_step(
        self, send: Send, round_: int, writer: Writer | None, sent: set[int]
    ) -> Awaitable[dict[str, Any]]: ...

    def _tool_step(
        self,
        run: Callable[[], Awaitable[ToolResult]],
        round_: int,
        writer: Writer | None,
        call: ToolCall,
        unknown: bool,
        check: StopCheck,
    ) -> Awaitable[dict[str, Any]]: ...

    def _output_type(self, output_type: Any) -> Any: ...

    def _deps(self, value: Any) -> Any: ...


class no_workflow_id:
    """No workflow id given: DBOS makes one."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


def results_topic(run_id: str) -> str:
    """The DBOS topic on which a waiting run gets its answers."""
    return f"agentloop.results:{run_id}"


def waiting_event(run_id: str) -> str:
    """The DBOS event in which a run says what it waits for."""
    return f"agentloop.waiting:{run_id}"


async def status_row(workflow_id: str | None = None) -> WorkflowStatus | None:
    """The status of the workflow `workflow_id` (this step's by default), or None.

    Read without the workflow's input (the history the run started with) or its output,
    which `DBOS.get_workflow_status` also loads and unpickles: a step needs neither, nor
    does a caller asking whether a run exists.
    """
    if workflow_id is None:
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None  # called in a step
    found = await DBOS.list_workflows_async(
        workflow_ids=[workflow_id], load_input=False, load_output=False
    )
    return found[0] if found else None


async def stop_requested() -> bool:
    """Whether `DurableAgent.cancel` asked the run of this step's workflow to stop."""
    status = await status_row()
    return status is not None and bool((status.attributes or {}).get(STOP_ATTRIBUTE))


class StopCheck:
    """One `stop_requested` read, shared by the steps that ask for it before it starts.

    The calls of a turn are dispatched one after the other before any of their steps
    runs, so they all join one check, which reads after the last of them was dispatched:
    it sees every request to stop that a read of each call's own would see.
    """

    def __init__(self) -> None:
        self.started = False
        """Whether a step asked for the answer: a call dispatched later needs a new check."""
        self._lock = anyio.Lock()
        self._stopped: bool | None = None

    async def stopped(self) -> bool:
        """Whether the run was asked to stop, read once for every step of this check."""
        self.started = True
        async with self._lock:
            if self._stopped is None:  # a read that failed is made again by the next step
                self._stopped = await stop_requested()
            return self._stopped


class Stop:
    """How the effects stop a run where its record ends or says it stopped (see `cancel`).

    The run is cancelled there, through `scope`, which its `Execution` runs in.
    """

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.run: Run[Any] | None = None
        """The run being driven (a resumed run is a new one)."""
        self.unsent = False
        """Whether the run stopped before sending the request of the round it began."""

    async def now(self, *, sent: bool = True) -> NoReturn:
        """Cancel the run here; `sent`: whether the request of this round was sent."""
        self.unsent = not sent
        self.scope.cancel()
        await anyio.sleep_forever()
        raise AssertionError("unreachable: the scope is cancelled")


def tool_names(request: ModelRequest) -> set[str]:
    """The names of the tools `request` offers (definitions of any kind)."""
    names = (t.name if isinstance(t, ToolDefinition) else t.get("name") for t in request.tools)
    return {name for name in names if isinstance(name, str)}


class Steps:
    """The effects of a run in a workflow: each one a DBOS step.

    When the run streams, each step publishes its own events, and `publisher` the loop's.
    """

    def __init__(
        self,
        durable: DurableAgent,
        run_id: str,
        streams: bool,
        output_type: Any,
        stop: Stop,
    ) -> None:
        self.durable = durable
        self.run_id = run_id
        self.stop = stop
        self.writer: Writer | None = None
        self.publisher: RunPublisher | None = None
        if streams:
            self.writer = Writer(run_id)
            self.publisher = RunPublisher(self.writer, durable._output_type(output_type))
        self.sent: set[int] = set()
        """The rounds whose request this process sent (not a recorded response)."""
        self.offered: set[str] = set()
        """The tools offered with the latest request."""
        self.recorded = False
        """Whether the latest response is a recorded one (this run is being recovered)."""
        self.check: StopCheck | None = None
        """The check for a stop the calls dispatched since its start share."""

    async def model(
        self,
        request: ModelRequest,
        round_: int,
        send: Send,
        stream: OnEvent | None,
    ) -> ModelResponse:
        """The model step's response: recorded, or sent and recorded now."""
        # The step streams to the run's stream, never to the turn: its calls start after
        # the response, as they do when the recorded response is replayed.
        writer = self.writer if stream is not None else None
        data = await self.durable._model_step(send, round_, writer, self.sent)
        self.offered = tool_names(request)
        self.recorded = round_ not in self.sent
        return await recorded_response(data, self.stop)

    async def tool(
        self,
        call: ToolCall,
        round_: int,
        run: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """The tool step's result: recorded, or run and recorded now."""
        if self.publisher is not None:
            self.publisher.stepped.add(call.id)
        unknown = (
            self.recorded
            and call.name not in self.offered
            and call.name not in self.durable.agent.registry
        )
        if self.check is None or self.check.started:
            self.check = StopCheck()
        # Calling the step takes its number at once, in the order the calls arrive.
        step = self.durable._tool_step(run, round_, self.writer, call, unknown, self.check)
        return ToolResult.from_json(await step)


async def recorded_response(data: dict[str, Any], stop: Stop) -> ModelResponse:
    """The response a model step recorded; the run stops if the step sent no request."""
    if data == NOT_SENT:
        await stop.now(sent=False)
    return ModelResponse.from_json(data)


def stream_key(run_id: str) -> str:
    """The key of a run's DBOS stream of events."""
    return f"agentloop.events:{run_id}"


class Writer:
    """Writes the items of a run's events to its DBOS stream, one write at a time.

    The parallel calls of a turn publish at once; one write at a time keeps them from
    competing for the stream's next offset (on Postgres, a conflict DBOS retries late).
    A writer serves one execution of the run's workflow (`Execution`).
    """

    def __init__(self, run_id: str) -> None:
        self.key = stream_key(run_id)
        self.lock = anyio.Lock()
        self._attempt: int | None = None

    async def __call__(self, item: dict[str, Any]) -> None:
        """Write one item to the stream."""
        async with self.lock:
            await DBOS.write_stream_async(self.key, item)

    async def publisher(self, round_: int, step: str) -> StepPublisher:
        """The publisher of a step's events (called in the step).

        Its attempt is the workflow's: how many times it was executed (recovered) so far.
        """
        if self._attempt is None:
            status = await status_row()
            self._attempt = (status.recovery_attempts if status is not None else None) or 1
        return StepPublisher(self, round_, step, self._attempt)


class Mailbox:
    """Where a waiting run says what it waits for, and gets the answers (DBOS events, messages)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def publish(self, waiting: dict[str, Any] | None) -> None:
        """Say what the run waits for (`None`: nothing)."""
        await DBOS.set_event_async(waiting_event(self.run_id), waiting)

    async def receive(self, seconds: float) -> Any:
        """The next answer, or `None` after `seconds`."""
        return await DBOS.recv_async(results_topic(self.run_id), timeout_seconds=seconds)


class Replay:
    """The effects and answers of a run read back from its recorded steps, in their order.

    When the record ends, the run is cancelled there.
    """

    def __init__(
        self,
        durable: DurableAgent,
        recorded: deque[tuple[str, Any, Exception | None]],
        stop: Stop,
    ) -> None:
        self.durable = durable
        self.recorded = recorded
        self.stop = stop

    async def _next(self, name: str) -> Any:
        if not self.recorded:
            await self.stop.now()
        recorded_name, output, error = self.recorded.popleft()
        if recorded_name != name:
            raise ConfigurationError(
                f"the recorded run does not replay: step {recorded_name} where {name} comes"
            )
        if error is not None:
            raise error
        return output

    async def model(
        self,
        request: ModelRequest,
        round_: int,
        send: Send,
        stream: OnEvent | None,
    ) -> ModelResponse:
        """The next recorded response."""
        return await recorded_response(await self._next(self.durable.model_step_name), self.stop)

    async def tool(
        self,
        call: ToolCall,
        round_: int,
        run: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """The next recorded result."""
        return ToolResult.from_json(await self._next(self.durable.tool_step_name))

    async def publish(self, waiting: dict[str, Any] | None) -> None:
        """Nothing to publish: the record is read, not written."""
        return None

    async def receive(self, seconds: float) -> Any:
        """The next recorded answer."""
        return await self._next("DBOS.recv")


@dataclass
class Execution:
    """One execution of a run's workflow body: the loop, then each wait and resumption."""

    durable: DurableAgent
    request: Mapping[str, Any]
    effects: Any
    mailbox: Any
    emit: RunPublisher | None
    stop: Stop

    async def result(self, run_id: str) -> dict[str, Any]:
        """Drive the run to its end, or to where it stops; its result as JSON values."""
        with self.stop.scope:
            return await self._drive(run_id)
        return await self._stopped(run_id)

    async def _drive(self, run_id: str) -> dict[str, Any]:
        durable, request = self.durable, self.request
        agent = durable.agent
        output_type = durable._output_type(request["output_type"])
        deps = durable._deps(request["deps"])
        limits = request["usage_limits"]
        result = await self._run(
            agent.start(
                history=request["messages"],
                deps=deps,
                external_tools=request["external_tools"],
                usage_limits=None if limits is None else UsageLimits(**limits),
                output_type=request["output_type"],
                **self._engine(run_id),
            )
        )
        wait = request["wait"]
        while wait is not None and result.state is not None:
            await self.mailbox.publish(result_to_json(result, output_type))
            answer = await self.mailbox.receive(wait)
            if answer is None:
                break
            if answer == STOP_MESSAGE:  # `cancel`: it ends as it paused
                result = replace(result, stop_reason="cancelled")
                break
            try:  # checked before the run is told it no longer waits
                plan(result.state, answer["decisions"], answer["results"], agent.registry)
            except ResumeError as exc:
                _log.warning("run.answer_refused", run_id=run_id, error=str(exc))
                continue
            await self.mailbox.publish(None)
            result = await self._run(
                agent.start(
                    state=result.state,
                    decisions=answer["decisions"],
                    results=answer["results"],
                    deps=deps,
                    **self._engine(run_id),
                )
            )
        if wait is not None:
            await self.mailbox.publish(None)
        if self.emit is not None:
            await DBOS.close_stream_async(stream_key(run_id))
        return result_to_json(result, output_type)

    def _engine(self, run_id: str) -> dict[str, Any]:
        """What `Agent.start` needs to run inside this workflow, as `run_id`."""
        return {
            "stream": self.emit is not None,
            "on_event": self.emit,
            "effects": self.effects,
            "run_id": run_id,
        }

    async def _run(self, run: Run[Any]) -> RunResult[Any]:
        self.stop.run = run
        async with run:
            pass
        return run.result

    async def _stopped(self, run_id: str) -> dict[str, Any]:
        """The result of the run as it stood where it was stopped, published if it streams."""
        run = self.stop.run
        assert run is not None
        # Its partial result; or, stopped between two runs of the loop (while it waited),
        # the paused one's.
        outcome = replace(run.result, stop_reason="cancelled")
        if self.stop.unsent:  # counted as it began; it is not a request the run made
            outcome = replace(outcome, rounds=outcome.rounds - 1)
        if self.emit is not None:
            await self.emit(RunFinished(outcome))
            await DBOS.close_stream_async(stream_key(run_id))
        return result_to_json(outcome, self.durable._output_type(self.request["output_type"]))
