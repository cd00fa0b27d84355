"""Tools: what the model may call.

`@tool` turns a plain function (sync or async) into a `Tool` whose JSON schema comes from
the signature and docstring (built by `agentloop.schema`); the registry validates a
call's input against it and runs it with the call's `RunContext`. The values that
describe a call and its result (`ToolCall`, `ToolResult`) live in `agentloop.calls`; what
a turn announces of a tool with `prepare` or `max_uses`, in `agentloop.dynamic`.
"""

from __future__ import annotations

import copy
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Generic, overload

from pydantic import BaseModel, ValidationError
from typing_extensions import ParamSpec, TypeVar

from .calls import (
    CallPaused,
    ToolCall,
    ToolDefinition,
    ToolResult,
    wire_tool_name,
)
from .context import RunContext
from .errors import ConfigurationError, ToolError
from .schema import input_model, parse_docstring
from .schema import input_schema as schema_of

__all__ = (
    "CallPaused",
    "RunContext",
    "Tool",
    "ToolCall",
    "ToolDefinition",
    "ToolPrepare",
    "ToolResult",
    "raw_tools",
    "tool",
    "wire_tool_name",
)

# The decorated function's parameters and return type, kept by `@tool`; the defaults let
# a bare `Tool` mean any tool under `mypy --strict`.
P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)


def _is_context(annotation: Any) -> bool:
    return annotation is RunContext or typing.get_origin(annotation) is RunContext


Executor = Callable[[str, dict[str, Any]], "tuple[bool, str] | Awaitable[tuple[bool, str]]"]

ToolPrepare = Callable[
    [RunContext[Any], ToolDefinition],
    "ToolDefinition | Awaitable[ToolDefinition | None] | None",
]
"""A tool's `prepare(ctx, definition)`, sync or async: the definition to announce this
turn (`definition` itself, or a changed copy), or None to hide the tool this turn."""


def _first_context_param(function: Callable[..., Any]) -> str | None:
    """The first parameter's name, when it is annotated `RunContext` (a raw-schema tool)."""
    try:
        hints = typing.get_type_hints(function)
        first = next(iter(inspect.signature(function).parameters.values()), None)
    except (NameError, TypeError, ValueError):
        return None
    if first is None or not _is_context(hints.get(first.name)):
        return None
    return first.name


def _is_async(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004
    )


