"""The tool registry: looks tools up, announces them, and runs one turn's calls in parallel.

`execute` takes the calls of one assistant turn and returns one `ToolResult` per call, in
tool_use order. Every call runs in its own task of one anyio task group, under a shared
`CapacityLimiter` and its own timeout; failures of any kind become `is_error` results
inside the call's task, so one tool never cancels its siblings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import ValidationError
from structlog.contextvars import bind_contextvars

from .errors import DuplicateToolError, ToolError
from .logs import get_logger
from .tools import (
    RunContext,
    Tool,
    ToolCall,
    ToolDefinition,
    ToolResult,
    describe_validation_error,
    to_content,
)

__all__ = ("ExecutionContext", "ToolRegistry", "bind_call_context")

_log = get_logger()


@dataclass
class ExecutionContext:
    """What one turn's execution needs from its run."""

    run_id: str
    """Id of the run, bound in logs and passed to tools in `RunContext`."""
    round: int
    """The model request whose calls these are, from 1."""
    limiter: anyio.CapacityLimiter
    """Caps the calls of this run in flight at once."""
    timeout: float
    """Default seconds per call; a tool's own `timeout` wins."""
    deps: Any = None
    """The run's `deps`, handed to tools through `RunContext`."""
    shared_limiter: anyio.CapacityLimiter | None = None
    """An optional second cap shared by every run of a process."""
    thread_limiter: anyio.CapacityLimiter | None = None
    """Worker threads for sync tools (anyio's default limiter of 40 when None)."""
    log: Any = None
    """The logger for this turn's events (`run_id` and `round` bound); a default if None."""


class ToolRegistry:
    """Tools by name: register, look up, announce, execute.

    Registration order is the order tools are announced to the model, so requests stay
    byte-stable (which keeps prompt caching effective).
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        """Create a registry holding `tools` (functions are wrapped with `Tool`)."""
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str | None] = {}
        self._definitions: list[ToolDefinition] | None = None
        for item in tools:
            self.register(item)

    def register(self, item: Tool | Callable[..., Any], *, source: str | None = None) -> Tool:
        """Add a tool; `source` records where it came from (a plugin's name).

        Raises:
            DuplicateToolError: a tool of that name is registered already.
        """
        new = item if isinstance(item, Tool) else Tool(item)
        source = source or new.source
        if new.name in self._tools:
            where = self._sources.get(new.name)
            raise DuplicateToolError(
                f"tool name {new.name!r} is registered twice "
                f"(by {where or 'the application'} and by {source or 'the application'}); "
                "the model addresses tools by name, so rename one"
            )
        self._tools[new.name] = new
        self._sources[new.name] = source
        self._definitions = None
        return new

    def get(self, name: str) -> Tool | None:
        """The tool called `name`, or None."""
        return self._tools.get(name)

    def source(self, name: str) -> str | None:
        """Where the tool called `name` came from (a plugin name), or None."""
        return self._sources.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def definitions(self) -> list[ToolDefinition]:
        """The definitions to announce, in registration order (computed once)."""
        if self._definitions is None:
            self._definitions = [t.definition for t in self._tools.values()]
        return self._definitions

    async def execute(
        self, calls: Sequence[ToolCall], context: ExecutionContext
    ) -> list[ToolResult]:
        """Run `calls` in parallel; return their results in the same order.

        Never raises for a tool's failure: unknown tools, invalid input, exceptions,
        `ToolError` and timeouts all become `is_error` results. Cancellation of the caller
        propagates (and cancels the calls).
        """
        results: list[ToolResult | None] = [None] * len(calls)

        async def run(index: int, call: ToolCall) -> None:
            bind_call_context(context, call)
            results[index] = await self.run_call(call, context)

        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(run, index, call)
        return [r for r in results if r is not None]

    async def run_call(self, call: ToolCall, context: ExecutionContext) -> ToolResult:
        """Run one call: validate, wait for a slot, run under its timeout, log it.

        Never raises for a tool's failure (see `execute`).
        """
        tool = self._tools.get(call.name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            result = ToolResult.error(
                call, f"Unknown tool '{call.name}'. Available tools: {available}."
            )
        else:
            try:
                arguments = tool.validate(call.input)
            except ValidationError as exc:
                result = ToolResult.error(call, describe_validation_error(call.name, exc))
            else:
                await _acquire(context.limiter)
                try:
                    if context.shared_limiter is None:
                        result = await self._call(tool, arguments, call, context)
                    else:
                        await _acquire(context.shared_limiter)
                        try:
                            result = await self._call(tool, arguments, call, context)
                        finally:
                            context.shared_limiter.release()
                finally:
                    context.limiter.release()
        _logger(context).debug(
            "tool.call",
            tool_use_id=call.id,
            name=call.name,
            duration=round(result.duration, 6),
            is_error=result.is_error,
        )
        return result

    async def _call(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        call: ToolCall,
        context: ExecutionContext,
    ) -> ToolResult:
        timeout = tool.timeout if tool.timeout is not None else context.timeout
        run_context = RunContext(context.run_id, context.round, call.id, call.name, context.deps)
        start = time.perf_counter()
        value: Any = None
        try:
            with anyio.move_on_after(timeout) as scope:
                value = await tool.invoke(
                    arguments, run_context, thread_limiter=context.thread_limiter
                )
            if scope.cancelled_caught:
                return ToolResult.error(
                    call,
                    f"Tool '{call.name}' timed out after {timeout:g} s and was stopped.",
                    time.perf_counter() - start,
                )
            content = to_content(value)
        except ToolError as exc:
            return ToolResult.error(call, exc.message, time.perf_counter() - start)
        except Exception as exc:
            _logger(context).exception("tool.exception", tool_use_id=call.id, name=call.name)
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ToolResult.error(
                call, f"Tool '{call.name}' failed: {detail}", time.perf_counter() - start
            )
        return ToolResult(call.id, call.name, content, duration=time.perf_counter() - start)


def _logger(context: ExecutionContext) -> Any:
    """The turn's logger, with `run_id` and `round` bound."""
    if context.log is not None:
        return context.log
    return _log.bind(run_id=context.run_id, round=context.round)


def bind_call_context(context: ExecutionContext, call: ToolCall) -> None:
    """Bind the call's ids into structlog's contextvars, so the tool's own logs carry them.

    Call it in the call's own task: a task works on a copy of its parent's context, so
    the binding ends with the task and needs no reset.
    """
    bind_contextvars(run_id=context.run_id, round=context.round, tool_use_id=call.id)


async def _acquire(limiter: anyio.CapacityLimiter) -> None:
    """Take a slot; without waiting when one is free.

    `CapacityLimiter.acquire()` always yields to the event loop once, even with a slot
    free; with a thousand calls in a turn that extra pass per call is most of the cost.
    """
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        await limiter.acquire()
