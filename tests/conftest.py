from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, settings

from agentloop import Agent, AnthropicProvider, OpenAIChatProvider
from agentloop.testing import ChatCompletionsServer, MessagesServer, SteppedProvider

ANTHROPIC = [pytest.param("json", id="json"), pytest.param("sse", id="sse")]
pytest_plugins = (
    "_dbos",
    "_temporal",
)  # DBOS's `database`, `launch`, `postgres`; `temporal_address`

# Property tests that do not set their own example count take it from the profile:
# "quick" by default (the whole of tests/test_contract.py well under a minute), "long"
# for a local hunt (`AGENTLOOP_HYPOTHESIS_PROFILE=long`, see docs/testing.md).
settings.register_profile(
    "quick", max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("AGENTLOOP_HYPOTHESIS_PROFILE", "quick"))

OPENAI = [
    pytest.param("openai-json", id="openai-json"),
    pytest.param("openai-sse", id="openai-sse"),
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_formats: run the test's `http_agent` on the Chat Completions path too "
        "(OpenAIChatProvider over ChatCompletionsServer), besides the Messages API",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`http_agent` runs on the Messages API; tests marked `both_formats` on both formats."""
    if "http_agent" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_formats") is not None
        metafunc.parametrize("http_agent", ANTHROPIC + (OPENAI if both else []), indirect=True)


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


@pytest.fixture
async def serve_chat() -> AsyncIterator[Callable[..., ChatCompletionsServer]]:
    """Start ChatCompletionsServers (options as the server takes them); all stopped at the end."""
    servers: list[ChatCompletionsServer] = []

    def start(script: Any, **options: Any) -> ChatCompletionsServer:
        server = ChatCompletionsServer(script, **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.aclose()


@pytest.fixture
def http_agent(
    request: pytest.FixtureRequest,
    serve: Callable[..., MessagesServer],
    serve_chat: Callable[..., ChatCompletionsServer],
) -> Callable[..., tuple[Agent, MessagesServer]]:
    """An Agent over a real SDK client talking to a local server, JSON or streamed.

    `json`/`sse`: `AnthropicProvider` over `MessagesServer`; `openai-json`/`openai-sse`:
    `OpenAIChatProvider` over `ChatCompletionsServer`. Either way `server.model.requests`
    holds the requests in the Messages API shape the script saw.
    """
    kind: str = request.param

    def make(script: Any, **options: Any) -> tuple[Agent, MessagesServer]:
        streamed = kind.endswith("sse")
        if kind.startswith("openai"):
            chat = serve_chat(script)
            provider: Any = OpenAIChatProvider(chat.client(), stream=streamed)
            return Agent(provider=provider, **options), chat
        server = serve(script)
        return Agent(
            provider=AnthropicProvider(server.client(), stream=streamed), **options
        ), server

    return make


STREAMING = ["stepped", "anthropic-sse", "openai-sse"]
"""The streaming providers the streaming tests run on: in process, and over HTTP in each format."""


class Hooked:
    """A streaming provider whose every event is followed by an awaited hook.

    As `SteppedProvider` does in process: `hook(n, event)` can hold the stream at an exact
    point (the provider stops reading the HTTP response meanwhile) or make it fail there.
    """

    def __init__(self, provider: Any, model: Any, hook: Any) -> None:
        self.provider = provider
        self.model = model
        self.hook = hook
        self.events_sent = 0

    async def complete(self, request: Any) -> Any:
        async def ignore(event: Any) -> None:
            return None

        return await self.stream(request, ignore)

    async def stream(self, request: Any, on_event: Any) -> Any:
        async def forward(event: Any) -> None:
            await on_event(event)
            self.events_sent += 1
            if self.hook is not None:
                await self.hook(self.events_sent, event)
            await anyio.lowlevel.checkpoint()

        return await self.provider.stream(request, forward)


@asynccontextmanager
async def _streaming_provider(
    kind: str, script: Any, hook: Any = None, *, truncate_last_input: bool = False
) -> AsyncIterator[Any]:
    if kind == "stepped":
        yield SteppedProvider(script, hook, truncate_last_input=truncate_last_input)
    elif kind == "anthropic-sse":
        async with MessagesServer(script) as server:
            yield Hooked(AnthropicProvider(server.client(), stream=True), server.model, hook)
    else:
        async with ChatCompletionsServer(script) as chat:
            yield Hooked(OpenAIChatProvider(chat.client(), stream=True), chat.model, hook)


@pytest.fixture
def streaming_provider() -> Callable[..., Any]:
    """`async with streaming_provider(kind, script, hook) as provider:` for a kind of STREAMING.

    The provider has `.model` (the `ScriptedModel`); `hook(n, event)` is awaited after
    every event it reports.
    """
    return _streaming_provider
