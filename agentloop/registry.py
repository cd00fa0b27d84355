"""The tool registry: looks tools up, announces them, and runs tool calls.

`run_call` is the one path every call takes: look the tool up, validate the input, take
the call's slots (the run's cap, the shared cap, a worker thread for a sync tool), run it
under its timeout, and turn every failure into that call's `is_error` result, so one tool
never cancels its siblings. `CallGroup` runs calls as tasks of a task group; `execute`
runs a list of calls that way and returns their results in call order.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from pydantic import ValidationError
from structlog.contextvars import bind_contextvars

from .calls import (
    CallPaused,
    ToolCall,
    ToolDefinition,
    ToolResult,
    describe_exception,
    to_content,
)
from .capabilities.base import Chain
from .context import RunContext, counted_apart
from .effects import DIRECT, CallTasks, Effects, task_group_for
from .errors import AgentloopError, DuplicateToolError, ToolError
from .logs import get_logger
from .progress import running_call
from .slots import DEFAULT_THREAD_LIMIT, Raised, Slots, thread_limiter, uncapped
from .tools import Tool, describe_validation_error
from .tracing import Tracing, fail

__all__ = (
    "DEFAULT_THREAD_LIMIT",
    "AgentTool",
    "CallGroup",
    "ExecutionContext",
    "ToolRegistry",
    "bind_call_context",
    "reraise_base_exception",
    "thread_limiter",
)

_log = get_logger()


def ExecutionContext(
    run_id: str,
    round: int,
    limiter: anyio.CapacityLimiter,
    timeout: float,
    deps: Any = None,
    shared_limiter: anyio.CapacityLimiter | None = None,
    thread_limiter: anyio.CapacityLimiter | None = None,
    log: Any = None,
    tracing: Tracing | None = None,
    effects: Effects = DIRECT,
) -> RunContext[Any]:
    """Deprecated: build a `RunContext` by keyword; it is what the registry takes now."""
    warnings.warn(
        "ExecutionContext is deprecated: pass a RunContext (built by keyword) to the registry",
        DeprecationWarning,
        stacklevel=2,
    )
    return RunContext(
        run_id,
        round,
        deps=deps,
        limiter=limiter,
        timeout=timeout,
        shared_limiter=shared_limiter,
        thread_limiter=thread_limiter,
        log=log,
        tracing=tracing,
        effects=effects,
    )


class ToolRegistry:
    """Tools by name: register, look up, announce, run.

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

    # -- running calls

    async def execute(
        self,
        calls: Sequence[ToolCall],
        ctx: RunContext[Any],
        *,
        on_result: Callable[[ToolResult], Awaitable[None]] | None = None,
    ) -> list[ToolResult]:
        """Run `calls` concurrently, a task each; return their results in the same order.

        Args:
            calls: The calls, e.g. a turn's `tool_use` blocks as `ToolCall`s.
            ctx: The turn's context: the run's caps, timeout, ids and deps.
            on_result: Awaited with each result as soon as it is in (to record or report
                it), in the order the calls finish.

        Never raises for a tool's failure (see `run_call`). Cancellation of the caller
        propagates (and cancels the calls); so does a tool's `BaseException` that is not
        an `Exception`, as itself.
        """
        results: list[ToolResult | None] = [None] * len(calls)

        async def keep(index: int, result: ToolResult) -> None:
            results[index] = result
            if on_result is not None:
                await on_result(result)

        async with CallGroup(self, ctx) as group:
            for index, call in enumerate(calls):
                group.start(call, partial(keep, index))
        return results  # type: ignore[return-value]  # every slot is filled

    async def run_call(self, call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
        """Run one call: look up, validate, take its slots, run under its timeout, log it.

        `ctx` is the turn's context; the tool gets it naming the call (`for_call`). Never
        raises for a tool's failure: an unknown tool, invalid input, `ToolError`,
        any other exception and a timeout all become `is_error` results. Cancellation of
        the caller propagates, and so does a tool's `BaseException` that is not an
        `Exception` (`SystemExit`, `KeyboardInterrupt`, ...).
        """
        if ctx.tool_use_id != call.id:  # through `CallGroup`, it names the call already
            ctx = ctx.for_call(call)
        if ctx.tracing is None:
            result = await self._run(call, ctx)
        else:
            with ctx.tracing.tool(call.name, call.id, call.input) as span:
                result = await self._run(call, ctx)
                if result.is_error:
                    fail(span, "tool_error", result.text[:200])
                if ctx.tracing.capture_content:
                    span.set_attribute("gen_ai.tool.call.result", result.text)
        _logger(ctx).debug(
            "tool.call",
            tool_use_id=call.id,
            name=call.name,
            duration=round(result.duration, 6),
            is_error=result.is_error,
        )
        return result

    async def run_call_through(
        self, call: ToolCall, ctx: RunContext[Any], capabilities: Chain
    ) -> ToolResult:
        """Run one call through `capabilities`' `wrap_tool_call`s, then as `run_call` does.

        A capability's `ToolError` answers the call without running it; an
        `AgentloopError` goes on (it ends the run); any other failure answers the call
        with an `is_error` result naming it.
        """
        if ctx.tool_use_id != call.id:  # through `CallGroup`, it names the call already
            ctx = ctx.for_call(call)

        async def tool(changed: ToolCall) -> ToolResult:
            # A capability may change the input; the call keeps its id and name.
            return await self.run_call(replace(changed, id=call.id), ctx)

        try:
            return await capabilities.tool_call(ctx, tool)(call)
        except ToolError as exc:
            return ToolResult.error(call, exc.message, ran=False)
        except AgentloopError:
            raise
        except Exception as exc:
            _logger(ctx).exception("capability.failed", tool_use_id=call.id, name=call.name)
            why = f"Not run: a capability of the run failed ({describe_exception(exc)})."
            return ToolResult.error(call, why, ran=False)

    async def _run(self, call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return ToolResult.error(
                call, f"Unknown tool '{call.name}'. Available tools: {available}."
            )
        try:
            arguments = tool.validate(call.input)
        except ValidationError as exc:
            return ToolResult.error(call, describe_validation_error(call.name, exc))
        function = tool.bind(arguments, ctx)
        timeout = tool.timeout if tool.timeout is not None else ctx.timeout
        slots = Slots()
        try:
            if ctx.limiter is not None:
                await slots.take(ctx.limiter)
            if ctx.shared_limiter is not None:
                await slots.take(ctx.shared_limiter)
            if not tool.is_async:
                await slots.take(ctx.thread_limiter or thread_limiter())
            start = time.perf_counter()
            try:
                with anyio.move_on_after(timeout) as scope:
                    if tool.is_async:
                        with running_call(ctx.round, call.id, call.name):
                            value = await function()
                    else:
                        value = await anyio.to_thread.run_sync(
                            slots.run, function, abandon_on_cancel=tool.abandon, limiter=uncapped()
                        )
                        if isinstance(value, Raised):
                            raise value.exc
            except anyio.get_cancelled_exc_class() as exc:
                if anyio.current_effective_deadline() == -math.inf:
                    raise  # the caller was cancelled
                # Nobody cancelled this call: the tool raised a cancellation of its own (it
                # awaited a future someone else cancelled, say). That is the tool failing.
                message = f"{_failure(call, exc)} (raised by the tool; the call was not cancelled)"
                return ToolResult.error(call, message, time.perf_counter() - start)
            except ToolError as exc:
                return ToolResult.error(call, _told(call, exc), time.perf_counter() - start)
            except Exception as exc:
                _logger(ctx).exception(
                    "tool.exception",
                    tool_use_id=call.id,
                    name=call.name,
                    error=describe_exception(exc),
                )
                return ToolResult.error(call, _failure(call, exc), time.perf_counter() - start)
            duration = time.perf_counter() - start
            if scope.cancelled_caught:
                return _timed_out(tool, call, timeout, duration)
            if scope.cancel_called and not tool.is_async:
                # An `abandon=False` tool, waited for past its timeout.
                return ToolResult.error(
                    call,
                    f"Tool '{call.name}' did not finish within {timeout:g} s; it was left "
                    f"to finish (after {duration:.3g} s), so its effects have happened, "
                    "but its output was discarded.",
                    duration,
                )
            if isinstance(value, CallPaused):
                return ToolResult(call.id, call.name, None, duration=duration, paused=value.state)
            try:
                content = to_content(value)
            except Exception as exc:  # the value's own code may run here (a generator, say)
                why = describe_exception(exc) if not isinstance(exc, TypeError) else str(exc)
                _logger(ctx).warning(
                    "tool.unsendable_result", tool_use_id=call.id, name=call.name, error=why
                )
                return ToolResult.error(call, _unsendable(call, why), duration)
            return ToolResult(call.id, call.name, content, duration=duration)
        finally:
            slots.release()


class AgentTool(Tool):
    """A tool whose calls run an agent (`Agent.as_tool`), with that agent's tools.

    A call whose run paused is answered, when the calling run resumes, through
    `sub_tools`: the decisions about the calls inside are checked against them.
    """

    sub_tools: ToolRegistry
    """The sub-agent's tools."""


class CallGroup:
    """Tool calls run as tasks of one task group, each through `ToolRegistry.run_call`.

    ```python
    async with CallGroup(registry, ctx) as group:
        group.start(call, on_result)   # awaits on_result(result) in the call's task
    ```

    A tool's `BaseException` that is not an `Exception` (`SystemExit`,
    `KeyboardInterrupt`, ...) cancels the group and leaves it as itself, not in an
    exception group: raised in a task, asyncio would let `SystemExit` and
    `KeyboardInterrupt` escape the event loop, past every caller. So does an
    `AgentloopError` a capability raises to end the run.
    """

    def __init__(
        self, registry: ToolRegistry, ctx: RunContext[Any], capabilities: Chain | None = None
    ) -> None:
        """Run calls of `registry` with `ctx`, the turn's context, inside `capabilities`."""
        self.registry = registry
        self.context = ctx
        self.capabilities = capabilities
        self._group: anyio.abc.TaskGroup | CallTasks | None = None
        self._fatal: BaseException | None = None

    async def __aenter__(self) -> CallGroup:
        # The run's effects may say what its calls run in (see `agentloop.effects`).
        self._group = task_group_for(self.context.effects)
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._group is not None
        try:
            handled = await self._group.__aexit__(*exc_info)
        except BaseException as exc:
            if self._fatal is not None:
                _raise(self._fatal)
            reraise_base_exception(exc)
            raise
        if self._fatal is not None:
            _raise(self._fatal)
        return handled

    @property
    def cancel_scope(self) -> anyio.CancelScope:
        """The group's cancel scope, when its calls run in an anyio task group (see `cancel`)."""
        assert isinstance(self._group, anyio.abc.TaskGroup)
        return self._group.cancel_scope

    def cancel(self) -> None:
        """Cancel every call of the group."""
        if isinstance(self._group, anyio.abc.TaskGroup):
            self._group.cancel_scope.cancel()
        elif self._group is not None:
            self._group.cancel()

    def start(self, call: ToolCall, on_result: Callable[[ToolResult], Awaitable[None]]) -> None:
        """Run `call` in a task of its own; await `on_result` with its result."""
        assert self._group is not None
        self._group.start_soon(self._run, call, on_result)

    async def _run(
        self, call: ToolCall, on_result: Callable[[ToolResult], Awaitable[None]]
    ) -> None:
        # The task works on a copy of its parent's context: the binding ends with it.
        bind_call_context(self.context, call)
        capabilities = self.capabilities
        if capabilities is not None and not capabilities.has("wrap_tool_call"):
            capabilities = None

        async def run_here(ctx: RunContext[Any]) -> ToolResult:
            if capabilities is None:
                return await self.registry.run_call(call, ctx)
            return await self.registry.run_call_through(call, ctx, capabilities)

        async def run() -> ToolResult:
            # What a sub-run or a capability spends inside the call rides on its result.
            result, spent = await counted_apart(self.context, run_here, call=call)
            return result.with_spent(spent)

        try:
            result = await self.context.effects.tool(call, self.context.round, run)
            if result.spent is not None:
                spent = result.spent
                self.context.add_usage(spent.usage, spent.cost, tool_calls=spent.tool_calls)
        except BaseException as exc:
            stops = isinstance(exc, AgentloopError)  # a capability ended the run
            if not stops and isinstance(exc, (Exception, *_cancellations())):
                raise
            if self._fatal is None:
                self._fatal = exc
            self.cancel()
            return
        await on_result(result)


# -- helpers


def _timed_out(tool: Tool, call: ToolCall, timeout: float, duration: float) -> ToolResult:
    if tool.is_async:
        message = f"Tool '{call.name}' timed out after {timeout:g} s and was stopped."
    else:
        message = (
            f"Tool '{call.name}' did not finish within {timeout:g} s and is still running: "
            "it may yet complete, so its effects may still happen. Check before calling it "
            "again."
        )
    return ToolResult.error(call, message, duration)


def _logger(ctx: RunContext[Any]) -> Any:
    """The turn's logger, with `run_id` and `round` bound."""
    if ctx.log is not None:
        return ctx.log
    return _log.bind(run_id=ctx.run_id, round=ctx.round)


def bind_call_context(ctx: RunContext[Any], call: ToolCall) -> None:
    """Bind the call's ids into structlog's contextvars, so the tool's own logs carry them.

    Call it in the call's own task (as `CallGroup` does): a task works on a copy of its
    parent's context, so the binding ends with the task and needs no reset.
    """
    bind_contextvars(run_id=ctx.run_id, round=ctx.round, tool_use_id=call.id)


def _failure(call: ToolCall, exc: BaseException) -> str:
    return f"Tool '{call.name}' failed: {describe_exception(exc)}"


def _told(call: ToolCall, exc: ToolError) -> str:
    """The message of a `ToolError`, as text; one that says nothing is said for it."""
    message: object = exc.message
    if message is None:
        message = ""
    elif not isinstance(message, str):
        try:
            message = str(message)
        except Exception:
            message = ""
    if not message.strip():
        return f"Tool '{call.name}' failed (it raised {type(exc).__name__} without a message)."
    return message


def _unsendable(call: ToolCall, why: str) -> str:
    return (
        f"Tool '{call.name}' ran, but its return value cannot be sent to the model: {why}. "
        "Its effects, if any, have happened; the fault is in the tool, not in the call."
    )


# -- exceptions out of task groups


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`, depth first (exception groups opened up)."""
    inner = getattr(exc, "exceptions", None)  # a BaseExceptionGroup (or its backport)
    if not isinstance(inner, tuple) or not hasattr(exc, "derive"):
        return [exc]
    return [leaf for sub in inner for leaf in _leaves(sub)]


def _raise(exc: BaseException) -> None:
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context  # not the group it was taken out of
        del exc, context


def reraise_base_exception(exc: BaseException) -> None:
    """Raise, as itself, a tool's `BaseException` that a task group wrapped in a group.

    `exc` is what a task group raised. If it holds an exception that is neither an
    `Exception` nor a cancellation (`SystemExit`, `KeyboardInterrupt`, `GeneratorExit`, a
    custom `BaseException`), the first one is raised as it is; otherwise this returns and
    the caller goes on (usually with a bare `raise`).

    ```python
    try:
        async with anyio.create_task_group() as group:
            ...
    except BaseException as exc:
        reraise_base_exception(exc)
        raise
    ```
    """
    for leaf in _leaves(exc):
        if not isinstance(leaf, (Exception, *_cancellations())):
            _raise(leaf)


def _cancellations() -> tuple[type[BaseException], ...]:
    """The cancellation classes of the backends in use (no event loop needed)."""
    trio = sys.modules.get("trio")
    return (asyncio.CancelledError,) if trio is None else (asyncio.CancelledError, trio.Cancelled)
