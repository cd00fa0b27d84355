"""An agent's configuration: every option of `Agent`, checked once, in one place.

`Agent(...)` builds one `AgentConfig` from its keywords; the run reads it and never
checks an option again. Each field's docstring is the option's documentation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import anyio
from opentelemetry.trace import TracerProvider

from .approval import ApprovalRule, agent_rule
from .capabilities.base import Capability, check_capabilities
from .checks import check_count, check_seconds
from .compaction import HistoryProcessor, context_management_params
from .defaults import DEFAULT_MODEL
from .errors import ConfigurationError
from .limits import UsageLimits, check_provider
from .output import OutputMode, OutputSchema, output_schema
from .providers.base import Provider
from .providers.caching import CacheSetting, cache_marker
from .server_tools import ServerTool, check_announced, server_request_params

if TYPE_CHECKING:
    from .registry import ToolRegistry

__all__ = ("DEFAULT_MODEL", "AgentConfig", "AgentOptions", "check_deps", "schema_of")


class AgentOptions(TypedDict, total=False):
    """The options `Agent(...)` takes as keywords besides its model, provider and tools.

    Each is the field of `AgentConfig` of the same name, documented there.
    """

    system: str | Sequence[Mapping[str, Any]] | None
    max_rounds: int
    max_tokens: int
    tool_concurrency: int
    tool_timeout: float
    tool_limiter: anyio.CapacityLimiter | None
    tool_choice: Mapping[str, Any] | None
    thinking: Mapping[str, Any] | None
    metadata: Mapping[str, Any] | None
    stop_sequences: Sequence[str] | None
    on_tool_error: Literal["continue", "stop"]
    params: Mapping[str, Any] | None
    context_management: Mapping[str, Any] | None
    name: str
    tracer_provider: TracerProvider | None
    history_check: Literal["strict", "off"]
    approval_required: Collection[str] | ApprovalRule | None
    usage_limits: UsageLimits | None
    history_processors: Sequence[HistoryProcessor]
    output_mode: OutputMode
    output_retries: int
    cache: CacheSetting
    capabilities: Sequence[Capability]


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """How an agent's runs go: the model, the request, the tool calls, the limits.

    `Agent(...)` takes these as keywords (and `provider` from `client=` when not given);
    `agent.config` holds them. Invalid values raise `ConfigurationError` here, so nothing
    is checked later that could have been checked now.
    """

    provider: Provider
    """Where requests go (an `AnthropicProvider` over `client=` by default)."""
    model: str = DEFAULT_MODEL
    """Model name sent with each request."""
    system: str | Sequence[Mapping[str, Any]] | None = None
    """System prompt, a string or a list of text blocks."""
    max_rounds: int = 10
    """Most model requests one run may make; when reached the run returns with
    `stop_reason="max_rounds"` and a complete history, ready to continue."""
    max_tokens: int = 4096
    """`max_tokens` of each request."""
    tool_concurrency: int = 8
    """Most tool calls of one run in flight at once."""
    tool_timeout: float = 30.0
    """Seconds a tool call may take, unless the tool sets its own (`math.inf`: none)."""
    tool_limiter: anyio.CapacityLimiter | None = None
    """A limiter shared by several agents or runs, capping tool calls across all of
    them (in addition to `tool_concurrency`)."""
    tool_choice: Mapping[str, Any] | None = None
    """`{"type": "auto" | "any" | "tool" | "none", ...}`, including
    `disable_parallel_tool_use`."""
    thinking: Mapping[str, Any] | None = None
    """Extended thinking, e.g. `{"type": "enabled", "budget_tokens": 2048}`."""
    metadata: Mapping[str, Any] | None = None
    """Request metadata, e.g. `{"user_id": ...}`."""
    stop_sequences: Sequence[str] | None = None
    """Custom stop sequences."""
    on_tool_error: Literal["continue", "stop"] = "continue"
    """`"continue"` sends failures to the model as `is_error` results; `"stop"` also ends
    the run with `ToolCallFailed` once the turn's results are in the history."""
    params: Mapping[str, Any] | None = None
    """Further request fields, passed through as they are (`temperature`, `top_p`,
    `service_tier`, `betas`, `extra_headers`, ...)."""
    context_management: Mapping[str, Any] | None = None
    """The Anthropic API's server-side context management, e.g. `{"edits": [{"type":
    "clear_tool_uses_20250919"}]}`, sent with each request under the beta its edits
    need. The blocks the API returns for it stay in the history verbatim."""
    name: str = "agentloop"
    """The agent's name in traces (`invoke_agent {name}`) and as a tool (`as_tool`)."""
    tracer_provider: TracerProvider | None = None
    """Where the run's OpenTelemetry spans go; by default the global tracer provider,
    which records nothing until an SDK is set up."""
    history_check: Literal["strict", "off"] = "strict"
    """`"strict"` checks the history against the API's rules before every request
    (`HistoryError` at the first broken one, nothing sent); `"off"` sends it unchecked,
    for a model that accepts what the checks refuse."""
    approval_required: Collection[str] | ApprovalRule | None = None
    """Tools whose calls wait for a person's decision, on top of each tool's own
    `requires_approval`: a set of tool names, or `rule(ctx, input) -> bool` deciding
    per call. See `Agent.resume`."""
    usage_limits: UsageLimits | None = None
    """The most each run may spend (tokens, tool calls, dollars); a run that would go
    over ends with `UsageLimitExceeded`. A run's own `usage_limits=` replaces these."""
    history_processors: Sequence[HistoryProcessor] = ()
    """Functions (sync or async, optionally taking the `RunContext` first) from the
    messages to the messages to send, applied in order before every request (see
    `agentloop.compaction`). They shape what is sent, never the run's history. A
    request refused for length is retried once with their `forced` form."""
    output_type: Any = str
    """What a run ends with, validated, as `result.output`: a pydantic model, a
    dataclass, a TypedDict, a plain type or a union of these; `str` is the final text."""
    output_mode: OutputMode = "auto"
    """How the output reaches the model: `"native"` (structured output), `"tool"` (a
    final-result tool), `"prompted"` (the schema in the system prompt), or `"auto"`:
    native where the provider has it, else tool."""
    output_retries: int = 2
    """How often an invalid output is sent back to the model before the run ends with
    `OutputValidationError`."""
    cache: CacheSetting = "auto"
    """Prompt caching (Anthropic): `"auto"` puts cache breakpoints on each request,
    moving with the history (5-minute TTL); `"1h"` the same with a 1-hour TTL; `"off"`
    adds none (the user's own markers are sent either way)."""
    capabilities: Sequence[Capability] = ()
    """Middleware around every run (`agentloop.capabilities`): guardrails, fallback,
    retries, your own. The first is the outermost; a run's own `capabilities=` come
    inside these."""
    server_tools: Sequence[ServerTool] = ()
    """Tools the API runs itself (`WebSearch`, `WebFetch`, `CodeExecution`,
    `ToolSearch`), from `Agent(tools=[...])`: announced after the function tools of
    every request, with the beta headers their versions need."""

    def __post_init__(self) -> None:
        """Check every option; refuse a value that cannot work with `ConfigurationError`."""
        check_count("max_rounds", self.max_rounds)
        check_count("max_tokens", self.max_tokens)
        check_count("tool_concurrency", self.tool_concurrency)
        check_seconds("tool_timeout", self.tool_timeout)
        _one_of("history_check", self.history_check, ("strict", "off"))
        _one_of("on_tool_error", self.on_tool_error, ("continue", "stop"))
        _one_of("output_mode", self.output_mode, ("auto", "native", "tool", "prompted"))
        if type(self.output_retries) is not int or self.output_retries < 0:
            raise ConfigurationError(
                f"output_retries must be a whole number >= 0, not {self.output_retries!r}"
            )
        if not callable(getattr(self.provider, "complete", None)):
            raise ConfigurationError(f"provider {self.provider!r} has no complete() method")
        _instance(
            "tool_limiter", self.tool_limiter, anyio.CapacityLimiter, "an anyio.CapacityLimiter"
        )
        _instance("usage_limits", self.usage_limits, UsageLimits, "a UsageLimits")
        check_provider(self.usage_limits, self.provider)
        if isinstance(self.history_processors, (str, bytes)) or not all(
            callable(p) for p in self.history_processors
        ):
            raise ConfigurationError("history_processors must be a list of functions")
        if self.context_management is not None and getattr(self.provider, "name", "") == "openai":
            raise ConfigurationError(
                "context_management is a Messages API feature; Chat Completions has none"
            )
        # Kept in their checked forms (frozen: set once, here).
        object.__setattr__(self, "approval_required", agent_rule(self.approval_required))
        object.__setattr__(self, "history_processors", tuple(self.history_processors))
        object.__setattr__(
            self, "capabilities", check_capabilities(self.capabilities, "capabilities")
        )
        _server_tools(self.server_tools, self.provider)
        object.__setattr__(self, "server_tools", tuple(self.server_tools))
        cache_marker(self.cache)
        self.output_schema  # noqa: B018 (refuses an output type it cannot describe)
        self.request_params  # noqa: B018 (refuses context management it cannot send)

    def check_tools(self, registry: ToolRegistry) -> None:
        """Refuse options that name tools the agent lacks, or that clash with its tools.

        Raises:
            ConfigurationError: `approval_required` names a tool not in `registry`, a
                server tool has a function tool's name, or a tool is deferred with no
                tool search to find it.
        """
        names = registry.names
        required = self.approval_required
        if isinstance(required, frozenset) and (unknown := sorted(required - set(names))):
            raise ConfigurationError(
                f"approval_required names {', '.join(unknown)}, not tools of this agent"
            )
        deferred = [t.name for t in registry if t.defer_loading]
        check_announced(names, deferred, self.request_params)

    @property
    def request_params(self) -> dict[str, Any]:
        """`params`, with `context_management`, the server tools and the betas they need."""
        params = dict(self.params or {})
        if self.context_management is not None:
            params = context_management_params(self.context_management, params)
        return server_request_params(self.server_tools, params)

    @property
    def cache_marker(self) -> dict[str, Any] | None:
        """The `cache_control` marker of the `cache` setting (None for `"off"`)."""
        return cache_marker(self.cache)

    @property
    def output_schema(self) -> OutputSchema | None:
        """The schema of `output_type` (None for `str`: the output is the text)."""
        return schema_of(self.output_type)


