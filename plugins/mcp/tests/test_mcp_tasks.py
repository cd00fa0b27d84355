"""Tool calls a server runs as tasks (`tasks_server.py`): polled until done, cancelled with the call."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from agentloop import Agent, ToolError
from agentloop.testing import ScriptedProvider, reply, tool_call

from agentloop_mcp import MCPServer, MCPToolSource

TASKS_SERVER = Path(__file__).with_name("tasks_server.py")


def jobs(**options: object) -> MCPServer:
    return MCPServer.stdio(sys.executable, [str(TASKS_SERVER)], name="jobs", **options)  # type: ignore[arg-type]


async def test_a_task_is_polled_at_the_servers_interval_until_its_result() -> None:
    async with MCPToolSource([jobs()]) as source:
        script = [reply(tool_call("report", {"topic": "sales"}, id="t1")), reply("done")]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        result = await agent.run("Report on sales")
        [call] = result.tool_calls
        assert (call.output, call.is_error) == ("report on sales after 2 polls", False)
        tools = {t.name: t for t in source.tools()}
        # The server asked for 200 ms between polls (pollIntervalMs); the client waits that.
        gaps = [float(g) for g in (await tools["poll_gaps"](task_id="report-1")).split(",")]
        assert len(gaps) == 1 and gaps[0] >= 0.15


async def test_a_failed_task_is_an_error_the_model_reads() -> None:
    async with MCPToolSource([jobs()]) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError) as failed:
            await tools["broken"]()
        assert str(failed.value) == (
            "'broken' ran as a task, which failed: the disk is full (code -32000)"
        )


async def test_cancelling_the_call_cancels_its_task() -> None:
    async with MCPToolSource([jobs()]) as source:
        tools = {t.name: t for t in source.tools()}
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: tools["stuck"](tag="a"))
            assert await tools["wait_started"](count=1) == "stuck-1"
            group.cancel_scope.cancel()
        assert await tools["wait_cancelled"](count=1) == "stuck-1"
        assert await tools["report"](topic="still here") == "report on still here after 2 polls"


async def test_a_call_that_times_out_cancels_its_task() -> None:
    async with MCPToolSource([jobs()]) as source:
        script = [reply(tool_call("stuck", {"tag": "b"}, id="t1")), reply("gave up")]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools(), tool_timeout=1.0)
        result = await agent.run("Wait for it")
        [call] = result.tool_calls
        assert call.is_error and "timed out" in call.output
        tools = {t.name: t for t in source.tools()}
        assert await tools["wait_cancelled"](count=1) == "stuck-1"


async def test_each_poll_the_task_answers_restarts_the_idle_timeout() -> None:
    # Four polls 200 ms apart take longer than the idle timeout of 0.5 s, and pass: each
    # answer is a sign of life. A task that is cut off is cancelled (see above).
    async with MCPToolSource([jobs(idle_timeout=0.5)]) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["report"](topic="q", polls=4) == "report on q after 4 polls"


async def test_the_handshake_era_declares_no_tasks_so_the_server_refuses() -> None:
    # The extension exists on the 2026-07-28 protocol only: a connection pinned to the
    # initialize handshake does not declare it, and the server says what it misses.
    async with MCPToolSource([jobs(protocol="legacy")]) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError) as refused:
            await tools["report"](topic="x")
        assert str(refused.value) == (
            "MCP server 'jobs' refused the call to 'report': Missing required client "
            "capability (code -32021)"
        )
