"""The tool registry: looks tools up, announces them, and runs a turn's tool calls.

`run_call` runs one call (the loop starts each call as soon as it can, in a task of its
own); `execute` runs a batch and returns the results in call order. Each call is
validated, waits for its slots (the run's cap, the shared cap, a worker thread for a sync
tool) and runs under its timeout; every failure becomes that call's `is_error` result, so
one tool never cancels its siblings. A slot is held until the tool has really stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
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

__all__ = (
    "DEFAULT_THREAD_LIMIT",
    "ExecutionContext",
    "ToolRegistry",
    "bind_call_context",
    "reraise_base_exception",
    "thread_limiter",
)

_log = get_logger()

DEFAULT_THREAD_LIMIT = 40
"""Worker threads for sync tools per event loop, unless changed with `thread_limiter()`."""

_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("agentloop_threads")
_UNCAPPED: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "agentloop_uncapped"
)


def thread_limiter() -> anyio.CapacityLimiter:
    """The event loop's cap on worker threads running sync tools, shared by every run.

    It holds `DEFAULT_THREAD_LIMIT` (40) tokens; set its `total_tokens` to change it
    (`thread_limiter().total_tokens = 100`, from within the event loop). A run uses it
    unless its `ExecutionContext.thread_limiter` names another limiter. A call that
    outlives its timeout keeps its token until its thread returns, so the tokens bound the
    number of threads that sync tools occupy, abandoned ones included.
    """
    try:
        return _THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DEFAULT_THREAD_LIMIT)
        _THREADS.set(limiter)
        return limiter


def _uncapped() -> anyio.CapacityLimiter:
    # anyio always takes a token for a worker thread; ours are counted by the limiters
    # the call holds, so anyio gets one that never blocks.
    try:
        return _UNCAPPED.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(math.inf)
        _UNCAPPED.set(limiter)
        return limiter


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
    """Worker threads for sync tools; `thread_limiter()`, shared by every run, when None."""
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
        context: ExecutionContext,
        *,
        on_result: Callable[[ToolResult], Awaitable[None]] | None = None,
    ) -> list[ToolResult]:
        """Run `calls` concurrently; return their results in the same order.

        Cheaper per call than one `run_call` task per call: a call that finishes without
        suspending runs in the task at hand and sets no timer, and more tasks are started
        only when calls do suspend (at most as many as the run's cap lets run at once).

        Args:
            calls: The calls, e.g. a turn's `tool_use` blocks as `ToolCall`s.
            context: The run's limits, ids and deps.
            on_result: Awaited with each result as soon as it is in (to record or report
                it), in the order the calls finish.

        Never raises for a tool's failure: unknown tools, invalid input, exceptions,
        `ToolError` and timeouts all become `is_error` results. Cancellation of the caller
        propagates (and cancels the calls). A `BaseException` that is not an `Exception`
        (`SystemExit`, `KeyboardInterrupt`, ...) raised by a tool propagates as itself.
        """
        batch = _Batch(self, calls, context, on_result)
        try:
            async with anyio.create_task_group() as group:
                batch.group = group
                await batch.work()
        except BaseException as exc:
            # Re-raise as itself, not wrapped in the task group's exception group.
            if batch.fatal is not None:
                _raise(batch.fatal)
            reraise_base_exception(exc)
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            leaves = _leaves(exc)
            if len(leaves) == 1 and leaves[0] is not exc:
                _raise(leaves[0])
            raise
        if batch.fatal is not None:
            _raise(batch.fatal)
        return batch.results  # type: ignore[return-value]  # every slot is filled

    async def run_call(self, call: ToolCall, context: ExecutionContext) -> ToolResult:
        """Run one call: validate, wait for its slots, run under its timeout, log it.

        Never raises for a tool's failure (see `execute`); cancellation of the caller and
        a tool's `BaseException`s that are not `Exception`s propagate.
        """
        timed_out: list[ToolResult] = []
        result: ToolResult | None = None
        try:
            with anyio.CancelScope() as scope:
                result = await self._run(call, context, scope, None, None, timed_out)
        except anyio.get_cancelled_exc_class():
            # Our timeout, but the tool raised a cancellation of its own making in answer.
            if not (timed_out and not _cancellation_requested()):
                raise
        return result if result is not None else timed_out[0]

    async def _run(
        self,
        call: ToolCall,
        context: ExecutionContext,
        scope: anyio.CancelScope,
        batch: _Batch | None,
        ctx: contextvars.Context | None,
        timed_out: list[ToolResult],
    ) -> ToolResult:
        """One call, under `scope` (the caller's, for timing it out; no deadline set).

        Returns its result, or raises the cancellation when `scope` timed the call out,
        after appending the timed-out result to `timed_out`. `batch` is told when the
        call suspends; `ctx` is the call's own context when it runs in a shared task.
        """
        tool = self._tools.get(call.name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            message = f"Unknown tool '{call.name}'. Available tools: {available}."
            return self._done(context, ToolResult.error(call, message))
        try:
            arguments = tool.validate(call.input)
        except ValidationError as exc:
            return self._done(
                context, ToolResult.error(call, describe_validation_error(call.name, exc))
            )
        function = tool.bind(
            arguments,
            lambda: RunContext(context.run_id, context.round, call.id, call.name, context.deps),
        )
        timeout = tool.timeout if tool.timeout is not None else context.timeout
        slots = _Slots()
        try:
            await slots.take(context.limiter, batch)
            if context.shared_limiter is not None:
                await slots.take(context.shared_limiter, batch)
            if not tool.is_async:
                if ctx is not None:  # the thread copies the context of the task at hand
                    bind_call_context(context, call)
                await slots.take(context.thread_limiter or thread_limiter(), batch)
                if batch is not None:
                    batch.suspended()
            start = time.perf_counter()
            try:
                if tool.is_async:
                    value = await self._run_async(function, timeout, scope, batch, ctx, start)
                else:
                    value = await self._run_sync(tool, function, timeout, scope, slots)
                result = ToolResult(
                    call.id, call.name, to_content(value), duration=time.perf_counter() - start
                )
                if scope.cancel_called and not tool.is_async:
                    # An `abandon=False` tool, waited for past its timeout.
                    result = ToolResult.error(
                        call,
                        f"Tool '{call.name}' did not finish within {timeout:g} s; it was left "
                        f"to finish (after {result.duration:.3g} s), so its effects have "
                        "happened, but its output was discarded.",
                        result.duration,
                    )
            except anyio.get_cancelled_exc_class() as exc:
                if scope.cancel_called:
                    duration = time.perf_counter() - start
                    timed_out.append(self._done(context, _timed_out(tool, call, timeout, duration)))
                    raise
                if _cancellation_requested():
                    raise
                # Nobody cancelled this call: the tool raised a cancellation of its own (it
                # awaited a future someone else cancelled, say). That is the tool failing.
                result = ToolResult.error(
                    call,
                    f"{_failure(call, exc)} (raised by the tool; the call was not cancelled)",
                    time.perf_counter() - start,
                )
            except ToolError as exc:
                result = ToolResult.error(call, exc.message, time.perf_counter() - start)
            except Exception as exc:
                _logger(context).exception("tool.exception", tool_use_id=call.id, name=call.name)
                result = ToolResult.error(call, _failure(call, exc), time.perf_counter() - start)
        finally:
            slots.release()
        return self._done(context, result)

    async def _run_async(
        self,
        function: Callable[[], Any],
        seconds: float,
        scope: anyio.CancelScope,
        batch: _Batch | None,
        ctx: contextvars.Context | None,
        start: float,
    ) -> Any:
        coroutine = ctx.run(function) if ctx is not None else function()
        if type(coroutine) is not types.CoroutineType:
            return await _timed(coroutine, seconds, scope, start)
        # The first step runs here and now: a call that finishes without suspending needs
        # no task and no timer.
        try:
            step = ctx.run(coroutine.send, None) if ctx is not None else coroutine.send(None)
        except StopIteration as stop:
            return stop.value
        if batch is not None:
            batch.suspended()
        return await _timed(_Resume(coroutine, step, ctx), seconds, scope, start)

    async def _run_sync(
        self,
        tool: Tool,
        function: Callable[[], Any],
        seconds: float,
        scope: anyio.CancelScope,
        slots: _Slots,
    ) -> Any:
        thread = _Thread(slots)
        try:
            value = await _timed(
                anyio.to_thread.run_sync(
                    thread.run, function, abandon_on_cancel=tool.abandon, limiter=_uncapped()
                ),
                seconds,
                scope,
                time.perf_counter(),
            )
        except anyio.get_cancelled_exc_class():
            # Given up on while it runs: the thread keeps the call's slots until it returns.
            thread.abandon()
            raise
        if type(value) is _Raised:
            _raise(value.exc)
        return value

    def _done(self, context: ExecutionContext, result: ToolResult) -> ToolResult:
        _logger(context).debug(
            "tool.call",
            tool_use_id=result.tool_use_id,
            name=result.name,
            duration=round(result.duration, 6),
            is_error=result.is_error,
        )
        return result


# -- a batch of calls


class _Batch:
    """The calls of one `execute`: a queue, its results, and the tasks working on it."""

    def __init__(
        self,
        registry: ToolRegistry,
        calls: Sequence[ToolCall],
        context: ExecutionContext,
        on_result: Callable[[ToolResult], Awaitable[None]] | None,
    ) -> None:
        self.registry = registry
        self.calls = calls
        self.context = context
        self.on_result = on_result
        self.results: list[ToolResult | None] = [None] * len(calls)
        self.next = 0
        self.group: anyio.abc.TaskGroup | None = None
        # No more tasks than calls the run's cap lets run at once.
        cap = context.limiter.total_tokens
        self.most = len(calls) if cap == math.inf else min(len(calls), int(cap))
        self.tasks = 1

        self.fatal: BaseException | None = None
        """A tool's `BaseException` caught in a helper task, for `execute` to raise."""

    def suspended(self) -> None:
        """A call is about to wait: start tasks for the calls not yet taken."""
        extra = min(self.most - self.tasks, len(self.calls) - self.next)
        if extra > 0 and self.group is not None:
            self.tasks += extra
            for _ in range(extra):
                self.group.start_soon(self.help)

    async def help(self) -> None:
        """`work` in a task of its own, handing a tool's `BaseException` to `execute`.

        Raised in a task, asyncio lets `SystemExit` and `KeyboardInterrupt` escape the
        event loop itself, past every caller; raised by `execute`, they go up the
        caller's stack like any exception.
        """
        try:
            await self.work()
        except BaseException as exc:
            if isinstance(exc, (Exception, *_cancellations())):
                raise
            if self.fatal is None:
                self.fatal = exc
            assert self.group is not None
            self.group.cancel_scope.cancel()

    async def work(self) -> None:
        """Take calls from the queue and run them, one at a time, until none is left."""
        registry, calls, context = self.registry, self.calls, self.context
        index = self.next
        while index < len(calls):
            self.next = index + 1
            timed_out: list[ToolResult] = []
            try:
                # One cancel scope for as many calls as it can serve: its deadline is set
                # only while a call waits, and a scope that timed a call out is spent.
                with anyio.CancelScope() as scope:
                    while True:
                        ctx = contextvars.copy_context()
                        ctx.run(bind_call_context, context, calls[index])
                        result = await registry._run(
                            calls[index], context, scope, self, ctx, timed_out
                        )
                        await self._finished(index, result)
                        index = self.next
                        if index >= len(calls) or scope.cancel_called:
                            break
                        self.next = index + 1
                    continue
            except anyio.get_cancelled_exc_class():
                if not (timed_out and not _cancellation_requested()):
                    raise
            if timed_out:
                await self._finished(index, timed_out[0])
                await anyio.lowlevel.checkpoint_if_cancelled()
            index = self.next

    async def _finished(self, index: int, result: ToolResult) -> None:
        self.results[index] = result
        if self.on_result is not None:
            await self.on_result(result)


# -- helpers


class _Resume:
    """Awaiting it runs a coroutine on from the step it yielded (`step`), in `ctx`."""

    __slots__ = ("coroutine", "ctx", "step")

    def __init__(
        self,
        coroutine: types.CoroutineType[Any, Any, Any],
        step: Any,
        ctx: contextvars.Context | None,
    ) -> None:
        self.coroutine, self.step, self.ctx = coroutine, step, ctx

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, step, ctx = self.coroutine, self.step, self.ctx
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # delivered to the task: the tool's to handle
                try:
                    step = ctx.run(coroutine.throw, exc) if ctx else coroutine.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = ctx.run(coroutine.send, sent) if ctx else coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _timed(
    awaitable: Awaitable[Any], seconds: float, scope: anyio.CancelScope, start: float
) -> Any:
    """Await under `scope`, its deadline `seconds` after `start` (a perf_counter)."""
    if seconds != math.inf:
        scope.deadline = anyio.current_time() + seconds - (time.perf_counter() - start)
    try:
        return await awaitable
    finally:
        scope.deadline = math.inf


class _Slots:
    """The limiter tokens one call holds; it is their borrower, so it can hand them on."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: list[anyio.CapacityLimiter] | None = []

    async def take(self, limiter: anyio.CapacityLimiter, batch: _Batch | None) -> None:
        """Take a token; without yielding to the event loop when one is free."""
        try:
            limiter.acquire_on_behalf_of_nowait(self)
        except anyio.WouldBlock:
            if batch is not None:
                batch.suspended()
            await limiter.acquire_on_behalf_of(self)
        assert self.held is not None
        self.held.append(limiter)

    def hand_over(self) -> list[anyio.CapacityLimiter]:
        """Take the tokens away from the call (its `release` does nothing after this)."""
        held, self.held = self.held or [], None
        return held

    def release(self) -> None:
        """Give back every token the call still holds."""
        for limiter in reversed(self.hand_over()):
            limiter.release_on_behalf_of(self)


@dataclass(frozen=True)
class _Raised:
    """A `BaseException` (not an `Exception`) that a sync tool raised in its thread."""

    exc: BaseException


_WAITING, _RUNNING, _FINISHED, _DROPPED = range(4)


class _Thread:
    """A sync call's function in its worker thread, and who gives its tokens back.

    Normally the call does, when the function has returned. A call that is abandoned
    (timed out or cancelled while the function runs) hands its tokens to the thread, which
    gives them back on the event loop when the function returns, so an abandoned call
    goes on counting against every cap until it has really stopped.
    """

    __slots__ = ("lock", "release", "slots", "state", "tokens")

    def __init__(self, slots: _Slots) -> None:
        self.lock = threading.Lock()
        self.state = _WAITING
        self.slots = slots
        self.tokens: list[anyio.CapacityLimiter] = []
        self.release: Callable[[Callable[[], None]], object] | None = None

    def run(self, function: Callable[[], Any]) -> Any:
        """In the worker thread: run `function`, unless the call was abandoned first."""
        with self.lock:
            if self.state == _DROPPED:
                return None
            self.state = _RUNNING
        try:
            return function()
        except BaseException as exc:
            if isinstance(exc, Exception):
                raise
            # Thrown into the awaiting coroutine, a `GeneratorExit` would close it rather
            # than propagate, and asyncio lets `SystemExit` escape the event loop: carry
            # these back as a value, to be raised on the event loop by the call.
            return _Raised(exc)
        finally:
            with self.lock:
                self.state = _FINISHED
                release = self.release
            if release is not None:
                try:
                    release(self._give_back)
                except Exception:  # the event loop has finished, its limiters with it
                    pass

    def abandon(self) -> None:
        """On the event loop, as the call gives up waiting: hand the tokens to the thread.

        If the function has not started, it never will; if it has finished, the call
        gives the tokens back itself as usual.
        """
        release = _threadsafe_caller()
        with self.lock:
            if self.state == _WAITING:
                self.state = _DROPPED
            elif self.state == _RUNNING:
                self.tokens = self.slots.hand_over()
                self.release = release

    def _give_back(self) -> None:
        for limiter in reversed(self.tokens):
            limiter.release_on_behalf_of(self.slots)
        self.tokens = []


def _threadsafe_caller() -> Callable[[Callable[[], None]], object]:
    """A function that schedules a callback on this event loop from any thread.

    It does not wait for the callback (the thread has nothing to wait for), and it raises
    once the event loop has finished. anyio offers only a waiting form
    (`anyio.from_thread.run_sync`), so this uses each backend's own.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # anyio's other backend
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    return loop.call_soon_threadsafe


def _cancellation_requested() -> bool:
    """Whether the task at hand was really asked to stop.

    True when an enclosing cancel scope was cancelled (anyio delivers every cancellation
    of its own that way, on both backends) or, on asyncio, when someone called
    `Task.cancel()` on the task.
    """
    if anyio.current_effective_deadline() == -math.inf:
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not asyncio
        return False
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling is not None and cancelling())


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


def _failure(call: ToolCall, exc: BaseException) -> str:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"Tool '{call.name}' failed: {detail}"


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
