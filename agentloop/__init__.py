"""agentloop: an async agent runner for the Anthropic Messages API with a parallel tool registry.

This module only re-exports the names most code needs; each lives in the module of its
step of the flow (prompt -> request -> provider -> response -> tools -> registry ->
history -> result). Everything else is public in its own module (`agentloop.errors`,
`agentloop.events`, `agentloop.providers`, `agentloop.registry`, `agentloop.testing`, ...).

The names are imported on first use, so `import agentloop` (and `agentloop --version`)
does not pay for the SDKs, pydantic and OpenTelemetry until something needs them.
"""

import typing

from .lazy import lazy_exports as _lazy_exports

# Only modules and private names here: every public name of this module is exported.
if typing.TYPE_CHECKING:
    from .agent import Agent as Agent
    from .approval import Approve as Approve
    from .approval import Deny as Deny
    from .calls import ToolDefinition as ToolDefinition
    from .capabilities import Capability as Capability
    from .capabilities import Fallback as Fallback
    from .capabilities import InputGuardrail as InputGuardrail
    from .capabilities import OutputGuardrail as OutputGuardrail
    from .capabilities import Retries as Retries
    from .capabilities import ToolGuardrail as ToolGuardrail
    from .config import AgentConfig as AgentConfig
    from .context import RunContext as RunContext
    from .errors import AgentloopError as AgentloopError
    from .errors import ConfigurationError as ConfigurationError
    from .errors import GuardrailTripped as GuardrailTripped
    from .errors import HistoryError as HistoryError
    from .errors import ModelRetry as ModelRetry
    from .errors import OutputValidationError as OutputValidationError
    from .errors import ProviderError as ProviderError
    from .errors import RunError as RunError
    from .errors import SessionConflict as SessionConflict
    from .errors import SessionError as SessionError
    from .errors import ToolCallFailed as ToolCallFailed
    from .errors import ToolError as ToolError
    from .errors import UsageLimitExceeded as UsageLimitExceeded
    from .events import ApprovalRequested as ApprovalRequested
    from .events import Event as Event
    from .events import ModelResponded as ModelResponded
    from .events import ModelStreamEvent as ModelStreamEvent
    from .events import RequestRetry as RequestRetry
    from .events import RequestStarted as RequestStarted
    from .events import RoundFinished as RoundFinished
    from .events import RunFinished as RunFinished
    from .events import RunStarted as RunStarted
    from .events import StepRestarted as StepRestarted
    from .events import TextDelta as TextDelta
    from .events import ThinkingDelta as ThinkingDelta
    from .events import ToolCallReady as ToolCallReady
    from .events import ToolCallStarted as ToolCallStarted
    from .events import ToolInputDelta as ToolInputDelta
    from .events import ToolLog as ToolLog
    from .events import ToolProgress as ToolProgress
    from .events import ToolResultEvent as ToolResultEvent
    from .events import ToolUserContent as ToolUserContent
    from .hookspecs import hookimpl as hookimpl
    from .limits import UsageLimits as UsageLimits
    from .lint import lint_history as lint_history
    from .messages import ContentBlock as ContentBlock
    from .messages import DocumentBlock as DocumentBlock
    from .messages import ImageBlock as ImageBlock
    from .messages import Message as Message
    from .messages import RedactedThinkingBlock as RedactedThinkingBlock
    from .messages import ServerToolResultBlock as ServerToolResultBlock
    from .messages import ServerToolUseBlock as ServerToolUseBlock
    from .messages import TextBlock as TextBlock
    from .messages import ThinkingBlock as ThinkingBlock
    from .messages import ToolResultBlock as ToolResultBlock
    from .messages import ToolUseBlock as ToolUseBlock
    from .messages import UnknownBlock as UnknownBlock
    from .options import RunOptions as RunOptions
    from .plugins import PluginManager as PluginManager
    from .plugins import plugin_capabilities as plugin_capabilities
    from .plugins import plugin_tools as plugin_tools
    from .providers.anthropic import AnthropicProvider as AnthropicProvider
    from .providers.base import Provider as Provider
    from .providers.openai import OpenAIChatProvider as OpenAIChatProvider
    from .repairs import RepairReport as RepairReport
    from .repairs import repair as repair
    from .result import ApprovalRequest as ApprovalRequest
    from .result import RunResult as RunResult
    from .result import StopReason as StopReason
    from .result import ToolCallRecord as ToolCallRecord
    from .result import Usage as Usage
    from .run import Run as Run
    from .server_tools import CodeExecution as CodeExecution
    from .server_tools import ServerTool as ServerTool
    from .server_tools import ToolSearch as ToolSearch
    from .server_tools import WebFetch as WebFetch
    from .server_tools import WebSearch as WebSearch
    from .sessions import RedisSession as RedisSession
    from .sessions import Session as Session
    from .sessions import SQLiteSession as SQLiteSession
    from .tools import Tool as Tool
    from .tools import raw_tools as raw_tools
    from .tools import tool as tool

    __version__: str
    """The installed distribution's version (`agentloop-runner`)."""

