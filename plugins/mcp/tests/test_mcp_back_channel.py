"""Servers written in the usual style ask the client questions mid-call under `protocol: auto`.

The test server's `ask`, `sample` and `roots` tools send their own requests while the call
runs (`ctx.elicit`, `ctx.session.create_message`, `ctx.session.list_roots`), which the
newest protocol gives a server no channel for. The source switches such a server to the
initialize handshake and sends the refused call again; pinned to the newest protocol, the
call fails with one line naming the `protocol` option.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mcp.types as mcp_types
import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess
from agentloop import ToolError
from agentloop.testing import ScriptedProvider, reply

from agentloop_mcp import MCPSampling, MCPServer, MCPToolSource


async def answer(server: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
    return mcp_types.ElicitResult(action="accept", content={"name": "Ada"})


async def test_auto_gives_a_stdio_server_that_asks_its_back_channel(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, tmp_path: Path
) -> None:
    await asks_everything(stdio_server(roots=(str(tmp_path),)), tmp_path)
    assert len(no_leaks.pids()) == 2  # one switch, then the same connection throughout


async def test_auto_gives_an_http_server_that_asks_its_back_channel(
    http_server: HTTPServerProcess, tmp_path: Path
) -> None:
    await asks_everything(http_server.declare(roots=(str(tmp_path),)), tmp_path)


async def asks_everything(server: MCPServer, root: Path) -> None:
    assert server.protocol == "auto"
    model = ScriptedProvider([reply("four")])
    sampling = MCPSampling(provider=model, model="claude-test")
    async with MCPToolSource([server], elicitation=answer, sampling=sampling) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["echo"](text="first") == "first"  # on the newest protocol
        assert await tools["ask"]() == "accept: Ada"
        assert await tools["roots"]() == f"{root.name}={root.as_uri()}"
        assert await tools["sample"](prompt="2+2?") == "scripted: four"
        assert await tools["echo"](text="after") == "after"


async def test_a_server_pinned_to_the_newest_protocol_is_told_about_the_option(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(protocol="2026-07-28")], elicitation=answer) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError) as caught:
            await tools["ask"]()
        message = str(caught.value)
        assert "\n" not in message
        assert "'local' asked this client a question" in message
        assert 'set its `protocol` option to "legacy"' in message
        assert await tools["echo"](text="still here") == "still here"
