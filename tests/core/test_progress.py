"""Progress of a running tool call (`ToolProgress` events, on both backends), and events a
tool emits through its context (`RunContext.emit`)."""

from __future__ import annotations

import anyio
import pytest

from agentloop import (
    Agent,
    Event,
    RunContext,
    TextBlock,
    ToolLog,
    ToolProgress,
    ToolUserContent,
    tool,
)
from agentloop.progress import progress_reporter, report_progress
from agentloop.testing import ScriptedProvider, reply, tool_call


@tool
async def copy_files(count: int) -> str:
    """Copy `count` files, reporting each."""
    for done in range(1, count + 1):
        report_progress(done, count, f"copied {done}")
    return "copied"


async def stream_progress() -> tuple[list[ToolProgress], str]:
    script = [reply(tool_call("copy_files", {"count": 2}, id="t1")), reply("done")]
    agent = Agent(provider=ScriptedProvider(script), tools=[copy_files])
    async with agent.run_stream("go") as stream:
        events = [e async for e in stream if isinstance(e, ToolProgress)]
    assert stream.result is not None
    return events, stream.result.text


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_reports_become_stream_events(backend: str) -> None:
    events, text = anyio.run(stream_progress, backend=backend)
    assert text == "done"
    assert events == [
        ToolProgress(1, "t1", "copy_files", 1, 2, "copied 1"),
        ToolProgress(1, "t1", "copy_files", 2, 2, "copied 2"),
    ]


async def test_outside_a_streamed_run_a_report_goes_nowhere() -> None:
    assert progress_reporter() is None
    report_progress(1)  # no run: nothing to do, nothing raised
    script = [reply(tool_call("copy_files", {"count": 3})), reply("done")]
    result = await Agent(provider=ScriptedProvider(script), tools=[copy_files]).run("go")
    assert [c.output for c in result.tool_calls] == ["copied"]


@tool
async def show_chart(ctx: RunContext) -> str:
    """Show the user a chart, and tell the model it was shown."""
    chart = (TextBlock(text="a chart"),)
    await ctx.emit(ToolUserContent(ctx.round, ctx.tool_use_id, ctx.tool_name, chart))
    await ctx.emit(ToolLog(ctx.round, ctx.tool_use_id, ctx.tool_name, "info", "drawn"))
    return "shown"


async def test_a_tool_emits_events_to_the_stream_and_to_on_event() -> None:
    script = [reply(tool_call("show_chart", {}, id="t1")), reply("done")]
    agent = Agent(provider=ScriptedProvider(script), tools=[show_chart])
    called_back: list[Event] = []

    async def on_event(event: Event) -> None:
        called_back.append(event)

    async with agent.start("go", on_event=on_event) as run:
        streamed = [e async for e in run if isinstance(e, (ToolUserContent, ToolLog))]
    expected = [
        ToolUserContent(1, "t1", "show_chart", (TextBlock(text="a chart"),)),
        ToolLog(1, "t1", "show_chart", "info", "drawn"),
    ]
    assert streamed == expected
    assert [e for e in called_back if isinstance(e, (ToolUserContent, ToolLog))] == expected
    # The events precede the call's result, and the model sees only the result.
    kinds = [type(e).__name__ for e in called_back]
    assert kinds.index("ToolLog") < kinds.index("ToolResultEvent")
    assert [c.output for c in run.result.tool_calls] == ["shown"]
    # A context made by hand has no run behind it: the event goes nowhere.
    assert await show_chart(RunContext("run", 1)) == "shown"
