"""Tools: what the model may call, and the values that describe a call and its result.

`@tool` turns a plain function (sync or async) into a `Tool` whose JSON schema comes from
the signature and docstring (built by `agentloop.schema`). `ToolCall` and `ToolResult`
are the provider-neutral values that pass between the response, the registry and the
history.
"""

from __future__ import annotations

import base64
import copy
import inspect
import json
import re
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Generic, overload

import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypeVar

from .errors import ConfigurationError, HistoryError, ToolError
from .lint import check_result_content
from .messages import (
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    json_problem,
)
from .schema import input_model, parse_docstring
from .schema import input_schema as schema_of

__all__ = (
    "CallPaused",
    "RunContext",
    "Tool",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "raw_tools",
    "tool",
    "wire_tool_name",
)

# The default lets a plugin author write a bare `ctx: RunContext` under `mypy --strict`.
DepsT = TypeVar("DepsT", default=Any)
F = TypeVar("F", bound=Callable[..., Any])
_BLOCKS = TypeAdapter(list[ContentBlock])


@dataclass(frozen=True)
class RunContext(Generic[DepsT]):
    """Facts about the current call, injected into a tool parameter typed `RunContext`.

    The parameter is hidden from the schema the model sees. `RunContext[MyDeps]` types
    `deps`; a bare `RunContext` means `RunContext[Any]`.
    """

    run_id: str
    """Id of the run (also bound in every log event of the run)."""
    round: int
    """Which model request of the run asked for this call, from 1."""
    tool_use_id: str
    """Id of the `tool_use` block being answered."""
    tool_name: str
    """Name of the tool being called."""
    deps: DepsT
    """The object passed as `agent.run(..., deps=...)`: connections, config, the user."""

    @property
    def idempotency_key(self) -> str:
        """`"{run_id}:{tool_use_id}"`: the same every time this call is run again.

        A run that is retried or resumed (a durable run after a crash, a paused run)
        may run a call whose effect already happened. A tool that changes the world
        records this key with its effect and skips an effect already recorded under it,
        so the call's effect happens once.
        """
        return f"{self.run_id}:{self.tool_use_id}"


@dataclass(frozen=True)
class ToolDefinition:
    """A tool as a model request announces it: provider-neutral."""

    name: str
    description: str
    input_schema: dict[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further wire fields sent with the definition (e.g. `cache_control`)."""

    def to_wire(self) -> dict[str, Any]:
        """The Anthropic `tools[]` entry."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            **self.extra,
        }


