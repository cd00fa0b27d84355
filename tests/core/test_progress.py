"""Progress of a running tool call: `ToolProgress` events of a streamed run, on both backends."""

from __future__ import annotations

import anyio
import pytest

from agentloop import Agent, ToolProgress, tool
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
