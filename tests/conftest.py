"""What every layer of the tests uses: scripted model servers and an agent over HTTP.

Each layer (core, providers, sessions, gateway, durable, cli, project) has a conftest.py of
its own for its fixtures; this one imports nothing beyond the base install.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from agentloop import Agent, AnthropicProvider, OpenAIChatProvider
from agentloop.testing import ChatCompletionsServer, MessagesServer

ANTHROPIC = [pytest.param("json", id="json"), pytest.param("sse", id="sse")]

# Property tests that do not set their own example count take it from the profile:
# "quick" by default (the whole of tests/core/test_contract.py well under a minute), "long"
# for a local hunt (`AGENTLOOP_HYPOTHESIS_PROFILE=long`, see docs/testing.md).
settings.register_profile(
    "quick", max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("AGENTLOOP_HYPOTHESIS_PROFILE", "quick"))

OPENAI = [
    pytest.param("openai-json", id="openai-json"),
    pytest.param("openai-sse", id="openai-sse"),
]

EXTRAS = {
    "openai": "openai",
    "opentelemetry.sdk": "dev",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "redis": "redis",
    "dbos": "dbos",
    "temporalio": "temporal",
}
"""Packages beyond the base install that a test may need, and the extra that brings each."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_formats: run the test's `http_agent` on the Chat Completions path too "
        "(OpenAIChatProvider over ChatCompletionsServer), besides the Messages API",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what imports and collection made (the SDKs' types, the tests themselves) out of
    the garbage collector's sight: every full collection, the automatic ones and a test's
    own `gc.collect()`, would otherwise walk those objects again, for nothing to free."""
    gc.collect()
    gc.freeze()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`http_agent` runs on the Messages API; tests marked `both_formats` on both formats."""
    if "http_agent" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_formats") is not None
        metafunc.parametrize("http_agent", ANTHROPIC + (OPENAI if both else []), indirect=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A test that needs a package of an extra that is not installed is skipped, saying so.

    So the core layer runs on the base install: there, the Chat Completions variants of its
    tests (the openai SDK) are skipped.
    """
    try:
        return (yield)
    except Exception as error:
        reason = _not_installed(error)
        if reason is None:
            raise
        pytest.skip(reason)


def _not_installed(error: BaseException | None) -> str | None:
    """Why `error` happened, when it or its cause (a `ConfigurationError` naming the extra,
    say) is the import of a package of an extra that is not installed."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError):
            package = _package_of(error.name or "")
            if package is not None and importlib.util.find_spec(package) is None:
                extra = EXTRAS[package]
                return f"{package} is not installed (pip install 'agentloop-runner[{extra}]')"
        error = error.__cause__ or error.__context__
    return None


def _package_of(module: str) -> str | None:
    """The package of EXTRAS that `module` is part of, if any."""
    return next((p for p in EXTRAS if module == p or module.startswith(p + ".")), None)


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
    """Start ChatCompletionsServers (options as the server takes them); all stopped at the end.

    `strict` is on unless a test turns it off: what a chat template cannot render fails
    here as it does on a real server.
    """
    servers: list[ChatCompletionsServer] = []

    def start(script: Any, **options: Any) -> ChatCompletionsServer:
        options.setdefault("strict", True)
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