# Where each exported name is defined: the module (below `agentloop`) it is imported from.
_MODULES = {
    "Agent": "agent",
    "AgentloopError": "errors",
    "AnthropicProvider": "providers.anthropic",
    "ApprovalRequest": "result",
    "ApprovalRequested": "events",
    "Approve": "approval",
    "Capability": "capabilities",
    "ConfigurationError": "errors",
    "ContentBlock": "messages",
    "Deny": "approval",
    "DocumentBlock": "messages",
    "Event": "events",
    "Fallback": "capabilities",
    "GuardrailTripped": "errors",
    "HistoryError": "errors",
    "ImageBlock": "messages",
    "InputGuardrail": "capabilities",
    "Message": "messages",
    "ModelResponded": "events",
    "ModelStreamEvent": "events",
    "OpenAIChatProvider": "providers.openai",
    "OutputGuardrail": "capabilities",
    "PluginManager": "plugins",
    "Provider": "providers.base",
    "ProviderError": "errors",
    "RedactedThinkingBlock": "messages",
    "RedisSession": "sessions",
    "RepairReport": "repairs",
    "RequestRetry": "events",
    "RequestStarted": "events",
    "Retries": "capabilities",
    "RoundFinished": "events",
    "StepRestarted": "events",
    "RunContext": "context",
    "ModelRetry": "errors",
    "OutputValidationError": "errors",
    "RunError": "errors",
    "RunFinished": "events",
    "RunResult": "result",
    "RunStarted": "events",
    "SQLiteSession": "sessions",
    "ServerToolResultBlock": "messages",
    "ServerToolUseBlock": "messages",
    "Session": "sessions",
    "SessionConflict": "errors",
    "SessionError": "errors",
    "StopReason": "result",
    "TextBlock": "messages",
    "TextDelta": "events",
    "ThinkingBlock": "messages",
    "ThinkingDelta": "events",
    "Tool": "tools",
    "ToolCallFailed": "errors",
    "ToolCallReady": "events",
    "ToolCallRecord": "result",
    "ToolCallStarted": "events",
    "ToolDefinition": "calls",
    "ToolError": "errors",
    "ToolGuardrail": "capabilities",
    "ToolInputDelta": "events",
    "ToolLog": "events",
    "ToolResultBlock": "messages",
    "ToolProgress": "events",
    "ToolResultEvent": "events",
    "ToolUserContent": "events",
    "ToolUseBlock": "messages",
    "UnknownBlock": "messages",
    "Usage": "result",
    "Run": "run",
    "RunOptions": "options",
    "AgentConfig": "config",
    "UsageLimitExceeded": "errors",
    "UsageLimits": "limits",
    "hookimpl": "hookspecs",
    "lint_history": "lint",
    "plugin_capabilities": "plugins",
    "plugin_tools": "plugins",
    "raw_tools": "tools",
    "repair": "repairs",
    "tool": "tools",
    "CodeExecution": "server_tools",
    "ServerTool": "server_tools",
    "ToolSearch": "server_tools",
    "WebFetch": "server_tools",
    "WebSearch": "server_tools",
}

__all__ = tuple(sorted(_MODULES))

# Old names, still importable, with a warning saying what replaced them.
_DEPRECATED = {
    "RunStream": ("run", "Run", "RunStream is now Run: agent.run_stream() yields a Run"),
}


def _version() -> str:
    from importlib import metadata  # not cheap: only for whoever asks for the version

    try:
        return metadata.version("agentloop-runner")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0+unknown"


__getattr__, __dir__ = _lazy_exports(
    globals(), _MODULES, computed={"__version__": _version}, deprecated=_DEPRECATED
)
