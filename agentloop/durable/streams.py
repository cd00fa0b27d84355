"""The events of a durable run, carried by its engine's stream to whoever reads them.

The engine's stream (a DBOS stream, a Temporal workflow stream) carries them from wherever
the run executes. A durable run is published as items of JSON values, in order:
`{"round": 2, "step": "model", "attempt": 1, "events": [...]}`. Who publishes what:

- **The workflow** publishes the loop's own events (`RunStarted`, `RequestStarted`,
  `ModelResponded`, `ToolCallReady`, `ApprovalRequested`, `RoundFinished`, `OutputReady`,
  `RunFinished`, and the results of calls answered without running), as step `"run"`,
  attempt 0. A replay of the workflow does not publish them twice: DBOS records each
  write of a workflow as one of its steps, Temporal rebuilds the stream with the workflow.
- **A model step** publishes the response's `ModelStreamEvent`s as they arrive (step
  `"model"`), and **a tool step** its call's `ToolProgress` and `ToolResultEvent` (step
  `"tool:<tool_use_id>"`). A step runs again when its worker died or it failed and is
  retried; each attempt publishes its own events under its own, larger, `attempt`.

`read_events` turns the items back into events: it drops what a superseded attempt still
publishes after the next one began, says `StepRestarted` where an attempt begins again,
and derives `TextDelta`, `ThinkingDelta`, `ToolCallStarted` and `ToolInputDelta` from each
`ModelStreamEvent`, as a plain streamed run does. A model step whose request a capability
sent again (`Retries`, `Fallback`) says `ResponseReplaced` before the response that
replaces the one it was streaming, as a plain streamed run does. What a durable stream
does not have: eager starts (every call starts after its response is whole, so
`ToolCallReady` comes after `ModelResponded`, with `eager=False`) and `PartialOutput`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, fields
from typing import Any, Generic, get_args

import anyio
from pydantic import TypeAdapter

from agentloop.durable.records import result_from_json, result_to_json
from agentloop.events import (
    Event,
    ModelResponded,
    ModelStreamEvent,
    OutputReady,
    PartialOutput,
    RequestStarted,
    ResponseReplaced,
    ResponseWatch,
    RoundFinished,
    RunFinished,
    RunStarted,
    StepRestarted,
    ToolResultEvent,
    ToolUserContent,
    friendly_event,
)
from agentloop.messages import ContentBlock
from agentloop.providers.base import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageStart,
    ModelResponse,
    StreamEvent,
)
from agentloop.result import OutputT, RunResult, Usage

__all__ = (
    "DurableStream",
    "RunPublisher",
    "StepPublisher",
    "event_from_json",
    "event_to_json",
    "read_events",
)

Write = Callable[[dict[str, Any]], Awaitable[None]]
"""Publishes one item to the run's stream."""

_EVENTS: dict[str, type[Any]] = {cls.__name__: cls for cls in get_args(Event)}
_BLOCK: TypeAdapter[ContentBlock] = TypeAdapter(ContentBlock)


# -- events as JSON values


def event_to_json(event: Event, output_type: Any = str) -> dict[str, Any]:
    """`event` as JSON values (`output_type`: the run's, for its output and result)."""
    if isinstance(event, ModelStreamEvent):
        return {
            "type": "ModelStreamEvent",
            "round": event.round,
            "event": _model_event(event.event),
        }
    if isinstance(event, ModelResponded):
        return {
            "type": "ModelResponded",
            "round": event.round,
            "response": event.response.to_json(),
        }
    if isinstance(event, RoundFinished):
        return {"type": "RoundFinished"} | asdict(event)
    if isinstance(event, RunFinished):
        return {"type": "RunFinished", "result": result_to_json(event.result, output_type)}
    if isinstance(event, (OutputReady, PartialOutput)):
        output = _adapter(output_type).dump_python(event.output, mode="json")
        return {"type": type(event).__name__, "round": event.round, "output": output}
    if isinstance(event, ToolUserContent):
        content = [block.to_wire() for block in event.content]
        named = {f.name: getattr(event, f.name) for f in fields(event)}
        return {"type": "ToolUserContent"} | named | {"content": content}
    return {"type": type(event).__name__} | {f.name: getattr(event, f.name) for f in fields(event)}


