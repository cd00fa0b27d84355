"""Providers: where a `ModelRequest` becomes a `ModelResponse`.

`base` holds the provider protocol and its neutral values; `AnthropicProvider` talks to
the Messages API through the official SDK, `OpenAIChatProvider` to Chat Completions
servers (OpenAI, Ollama, vLLM, llama.cpp) through the `openai` SDK, which it imports only
when it is used. The scripted test doubles live in `agentloop.testing`.
"""

from typing import Any

from .anthropic import AnthropicProvider as AnthropicProvider
from .base import ModelRequest as ModelRequest
from .base import ModelResponse as ModelResponse
from .base import Provider as Provider
from .base import StreamingProvider as StreamingProvider
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


def provider_for(client: Any) -> Provider:
    """The provider for an SDK client.

    `OpenAIChatProvider` for an `openai.AsyncOpenAI`, else `AnthropicProvider` (which
    makes its own client when `client` is None).
    """
    if type(client).__module__.split(".")[0] == "openai":
        return OpenAIChatProvider(client)
    return AnthropicProvider(client)
