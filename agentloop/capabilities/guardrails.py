"""Guardrails: checks of a run's input, its output and its tool calls, as capabilities.

A guardrail is a function `fn(ctx, value)`, sync or async, that returns None to pass or a
message to trip. `InputGuardrail` checks the run's new input before its first request (or
beside it), `OutputGuardrail` its final output as the run ends, `ToolGuardrail` a call's
input before it runs and its result after. A check that raises counts as tripped: a
broken check must not let anything through.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Union

import anyio

from agentloop.calls import describe_exception
from agentloop.errors import ConfigurationError, GuardrailTripped, ToolError
from agentloop.logs import get_logger

from .base import Capability, NextCall, NextRequest

if TYPE_CHECKING:
    from agentloop.calls import ToolCall, ToolResult
    from agentloop.context import RunContext
    from agentloop.providers.base import ModelRequest, ModelResponse
    from agentloop.result import RunResult

__all__ = ("GuardrailFunction", "InputGuardrail", "OutputGuardrail", "ToolGuardrail")

_log = get_logger()

GuardrailFunction = Callable[
    ["RunContext[Any]", Any], Union[str, Awaitable[Union[str, None]], None]  # noqa: UP007
]
"""`fn(ctx, value)`, sync or async: None to pass, a message (`str`) to trip.