def event_from_json(data: Mapping[str, Any], output_type: Any = str) -> Event:
    """The event `event_to_json` wrote.

    Raises:
        ValueError: `data` is not an event `event_to_json` writes.
    """
    values = {k: v for k, v in data.items() if k != "type"}
    kind = _EVENTS.get(str(data.get("type")))
    if kind is None:
        raise ValueError(f"not a recorded event: {str(data)[:200]}")
    if kind is ModelStreamEvent:
        return ModelStreamEvent(values["round"], _model_event_from(values["event"]))
    if kind is ModelResponded:
        return ModelResponded(values["round"], ModelResponse.from_json(values["response"]))
    if kind is RoundFinished:
        return RoundFinished(values["round"], values["stop_reason"], Usage(**values["usage"]))
    if kind is RunFinished:
        return RunFinished(result_from_json(values["result"], output_type))
    if kind is OutputReady:
        return OutputReady(values["round"], _adapter(output_type).validate_python(values["output"]))
    if kind is PartialOutput:
        adapter = _adapter(output_type)
        output = adapter.validate_python(values["output"], experimental_allow_partial=True)
        return PartialOutput(values["round"], output)
    if kind is ToolUserContent:
        content = tuple(_BLOCK.validate_python(b) for b in values.pop("content"))
        return ToolUserContent(**values, content=content)
    event: Event = kind(**values)
    return event


def _model_event(event: StreamEvent) -> dict[str, Any]:
    if isinstance(event, MessageStart):
        return {"type": "message_start", "message": dict(event.message)} | {
            "headers": dict(event.headers)
        }
    if isinstance(event, BlockDelta):
        return {"type": "delta", "index": event.index, "kind": event.kind, "value": event.value}
    if isinstance(event, BlockStart):
        return {"type": "block_start", "index": event.index, "block": event.block.to_wire()}
    return {
        "type": "block_stop",
        "index": event.index,
        "block": event.block.to_wire(),
        "complete": event.complete,
    }


def _model_event_from(data: Mapping[str, Any]) -> StreamEvent:
    kind = data["type"]
    if kind == "message_start":
        return MessageStart(data["message"], data["headers"])
    if kind == "delta":
        return BlockDelta(data["index"], data["kind"], data["value"])
    block = _BLOCK.validate_python(data["block"])
    if kind == "block_start":
        return BlockStart(data["index"], block)
    return BlockStop(data["index"], block, data["complete"])


