"""Typed output: how a run ends with a validated `output_type` instead of text.

`Agent` gives each run with an `output_type` an `OutputRun`. Before each request it shapes
the request for the run's mode (final-result tools beside the agent's tools, the provider's
structured-output format, or the schema in the system prompt); after each turn it reads
the model's output, validates it (schema, then the agent's output validators), and either
ends the run or sends the failure back to the model, at most `output_retries` times.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

from .calls import ToolCall, ToolResult
from .context import RunContext
from .errors import ConfigurationError, OutputValidationError, ToolError
from .history import History
from .providers.base import ModelRequest, ModelResponse
from .registry import ToolRegistry
from .schema import type_schema
from .tools import Tool, describe_validation_error, validation_problems

__all__ = (
    "FINAL_RESULT_TOOL",
    "OutputChoice",
    "OutputMode",
    "OutputRun",
    "OutputSchema",
    "OutputValidator",
    "output_schema",
    "resolve_mode",
)

OutputMode = Literal["auto", "native", "tool", "prompted"]
"""How the output reaches the model: `auto` is `native` where the provider has structured
output, else `tool`."""

OutputValidator = Callable[..., Any]
"""`validator(output)` or `validator(ctx: RunContext, output)`, sync or async; returns the
output (possibly changed) or raises `ToolError` to send the model back."""

FINAL_RESULT_TOOL = "final_result"
"""The name of the final-result tool (`final_result_<Type>` for each member of a union)."""

_WRAPPER = "response"
"""The one property of the object that carries an output which is not itself an object."""

_FINAL_STOPS = frozenset({"end_turn", "stop_sequence"})
"""Stop reasons after which a response without tool calls is the model's answer."""

RECEIVED = "Final result received."
"""What a valid final-result call is answered with."""


@dataclass(frozen=True)
class OutputChoice:
    """One shape the output may take: its object schema and how to validate it."""

    name: str
    """The final-result tool's name in tool mode."""
    description: str
    schema: dict[str, Any]
    """The JSON schema of an object, as the model sees it."""
    adapter: TypeAdapter[Any]
    """Validates that object."""
    wrapped: bool
    """Whether the output is the object's `response` property (a type that is not an
    object, such as `int`, `list[str]` or a union)."""

    def validate(self, value: Any, *, partial: bool = False) -> Any:
        """The output held by `value` (the object the model sent), validated.

        Raises:
            pydantic.ValidationError: `value` does not fit the schema.
        """
        valid = self.adapter.validate_python(value, experimental_allow_partial=partial)
        return getattr(valid, _WRAPPER) if self.wrapped else valid

    def validate_json(self, text: str) -> Any:
        """The output held by the JSON `text`, validated.

        Raises:
            pydantic.ValidationError: `text` is not JSON, or does not fit the schema.
        """
        valid = self.adapter.validate_json(text)
        return getattr(valid, _WRAPPER) if self.wrapped else valid


@dataclass(frozen=True)
class OutputSchema:
    """An output type as the model is told it, in every mode."""

    output_type: Any
    whole: OutputChoice
    """The whole type as one object (native and prompted modes)."""
    choices: tuple[OutputChoice, ...]
    """One choice per member of a union, each its own final-result tool (tool mode)."""
    allows_text: bool
    """`str` is a member: in tool mode a plain text answer is the output."""
    tools: tuple[Tool, ...]
    """The final-result tools (tool mode); the registry never calls their functions."""


def output_schema(output_type: Any) -> OutputSchema:
    """The `OutputSchema` of `output_type` (computed once per type when it is hashable).

    Raises:
        ConfigurationError: the type has no JSON schema, or is only `str`.
    """
    try:
        return _cached_schema(output_type)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _build_schema(output_type)


@lru_cache(maxsize=256)
def _cached_schema(output_type: Any) -> OutputSchema:
    return _build_schema(output_type)


def _build_schema(output_type: Any) -> OutputSchema:
    members = _members(output_type)
    typed = [m for m in members if m is not str]
    if not typed:
        raise ConfigurationError("output_type str needs no output schema: the output is the text")
    single = len(typed) == 1
    choices = []
    taken: set[str] = set()
    for member in typed:
        name = FINAL_RESULT_TOOL if single else _tool_name(member, taken)
        taken.add(name)
        choices.append(_choice(member, name))
    whole = choices[0] if len(members) == 1 else _choice(output_type, FINAL_RESULT_TOOL)
    tools = tuple(
        Tool(_never_called, name=c.name, description=c.description, input_schema=c.schema)
        for c in choices
    )
    return OutputSchema(output_type, whole, tuple(choices), str in members, tools)


def _members(output_type: Any) -> list[Any]:
    if typing.get_origin(output_type) in (typing.Union, types.UnionType):
        return list(typing.get_args(output_type))
    return [output_type]


