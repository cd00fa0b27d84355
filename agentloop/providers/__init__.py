"""Providers: where a `ModelRequest` becomes a `ModelResponse`.

`base` holds the provider protocol and its neutral values; `AnthropicProvider` talks to
the Messages API through the official SDK, `OpenAIChatProvider` to Chat Completions
servers through the `openai` SDK. Each SDK is imported when its provider is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "ModelRequest",
    "ModelResponse",
    "OpenAIChatProvider",
    "Provider",
    "StreamingProvider",
    "provider_for",
)

_LAZY = {
    "AnthropicProvider": ".anthropic",
    "ChatCompat": ".openai",
    "OpenAIChatProvider": ".openai",
}
"""Names whose modules import an SDK (or its HTTP client): loaded on first use."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