A sync function runs on the event loop, between the run's other work: keep it quick (a
pattern, a lookup) and make a slow check (a request to a moderation service) async.
"""


def _named(fn: Any, name: str | None, kind: str) -> str:
    """The name of a guardrail of `kind` checking with `fn`: `name`, or the function's."""
    if not callable(fn):
        raise ConfigurationError(f"{kind} needs a function fn(ctx, value), not {type(fn).__name__}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(f"{kind}: name must be a non-empty string, not {name!r}")
    return name or getattr(fn, "__name__", None) or type(fn).__name__


class _Check:
    """One guardrail function under its name: asks it, and reads its verdict."""

    def __init__(self, fn: GuardrailFunction, name: str | None, kind: str) -> None:
        self.fn = fn
        self.name = _named(fn, name, kind)
        self.kind = kind

    async def verdict(self, ctx: RunContext[Any], value: Any, **fields: Any) -> str | None:
        """None when `value` passes; else why not (the message, or the check's failure)."""
        log = (ctx.log if ctx.log is not None else _log).bind(
            guardrail=self.name, kind=self.kind, **fields
        )
        try:
            answer = self.fn(ctx, value)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            log.exception("guardrail.failed")
            return f"The check {self.name!r} failed ({describe_exception(exc)})."
        if answer is None:
            return None
        if not isinstance(answer, str) or not answer:
            # Neither a pass nor a message: refused, as a failed check is.
            log.error("guardrail.failed", returned=repr(answer)[:200])
            return (
                f"The check {self.name!r} failed (it returned {answer!r}, not None or a message)."
            )
        log.warning("guardrail.tripped", message=answer)
        return answer


class InputGuardrail(Capability):
    """Checks the run's new input before its first model request, or beside it.

    The value checked is `ctx.prompt`: the prompt (a string, or content blocks), or for a
    run given a history and no prompt, what the history's last message says if it is the
    user's (its tool results left out). A run with no new input (a resumed run, a history
    ending with the model's message or with tool results only) is not checked.

    A trip ends the run with `GuardrailTripped` before any tool runs. With
    `parallel=True` the check runs beside the first request instead of before it: the
    request is cancelled when the check trips (a response that had come in whole counts
    in the run's usage), and tool calls that start while the response streams wait for
    the check to pass.

    ```python
    def no_secrets(ctx, prompt):
        return "Do not paste keys." if "sk-" in str(prompt) else None

    agent = Agent(..., capabilities=[InputGuardrail(no_secrets)])
    ```
    """

    def __init__(
        self, fn: GuardrailFunction, *, parallel: bool = False, name: str | None = None
    ) -> None:
        """A guardrail checking the run's input with `fn`.

        Args:
            fn: `fn(ctx, value)`, sync or async: None to pass, a message to trip.
            parallel: Run the check beside the first model request instead of before.
            name: How the guardrail is named in `GuardrailTripped` and in the logs (by
                default the function's name).
        """
        if not isinstance(parallel, bool):
            raise ConfigurationError(f"InputGuardrail: parallel must be a bool, not {parallel!r}")
        self._check = _Check(fn, name, "InputGuardrail")
        self.name = self._check.name
        self.parallel = parallel

    def for_run(self, ctx: RunContext[Any]) -> Capability:
        """Itself; a parallel check keeps the state of its run in a fresh `_Beside`."""
        return _Beside(self._check) if self.parallel else self

    async def before_run(self, ctx: RunContext[Any]) -> None:
        """Check the input; a trip ends the run before its first request."""
        if ctx.prompt is None:
            return
        message = await self._check.verdict(ctx, ctx.prompt)
        if message is not None:
            raise GuardrailTripped(message, guardrail=self.name)

    def __repr__(self) -> str:
        return f"InputGuardrail({self.name!r}, parallel={self.parallel})"


@dataclass
class _Verdict:
    """A parallel input check under way, or done."""

    decided: anyio.Event = field(default_factory=anyio.Event)
    """Set once the check is over (passed, tripped, or dropped with its request)."""
    message: str | None = None
    """Why it tripped."""
    passed: bool = False


class _Beside(Capability):
    """A parallel `InputGuardrail` in one run: its check beside the first request.

    The check is asked once per run; a request that fails before the check is over
    (a compaction's retry follows) drops it, and the next request asks again.
    """

    def __init__(self, check: _Check) -> None:
        self.check = check
        self.name = check.name
        self.verdict: _Verdict | None = None

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        """The first request, sent while the check runs; cancelled if the check trips."""
        if ctx.prompt is None or (self.verdict is not None and self.verdict.passed):
            return await call_next(request)
        verdict = self.verdict = _Verdict()
        response: ModelResponse | None = None
        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._judge, ctx, verdict, group.cancel_scope)
                try:
                    response = await call_next(request)
                except Exception as exc:
                    # Kept out of the group (raised as itself, not in an exception group).
                    failure = exc
                    group.cancel_scope.cancel()
        finally:
            verdict.decided.set()  # calls waiting for a check that did not pass: not run
        if verdict.message is not None:
            if response is not None and ctx.meter is not None:
                ctx.meter.add(response)  # it came in whole: the API bills it
            raise GuardrailTripped(verdict.message, guardrail=self.name)
        if failure is not None:
            raise failure
        assert response is not None
        return response

    async def _judge(
        self, ctx: RunContext[Any], verdict: _Verdict, request: anyio.CancelScope
    ) -> None:
        verdict.message = await self.check.verdict(ctx, ctx.prompt)
        verdict.passed = verdict.message is None
        verdict.decided.set()
        if not verdict.passed:
            request.cancel()

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        """A call started while the check runs (a streamed response's) waits for it."""
        verdict = self.verdict
        if verdict is not None and not verdict.passed:
            await verdict.decided.wait()
            if not verdict.passed:
                raise ToolError(f"Not run: the input check {self.name!r} did not pass.")
        return await call_next(call)

    def __repr__(self) -> str:
        return f"InputGuardrail({self.name!r}, parallel=True)"


