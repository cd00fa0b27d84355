"""Helpers for the MCP plugin tests: the test server over stdio or HTTP, process checks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from agentloop_mcp import MCPServer

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")


class ConnectionLog:
    """The file a test server appends its pid to when a process starts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def pids(self) -> list[int]:
        return [int(line) for line in self.path.read_text().split()]


def stdio_declaration(log: ConnectionLog, name: str = "local", **options: object) -> MCPServer:
    return MCPServer.stdio(
        sys.executable,
        [str(SERVER_SCRIPT), "--name", name],
        env={"MCP_TEST_CONN_LOG": str(log.path), **options.pop("env", {})},  # type: ignore[dict-item]
        name=name,
        **options,  # type: ignore[arg-type]
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until(condition: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Poll a condition another process makes true (a file it writes, a port it opens)."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - another process, no event to wait on
            await anyio.sleep(0.02)


class HTTPServerProcess:
    """The test server over streamable HTTP in a subprocess on 127.0.0.1."""

    def __init__(self, name: str = "remote", *, sse: bool = False) -> None:
        self.name = name
        self.port = free_port()
        self.option = "--sse" if sse else "--http"
        self.url = f"http://127.0.0.1:{self.port}/{'sse' if sse else 'mcp'}"
        self.process: anyio.abc.Process | None = None

    async def start(self) -> HTTPServerProcess:
        self.process = await anyio.open_process(
            [sys.executable, str(SERVER_SCRIPT), self.option, str(self.port), "--name", self.name],
            stdin=subprocess.DEVNULL,
            stdout=None,
            stderr=None,
        )
        await wait_until(self._accepts, f"the HTTP server on port {self.port}")
        return self

    def _accepts(self) -> bool:
        assert self.process is not None and self.process.returncode is None, "server exited"
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    async def stop(self) -> None:
        """Kill the server: gone at once, as in a crash (no graceful shutdown)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.returncode is None:
            process.kill()
        await process.wait()
        await process.aclose()

    def declare(self, **options: object) -> MCPServer:
        return MCPServer.http(self.url, name=self.name, **options)  # type: ignore[arg-type]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; it is gone for our purposes once it is not running.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return status != "Z"
