"""The core layer's fixtures: streaming providers to hold or break a stream at any event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentloop import AnthropicProvider, OpenAIChatProvider
from agentloop.testing import ChatCompletionsServer, MessagesServer, SteppedProvider

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