def wire_tool_name(definition: ToolDefinition | Mapping[str, Any]) -> str | None:
    """The name a tool definition announces, or None for a tool kind without one.

    Some kinds the API runs itself carry no name (the MCP connector's
    `{"type": "mcp_toolset", "mcp_server_name": ...}`): they are announced as they are,
    and the model never calls them by a name of theirs.

    Raises:
        ConfigurationError: the definition has neither a name nor a `type`, or its name
            is not a non-empty string.
    """
    if isinstance(definition, ToolDefinition):
        name: Any = definition.name
    else:
        name = definition.get("name")
        kind = definition.get("type")
        if name is None and isinstance(kind, str) and kind:
            return None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "a tool needs a name, unless it is a tool kind without one (a `type` such as "
            f"mcp_toolset): {definition!r}"[:500]
        )
    return name


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: provider-neutral."""

    id: str
    name: str
    input: dict[str, Any]
    error: str | None = None
    """Why this call must not run (its input was cut off, was not valid JSON, was not an
    object, ...): the loop answers it with an `is_error` result carrying this text,
    without running the tool, whatever kind of tool it names."""

    @classmethod
    def from_block(cls, block: ToolUseBlock, *, error: str | None = None) -> ToolCall:
        """The call a `tool_use` block asks for (with `error` if it must not run)."""
        return cls(id=block.id, name=block.name, input=block.input, error=error)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call, ready to become a `tool_result` block."""

    tool_use_id: str
    name: str
    content: str | list[ContentBlock] | None
    """What the model sees; `None` for a tool that returned nothing."""
    is_error: bool = False
    duration: float = 0.0
    """Seconds the tool ran (not counting the wait for a concurrency slot)."""
    ran: bool = True
    """False when the call was answered without running the tool (cut off, cancelled)."""
    paused: dict[str, Any] | None = None
    """The state of a run the call started that paused (a sub-agent's, see `CallPaused`):
    then the call has no answer yet, and waits with that run for its caller."""

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON values; `from_json` turns them back into an equal one.

        How a result is recorded outside the process (a durable run's step, a paused run).
        """
        content = self.content
        data = {
            "tool_use_id": self.tool_use_id,
            "name": self.name,
            "content": content if not isinstance(content, list) else [b.to_wire() for b in content],
            "is_error": self.is_error,
            "duration": self.duration,
            "ran": self.ran,
        }
        return data if self.paused is None else data | {"paused": self.paused}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolResult:
        """The result `to_json` recorded.

        Raises:
            ValueError: `data` is not what `to_json` writes.
        """
        try:
            content = data["content"]
            if isinstance(content, list):
                content = _BLOCKS.validate_python(content)
            elif content is not None and not isinstance(content, str):
                raise TypeError(f"content is a {type(content).__name__}")
            paused = data.get("paused")  # absent from what an earlier version recorded
            if paused is not None and not isinstance(paused, dict):
                raise TypeError(f"paused is a {type(paused).__name__}")
            return cls(
                str(data["tool_use_id"]),
                str(data["name"]),
                content,
                is_error=bool(data["is_error"]),
                duration=float(data["duration"]),
                ran=bool(data["ran"]),
                paused=paused,
            )
        except (KeyError, TypeError, ValidationError) as exc:
            raise ValueError(f"not a recorded tool result: {exc}"[:500]) from exc

    @classmethod
    def error(
        cls, call: ToolCall, message: str, duration: float = 0.0, *, ran: bool = True
    ) -> ToolResult:
        """An `is_error` result carrying `message`."""
        return cls(call.id, call.name, message, is_error=True, duration=duration, ran=ran)

    def to_block(self) -> ToolResultBlock:
        """The `tool_result` block for the history."""
        fields: dict[str, Any] = {"tool_use_id": self.tool_use_id}
        if self.content is not None and self.content != "":
            fields["content"] = self.content
        if self.is_error:
            fields["is_error"] = True
        return ToolResultBlock(**fields)  # only the fields set here are dumped

    @property
    def text(self) -> str:
        """The content as text (block content joined), for logs and the tool-call log."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text if isinstance(b, TextBlock) else f"[{b.type}]" for b in self.content)


@dataclass(frozen=True)
class CallPaused:
    """What a tool returns when its call waits: a run it started paused.

    A sub-agent's tool (`Agent.as_tool`) returns it when the sub-agent's run ends with
    calls waiting for approval or for the caller. The call then gets no result: the
    calling run pauses too, with this state inside its own, and resuming it resumes
    this run first.
    """

    state: dict[str, Any]
    """The paused run's `RunResult.state`."""


def _is_context(annotation: Any) -> bool:
    return annotation is RunContext or typing.get_origin(annotation) is RunContext


Executor = Callable[[str, dict[str, Any]], "tuple[bool, str] | Awaitable[tuple[bool, str]]"]


def _is_async(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004
    )


class Tool:
    """A callable the model may use: a name, a description, a JSON schema and a function.

    Build one with `@tool` (or `Tool(function)`); the registry validates input against the
    signature, injects the `RunContext`, and runs sync functions in worker threads.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        eager: bool = True,
        abandon: bool = True,
        input_schema: Mapping[str, Any] | None = None,
        requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
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
                it: the function is then called with the input dict as its one argument,
                unvalidated (validating it is the function's job).
            requires_approval: Whether a call waits for a person's decision before it
                runs: True, False, or `rule(ctx, input) -> bool` deciding per call (a
                non-empty string counts as True and is shown as the reason). See
                `Agent.resume`.
        """
        if not callable(function):
            raise ConfigurationError(f"@tool needs a function, got {function!r}")
        self.function = function
        self.name: str = name or str(getattr(function, "__name__", ""))
        self.is_async = _is_async(function)
        self.timeout, self.eager, self.abandon = timeout, eager, abandon
        self.requires_approval = requires_approval
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
        self.definition = ToolDefinition(self.name, self.description, self.input_schema)
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
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
    ) -> Tool:
        """A copy with the given options changed (and no `source`); the rest is kept."""
        new = copy.copy(self)
        new.name = self.name if name is None else name
        new.description = self.description if description is None else description
        new.timeout = self.timeout if timeout is None else timeout
        new.eager = self.eager if eager is None else eager
        new.abandon = self.abandon if abandon is None else abandon
        if requires_approval is not None:
            new.requires_approval = requires_approval
        new._check()
        new.source = None
        new.definition = replace(self.definition, name=new.name, description=new.description)
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

    def bind(
        self, arguments: dict[str, Any], context: Callable[[], RunContext[Any]]
    ) -> Callable[[], Any]:
        """The call of the function with validated `arguments`, ready to run.

        `context` makes the `RunContext` for a function that takes one (it is not called
        otherwise). `arguments` (from `validate`) is used up.
        """
        if self._model is None:
            return partial(self.function, arguments)
        if self._context_param is not None:
            arguments[self._context_param] = context()
        if self._positional:
            args = [arguments.pop(name) for name in self._positional]
            return partial(self.function, *args, **arguments)
        return partial(self.function, **arguments)


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


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 128 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