def check_deps(deps: object, deps_type: type | None) -> None:
    """Refuse a run's `deps` that are not of the agent's `deps_type` (when that is a class).

    Raises:
        ConfigurationError: `deps` is of another class.
    """
    if deps is None or deps_type is None or not isinstance(deps_type, type):
        return
    try:
        fits = isinstance(deps, deps_type)
    except TypeError:  # a Protocol that is not runtime-checkable, say: not checkable
        return
    if not fits:
        raise ConfigurationError(
            f"deps must be a {deps_type.__qualname__} (the agent's deps_type), "
            f"not {type(deps).__qualname__}"
        )


def schema_of(output_type: Any) -> OutputSchema | None:
    """The output schema of a type (None for `str`: the output is the text)."""
    return None if output_type is str else output_schema(output_type)


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        *most, last = (repr(a) for a in allowed)
        raise ConfigurationError(f"{name} must be {', '.join(most)} or {last}, not {value!r}")


def _server_tools(tools: Sequence[ServerTool], provider: Provider) -> None:
    """Refuse server tools a request cannot carry.

    The same name twice is refused, and any on Chat Completions (which has none).
    """
    names = [t.tool_name for t in tools]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigurationError(f"server tool {', '.join(twice)} is given more than once")
    if tools and getattr(provider, "name", "") == "openai":
        raise ConfigurationError(
            "server tools (web search, code execution, ...) are a Messages API feature; "
            "Chat Completions has none"
        )


def _instance(name: str, value: Any, kind: type, shown: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigurationError(f"{name} must be {shown}, not {type(value).__name__}")