def _tool_name(member: Any, taken: set[str]) -> str:
    label = getattr(member, "__name__", None) or repr(member)
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", str(label)).strip("_")[:40] or "output"
    name = f"{FINAL_RESULT_TOOL}_{slug}"
    number = 2
    while name in taken:
        name = f"{FINAL_RESULT_TOOL}_{slug}_{number}"
        number += 1
    return name


def _choice(output_type: Any, name: str) -> OutputChoice:
    where = f"output_type {output_type!r}"
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        schema = type_schema(adapter)
    except Exception as exc:
        raise ConfigurationError(f"{where} cannot be described in JSON schema: {exc}") from exc
    description = str(schema.get("description") or "")
    wrapped = schema.get("type") != "object" or "properties" not in schema
    if wrapped:
        model: type[BaseModel] = create_model(f"{name}_output", response=(output_type, ...))
        adapter = TypeAdapter(model)
        defs = schema.pop("$defs", None)
        schema = {
            "type": "object",
            "properties": {_WRAPPER: schema},
            "required": [_WRAPPER],
            **({"$defs": defs} if defs else {}),
        }
    lead = "Give the final response; calling this ends the run."
    return OutputChoice(name, f"{lead} {description}".strip(), schema, adapter, wrapped)


def _never_called(arguments: dict[str, Any]) -> None:
    raise AssertionError("final-result calls are answered by the run's OutputRun")


def resolve_mode(mode: str, provider: object) -> Literal["native", "tool", "prompted"]:
    """The mode a run uses: `auto` is `native` when the provider says it has it.

    A provider has native structured output when its `native_output` attribute is true.

    Raises:
        ConfigurationError: an unknown mode, or `native` for a provider without it.
    """
    native = bool(getattr(provider, "native_output", False))
    if mode == "auto":
        return "native" if native else "tool"
    if mode == "native" and not native:
        raise ConfigurationError(
            f"output_mode 'native': provider {type(provider).__name__} has no native "
            "structured output; use output_mode='tool' or 'prompted'"
        )
    if mode not in ("native", "tool", "prompted"):
        raise ConfigurationError(
            f"output_mode must be 'auto', 'native', 'tool' or 'prompted', not {mode!r}"
        )
    return mode  # type: ignore[return-value]  # checked just above