@overload
def tool(
    function: F,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
) -> Callable[[F], Tool]: ...


def tool(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    eager: bool = True,
    abandon: bool = True,
    requires_approval: bool | Callable[[RunContext[Any], dict[str, Any]], bool | str] = False,
) -> Tool | Callable[[F], Tool]:
    """Make a function a tool; use bare (`@tool`) or with options (`@tool(timeout=5)`).

    The docstring becomes the description (parameter sections in Google, NumPy or Sphinx
    style become parameter descriptions), the signature becomes the JSON schema
    (`Literal` -> `enum`, defaults, pydantic models, TypedDicts,
    `Annotated[..., Field(description=...)]`), and a parameter typed `RunContext` is
    injected rather than shown to the model.

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
    """
    options: dict[str, Any] = {
        "name": name,
        "description": description,
        "timeout": timeout,
        "eager": eager,
        "abandon": abandon,
        "requires_approval": requires_approval,
    }
    if function is not None:
        return Tool(function, **options)

    def decorate(fn: F) -> Tool:
        return Tool(fn, **options)

    return decorate


# --------------------------------------------------------------------------- outputs

_BLOCK_OUTPUTS = (TextBlock, ImageBlock, DocumentBlock)


def to_content(value: Any) -> str | list[ContentBlock] | None:
    """What the model sees for a tool's return value.

    str as is; None as an empty success; bytes as their text when they are UTF-8, else
    in base64 after a line saying so; a content block, or a list of them, as block
    content (empty text blocks left out); a pydantic model as its JSON; anything else
    JSON-encodable as JSON.

    Raises:
        TypeError: the value cannot be sent to the model: an object pydantic cannot
            serialise, a cycle, bytes that are not UTF-8 inside a container, a block the
            API would refuse. The message says what is wrong.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_text(bytes(value))
    if isinstance(value, _BLOCK_OUTPUTS):
        return _result_blocks([value])
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, _BLOCK_OUTPUTS) for v in value)
    ):
        return _result_blocks(value)
    try:
        if isinstance(value, BaseModel):
            return value.model_dump_json()
        return pydantic_core.to_json(value).decode()
    except Exception as exc:  # the value's own code may run here (a generator, a serialiser)
        raise TypeError(
            f"it is not JSON ({type(value).__name__} value; {describe_exception(exc)})"
        ) from exc


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        encoded = base64.b64encode(data).decode()
        return f"[{len(data)} bytes that are not UTF-8 text, in base64:]\n{encoded}"


def _result_blocks(blocks: Sequence[ContentBlock]) -> list[ContentBlock] | None:
    """Blocks a tool returned, less empty text (the API refuses it), checked as the API would."""
    kept = [b for b in blocks if not (isinstance(b, TextBlock) and b.text == "")]
    for k, block in enumerate(kept):
        problem = json_problem(block)
        if problem is not None:
            where, why = problem
            raise TypeError(f"block {k} ({block.type}){where}: {why}")
    try:
        check_result_content(kept)
    except HistoryError as exc:
        raise TypeError(f"{exc} (blocks counted from 0, empty text left out)") from None
    return kept or None


def describe_exception(exc: BaseException) -> str:
    """`TYPE: MESSAGE` (`TYPE` when the message is empty), even if reading the message fails."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        return f"{name} (its message could not be read)"
    return f"{name}: {text}" if text else name


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


_SURROGATES = re.compile("[\ud800-\udfff]")


def sendable(result: ToolResult) -> ToolResult:
    """`result` with text UTF-8 cannot carry (lone surrogates) replaced, and the fact said.

    A tool returning `os.fsdecode(...)` of a file name that is not UTF-8 (what `os.listdir`
    gives for such names) would otherwise make the next request impossible to send. Each such
    character becomes U+FFFD, and a note at the end tells the model so.
    """
    content = result.content
    if isinstance(content, str):
        if content.isascii() or not _SURROGATES.search(content):
            return result
        fixed, count = _SURROGATES.subn("\ufffd", content)
        return replace(result, content=fixed + _replaced_note(count))
    if not content or not any(
        isinstance(b, TextBlock) and _SURROGATES.search(b.text) for b in content
    ):
        return result
    blocks: list[ContentBlock] = []
    total = 0
    for block in content:
        if isinstance(block, TextBlock):
            text, count = _SURROGATES.subn("\ufffd", block.text)
            total += count
            block = block.model_copy(update={"text": text}) if count else block
        blocks.append(block)
    blocks.append(TextBlock(text=_replaced_note(total).strip()))
    return replace(result, content=blocks)


def _replaced_note(count: int) -> str:
    return (
        f"\n[{count} character(s) of this result could not be encoded as UTF-8 (lone "
        "surrogates, e.g. from a file name that is not UTF-8) and were replaced with U+FFFD]"
    )
