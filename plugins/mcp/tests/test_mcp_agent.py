"""Agent runs over MCP tools: parallel calls across two servers, and cancellation mid-call."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess, pid_alive
from agentloop import Agent, RunResult
from agentloop.lint import lint_history
from agentloop.messages import parse_history
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.testing import ScriptedProvider, reply, tool_call

from agentloop_mcp import MCPServer, MCPToolSource


async def test_twenty_parallel_calls_across_two_servers(
    stdio_server: Callable[..., MCPServer], http_server: HTTPServerProcess, no_leaks: ConnectionLog
) -> None:
    # Each server's `gather` answers only once all ten of its calls are in progress at
    # once, so the run finishes only if the twenty calls really run in parallel.
    calls = []
    for i in range(10):
        calls.append(tool_call("a_gather", {"group": "g", "size": 10, "index": i}))
        calls.append(tool_call("b_gather", {"group": "g", "size": 10, "index": i}))
    servers = [stdio_server(name="local", prefix="a"), http_server.declare(prefix="b")]
    async with MCPToolSource(servers) as source:
        agent = Agent(
            provider=ScriptedProvider([reply(*calls), reply("all gathered")]),
            tools=source.tools(),
            tool_concurrency=20,
            tool_timeout=60,
        )
        with anyio.fail_after(60):
            result = await agent.run("gather everyone")

    assert result.text == "all gathered"
    assert result.stop_reason == "end_turn"
    expected = []
    for i in range(10):
        expected += [("a_gather", f"local:g:{i}"), ("b_gather", f"remote:g:{i}")]
    assert [(c.name, c.output) for c in result.tool_calls] == expected
    assert not any(c.is_error for c in result.tool_calls)

    lint_history(parse_history(result.messages))
    user, assistant, results, final = result.messages
    assert user == {"role": "user", "content": "gather everyone"}
    uses = [b for b in assistant["content"] if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in results["content"]] == [u["id"] for u in uses]
    assert [b["content"] for b in results["content"]] == [text for _, text in expected]
    assert all("is_error" not in b for b in results["content"])
    assert final["content"] == [{"type": "text", "text": "all gathered"}]


async def test_cancelling_a_run_mid_call_leaves_a_valid_history_and_no_process(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    partial: RunResult | None = None
    async with MCPToolSource([stdio_server()]) as source:
        tools = {t.name: t for t in source.tools()}
        agent = Agent(
            provider=ScriptedProvider([reply(tool_call("block", {"tag": "b"}))]),
            tools=source.tools(),
        )

        async def run() -> None:
            nonlocal partial
            try:
                async with agent.run_stream("start the long job") as stream:
                    async for _ in stream:
                        pass
            finally:
                partial = stream.result

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                assert await tools["wait_started"](count=1) == "b"  # `block` is running
                scope.cancel()
        assert scope.cancelled_caught

        # The connection outlives the cancelled run.
        assert await tools["echo"](text="still up") == "still up"
        [pid] = no_leaks.pids()
        assert pid_alive(pid)
    assert not pid_alive(pid)  # closing the source stopped the server process

    assert partial is not None
    assert partial.stop_reason == "cancelled"
    lint_history(parse_history(partial.messages))
    results = partial.messages[-1]
    assert results["role"] == "user"
    [block] = results["content"]
    assert block == {
        "type": "tool_result",
        "tool_use_id": partial.messages[-2]["content"][0]["id"],
        "content": CANCELLED_MESSAGE,
        "is_error": True,
    }


@pytest.mark.parametrize(
    ("choice", "waiting"),
    [
        pytest.param("destructive", ["add"], id="destructive"),
        pytest.param("always", ["add", "echo"], id="always"),
        pytest.param("never", [], id="never"),
    ],
)
async def test_require_approval_sends_calls_through_the_approval_flow(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, choice: str, waiting: list[str]
) -> None:
    """`echo` is marked read-only; `add` has no hints, so it may be destructive."""
    async with MCPToolSource([stdio_server(require_approval=choice)]) as source:
        script = [
            reply(tool_call("echo", {"text": "hi"}), tool_call("add", {"a": 1, "b": 2})),
            reply("done"),
        ]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        result = await agent.run("go")
    assert sorted(a.name for a in result.approvals) == waiting
    assert result.stop_reason == ("approval_required" if waiting else "end_turn")
    for approval in result.approvals:
        assert "MCP server 'local'" in approval.reason and "require_approval" in approval.reason
    ran = {c.name: c.output for c in result.tool_calls}
    assert ran == {k: v for k, v in {"echo": "hi", "add": "3"}.items() if k not in waiting}