class Tool(Generic[P, R]):
    """A callable the model may use: a name, a description, a JSON schema and a function.

    Build one with `@tool` (or `Tool(function)`); the registry validates input against the
    signature, injects the `RunContext`, and runs sync functions in worker threads. It is
    generic in the function's parameters and return type, so calling it directly (in a
    test) is type-checked as a call of the function: `Tool[[str], int]`; a bare `Tool` is
    any tool.
    """

    def __init__(
        self,
        function: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        eager: bool = True,
        abandon: bool = True,
        input_schema: Mapping[str, Any] | None = None,
        requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
        prepare: ToolPrepare | None = None,
        max_uses: int | None = None,
        defer_loading: bool = False,
        deps: Any = None,
        deps_factory: Callable[[], Any] | None = None,
    ) -> None:
        """Describe `function` as a tool.

        Args:
            function: The function to call; sync or async.
            name: Name the model sees; defaults to the function's name.
            description: Defaults to the docstring (without its parameter sections).
            timeout: Seconds a call may take (more than 0; `math.inf` for no limit);
                defaults to the agent's `tool_timeout`.
            eager: Whether a streamed call may start before the whole message arrived.
            abandon: For a sync function: whether a call that outlives its timeout (or its
                cancelled run) may leave its thread running in the background. `False`
                waits for the function to return first, so its effects have landed before
                the model hears of the timeout. Async functions are always cancelled.
            input_schema: The input's JSON schema, when the signature does not describe
                it: the function is then called with the input dict as its one argument
                (after the call's `RunContext`, when its first parameter is annotated
                `RunContext`), unvalidated (validating it is the function's job).
            requires_approval: Whether a call waits for a person's decision before it
                runs: True, False, or `rule(ctx, input) -> bool` deciding per call (a
                non-empty string counts as True and is shown as the reason). See
                `Agent.resume`.
            prepare: `prepare(ctx, definition)`, sync or async, called before each model
                request with the turn's `RunContext` and the tool's own definition:
                returns the definition to announce this turn (the same, or a copy with
                another description or schema; not another name), or None to hide the
                tool this turn. A call of a hidden tool is answered `is_error`.
            max_uses: The most calls of this tool a run may make (a whole number from
                1): the calls beyond are answered `is_error` without running, and the
                tool is no longer announced in the run. Calls answered without running
                (cut off, refused, denied) do not count.
            defer_loading: Whether the API keeps the tool out of the model's context
                until a tool search (`ToolSearch`) finds it: for agents with many tools.
            deps: The tool's own `RunContext.deps`, given instead of the run's: what a
                plugin gives its tools (a plugin's tools see the plugin's deps, the
                application's tools the run's). None: the run's `deps`.
            deps_factory: Makes the tool's own `RunContext.deps` (instead of `deps`),
                called with no arguments at each call, inside the call (a sync tool's in
                its worker thread), so a failure is the call's `is_error` result. To
                share one object across calls, return a cached one.
        """
        if not callable(function):
            raise ConfigurationError(f"@tool needs a function, got {function!r}")
        self.function = function
        self.name: str = name or str(getattr(function, "__name__", ""))
        self.is_async = _is_async(function)
        self.timeout, self.eager, self.abandon = timeout, eager, abandon
        self.requires_approval = requires_approval
        self.prepare, self.max_uses = prepare, max_uses
        self.defer_loading = defer_loading
        self.deps, self.deps_factory = deps, deps_factory
        self._check()
        self.source: str | None = None
        """The plugin that registered this tool, if any."""
        self._context_param: str | None = None
        self._positional: tuple[str, ...] = ()
        docstring, params = parse_docstring(inspect.getdoc(function))
        self.description: str = docstring if description is None else description
        self._model: type[BaseModel] | None = None
        if input_schema is None:
            described = input_model(function, self.name, params, _is_context)
            self._model = described.model
            self._context_param, self._positional = described.context_param, described.positional
            self.input_schema: dict[str, Any] = schema_of(self._model, self.name)
        else:
            self.input_schema = dict(input_schema)
            self._context_param = _first_context_param(function)
        extra = {"defer_loading": True} if defer_loading else {}
        self.definition = ToolDefinition(self.name, self.description, self.input_schema, extra)
        self.__doc__ = function.__doc__
        self.__name__ = self.name

    def _check(self) -> None:
        if not self.name or not _valid_name(self.name):
            raise ConfigurationError(
                f"invalid tool name {self.name!r}: use 1-128 letters, digits, '_' or '-'"
            )
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise ConfigurationError(
                f"tool {self.name!r}: timeout must be a number of seconds above 0 "
                f"(math.inf for no limit), not {timeout!r}"
            )
        if self.is_async and not self.abandon:
            raise ConfigurationError(
                f"tool {self.name!r}: abandon=False is for sync tools; an async tool is "
                "cancelled at its next await (shield a section with "
                "anyio.CancelScope(shield=True) if it must complete)"
            )
        if not isinstance(self.requires_approval, bool) and not callable(self.requires_approval):
            raise ConfigurationError(
                f"tool {self.name!r}: requires_approval must be True, False or a function "
                f"(ctx, input) -> bool, not {self.requires_approval!r}"
            )
        if self.prepare is not None and not _takes_two(self.prepare):
            raise ConfigurationError(
                f"tool {self.name!r}: prepare must be a function (ctx, definition) -> "
                f"definition or None, sync or async, not {self.prepare!r}"
            )
        uses = self.max_uses
        if uses is not None and (isinstance(uses, bool) or not isinstance(uses, int) or uses < 1):
            raise ConfigurationError(
                f"tool {self.name!r}: max_uses must be a whole number from 1 (or None for no "
                f"limit), not {uses!r}"
            )
        if not isinstance(self.defer_loading, bool):
            raise ConfigurationError(
                f"tool {self.name!r}: defer_loading must be True or False, "
                f"not {self.defer_loading!r}"
            )
        if self.deps_factory is not None and not callable(self.deps_factory):
            raise ConfigurationError(
                f"tool {self.name!r}: deps_factory must be a function making the tool's deps, "
                f"not {self.deps_factory!r} (give an object as deps=)"
            )
        if self.deps_factory is not None and self.deps is not None:
            raise ConfigurationError(
                f"tool {self.name!r}: give deps (the object) or deps_factory (a function "
                "making it), not both"
            )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the underlying function directly, as if undecorated."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def replace(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        eager: bool | None = None,
        abandon: bool | None = None,
        requires_approval: bool
        | Callable[[RunContext[Any], dict[str, Any]], bool | str]
        | None = None,
        prepare: ToolPrepare | None = None,
        max_uses: int | None = None,
        defer_loading: bool | None = None,
        deps: Any = None,
        deps_factory: Callable[[], Any] | None = None,
    ) -> Tool[P, R]:
        """A copy with the given options changed (and no `source`); the rest is kept.

        Giving `deps` or `deps_factory` replaces both (a service giving a plugin's tools
        its own data: `t.replace(deps=...)`).
        """
        new = copy.copy(self)
        new.name = self.name if name is None else name
        new.description = self.description if description is None else description
        new.timeout = self.timeout if timeout is None else timeout
        new.eager = self.eager if eager is None else eager
        new.abandon = self.abandon if abandon is None else abandon
        if requires_approval is not None:
            new.requires_approval = requires_approval
        new.prepare = self.prepare if prepare is None else prepare
        new.max_uses = self.max_uses if max_uses is None else max_uses
        new.defer_loading = self.defer_loading if defer_loading is None else defer_loading
        if deps is not None or deps_factory is not None:
            new.deps, new.deps_factory = deps, deps_factory
        new._check()
        new.source = None
        extra = {k: v for k, v in self.definition.extra.items() if k != "defer_loading"}
        if new.defer_loading:
            extra["defer_loading"] = True
        new.definition = replace(
            self.definition, name=new.name, description=new.description, extra=extra
        )
        new.__name__ = new.name
        return new

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check the model's input against the signature; return the call's arguments.

        A tool made with an explicit `input_schema` takes its input as it is.

        Raises:
            pydantic.ValidationError: the input does not fit the schema.
        """
        if self._model is None:
            return dict(arguments)
        # The instance is thrown away, so its __dict__ is ours to hand on.
        return self._model.model_validate(arguments).__dict__

    def bind(self, arguments: dict[str, Any], ctx: RunContext[Any]) -> Callable[[], Any]:
        """The call of the function with validated `arguments`, ready to run.

        `ctx` is the call's context, passed to a function that takes one, with the tool's
        own `deps` when it has some. `arguments` (from `validate`) is used up.
        """
        factory = self.deps_factory
        if factory is None:
            own = ctx if self.deps is None else replace(ctx, deps=self.deps)
            return self._bind(arguments, own)
        # The factory runs inside the call, so its failure is the call's, like the tool's.
        if self.is_async:

            async def call_async() -> Any:
                return await self._bind(arguments, replace(ctx, deps=factory()))()

            return call_async

        def call() -> Any:
            return self._bind(arguments, replace(ctx, deps=factory()))()

        return call

    def _bind(self, arguments: dict[str, Any], ctx: RunContext[Any]) -> Callable[[], Any]:
        function: Callable[..., Any] = self.function  # called with the model's input
        if self._model is None:
            if self._context_param is not None:
                return partial(function, ctx, arguments)
            return partial(function, arguments)
        if self._context_param is not None:
            arguments[self._context_param] = ctx
        if self._positional:
            args = [arguments.pop(name) for name in self._positional]
            return partial(function, *args, **arguments)
        return partial(function, **arguments)


def raw_tools(definitions: Sequence[Mapping[str, Any]], executor: Executor) -> list[Tool]:
    """Tools from raw definitions and one executor, for code in the `tool_request` style.

    Args:
        definitions: Dicts with `name`, `description` and `input_schema`, as the API takes
            them; further keys (e.g. `cache_control`) are sent along.
        executor: `executor(name, input) -> (ok, text)`, sync or async. `ok=False` sends
            `text` back as an `is_error` result.
    """
    tools = []
    for definition in definitions:
        try:
            name = str(definition["name"])
            schema = definition.get("input_schema") or {"type": "object", "properties": {}}
            extra = {
                k: v
                for k, v in definition.items()
                if k not in ("name", "description", "input_schema")
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigurationError(f"a raw tool definition needs a name: {definition!r}") from exc
        made = Tool(
            _executor_call(executor, name),
            name=name,
            description=str(definition.get("description") or ""),
            input_schema=schema,
        )
        made.definition = replace(made.definition, extra=extra)
        tools.append(made)
    return tools


def _executor_call(executor: Executor, name: str) -> Callable[[dict[str, Any]], Any]:
    """A function of the input alone that runs `executor` for tool `name`, sync or async."""
    if _is_async(executor):

        async def run_async(arguments: dict[str, Any]) -> str:
            return _outcome(name, await executor(name, arguments))  # type: ignore[misc]

        return run_async

    def run(arguments: dict[str, Any]) -> str:
        return _outcome(name, executor(name, arguments))

    return run


def _outcome(name: str, outcome: Any) -> str:
    try:
        ok, text = outcome
    except (TypeError, ValueError):
        raise TypeError(f"executor for {name!r} must return (ok, text), got {outcome!r}") from None
    if not ok:
        raise ToolError(str(text))
    return str(text)


def _takes_two(function: Any) -> bool:
    """Whether `function` is callable with two positional arguments (as far as can be told)."""
    if not callable(function):
        return False
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): take it on trust
        return True
    return True


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 128 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


@overload
def tool(
    function: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
    prepare: ToolPrepare | None = None,
    max_uses: int | None = None,
    defer_loading: bool = False,
    deps: Any = None,
    deps_factory: Callable[[], Any] | None = None,
) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
    prepare: ToolPrepare | None = None,
    max_uses: int | None = None,
    defer_loading: bool = False,
    deps: Any = None,
    deps_factory: Callable[[], Any] | None = None,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
    prepare: ToolPrepare | None = None,
    max_uses: int | None = None,
    defer_loading: bool = False,
    deps: Any = None,
    deps_factory: Callable[[], Any] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool; use bare (`@tool`) or with options (`@tool(timeout=5)`).

    The docstring becomes the description (parameter sections in Google, NumPy or Sphinx
    style become parameter descriptions), the signature becomes the JSON schema
    (`Literal` -> `enum`, defaults, pydantic models, TypedDicts,
    `Annotated[..., Field(description=...)]`), and a parameter typed `RunContext` is
    injected rather than shown to the model. The `Tool` keeps the function's signature:
    calling it directly is type-checked and returns what the function returns.

    Args:
        function: The function, when used bare.
        name: Name the model sees; defaults to the function's name.
        description: Overrides the docstring.
        timeout: Seconds a call may run before it fails with a timeout (more than 0).
        eager: Whether a streamed call may start before the whole message arrived.
        abandon: For a sync function: `False` makes a timed-out or cancelled call wait
            for the function to return instead of leaving its thread running.
        requires_approval: Whether a call waits for a person's decision before it runs:
            True, or `rule(ctx, input) -> bool` deciding per call (see `Agent.resume`).
        prepare: `prepare(ctx, definition) -> definition | None`, sync or async: what
            each turn announces of the tool (a changed definition), or None to hide it.
        max_uses: The most calls of the tool per run; beyond, calls are answered
            `is_error` and the tool is hidden.
        defer_loading: Keep the tool out of the model's context until a tool search
            (`ToolSearch`, given beside it) finds it.
        deps: The tool's own `RunContext.deps`, instead of the run's (None: the run's).
        deps_factory: Makes the tool's own deps at each call, instead of `deps`.
    """
    options: dict[str, Any] = {
        "name": name,
        "description": description,
        "timeout": timeout,
        "eager": eager,
        "abandon": abandon,
        "requires_approval": requires_approval,
        "prepare": prepare,
        "max_uses": max_uses,
        "defer_loading": defer_loading,
        "deps": deps,
        "deps_factory": deps_factory,
    }
    if function is not None:
        return Tool(function, **options)

    def decorate(fn: Callable[..., Any]) -> Tool:
        return Tool(fn, **options)

    return decorate


# --------------------------------------------------------------------------- outputs


def describe_validation_error(tool_name: str, error: ValidationError) -> str:
    """An is_error message naming each bad field and what is wrong, for the model to fix."""
    lines = [f"Invalid input for tool '{tool_name}'. Fix these and call it again:"]
    return "\n".join([*lines, *validation_problems(error)])


def validation_problems(error: ValidationError) -> list[str]:
    """One line per bad field of `error`: where, what is wrong, and what was sent."""
    lines = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(p) for p in problem["loc"]) or "(input)"
        got = ""
        if problem["type"] not in ("missing", "extra_forbidden") and "input" in problem:
            got = f" (got {json.dumps(problem['input'], default=repr)[:200]})"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unexpected argument; this tool does not take it"
        elif problem["type"] == "missing":
            message = "required argument is missing"
        lines.append(f"- {where}: {message}{got}")
    return lines
