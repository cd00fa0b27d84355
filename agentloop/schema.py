"""From a tool function to what the model sees: signature -> pydantic model -> JSON schema.

`Tool` (agentloop.tools) asks this module once, when it is defined: `parse_docstring`
gives the description and each parameter's text, `input_model` builds the pydantic model
that validates the model's input, and `input_schema` the JSON schema sent with the tool.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docstring_parser
from docstring_parser import DocstringStyle
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema

from .errors import ConfigurationError

__all__ = ("InputModel", "input_model", "input_schema", "parse_docstring", "type_schema")

# Google style with the sections that also list parameters, which docstring_parser's
# default Google sections leave out.
_GOOGLE = docstring_parser.google.GoogleParser(
    sections=[
        *docstring_parser.google.DEFAULT_SECTIONS,
        *(
            docstring_parser.google.Section(
                title, "param", docstring_parser.google.SectionType.MULTIPLE
            )
            for title in ("Keyword Args", "Keyword Arguments", "Other Args", "Other Parameters")
        ),
    ]
)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (summary and body, no sections) and each parameter's text.

    docstring_parser picks the style (the one that finds the most sections); a Google
    docstring is then read with its other parameter sections too.
    """
    if not doc:
        return "", {}
    try:
        parsed = docstring_parser.parse(doc, style=DocstringStyle.AUTO)
        if parsed.style is DocstringStyle.GOOGLE:
            parsed = _GOOGLE.parse(doc)
    except docstring_parser.ParseError:
        return doc.strip(), {}
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    description = ("\n\n" if parsed.blank_after_short_description else "\n").join(parts)
    params: dict[str, str] = {}
    for param in parsed.params:
        if param.args[0] == "attribute" or not param.description:
            continue
        # "x, y: ..." documents both; "*args" and "\\*args" name `args`.
        for name in param.arg_name.split(","):
            name = name.strip().replace("\\", "").lstrip("*")
            if name.isidentifier():
                params.setdefault(name, " ".join(param.description.split()))
    return description.strip(), params


@dataclass(frozen=True)
class InputModel:
    """How a function takes the model's input."""

    model: type[BaseModel]
    """Validates the input: one field per parameter the model fills in."""
    context_param: str | None
    """The parameter that receives the `RunContext`, if any (not in `model`)."""
    positional: tuple[str, ...]
    """Positional-only parameters, in order (passed by position, not by name)."""


def input_model(
    function: Callable[..., Any],
    tool_name: str,
    param_docs: Mapping[str, str],
    is_context: Callable[[Any], bool],
) -> InputModel:
    """The pydantic model of `function`'s parameters, described by `param_docs`.

    A parameter whose annotation `is_context` is left out of the model: it is injected.

    Raises:
        ConfigurationError: the signature cannot be read or described to the model.
    """
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot read its signature: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param: str | None = None
    positional: list[str] = []
    for param in signature.parameters.values():
        annotation = hints.get(param.name, Any)
        if is_context(annotation):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {tool_name!r}: *{param.name} cannot be described to the model; "
                "name each parameter"
            )
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(param.name)
        default = ... if param.default is param.empty else param.default
        # An `Annotated[..., Field(description=...)]` says more precisely what the author
        # meant than the docstring, so it wins.
        described = param.name in param_docs and not _has_description(annotation)
        info = Field(default, description=param_docs[param.name]) if described else Field(default)
        fields[param.name] = (annotation, info)
    try:
        model = _model_of(tool_name, fields)
    except Exception as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot build its schema: {exc}") from exc
    return InputModel(model, context_param, tuple(positional))


def input_schema(model: type[BaseModel], tool_name: str) -> dict[str, Any]:
    """The JSON schema the model sees for `model`, without titles.

    Raises:
        ConfigurationError: a parameter's type has no JSON schema (the parameter is named).
    """
    try:
        schema = model.model_json_schema(schema_generator=_Untitled)
    except Exception as exc:
        # Name the parameter: the model's own error names only the type.
        for name, info in model.model_fields.items():
            try:
                _model_of(tool_name, {name: (info.annotation, info)}).model_json_schema()
            except Exception:
                raise ConfigurationError(
                    f"tool {tool_name!r}: parameter {name!r} has a type that cannot be "
                    f"described in JSON schema to the model ({exc})"
                ) from exc
        raise ConfigurationError(f"tool {tool_name!r}: cannot build its schema: {exc}") from exc
    schema.setdefault("properties", {})
    return schema


def type_schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    """The JSON schema of any type pydantic validates (an output type), without titles.

    A model's or dataclass's own description (its docstring) is kept.
    """
    return adapter.json_schema(schema_generator=_Untitled)


class _Untitled(GenerateJsonSchema):
    """JSON schema without the titles pydantic derives from names.

    They repeat the names ("Location" for `location`, "Point" for `Point`) and cost
    tokens. A field's title given explicitly (`Field(title=...)`) is kept.
    """

    def field_title_should_be_set(self, schema: Any) -> bool:
        """Never derive a field's title from its name."""
        return False

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        """The schema, with no title on the input object or on its definitions."""
        json_schema = super().generate(schema, mode)
        for definition in (json_schema, *json_schema.get("$defs", {}).values()):
            definition.pop("title", None)
        return json_schema


def _model_of(tool_name: str, fields: Mapping[str, Any]) -> type[BaseModel]:
    return create_model(
        f"{tool_name}_input",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )


def _has_description(annotation: Any) -> bool:
    return any(
        isinstance(meta, FieldInfo) and meta.description
        for meta in getattr(annotation, "__metadata__", ())
    )
