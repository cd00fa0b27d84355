"""Transports and per-server options: SSE beside stdio and HTTP, a fixed protocol, filters,
prefixes from any name, instructions, and a server that writes garbage on stdout."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess

from agentloop_mcp import MCPServer, MCPToolSource

RAW_SERVER = str(Path(__file__).with_name("raw_server.py"))


def raw(name: str, *options: str, **fields: object) -> MCPServer:
    return MCPServer.stdio(sys.executable, [RAW_SERVER, *options], name=name, **fields)  # type: ignore[arg-type]


async def test_legacy_sse_transport_detected_from_the_url() -> None:
    server = await HTTPServerProcess("old", sse=True).start()
    try:
        declared = MCPServer.http(server.url, name="old")
        assert declared.transport == "sse"
        async with MCPToolSource([declared]) as source:
            tools = {t.name: t for t in source.tools()}
            assert await tools["add"](a=2, b=3) == "5"
            caption, _image = await tools["picture"]()
            assert caption.text == "a red pixel"
    finally:
        await server.stop()


async def test_a_fixed_protocol_connects_without_the_probe() -> None:
    """A server that ignores `server/discover`: `auto` waits for the probe, a pin does not."""
    started = anyio.current_time()
    async with MCPToolSource([raw("raw", protocol="legacy")]) as source:
        assert [t.name for t in source.tools()] == ["echo"]
        assert await source.tools()[0](a=1) == '{"a": 1}'
    assert anyio.current_time() - started <= 1.0
    started = anyio.current_time()
    async with MCPToolSource([raw("raw", protocol="2025-06-18")]) as source:
        assert [t.name for t in source.tools()] == ["echo"]
    assert anyio.current_time() - started <= 1.0


async def test_include_exclude_prefix_and_names_with_dots(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    server = stdio_server(
        name="my.server",
        prefix="my.server",
        include=("e*", "add", "pi*"),
        exclude=("picture",),
    )
    async with MCPToolSource([server]) as source:
        assert [t.name for t in source.tools()] == [
            "my_server_add",
            "my_server_echo",
            "my_server_pid",
        ]
        assert {t.server for t in source.tools()} == {"my.server"}  # type: ignore[attr-defined]


async def test_instructions_only_when_asked(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(name="a", prefix="a")]) as source:
        assert source.instructions() is None
    servers = [stdio_server(name="a", prefix="a", instructions=True), stdio_server(name="b")]
    async with MCPToolSource(servers) as source:
        assert source.instructions() == "## MCP server a\n\nCall a's echo to echo."


async def test_a_server_writing_garbage_is_reported_clearly(
    capfd: pytest.CaptureFixture[str],
) -> None:
    garbled = raw("noisy", "--garbage", "--mute", protocol="legacy", connect_timeout=1)
    async with MCPToolSource([garbled]) as source:
        [problem] = source.errors
    assert problem.reason.endswith(
        "--garbage --mute): the server wrote something that is not an MCP message on its "
        "output (a line reading 'this is not JSON-RPC'); a stdio server must write only "
        "JSON-RPC to stdout (logs go to stderr)"
    )
    assert "Traceback" not in capfd.readouterr().err  # the SDK's tracebacks stay quiet
    # A server that writes a stray line now and then still works.
    async with MCPToolSource([raw("chatty", "--garbage", protocol="legacy")]) as source:
        assert await source.tools()[0](b=2) == '{"b": 2}'
