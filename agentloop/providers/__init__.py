"""Providers: where a `ModelRequest` becomes a `ModelResponse`.

`AnthropicProvider` talks to the Messages API through the official SDK;
`ScriptedProvider` answers from a script, for tests and the offline demo.
"""

from .anthropic import AnthropicProvider as AnthropicProvider
from .base import ModelRequest as ModelRequest
from .base import ModelResponse as ModelResponse
from .base import Provider as Provider
from .base import Usage as Usage
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedProvider as ScriptedProvider

__all__ = (
    "AnthropicProvider",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "ScriptedModel",
    "ScriptedProvider",
    "Usage",
)
