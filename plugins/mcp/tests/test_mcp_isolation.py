"""One failing server never takes the others down: it is left out and named, unless strict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from _mcp_support import SERVER_SCRIPT, ConnectionLog
from agentloop.errors import DuplicateToolError

from agentloop_mcp import MCPConnectError, MCPProblem, MCPServer, MCPToolSource

RAW_SERVER = str(Path(__file__).with_name("raw_server.py"))


def raw(name: str, *options: str, **fields: object) -> MCPServer:
    """The hand-written server (tests/raw_server.py) with its command-line options."""
    return MCPServer.stdio(sys.executable, [RAW_SERVER, *options], name=name, **fields)  # type: ignore[arg-type]


def tool(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


async def test_a_missing_binary_leaves_the_healthy_server_working(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    ghost = MCPServer.stdio("/nonexistent/mcp-server", name="ghost")
    async with MCPToolSource([stdio_server(prefix="ok"), ghost]) as source:
        tools = {t.name: t for t in source.tools()}
        assert "ok_echo" in tools and await tools["ok_echo"](text="hi") == "hi"
        [problem] = source.errors
        assert problem.server == "ghost"
        assert "cannot start or reach it (/nonexistent/mcp-server)" in problem.reason
        assert str(problem).startswith("MCP server 'ghost' left out: cannot start or reach it")
    with pytest.raises(MCPConnectError, match="'ghost'"):
        async with MCPToolSource([stdio_server(), ghost], strict=True):
            pass  # pragma: no cover


async def test_a_server_that_times_out_is_left_out(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    mute = raw("mute", "--mute", connect_timeout=1)
    async with MCPToolSource([mute, stdio_server()]) as source:
        assert "echo" in [t.name for t in source.tools()]
        assert source.errors == [
            MCPProblem(
                "mute",
                f"cannot start or reach it ({sys.executable} {RAW_SERVER} --mute): "
                "no answer within 1 s",
            )
        ]


async def test_only_the_tools_whose_names_collide_are_left_out(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    # Between servers: the later one's clashing tool is left out, and the message names both.
    other = raw("other", "--tools", json.dumps([tool("echo"), tool("shout")]), protocol="legacy")
    async with MCPToolSource([stdio_server(), other]) as source:
        tools = {t.name: t for t in source.tools()}
        assert tools["echo"].server == "local"  # type: ignore[attr-defined]
        assert tools["shout"].server == "other"  # type: ignore[attr-defined]
        assert source.errors == []
        [problem] = source.skipped
        assert (problem.server, problem.tool) == ("other", "echo")
        assert "MCP server 'local'" in problem.reason and "prefix" in problem.reason
        assert await tools["echo"](text="x") == "x"
        assert await tools["shout"](a=1) == '{"a": 1}'
    # Within one server: two names that become one once made valid for the API.
    listing = [tool("a.b"), tool("a_b"), tool("c")]
    clash = raw("clash", "--tools", json.dumps(listing), protocol="legacy")
    async with MCPToolSource([clash]) as source:
        assert [t.name for t in source.tools()] == ["c"]
        assert source.errors == []
        assert sorted(p.tool or "" for p in source.skipped) == ["a.b", "a_b"]
        assert all("'a_b'" in p.reason for p in source.skipped)
    with pytest.raises(DuplicateToolError):
        async with MCPToolSource([clash], strict=True):
            pass  # pragma: no cover


async def test_tools_the_model_cannot_be_offered_are_skipped_and_listed() -> None:
    listing = [
        tool("x" * 129),
        tool("needs_task", execution={"taskSupport": "required"}),
        tool("may_task", execution={"taskSupport": "optional"}),
        tool("plain"),
    ]
    async with MCPToolSource([raw("odd", "--tools", json.dumps(listing))]) as source:
        assert [t.name for t in source.tools()] == ["may_task", "plain"]
        task, long = sorted(source.skipped, key=lambda p: len(p.tool or ""))
        assert long.tool == "x" * 129
        assert long.reason == "its name is 129 characters long, over the 128 the API allows"
        assert task.tool == "needs_task" and "task augmentation" in task.reason
        assert str(task) == (
            "MCP server 'odd': tool 'needs_task' left out: it must run as a task "
            "(task augmentation) of the 2025-11-25 protocol, which this client does not do "
            "(it runs the 2026-07-28 protocol's tasks)"
        )
        assert source.errors == []


def test_the_command_names_the_failed_server_and_lists_the_others(
    tmp_path: Path, conn_log: ConnectionLog
) -> None:
    """`agentloop tools --mcp-config FILE` (no `--plugin mcp` needed) with one missing binary."""
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "test": {
                        "command": sys.executable,
                        "args": [str(SERVER_SCRIPT)],
                        "env": {"MCP_TEST_CONN_LOG": str(conn_log.path)},
                    },
                    "ghost": {"command": "/nonexistent/mcp-server"},
                }
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOOP_")}
    command = [sys.executable, "-m", "agentloop", "tools", "--mcp-config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "echo" in done.stdout and "[mcp:test]" in done.stdout
    [warning] = done.stderr.splitlines()
    assert warning.startswith(
        "agentloop: warning: MCP server 'ghost' left out: cannot start or reach it "
        "(/nonexistent/mcp-server): "
    )

    strict = subprocess.run(
        [*command, "--plugin", "mcp", "--mcp-strict"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert strict.returncode == 2
    [line] = strict.stderr.splitlines()
    assert line.startswith("agentloop: error: plugin 'mcp' failed") and "'ghost'" in line


async def test_a_server_that_crashes_mid_call_fails_that_call_only(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    from agentloop import ToolError

    listing = [tool("crash"), tool("echo")]
    crashing = raw("crashy", "--tools", json.dumps(listing), protocol="legacy", prefix="c")
    async with MCPToolSource([crashing, stdio_server()], reconnect_attempts=1) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(
            ToolError, match="MCP server 'crashy' dropped while 'crash' was running"
        ):
            await tools["c_crash"]()
        assert await tools["echo"](text="fine") == "fine"  # the other server is untouched
        assert await tools["c_echo"](x=1) == '{"x": 1}'  # and this one reconnected


async def test_a_reply_the_sdk_cannot_parse_answers_its_call_at_once() -> None:
    """A lone UTF-16 surrogate (a JavaScript string cut mid-emoji) or a byte that is not
    UTF-8 in a reply: the call is answered now (U+FFFD in place), and the next one works."""
    listing = [tool("cut_emoji"), tool("latin1"), tool("echo")]
    async with MCPToolSource(
        [raw("js", "--tools", json.dumps(listing), protocol="legacy")]
    ) as source:
        tools = {t.name: t for t in source.tools()}
        with anyio.fail_after(20):  # before the fix, each hung until its timeout
            assert await tools["cut_emoji"]() == "cut \ufffd"
            assert await tools["echo"](n=1) == '{"n": 1}'
            assert await tools["latin1"]() == "caf\ufffd"
            assert await tools["echo"](n=2) == '{"n": 2}'
