from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentloop import Agent, AnthropicProvider
from agentloop.testing import MessagesServer


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., MessagesServer]]:
    """Start MessagesServers for a test; all are stopped (clients closed) when it ends."""
    servers: list[MessagesServer] = []

    def start(script: Any) -> MessagesServer:
        server = MessagesServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.aclose()


@pytest.fixture(params=[False, True], ids=["json", "sse"])
def http_agent(
    request: pytest.FixtureRequest, serve: Callable[..., MessagesServer]
) -> Callable[..., tuple[Agent, MessagesServer]]:
    """An Agent over the real SDK client talking to a local server, JSON or streamed."""

    def make(script: Any, **options: Any) -> tuple[Agent, MessagesServer]:
        server = serve(script)
        provider = AnthropicProvider(server.client(), stream=request.param)
        return Agent(provider=provider, **options), server

    return make
