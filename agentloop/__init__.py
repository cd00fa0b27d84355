"""agentloop: an async agent runner for the Anthropic Messages API with a parallel tool registry.

This module only re-exports the public names; each lives in the module of its step of
the flow (prompt -> request -> provider -> response -> tools -> registry -> history).
"""

from .agent import Agent as Agent
from .agent import RunResult as RunResult
from .agent import ToolCallRecord as ToolCallRecord
from .errors import AgentloopError as AgentloopError
from .errors import APIConnectionError as APIConnectionError
from .errors import AuthenticationError as AuthenticationError
from .errors import BadRequestError as BadRequestError
from .errors import ConfigurationError as ConfigurationError
from .errors import CreditBalanceError as CreditBalanceError
from .errors import DuplicateToolError as DuplicateToolError
from .errors import HistoryError as HistoryError
from .errors import InvalidResponseError as InvalidResponseError
from .errors import MissingAPIKeyError as MissingAPIKeyError
from .errors import OverloadedError as OverloadedError
from .errors import ProviderError as ProviderError
from .errors import RateLimitError as RateLimitError
from .errors import RunError as RunError
from .errors import ServerError as ServerError
from .errors import ToolCallFailed as ToolCallFailed
from .errors import ToolError as ToolError
from .hookspecs import hookimpl as hookimpl
from .messages import Message as Message
from .messages import RepairReport as RepairReport
from .messages import lint_history as lint_history
from .messages import repair as repair
from .plugins import PluginManager as PluginManager
from .plugins import plugin_tools as plugin_tools
from .providers.anthropic import AnthropicProvider as AnthropicProvider
from .providers.base import ModelRequest as ModelRequest
from .providers.base import ModelResponse as ModelResponse
from .providers.base import Provider as Provider
from .providers.base import StreamingProvider as StreamingProvider
from .providers.base import Usage as Usage
from .registry import ToolRegistry as ToolRegistry
from .stream import RunStream as RunStream
from .tools import RunContext as RunContext
from .tools import Tool as Tool
from .tools import ToolCall as ToolCall
from .tools import ToolDefinition as ToolDefinition
from .tools import ToolResult as ToolResult
from .tools import raw_tools as raw_tools
from .tools import tool as tool

__version__ = "0.1.0"

__all__ = (
    "APIConnectionError",
    "Agent",
    "AgentloopError",
    "AnthropicProvider",
    "AuthenticationError",
    "BadRequestError",
    "ConfigurationError",
    "CreditBalanceError",
    "DuplicateToolError",
    "HistoryError",
    "InvalidResponseError",
    "Message",
    "MissingAPIKeyError",
    "ModelRequest",
    "ModelResponse",
    "OverloadedError",
    "PluginManager",
    "Provider",
    "ProviderError",
    "RateLimitError",
    "RepairReport",
    "RunContext",
    "RunError",
    "RunResult",
    "RunStream",
    "ServerError",
    "StreamingProvider",
    "Tool",
    "ToolCall",
    "ToolCallFailed",
    "ToolCallRecord",
    "ToolDefinition",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "Usage",
    "hookimpl",
    "lint_history",
    "plugin_tools",
    "raw_tools",
    "repair",
    "tool",
)
