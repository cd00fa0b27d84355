"""The gateway served in this process (uvicorn on a real socket), for what needs a
rendezvous with the gateway's own tool: keep-alive pings while it runs, and a client that
goes away mid-run.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from _gateway import free_port

from agentloop import tool
from agentloop.gateway.app import Gateway, GatewayConfig
from agentloop.testing import MessagesServer, reply, tool_call

pytestmark = pytest.mark.timeout(60)


@dataclass
class Served:
    url: str
    upstream: MessagesServer
    started: anyio.Event
    release: anyio.Event
    cancelled: anyio.Event


@asynccontextmanager
async def serve_gateway() -> AsyncIterator[Served]:
    """The gateway on uvicorn in this task's task group (a fixture would cross tasks)."""
    started, release, cancelled = anyio.Event(), anyio.Event(), anyio.Event()

    @tool
    async def wait_here() -> str:
        """Wait until the test lets the call go."""
        started.set()
        try:
            await release.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return "released"

    upstream = MessagesServer([reply("Waiting.", tool_call("wait_here")), reply("Done waiting.")])
    upstream.start()
    gateway = Gateway(
        GatewayConfig(
            upstream=upstream.base_url, store="memory://", tools=[wait_here], ping_interval=0.05
        )
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(gateway.app(), host="127.0.0.1", port=port, log_level="warning")
    )
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        url = f"http://127.0.0.1:{port}"
        await anyio.to_thread.run_sync(_wait_healthy, url)
        try:
            yield Served(url, upstream, started, release, cancelled)
        finally:
            release.set()
            server.should_exit = True
    upstream.stop()


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx2.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError("the gateway did not start")


BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 50,
    "stream": True,
    "messages": [{"role": "user", "content": "Wait for it."}],
}
HEADERS = {"x-api-key": "sk-test"}


async def test_pings_keep_the_stream_alive_while_a_gateway_tool_runs() -> None:
    events: list[str] = []
    async with serve_gateway() as served, httpx2.AsyncClient(timeout=30) as http:
        async with http.stream(
            "POST", served.url + "/v1/messages", json=BODY, headers=HEADERS
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("event: "):
                    continue
                events.append(line.removeprefix("event: "))
                if served.started.is_set() and events.count("ping") >= 4:
                    served.release.set()
    before_release = events[: events.index("content_block_start", 3)]
    assert before_release.count("ping") >= 4
    assert events[-2:] == ["message_delta", "message_stop"]
    assert events.count("message_start") == 1


async def test_a_client_that_goes_away_cancels_the_run() -> None:
    async with serve_gateway() as served:
        async with httpx2.AsyncClient(timeout=30) as http:
            async with http.stream(
                "POST", served.url + "/v1/messages", json=BODY, headers=HEADERS
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and served.started.is_set():
                        json.loads(line.removeprefix("data: "))
                        break
        # The connection is closed; the gateway cancels the run and its tool call.
        with anyio.fail_after(10):
            await served.cancelled.wait()
        assert len(served.upstream.requests) == 1, "no further round was asked for"
