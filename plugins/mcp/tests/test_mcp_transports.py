"""Transports and per-server options: SSE beside stdio and HTTP, a fixed protocol, filters,
prefixes from any name, instructions, and a server that writes garbage on stdout."""

from __future__ import annotations

import json
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


DENYING_SERVER = """
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Deny(BaseHTTPRequestHandler):
    def deny(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(int(sys.argv[2]))
        self.send_header("content-length", "0")
        self.end_headers()

    do_POST = do_GET = do_DELETE = deny

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Deny).serve_forever()
"""


@pytest.mark.parametrize(
    ("status", "said"),
    [
        pytest.param(
            401,
            "HTTP 401 Unauthorized: the server wants authorization, and the token is missing or wrong",
            id="401",
        ),
        pytest.param(403, "HTTP 403 Forbidden: the server refused the token given", id="403"),
    ],
)
async def test_an_http_server_refusing_authorization_is_named_as_such(
    status: int, said: str
) -> None:
    import subprocess

    from _mcp_support import free_port, wait_until

    port = free_port()
    process = await anyio.open_process(
        [sys.executable, "-c", DENYING_SERVER, str(port), str(status)], stdin=subprocess.DEVNULL
    )
    try:

        def accepts() -> bool:
            import socket

            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        await wait_until(accepts, "the denying server")
        async with MCPToolSource(
            [MCPServer.http(f"http://127.0.0.1:{port}/mcp", name="gh")]
        ) as source:
            [problem] = source.errors
        assert problem.server == "gh" and said in problem.reason
        assert "Server returned an error response" not in problem.reason
    finally:
        process.kill()
        await process.wait()
        await process.aclose()


async def test_auto_remembers_a_server_that_ignores_the_probe(protocol_cache: Path) -> None:
    """The probe's wait is paid once per server command, then the handshake is used at once,
    in this process and (through the cache file) the next."""
    from agentloop_mcp import protocols

    declared = raw("quiet")
    assert declared.protocol == "auto"
    async with MCPToolSource([declared]) as source:  # waits for the probe, then falls back
        assert await source.tools()[0](a=1) == '{"a": 1}'
    assert declared.describe() in json.loads(await anyio.Path(protocol_cache).read_text())
    for fresh_process in (False, True):
        if fresh_process:
            protocols._seen.clear()  # as the next `agentloop run` starts
        started = anyio.current_time()
        async with MCPToolSource([raw("quiet")]) as source:
            assert await source.tools()[0](a=2) == '{"a": 2}'
        assert anyio.current_time() - started <= 3.0
