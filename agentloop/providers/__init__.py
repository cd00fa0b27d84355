"""Providers: where a `ModelRequest` becomes a `ModelResponse`.

`base` holds the provider protocol and its neutral values; `AnthropicProvider` talks to
the Messages API through the official SDK. The scripted test doubles live in
`agentloop.testing`.
"""

from .anthropic import AnthropicProvider as AnthropicProvider
from .base import ModelRequest as ModelRequest
from .base import ModelResponse as ModelResponse
from .base import Provider as Provider
from .base import StreamingProvider as StreamingProvider

__all__ = (
    "AnthropicProvider",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "StreamingProvider",
)
