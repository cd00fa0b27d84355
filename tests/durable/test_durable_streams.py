"""A durable run's events: published through its engine's stream, read back as events.

`agentloop.durable.streams` on its own (every event through JSON; a superseded attempt
dropped), then DBOS: `run_stream` beside a plain `Agent.run_stream`, a second reader
attaching, a failed run, and a process killed while the model streams, whose run another
process recovers: the reader is told the model's step starts again, and the rest equals
an uninterrupted run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import _durable_app as app
import anyio
import pytest

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

from _dbos import child
from _events import STREAMED, around_the_restart, by_kind, comparable, without_eager
from dbos import DBOS
from pydantic import BaseModel

from agentloop import Agent, AnthropicProvider, RunContext, tool
from agentloop.durable.dbos import DurableAgent
from agentloop.durable.streams import event_from_json, event_to_json, read_events
from agentloop.errors import BadRequestError, ConfigurationError, ToolCallFailed
from agentloop.events import (
    ApprovalRequested,
    Event,
    ModelResponded,
    ModelStreamEvent,
    OutputReady,
    PartialOutput,
    RequestStarted,
    ResponseReplaced,
    RoundFinished,
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
    ToolUserContent,
)
from agentloop.messages import TextBlock, ToolUseBlock
from agentloop.progress import report_progress
from agentloop.providers.base import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageStart,
    ModelResponse,
)
from agentloop.result import Usage
from agentloop.testing import (
    Fault,
    MessagesServer,
    ScriptedProvider,
    SteppedProvider,
    reply,
    tool_call,
)

pytestmark = pytest.mark.durable


class Verdict(BaseModel):
    city: str
    warm: bool


# -- the stream's items, without an engine


async def test_every_event_comes_back_equal_through_json() -> None:
    typed = await Agent(
        provider=ScriptedProvider([reply(output={"city": "Rome", "warm": True})]),
        output_type=Verdict,
    ).run("Rome?")
    use = ToolUseBlock(id="toolu_1", name="add", input={"a": 1})
    response = ModelResponse([TextBlock(text="hi"), use], "tool_use", Usage(3, 4), id="msg_1")
    events: list[Event] = [
        RunStarted("run-1"),
        RequestStarted(1),
        TextDelta(1, 0, "hi"),
        ThinkingDelta(1, 0, "hmm"),
        ToolCallStarted(1, 1, "toolu_1", "add"),
        ToolInputDelta(1, 1, "toolu_1", '{"a": '),
        ToolCallReady(1, "toolu_1", "add", {"a": 1}, False),
        ApprovalRequested(1, "toolu_2", "pay", {"sum": 3}, "it pays"),
        ToolProgress(1, "toolu_1", "add", 0.5, 1.0, "half"),
        ToolUserContent(1, "toolu_1", "add", (TextBlock(text="for you"),)),
        ToolLog(1, "toolu_1", "add", "warning", {"disk": "full"}, "db", "mcp:files"),
        ToolResultEvent(1, "toolu_1", "add", False, "2", 0.01),
        ModelStreamEvent(1, MessageStart({"id": "msg_1", "usage": {}}, {"request-id": "r"})),
        ResponseReplaced(1, 2),
        ModelStreamEvent(1, BlockStart(1, use)),
        ModelStreamEvent(1, BlockDelta(0, "text", "hi")),
        ModelStreamEvent(1, BlockStop(1, use, complete=False)),
        ModelResponded(1, response),
        RoundFinished(1, "tool_use", Usage(3, 4)),
        PartialOutput(1, Verdict(city="Ro", warm=False)),
        StepRestarted(1, None, 2),
        StepRestarted(1, "toolu_1", 3),
        RunFinished(typed),
    ]
    for event in events:
        data = json.loads(json.dumps(event_to_json(event, Verdict)))
        assert event_from_json(data, Verdict) == event
    ready = OutputReady(1, Verdict(city="Rome", warm=True))
    assert event_from_json(json.loads(json.dumps(event_to_json(ready, Verdict))), Verdict) == ready
    with pytest.raises(ValueError, match="not a recorded event"):
        event_from_json({"type": "Nothing"})


def _item(round_: int, step: str, attempt: int, *events: Event) -> dict[str, Any]:
    return {
        "round": round_,
        "step": step,
        "attempt": attempt,
        "events": [event_to_json(e) for e in events],
    }


async def _read(items: list[dict[str, Any]]) -> list[Event]:
    async def produce() -> AsyncIterator[Mapping[str, Any]]:
        for item in items:
            yield item

    return [event async for event in read_events(produce())]


async def test_a_superseded_attempt_is_dropped_and_the_restart_said() -> None:
    use = ToolUseBlock(id="toolu_1", name="add", input={})
    start = ModelStreamEvent(1, BlockStart(0, TextBlock(text="")))
    tool_start = ModelStreamEvent(1, BlockStart(1, use))
    events = await _read(
        [
            _item(1, "run", 0, RequestStarted(1)),
            _item(1, "model", 1, start, ModelStreamEvent(1, BlockDelta(0, "text", "Hel"))),
            _item(1, "model", 2, start, ModelStreamEvent(1, BlockDelta(0, "text", "Hello"))),
            # The first attempt's worker was not dead after all: what it still writes is void.
            _item(1, "model", 1, ModelStreamEvent(1, BlockDelta(0, "text", "p!"))),
            _item(1, "model", 2, tool_start, ModelStreamEvent(1, BlockDelta(1, "input_json", "{"))),
            _item(1, "tool:toolu_1", 1, ToolProgress(1, "toolu_1", "add", 1.0)),
            _item(1, "tool:toolu_1", 2, ToolResultEvent(1, "toolu_1", "add", False, "2", 0.0)),
        ]
    )
    friendly = [e for e in events if not isinstance(e, ModelStreamEvent)]
    assert friendly == [
        RequestStarted(1),
        TextDelta(1, 0, "Hel"),
        StepRestarted(1, None, 2),
        TextDelta(1, 0, "Hello"),
        ToolCallStarted(1, 1, "toolu_1", "add"),
        ToolInputDelta(1, 1, "toolu_1", "{"),
        ToolProgress(1, "toolu_1", "add", 1.0),
        StepRestarted(1, "toolu_1", 2),
        ToolResultEvent(1, "toolu_1", "add", False, "2", 0.0),
    ]


# -- DBOS


@tool
async def measure(ctx: RunContext[dict[str, str]], item: str) -> str:
    """Measure an item, saying how far it got."""
    report_progress(1, 2, f"measuring {item}")
    report_progress(2, 2)
    await ctx.emit(ToolLog(ctx.round, ctx.tool_use_id, ctx.tool_name, "info", f"measured {item}"))
    return f"{item} is 3 m"


def _measuring(request: dict[str, Any]) -> dict[str, Any]:
    rounds = sum(1 for m in request["messages"] if m["role"] == "assistant")
    if rounds == 0:
        calls = [tool_call("measure", {"item": i}, id=f"toolu_{i}") for i in "ab"]
        thought = {"type": "thinking", "thinking": "Two items.", "signature": "c2ln"}
        return reply(thought, "Measuring both.", *calls)
    return reply("Both are 3 m.")


def _agent(server: MessagesServer) -> Agent:
    return Agent(provider=AnthropicProvider(server.client()), tools=[measure], name="measurer")


async def test_a_streamed_durable_run_publishes_a_plain_run_s_events(
    tmp_path: Path, serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    durable = DurableAgent(_agent(serve(_measuring)))
    launch()
    async with _agent(serve(_measuring)).run_stream("Measure a and b.") as plain:
        expected = [event async for event in plain]
    async with durable.run_stream("Measure a and b.", run_id="stream-1") as stream:
        assert stream.run_id == "stream-1"
        events = [event async for event in stream]
    assert stream.result is not None and plain.result is not None
    assert stream.result.messages == plain.result.messages
    assert stream.result.usage == plain.result.usage and stream.result.text == "Both are 3 m."
    assert by_kind(events) == by_kind(without_eager(expected))
    # In their order: the run, each request, its response streamed, its calls, the end.
    assert isinstance(events[0], RunStarted) and events[0].run_id == "stream-1"
    assert isinstance(events[-1], RunFinished) and events[-1].result == stream.result
    assert [comparable(e) for e in events if isinstance(e, STREAMED)] == [
        comparable(e) for e in expected if isinstance(e, STREAMED)
    ]
    kinds = [type(e).__name__ for e in events if not isinstance(e, STREAMED)]
    assert kinds[:4] == ["RunStarted", "RequestStarted", "ModelResponded", "ToolCallReady"]
    first_round = kinds[kinds.index("ToolCallReady") + 2 : kinds.index("RoundFinished")]
    assert sorted(first_round) == ["ToolLog"] * 2 + ["ToolProgress"] * 4 + ["ToolResultEvent"] * 2
    progress = [e for e in events if isinstance(e, ToolProgress) and e.tool_use_id == "toolu_a"]
    assert [(p.progress, p.message) for p in progress] == [(1, "measuring a"), (2, None)]

    # Anyone may read the run's events again, from the first, by its id.
    async with durable.run_stream(run_id="stream-1") as again:
        assert [event async for event in again] == events
    assert again.result == stream.result
    # What DBOS recorded: the steps, and each write of the workflow's own events.
    steps = [s["function_name"] for s in await DBOS.list_workflow_steps_async("stream-1")]
    assert steps.count("agentloop.measurer.model") == 2
    assert steps.count("agentloop.measurer.tool") == 2


async def test_a_failed_run_s_events_end_with_its_error(launch: Callable[[], None]) -> None:
    @tool
    async def explode(item: str) -> str:
        """Fail."""
        raise RuntimeError(f"no {item}")

    provider = ScriptedProvider([reply("Trying.", tool_call("explode", {"item": "x"}))])
    agent = Agent(provider=provider, tools=[explode], name="failing", on_tool_error="stop")
    durable = DurableAgent(agent)
    launch()
    seen: list[Event] = []
    async with durable.run_stream("Go.", run_id="fail-1") as stream:
        with pytest.raises(ToolCallFailed):
            async for event in stream:
                seen.append(event)
    assert [type(e).__name__ for e in seen][:2] == ["RunStarted", "RequestStarted"]
    assert any(isinstance(e, ToolResultEvent) and e.is_error for e in seen)


async def test_a_failed_model_request_s_error_is_the_run_s_as_it_is(
    serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve([Fault.http_error(400, "invalid_request_error", "not this")])
    durable = DurableAgent(Agent(provider=AnthropicProvider(server.client()), name="refused"))
    launch()
    seen: list[Event] = []
    async with durable.run_stream("Go.", run_id="refused-1") as stream:
        # The step's own error, not an ExceptionGroup around it.
        with pytest.raises(BadRequestError, match="not this"):
            async for event in stream:
                seen.append(event)
    assert [type(e).__name__ for e in seen] == ["RunStarted", "RequestStarted"]


async def test_run_stream_refuses_to_start_inside_a_workflow(launch: Callable[[], None]) -> None:
    durable = DurableAgent(Agent(provider=ScriptedProvider([reply("hi")]), name="inner"))

    @DBOS.workflow(name="tests.streams.outer")
    async def outer() -> str:
        try:
            async with durable.run_stream("hi"):
                return "started"
        except ConfigurationError as exc:
            return str(exc)

    launch()
    handle = await DBOS.start_workflow_async(outer)
    assert "outside" in await handle.get_result()
    with pytest.raises(ConfigurationError):
        async with durable.run_stream(run_id="no-such-run"):
            pass


async def test_a_process_killed_while_the_model_streams_leaves_a_restart_in_the_events(
    tmp_path: Path,
    database: str,
    serve: Callable[..., MessagesServer],
    launch: Callable[[], None],
) -> None:
    # The first process reads its run's events and dies at the first delta of round 1.
    crashed = await child(database, "kill-1", tmp_path, until="DELTA", DURABLE_STREAM="1")
    assert "DELTA" in crashed and "RESULT" not in crashed
    # This process recovers the run (DBOS.launch) and reads its events from the first.
    durable = DurableAgent(app.make_agent(serve(app.paced_script)))
    launch()
    async with durable.run_stream(run_id="kill-1") as stream:
        events = [event async for event in stream]
    before, after = around_the_restart(events)
    assert any(isinstance(e, TextDelta) for e in before)  # what the dead process streamed
    # From the restart on, the events are those of a run that never stopped.
    plain_deps = {"ledger": str(tmp_path / "plain.jsonl")}
    async with app.make_agent(serve(app.script)).run_stream(
        "Record a and b.", deps=plain_deps
    ) as plain:
        expected = without_eager([event async for event in plain])
    assert by_kind(before[:2] + after) == by_kind(expected)
    assert stream.result is not None and plain.result is not None
    assert stream.result.messages == plain.result.messages
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in ledger) == ["kill-1:toolu_a", "kill-1:toolu_b"]


async def test_deltas_reach_the_reader_while_the_model_still_writes(
    launch: Callable[[], None],
) -> None:
    """The model's step publishes as it streams: the reader sees a delta, then it goes on."""
    read_first = anyio.Event()

    async def hold(n: int, event: Any) -> None:
        if isinstance(event, BlockDelta):  # after the first delta: wait for the reader
            with anyio.fail_after(10):
                await read_first.wait()

    provider = SteppedProvider([reply("One, two, three.")], hold)
    durable = DurableAgent(Agent(provider=provider, name="held"))
    launch()
    deltas: list[str] = []
    async with durable.run_stream("Count.", run_id="held-1") as stream:
        async for event in stream:
            if isinstance(event, TextDelta):
                deltas.append(event.text)
                read_first.set()
    assert "".join(deltas) == "One, two, three."
    assert stream.result is not None and stream.result.text == "One, two, three."
