"""Providers: where a `ModelRequest` becomes a `ModelResponse`.

`base` holds the provider protocol and its neutral values; `AnthropicProvider` talks to
the Messages API through the official SDK, `OpenAIChatProvider` to Chat Completions
servers through the `openai` SDK. Each SDK is imported when its provider is first used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agentloop.lazy import lazy_exports as _lazy_exports

from .base import CountingProvider as CountingProvider
from .base import ModelRequest as ModelRequest
from .base import ModelResponse as ModelResponse
from .base import Provider as Provider
from .base import StreamingProvider as StreamingProvider

if TYPE_CHECKING:
    from .anthropic import AnthropicProvider as AnthropicProvider
    from .openai import ChatCompat as ChatCompat
    from .openai import OpenAIChatProvider as OpenAIChatProvider

__all__ = (
    "AnthropicProvider",
    "ChatCompat",
    "CountingProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChatProvider",
    "Provider",
    "StreamingProvider",
    "as_sent",
    "provider_for",
    "retried_by_caller",
    "without_sdk_retries",
)

_LAZY = {
    "AnthropicProvider": "anthropic",
    "ChatCompat": "openai",
    "OpenAIChatProvider": "openai",
}
"""Names whose modules import an SDK (or its HTTP client): loaded on first use."""

__getattr__, __dir__ = _lazy_exports(globals(), _LAZY)


def provider_for(client: Any) -> Provider:
    """The provider for an SDK client.

    `OpenAIChatProvider` for an `openai.AsyncOpenAI`, else `AnthropicProvider` (which
    makes its own client when `client` is None).
    """
    if type(client).__module__.split(".")[0] == "openai":
        from .openai import OpenAIChatProvider

        return OpenAIChatProvider(client)
    from .anthropic import AnthropicProvider

    return AnthropicProvider(client)


def without_sdk_retries(provider: Provider) -> Provider:
    """`provider` with its SDK client's own retries off, when it is one of ours.

    An `AnthropicProvider` or `OpenAIChatProvider` over a copy of its client with
    `max_retries=0` (so the Anthropic provider does not retry a failed empty stream
    either); any other provider as it is.
    """
    from .anthropic import AnthropicProvider
    from .openai import OpenAIChatProvider

    if isinstance(provider, AnthropicProvider):
        return AnthropicProvider(
            provider.client.with_options(max_retries=0),
            stream=provider.streaming,
            max_retry_wait=provider.max_retry_wait,
            retry_delay=provider.retry_delay,
        )
    if isinstance(provider, OpenAIChatProvider):
        return OpenAIChatProvider(
            provider.client.with_options(max_retries=0),
            compat=provider.compat,
            stream=provider.streaming,
            retry_delay=provider.retry_delay,
        )
    return provider


_RETRIED_BY_CALLER: ContextVar[str | None] = ContextVar("agentloop_retried_by_caller", default=None)
"""The run whose requests a caller (a `Retries` capability) retries itself, if any."""


@contextmanager
def retried_by_caller(run_id: str) -> Iterator[None]:
    """The requests of run `run_id` sent inside go out without their SDK's own retries.

    For a caller that retries them itself (`agentloop.capabilities.Retries`), so that a
    failure is retried by one policy, not by two nested ones. Only that run's requests:
    a sub-agent's run, started by a call in a task made meanwhile, keeps its own.
    """
    token = _RETRIED_BY_CALLER.set(run_id)
    try:
        yield
    finally:
        _RETRIED_BY_CALLER.reset(token)


def as_sent(provider: Provider, run_id: str) -> Provider:
    """`provider` as a request of run `run_id` goes through it.

    Without its SDK's own retries inside `retried_by_caller(run_id)`; as it is otherwise.
    """
    return without_sdk_retries(provider) if _RETRIED_BY_CALLER.get() == run_id else provider
