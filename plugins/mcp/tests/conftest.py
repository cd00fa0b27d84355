"""Fixtures: real MCP servers (tests/mcp_server.py) over stdio and over streamable HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess, pid_alive, stdio_declaration

from agentloop_mcp import MCPServer


@pytest.fixture(autouse=True)
def protocol_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """What `protocol: auto` learns stays in this test (a file of its own, memory cleared)."""
    from agentloop_mcp import protocols

    path = tmp_path / "mcp-protocols.json"
    monkeypatch.setenv(protocols.CACHE_ENV_VAR, str(path))
    protocols._seen.clear()
    yield path
    protocols._seen.clear()


@pytest.fixture
def conn_log(tmp_path: Path) -> ConnectionLog:
    return ConnectionLog(tmp_path / "connections.log")


@pytest.fixture
def stdio_server(conn_log: ConnectionLog) -> Callable[..., MCPServer]:
    """Declare the test server over stdio: `stdio_server(name="a", prefix="a", env={...})`."""

    def make(name: str = "local", **options: object) -> MCPServer:
        return stdio_declaration(conn_log, name, **options)

    return make


@pytest.fixture
async def http_server() -> AsyncIterator[HTTPServerProcess]:
    server = await HTTPServerProcess().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def no_leaks(conn_log: ConnectionLog) -> Iterator[ConnectionLog]:
    """After the test, every stdio server process it started is gone."""
    yield conn_log
    alive = [pid for pid in conn_log.pids() if pid_alive(pid)]
    assert alive == [], f"server processes left running: {alive}"
