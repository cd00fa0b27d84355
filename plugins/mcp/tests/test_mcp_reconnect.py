"""Dropped connections: a killed server process, an HTTP server that went away.

The server runs in another process, so rendezvous go through the server itself
(`wait_started` returns once the hanging calls are in flight there) and connections are
counted on the server side (each stdio process appends its pid to a file).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess, wait_until
from agentloop import Tool, ToolError

from agentloop_mcp import MCPServer, MCPToolSource


async def outcome(tool: Tool, **arguments: Any) -> tuple[str, Any]:
    try:
        return "ok", await tool(**arguments)
    except ToolError as exc:
        return "error", exc.message


async def test_kill_mid_call_retries_read_only_calls_once_and_reports_the_write(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    results: dict[str, tuple[str, Any]] = {}

    async def run(key: str, tool: Tool, arguments: dict[str, Any]) -> None:
        results[key] = await outcome(tool, **arguments)

    async with MCPToolSource([stdio_server()], reconnect_backoff=0.05) as source:
        tools = {t.name: t for t in source.tools()}
        async with anyio.create_task_group() as group:
            for i in range(4):
                group.start_soon(run, f"read{i}", tools["slow_read"], {"tag": f"r{i}"})
            group.start_soon(run, "write", tools["slow_write"], {"tag": "w"})
            started = await tools["wait_started"](count=5)
            assert sorted(started.split(",")) == ["r0", "r1", "r2", "r3", "w"]
            [first] = no_leaks.pids()
            os.kill(first, signal.SIGKILL)
            # Calls made while the connection is down wait for the same reconnect.
            for i in range(5):
                group.start_soon(run, f"echo{i}", tools["echo"], {"text": f"e{i}"})

        for i in range(4):
            assert results[f"read{i}"] == ("ok", f"read r{i} in generation 2")
        kind, message = results["write"]
        assert kind == "error"
        assert "dropped while 'slow_write' was running" in message
        assert "may or may not have run" in message
        for i in range(5):
            assert results[f"echo{i}"] == ("ok", f"e{i}")
        # One reconnect served every dropped and waiting call.
        assert len(no_leaks.pids()) == 2
        second = int(await tools["pid"]())
        assert second == no_leaks.pids()[1] != first


async def test_a_read_only_call_is_retried_only_once(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    server = stdio_server(env={"MCP_TEST_HANG_GENERATIONS": "2"})
    async with MCPToolSource([server], reconnect_backoff=0.05) as source:
        tools = {t.name: t for t in source.tools()}
        async with anyio.create_task_group() as group:
            results: list[tuple[str, Any]] = []

            async def read() -> None:
                results.append(await outcome(tools["slow_read"], tag="r"))

            group.start_soon(read)
            for expected_generation in (1, 2):
                await tools["wait_started"](count=1)  # on the current process
                pids = no_leaks.pids()
                assert len(pids) == expected_generation
                os.kill(pids[-1], signal.SIGKILL)
        [(kind, message)] = results
        assert kind == "error"
        assert "dropped again while 'slow_read' was running" in message
        assert await tools["echo"](text="still here") == "still here"
        assert len(no_leaks.pids()) == 3  # a connection for the retry, one for what follows


async def test_a_server_that_cannot_come_back_fails_waiting_calls_then_tries_again(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    server = stdio_server(env={"MCP_TEST_LAST_GENERATION": "1"})
    async with MCPToolSource([server], reconnect_attempts=2, reconnect_backoff=0.01) as source:
        tools = {t.name: t for t in source.tools()}
        results: dict[str, tuple[str, Any]] = {}

        async def run(key: str, tool: Tool, arguments: dict[str, Any]) -> None:
            results[key] = await outcome(tool, **arguments)

        async with anyio.create_task_group() as group:
            group.start_soon(run, "write", tools["slow_write"], {"tag": "w"})
            await tools["wait_started"](count=1)
            os.kill(no_leaks.pids()[0], signal.SIGKILL)
            group.start_soon(run, "echo", tools["echo"], {"text": "waiting"})
        assert "may or may not have run" in results["write"][1]
        kind, message = results["echo"]
        assert kind == "error"
        assert "MCP server 'local' is unavailable" in message
        assert "the call was not run" in message
        assert len(no_leaks.pids()) == 3  # the first process, then two failed attempts
        # The next call tries again rather than failing forever without a try.
        kind, message = await outcome(tools["echo"], text="x")
        assert kind == "error" and "unavailable" in message
        assert len(no_leaks.pids()) == 5


async def test_http_server_gone_then_back(http_server: HTTPServerProcess) -> None:
    async with MCPToolSource(
        [http_server.declare()], reconnect_attempts=1, reconnect_backoff=0.01
    ) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["add"](a=1, b=2) == "3"
        await http_server.stop()
        # Nothing listens: the call provably never reached a server, so even a tool that is
        # not idempotent is reported as not run (rather than "may or may not have run").
        kind, message = await outcome(tools["add"], a=2, b=2)
        assert kind == "error"
        assert "is unavailable" in message and "the call was not run" in message
        await http_server.start()
        assert await tools["add"](a=3, b=4) == "7"
        assert await tools["stats"]() == '{\n  "add": 1\n}'


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
async def test_an_idle_server_that_dies_is_replaced_before_the_next_call(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, kill: int
) -> None:
    async with MCPToolSource([stdio_server()], reconnect_backoff=0.01) as source:
        tools = {t.name: t for t in source.tools()}
        first = int(await tools["pid"]())
        os.kill(first, kill)
        # Not idempotent, and still not "may or may not have run": the loss was noticed
        # (end of the process's output) before this call was sent.
        await wait_until(lambda: len(no_leaks.pids()) == 2, "the replacement process")
        assert await tools["add"](a=20, b=22) == "42"
        assert len(no_leaks.pids()) == 2