class OutputGuardrail(Capability):
    """Checks the run's final output: `result.output`, the text or the typed output.

    It runs as the run ends (`after_run`); a trip ends the run with `GuardrailTripped`,
    whose `result` holds the refused answer. A run that pauses (calls waiting for
    approval or for the caller) has no final output yet: its resumed run is checked.
    """

    def __init__(self, fn: GuardrailFunction, *, name: str | None = None) -> None:
        """A guardrail checking the run's output with `fn`.

        Args:
            fn: `fn(ctx, output)`, sync or async: None to pass, a message to trip.
            name: How the guardrail is named in `GuardrailTripped` and in the logs (by
                default the function's name).
        """
        self._check = _Check(fn, name, "OutputGuardrail")
        self.name = self._check.name

    async def after_run(self, ctx: RunContext[Any], result: RunResult[Any]) -> None:
        """Check the output; a trip ends the run with `GuardrailTripped`."""
        if result.state is not None:
            return
        message = await self._check.verdict(ctx, result.output)
        if message is not None:
            raise GuardrailTripped(message, guardrail=self.name)

    def __repr__(self) -> str:
        return f"OutputGuardrail({self.name!r})"


class ToolGuardrail(Capability):
    """Checks a tool call's input before it runs, and its result after.

    `before(ctx, input)` gets the call's input (a dict); a trip answers the call with an
    `is_error` result carrying the message, and the tool does not run. `after(ctx,
    result)` gets the call's `ToolResult`; a trip replaces it with an `is_error` result
    carrying the message (the tool ran). With `end_run=True` a trip ends the run with
    `GuardrailTripped` instead. `ctx.tool_name` and `ctx.tool_use_id` name the call.
    """

    def __init__(
        self,
        before: GuardrailFunction | None = None,
        after: GuardrailFunction | None = None,
        *,
        tools: Iterable[str] | None = None,
        end_run: bool = False,
        name: str | None = None,
    ) -> None:
        """A guardrail around tool calls.

        Args:
            before: `fn(ctx, input)`, sync or async: None to let the call run, a message
                to answer it with instead.
            after: `fn(ctx, result)`, sync or async: None to keep the result, a message
                to replace it with.
            tools: The names of the tools it checks; by default every tool.
            end_run: A trip ends the run (`GuardrailTripped`) instead of answering the
                call with the message.
            name: How the guardrail is named in `GuardrailTripped` and in the logs (by
                default the name of `before`, else of `after`).
        """
        if before is None and after is None:
            raise ConfigurationError("ToolGuardrail needs a before= or an after= function")
        if not isinstance(end_run, bool):
            raise ConfigurationError(f"ToolGuardrail: end_run must be a bool, not {end_run!r}")
        name = _named(before if before is not None else after, name, "ToolGuardrail")
        self._before = None if before is None else _Check(before, name, "ToolGuardrail")
        self._after = None if after is None else _Check(after, name, "ToolGuardrail")
        self.name = name
        self.tools = _tool_names(tools)
        self.end_run = end_run

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        """The call checked before it runs and after."""
        if self.tools is not None and call.name not in self.tools:
            return await call_next(call)
        fields = {"tool_use_id": call.id, "tool": call.name}
        if self._before is not None:
            message = await self._before.verdict(ctx, call.input, **fields)
            if message is not None:
                if self.end_run:
                    raise GuardrailTripped(message, guardrail=self.name)
                raise ToolError(message)
        result = await call_next(call)
        if self._after is None or result.paused is not None:
            return result  # a sub-run that paused has no result yet: checked once it ends
        message = await self._after.verdict(ctx, result, **fields)
        if message is None:
            return result
        if self.end_run:
            raise GuardrailTripped(message, guardrail=self.name)
        return replace(result, content=message, is_error=True)

    def __repr__(self) -> str:
        return f"ToolGuardrail({self.name!r})"


def _tool_names(tools: Iterable[str] | None) -> frozenset[str] | None:
    """`tools` as a set of names, checked."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
        raise ConfigurationError(f"ToolGuardrail: tools must be a list of names, not {tools!r}")
    names = tuple(tools)
    wrong = [n for n in names if not isinstance(n, str)]
    if wrong:
        raise ConfigurationError(f"ToolGuardrail: tools must be names, not {wrong[0]!r}")
    return frozenset(names)
