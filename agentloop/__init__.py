"""agentloop: an async agent runner for the Anthropic Messages API with a parallel tool registry.

This module only re-exports the names most code needs; each lives in the module of its
step of the flow (prompt -> request -> provider -> response -> tools -> registry ->
history -> result). Everything else is public in its own module (`agentloop.errors`,
`agentloop.events`, `agentloop.providers`, `agentloop.registry`, `agentloop.testing`, ...).
"""

from .agent import Agent as Agent
from .errors import AgentloopError as AgentloopError
from .errors import ConfigurationError as ConfigurationError
from .errors import HistoryError as HistoryError
from .errors import ProviderError as ProviderError
from .errors import RunError as RunError
from .errors import ToolCallFailed as ToolCallFailed
from .errors import ToolError as ToolError
from .hookspecs import hookimpl as hookimpl
from .lint import lint_history as lint_history
from .messages import Message as Message
from .plugins import PluginManager as PluginManager
from .plugins import plugin_tools as plugin_tools
from .providers.anthropic import AnthropicProvider as AnthropicProvider
from .providers.base import Provider as Provider
from .providers.openai import OpenAIChatProvider as OpenAIChatProvider
from .repair import RepairReport as RepairReport
from .repair import repair as repair
from .result import RunResult as RunResult
from .result import ToolCallRecord as ToolCallRecord
from .result import Usage as Usage
from .stream import RunStream as RunStream
from .tools import RunContext as RunContext
from .tools import Tool as Tool
from .tools import raw_tools as raw_tools
from .tools import tool as tool

__version__ = "0.1.0"

__all__ = (
    "Agent",
    "AgentloopError",
    "AnthropicProvider",
    "ConfigurationError",
    "HistoryError",
    "Message",
    "OpenAIChatProvider",
    "PluginManager",
    "Provider",
    "ProviderError",
    "RepairReport",
    "RunContext",
    "RunError",
    "RunResult",
    "RunStream",
    "Tool",
    "ToolCallFailed",
    "ToolCallRecord",
    "ToolError",
    "Usage",
    "hookimpl",
    "lint_history",
    "plugin_tools",
    "raw_tools",
    "repair",
    "tool",
)
