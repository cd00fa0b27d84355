"""Capabilities: middleware around a run, its model requests and its tool calls.

A `Capability` overrides the hooks it needs; the others pass through. The run composes
its capabilities (the agent's, then the run's own) in a `Chain`: the first given is the
outermost, so its `wrap_request` sees the request first and the response last. Hooks are
async; a capability that keeps state for one run makes a fresh copy of itself in
`for_run`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from agentloop.errors import ConfigurationError

if TYPE_CHECKING:
    from agentloop.calls import AnnouncedTool, ToolCall, ToolResult
    from agentloop.context import RunContext
    from agentloop.providers.base import ModelRequest, ModelResponse, Provider
    from agentloop.result import RunResult

__all__ = ("Capability", "Chain", "NextCall", "NextRequest", "check_capabilities")


class NextRequest(Protocol):
    """Sends the request on, to the next capability or to the provider.

    `provider` sends it to another provider than the run's (a fallback's), the run's
    streaming and effects kept.
    """

    async def __call__(
        self, request: ModelRequest, *, provider: Provider | None = None
    ) -> ModelResponse:
        """The response to `request` (sent through `provider` when one is given)."""
        ...


NextCall = Callable[["ToolCall"], Awaitable["ToolResult"]]
"""Runs the call on, through the next capability or the tool; returns its result."""


class Capability:
    """Middleware around a run; every hook is optional (the defaults pass through).

    ```python
    class Redact(Capability):
        async def wrap_tool_call(self, ctx, call, call_next):
            result = await call_next(call)
            return replace(result, content=scrub(result.text))
    ```

    `ctx` is the run's `RunContext`: the turn's in `prepare_tools` and `wrap_request`,
    the call's in `wrap_tool_call`, the run's first in `before_run` and `after_run`.
    """

    name: str = ""
    """How the capability is named in errors, logs and on the command line (by default
    its class's name)."""

    def for_run(self, ctx: RunContext[Any]) -> Capability:
        """The capability one run uses: `self`, or a fresh copy for a stateful one."""
        return self

    async def before_run(self, ctx: RunContext[Any]) -> None:
        """Before the run's first request. Raising an `AgentloopError` ends the run."""

    async def prepare_tools(
        self, ctx: RunContext[Any], tools: list[AnnouncedTool]
    ) -> list[AnnouncedTool]:
        """The tools announced this turn: add, hide or change definitions.

        `tools` are the run's tools (`ToolDefinition`s) and its external ones (as they
        were given). A call of a tool that is not announced is answered as not available.
        """
        return tools

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        """Around each model request: see or change it, retry, fall back, or answer it.

        Runs inside the request's effect (a durable run's step): what it does is
        recorded with the response. An extra request it makes itself is counted with
        `ctx.add_usage`.
        """
        return await call_next(request)

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        """Around each tool call: change the input, deny, redact the result, stop the run.

        Raise `ToolError(message)` without calling `call_next` to answer the call with
        an `is_error` result carrying `message` (the tool does not run); raise an
        `AgentloopError` to end the run. Runs inside the call's effect.
        """
        return await call_next(call)

    async def after_run(self, ctx: RunContext[Any], result: RunResult[Any]) -> None:
        """After the run ended normally, before its result is handed over.

        Raising an `AgentloopError` ends the run with that error instead.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _label(capability: Capability) -> str:
    return capability.name or type(capability).__name__


def check_capabilities(value: Any, where: str) -> tuple[Capability, ...]:
    """`value` as a tuple of capabilities.

    Raises:
        ConfigurationError: it is not a list of `Capability` instances.
    """
    if value is None:
        return ()
    if isinstance(value, (Capability, str, bytes)) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{where} must be a list of capabilities, not {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, Capability):
            kind = type(item).__name__
            if isinstance(item, type) and issubclass(item, Capability):
                kind = f"the class {item.__name__} (make an instance)"
            raise ConfigurationError(f"{where}: {kind} is not a Capability")
    return items


def _overrides(capability: Capability, hook: str) -> bool:
    return getattr(type(capability), hook) is not getattr(Capability, hook)


class Chain:
    """One run's capabilities, composed: each hook in the order the run needs it.

    Only the capabilities that override a hook take part in it, so a run without
    capabilities pays nothing.
    """

    def __init__(
        self, capabilities: Sequence[Capability] = (), ctx: RunContext[Any] | None = None
    ) -> None:
        """The capabilities of one run (`for_run` asked with `ctx`), the first outermost."""
        self.capabilities = tuple(c if ctx is None else c.for_run(ctx) for c in capabilities)
        self._with = {
            hook: tuple(c for c in self.capabilities if _overrides(c, hook))
            for hook in (
                "before_run",
                "prepare_tools",
                "wrap_request",
                "wrap_tool_call",
                "after_run",
            )
        }

    def __bool__(self) -> bool:
        return bool(self.capabilities)

    def has(self, hook: str) -> bool:
        """Whether a capability of the run overrides `hook`."""
        return bool(self._with[hook])

    async def before_run(self, ctx: RunContext[Any]) -> None:
        """Each `before_run`, outermost first."""
        for capability in self._with["before_run"]:
            await capability.before_run(ctx)

    async def prepare_tools(
        self, ctx: RunContext[Any], tools: list[AnnouncedTool]
    ) -> list[AnnouncedTool]:
        """The tools through each `prepare_tools`, outermost first."""
        for capability in self._with["prepare_tools"]:
            tools = await capability.prepare_tools(ctx, list(tools))
            if not isinstance(tools, list):
                raise ConfigurationError(
                    f"capability {_label(capability)}: prepare_tools returned "
                    f"{type(tools).__name__}, not a list of tool definitions"
                )
        return tools

    def request(self, ctx: RunContext[Any], send: NextRequest) -> NextRequest:
        """`send` wrapped in each `wrap_request`, the first capability outermost."""
        for capability in reversed(self._with["wrap_request"]):
            send = _next_request(capability, ctx, send)
        return send

    def tool_call(self, ctx: RunContext[Any], run: NextCall) -> NextCall:
        """`run` wrapped in each `wrap_tool_call`, the first capability outermost."""
        for capability in reversed(self._with["wrap_tool_call"]):
            run = partial(capability.wrap_tool_call, ctx, call_next=run)
        return run

    async def after_run(self, ctx: RunContext[Any], result: RunResult[Any]) -> None:
        """Each `after_run`, innermost first (as the wraps unwind)."""
        for capability in reversed(self._with["after_run"]):
            await capability.after_run(ctx, result)


def _next_request(capability: Capability, ctx: RunContext[Any], inner: NextRequest) -> NextRequest:
    """`inner` behind `capability`: the `call_next` of the capability outside it.

    The provider an outer capability names goes on down to the send: a capability in
    between that calls its `call_next(request)` without one keeps it.
    """

    async def call_next(
        request: ModelRequest, *, provider: Provider | None = None
    ) -> ModelResponse:
        async def onward(
            request: ModelRequest, *, provider: Provider | None = provider
        ) -> ModelResponse:
            return await inner(request, provider=provider)

        return await capability.wrap_request(ctx, request, onward)

    return call_next