class _Retry(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OutputRun:
    """The typed output of one run: shapes its requests, reads and validates its answers."""

    def __init__(
        self,
        schema: OutputSchema,
        mode: Literal["native", "tool", "prompted"],
        *,
        retries: int,
        validators: Sequence[OutputValidator],
        registry: ToolRegistry,
    ) -> None:
        """Output of `schema` in `mode`, for a run whose own tools are `registry`."""
        self.schema = schema
        self.mode = mode
        self.retries = retries
        self.validators = tuple(validators)
        self.failures = 0
        """Tries that failed validation so far."""
        self.problems = ""
        """What was wrong with the latest failed try."""
        self.done = False
        self.value: Any = None
        """The validated output, once `done`."""
        self._values: dict[str, Any] = {}  # final-result tool_use id -> its valid output
        self._crash: Exception | None = None  # a validator's own failure, raised after the turn
        self.tool_names = frozenset(t.name for t in schema.tools) if mode == "tool" else frozenset()
        self.registry = _WithOutputTools(registry, self) if mode == "tool" else registry
        """The tools announced and run: the agent's, plus the final-result tools."""

    # -- before a request

    def shape(self, request: ModelRequest) -> ModelRequest:
        """`request` asking for the output in this run's mode."""
        whole = self.schema.whole
        if self.mode == "native":
            return replace(request, output_format={"name": whole.name, "schema": whole.schema})
        if self.mode == "prompted":
            return replace(request, system=_with_prompt(request.system, whole.schema))
        return request

    # -- after a turn

    async def after_turn(
        self,
        response: ModelResponse,
        calls: Sequence[ToolCall],
        history: History,
        ctx: RunContext[Any],
    ) -> Literal["done", "retry"] | None:
        """What the turn means for the output: `done`, `retry` (sent back), or None.

        None: the turn gave no output and the loop goes on as it would without one.

        Raises:
            OutputValidationError: the tries are used up (the history stays valid).
            Exception: what an output validator raised, other than `ToolError`.
        """
        if self._crash is not None:
            raise self._crash
        for call in calls:
            if call.id in self._values:
                return self._finish(self._values[call.id])
        self._check_tries()
        if calls or response.stop_reason not in _FINAL_STOPS:
            return None
        if self.mode == "tool":
            if self.schema.allows_text:
                return self._finish(response.text)
            names = ", ".join(self.tool_names)
            problem = (
                f"Give your final response by calling {names}; text alone does not end the run."
            )
        else:
            try:
                return self._finish(await self._read(response.text, ctx))
            except _Retry as exc:
                problem = exc.message
        self._failed(problem)
        self._check_tries()
        history.add_user(problem)
        return "retry"

    def check_end(self, stop_reason: str) -> None:
        """Refuse a run that ended without its output, unless it handed calls back.

        Raises:
            OutputValidationError: the run stopped (`max_rounds`, `max_tokens`, a refusal,
                ...) before the model gave a valid output.
        """
        if self.done or stop_reason in ("tool_use", "cancelled"):
            return
        raise OutputValidationError(
            f"the run ended (stop_reason {stop_reason!r}) before the model gave its output",
            problems=self.problems,
        )

    async def run_tool(self, call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
        """Answer a final-result call: validate it, run the validators, keep the output.

        `ctx` is the call's context.
        """
        choice = next(c for c in self.schema.choices if c.name == call.name)
        try:
            value = choice.validate(call.input)
        except ValidationError as exc:
            return self._failed_call(call, describe_validation_error(call.name, exc))
        try:
            value = await self._validated(value, ctx)
        except _Retry as exc:
            return self._failed_call(call, exc.message)
        except Exception as exc:
            # Raised once the turn is complete, so the history stays valid.
            self._crash = self._crash or exc
            return ToolResult.error(call, f"Not accepted: the output validator failed ({exc!r}).")
        self._values[call.id] = value
        return ToolResult(call.id, call.name, RECEIVED)

    # -- helpers

    async def _read(self, text: str, ctx: RunContext[Any]) -> Any:
        """The output in a text answer (native or prompted), validated."""
        source = text if self.mode == "native" else _json_in(text)
        try:
            value = self.schema.whole.validate_json(source)
        except ValidationError as exc:
            lines = "\n".join(validation_problems(exc))
            lead = "Your answer is not a valid output. Fix these and answer again:"
            raise _Retry(f"{lead}\n{lines}") from exc
        return await self._validated(value, ctx)

    async def _validated(self, value: Any, ctx: RunContext[Any]) -> Any:
        """`value` through the output validators; a `ToolError` becomes a `_Retry`."""
        for validator in self.validators:
            try:
                returned = validator(ctx, value) if _takes_context(validator) else validator(value)
                if inspect.isawaitable(returned):
                    returned = await returned
            except ToolError as exc:
                raise _Retry(exc.message) from exc
            value = returned
        return value

    def _finish(self, value: Any) -> Literal["done"]:
        self.value, self.done = value, True
        return "done"

    def _failed(self, problem: str) -> None:
        self.failures += 1
        self.problems = problem

    def _failed_call(self, call: ToolCall, problem: str) -> ToolResult:
        self._failed(problem)
        return ToolResult.error(call, problem)

    def _check_tries(self) -> None:
        if self.failures > self.retries:
            first = self.problems.splitlines()[0] if self.problems else ""
            raise OutputValidationError(
                f"the model gave no valid output in {self.failures} tries "
                f"(output_retries={self.retries}): {first}",
                problems=self.problems,
            )


class _WithOutputTools(ToolRegistry):
    """The agent's tools plus the final-result tools, whose calls the `OutputRun` answers."""

    def __init__(self, base: ToolRegistry, output: OutputRun) -> None:
        super().__init__()
        for item in base:
            self.register(item, source=item.source)
        for made in output.schema.tools:
            self.register(made)
        self._output = output

    async def run_call(self, call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
        """A final-result call is validated by the run's output; others run as usual."""
        if call.name in self._output.tool_names:
            return await self._output.run_tool(call, ctx.for_call(call))
        return await super().run_call(call, ctx)


def _takes_context(validator: OutputValidator) -> bool:
    """Whether a validator's first of two parameters is the `RunContext`."""
    try:
        parameters = inspect.signature(validator).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


def check_validator(validator: OutputValidator) -> OutputValidator:
    """`validator`, if it can be called with the output (and a `RunContext`).

    Raises:
        ConfigurationError: it is not callable or takes no parameter.
    """
    if not callable(validator):
        raise ConfigurationError(f"an output validator must be callable, not {validator!r}")
    try:
        count = len(inspect.signature(validator).parameters)
    except (TypeError, ValueError):
        return validator
    if count == 0:
        raise ConfigurationError(
            f"output validator {validator!r} takes no parameter; it receives the output "
            "(and, first, a RunContext if it takes two)"
        )
    return validator


PROMPT = (
    "Answer with one JSON value that matches this JSON schema, and nothing else "
    "(no text before or after it):\n```json\n{schema}\n```"
)
"""What prompted mode adds to the system prompt."""


def _with_prompt(
    system: str | Sequence[Mapping[str, Any]] | None, schema: Mapping[str, Any]
) -> str | list[Mapping[str, Any]]:
    prompt = PROMPT.format(schema=json.dumps(schema, indent=1))
    if not system:
        return prompt
    if isinstance(system, str):
        return f"{system}\n\n{prompt}"
    return [*system, {"type": "text", "text": prompt}]


_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)\n\s*```", re.DOTALL)


def _json_in(text: str) -> str:
    """The JSON in a prompted answer: inside a code fence, or from the first brace on."""
    fenced = _FENCED.search(text)
    if fenced:
        return fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text.strip()