def _adapter(output_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(str if output_type is None else output_type)


# -- publishing


class RunPublisher:
    """The `emit` of a durable run's loop: publishes the workflow's own events.

    The results of calls performed by a step are the step's to publish (`StepPublisher`):
    the engine's effects add each such call's id to `stepped`, and their `ToolResultEvent`
    is left out here. The loop's own events happen one after another in the workflow's
    main task, so a replay meets them in the same order.
    """

    def __init__(self, write: Write, output_type: Any = str, *, continued: bool = False) -> None:
        """Publish with `write`; outputs and results are of `output_type`.

        `continued`: the run goes on from an earlier workflow run (Temporal's continue-as-new),
        which published its `RunStarted`, and the `RequestStarted` of the request it left
        to this one to send: neither is published again.
        """
        self.write = write
        self.output_type = output_type
        self.continued = continued
        self.stepped: set[str] = set()
        """The ids of the calls whose steps publish their results."""

    async def __call__(self, event: Event) -> None:
        """Publish `event` (unless its step does)."""
        if isinstance(event, ToolResultEvent) and event.tool_use_id in self.stepped:
            return
        if self.continued and isinstance(event, RunStarted):
            return
        if self.continued and isinstance(event, RequestStarted):
            self.continued = False  # the requests after this one are this run's own
            return
        data = event_to_json(event, self.output_type)
        await self.write(
            {"round": getattr(event, "round", 0), "step": "run", "attempt": 0} | {"events": [data]}
        )


class StepPublisher:
    """Publishes the events of one attempt of one step, in order, from a task of its own.

    ```python
    async with StepPublisher(write, round_, "model", attempt) as publisher:
        response = await send(publisher.model_event)
    ```

    Events wait in a buffer while an earlier write is under way, and go out together in the
    next: the step never waits for the stream, and a slow stream gets fewer, larger items.
    Leaving the block waits until everything is written.
    """

    def __init__(self, write: Write, round_: int, step: str, attempt: int) -> None:
        """Events of `step` (`"model"`, `"tool:<id>"`) of round `round_`, attempt `attempt`."""
        self.write = write
        self.round = round_
        self.step = step
        self.attempt = attempt
        self._buffer: list[dict[str, Any]] = []
        self._ready = anyio.Event()
        self._closed = False
        self._group: anyio.abc.TaskGroup | None = None
        self._watch = ResponseWatch(round_)

    def put(self, event: Event) -> None:
        """Publish `event` (a `ToolProgress` reporter may call this from any task)."""
        self._buffer.append(event_to_json(event))
        self._ready.set()

    async def model_event(self, event: StreamEvent) -> None:
        """Publish a streamed model event (an `OnEvent` for `send`).

        A capability that sends the request again within the step (`Retries`,
        `Fallback`) starts another response: `ResponseReplaced` says so first.
        """
        replaced = self._watch.replaced(event)
        if replaced is not None:
            self.put(replaced)
        self.put(ModelStreamEvent(self.round, event))

    async def __aenter__(self) -> StepPublisher:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._write_all)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._group is not None
        self._closed = True
        self._ready.set()
        # Not given the block's error: the task group would wrap it in an ExceptionGroup,
        # and the step's own error (a `ProviderError`, ...) is what its run raises.
        await self._group.__aexit__(None, None, None)

    async def _write_all(self) -> None:
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            batch, self._buffer = self._buffer, []
            if batch:
                item = {"round": self.round, "step": self.step, "attempt": self.attempt}
                await self.write(item | {"events": batch})
            if self._closed and not self._buffer:
                return


# -- reading


async def read_events(
    items: AsyncIterator[Mapping[str, Any]], output_type: Any = str
) -> AsyncGenerator[Event, None]:
    """The events of a durable run's stream `items` (see the module), in order.

    An item of an attempt older than one already seen for its step is dropped; the first
    item of a newer attempt is preceded by `StepRestarted`.
    """
    latest: dict[tuple[int, str], int] = {}
    tool_ids: dict[int, dict[int, str]] = {}  # round -> (block index -> tool_use id)
    async for item in items:
        round_, step, attempt = item["round"], item["step"], item["attempt"]
        seen = latest.get((round_, step))
        if seen is not None and attempt < seen:
            continue
        latest[(round_, step)] = attempt
        if seen is not None and attempt > seen:
            if step == "model":
                tool_ids[round_] = {}  # the response streams again from its first block
            call = None if step == "model" else step.removeprefix("tool:")
            yield StepRestarted(round_, call, attempt)
        for data in item["events"]:
            event = event_from_json(data, output_type)
            yield event
            if isinstance(event, ResponseReplaced):
                tool_ids[round_] = {}  # another response streams from its first block
            if isinstance(event, ModelStreamEvent):
                friendly = friendly_event(event.round, event.event, tool_ids.setdefault(round_, {}))
                if friendly is not None:
                    yield friendly


class DurableStream(Generic[OutputT]):
    """The events of a durable run as they are published, then its result.

    Iterate it for events (`read_events`); after the last one, `result` holds the run's
    `RunResult`. If the run failed, iterating raises the failure after its events.
    """

    def __init__(
        self,
        run_id: str,
        events: AsyncIterator[Event],
        result: Callable[[], Awaitable[RunResult[Any]]],
    ) -> None:
        """The run `run_id`: its `events`, then `result()`."""
        self.run_id = run_id
        """The run's id."""
        self._events = events
        self._get_result = result
        self._result: RunResult[Any] | None = None

    @property
    def result(self) -> RunResult[OutputT] | None:
        """The run's result once the events are over, else None."""
        return self._result

    def __aiter__(self) -> DurableStream[OutputT]:
        return self

    async def __anext__(self) -> Event:
        if self._result is not None:
            raise StopAsyncIteration
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            self._result = await self._get_result()
            raise

    def __repr__(self) -> str:
        return f"DurableStream(run_id={self.run_id!r}, done={self._result is not None})"
