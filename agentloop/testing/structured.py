"""Structured output in the test doubles: the schema checks the APIs make, and made-up output.

`check_output_config` refuses an `output_config.format` the Messages API would refuse, and
`check_response_format` a `response_format` OpenAI's strict mode would; the scripted model
and both local servers call them on every request. `schema_reply` answers a request with
an output made up from its schema (as a stand-in model does for quick tests), whichever
way the request asks for it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from agentloop.errors import BadRequestError
from agentloop.messages import ToolUseBlock
from agentloop.providers.base import ModelResponse

__all__ = (
    "ANTHROPIC_STRING_FORMATS",
    "check_output_config",
    "check_response_format",
    "example_of",
    "schema_reply",
)

ANTHROPIC_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)
"""The string `format`s the Messages API's structured outputs accept."""

_ANTHROPIC_REFUSED = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "patternProperties",
)
"""Keywords the Messages API refuses in an output schema (the SDK's `transform_schema`
moves them into descriptions)."""


def check_output_config(body: Mapping[str, Any]) -> None:
    """Refuse a Messages API request whose `output_config.format` the API would refuse.

    Raises:
        BadRequestError: the format is not `{"type": "json_schema", "schema": {...}}`, or
            the schema uses what structured outputs do not support: a numeric, string or
            array constraint, an object without `additionalProperties: false`, an
            unknown string format, an external or recursive `$ref`.
    """
    config = body.get("output_config")
    if config is None:
        return
    where = "output_config.format"
    form = config.get("format") if isinstance(config, Mapping) else None
    if form is None:
        return
    if not isinstance(form, Mapping) or form.get("type") != "json_schema":
        raise BadRequestError(f"{where}.type: Input should be 'json_schema'")
    schema = form.get("schema")
    if not isinstance(schema, Mapping):
        raise BadRequestError(f"{where}.schema: Field required")
    problem = _anthropic_problem(schema, schema, f"{where}.schema", ())
    if problem:
        raise BadRequestError(problem)


def _anthropic_problem(
    node: Any, root: Mapping[str, Any], path: str, refs: tuple[str, ...]
) -> str | None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            found = _anthropic_problem(item, root, f"{path}.{i}", refs)
            if found:
                return found
        return None
    if not isinstance(node, Mapping):
        return None
    for keyword in _ANTHROPIC_REFUSED:
        if keyword in node:
            return f"{path}: the keyword '{keyword}' is not supported in structured outputs"
    if node.get("minItems", 0) not in (0, 1):
        return f"{path}: 'minItems' may only be 0 or 1"
    if node.get("type") == "object" and node.get("additionalProperties") is not False:
        return f"{path}: 'additionalProperties' must be set to false for every object"
    fmt = node.get("format")
    if node.get("type") == "string" and fmt is not None and fmt not in ANTHROPIC_STRING_FORMATS:
        return f"{path}: the string format '{fmt}' is not supported in structured outputs"
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref != "#" and not ref.startswith("#/"):
            return f"{path}: external $ref '{ref}' is not supported"
        if ref in refs:
            return f"{path}: recursive schemas are not supported ($ref '{ref}')"
        target = _resolve(root, ref)
        if target is None:
            return f"{path}: $ref '{ref}' points nowhere"
        found = _anthropic_problem(target, root, path, (*refs, ref))
        if found:
            return found
    for key, value in node.items():
        if key in ("$defs", "definitions", "enum", "const", "default", "examples"):
            continue
        if key == "properties" and isinstance(value, Mapping):
            for name, sub in value.items():
                found = _anthropic_problem(sub, root, f"{path}.properties.{name}", refs)
                if found:
                    return found
        elif isinstance(value, (Mapping, list)):
            found = _anthropic_problem(value, root, f"{path}.{key}", refs)
            if found:
                return found
    return None


def check_response_format(body: Mapping[str, Any]) -> None:
    """Refuse a Chat Completions `response_format` that OpenAI's strict mode would refuse.

    Raises:
        BadRequestError: a `json_schema` format without a name or schema, or a strict
            schema with an object that does not list every property as required or does
            not set `additionalProperties: false` (OpenAI's wording).
    """
    form = body.get("response_format")
    if form is None:
        return
    if not isinstance(form, Mapping) or form.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise BadRequestError(
            "Invalid value for 'response_format.type': expected one of 'text', "
            "'json_object' or 'json_schema'."
        )
    if form["type"] != "json_schema":
        return
    spec = form.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise BadRequestError("Missing required parameter: 'response_format.json_schema.name'.")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise BadRequestError("Missing required parameter: 'response_format.json_schema.schema'.")
    if spec.get("strict"):
        problem = _strict_problem(schema, spec["name"], ())
        if problem:
            raise BadRequestError(f"Invalid schema for response_format '{spec['name']}': {problem}")


def _strict_problem(node: Any, name: str, path: tuple[str, ...]) -> str | None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            found = _strict_problem(item, name, (*path, str(i)))
            if found:
                return found
        return None
    if not isinstance(node, Mapping):
        return None
    where = f"context=({', '.join(repr(p) for p in path)})"
    if node.get("type") == "object":
        if node.get("additionalProperties") is not False:
            return f"In {where}, 'additionalProperties' is required to be supplied and to be false."
        properties = node.get("properties") or {}
        missing = [p for p in properties if p not in (node.get("required") or [])]
        if missing:
            return (
                f"In {where}, 'required' is required to be supplied and to be an array "
                f"including every key in properties. Missing '{missing[0]}'."
            )
    for key, value in node.items():
        if key in ("enum", "const", "default"):
            continue
        if isinstance(value, (Mapping, list)):
            found = _strict_problem(value, name, (*path, key))
            if found:
                return found
    return None


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    node: Any = root
    if ref == "#":
        return node
    for part in ref.removeprefix("#/").split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def example_of(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """A value that fits `schema`: the first choice of each union, the least of each range."""
    root = schema if root is None else root
    if "$ref" in schema:
        return example_of(_resolve(root, str(schema["$ref"])) or {}, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for union in ("anyOf", "oneOf", "allOf"):
        if schema.get(union):
            return example_of(schema[union][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: example_of(sub, root) for name, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [example_of(schema.get("items") or {}, root) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in schema else low
        value = min(value, schema.get("maximum", value))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string_example(schema)


def _string_example(schema: Mapping[str, Any]) -> str:
    formats = {
        "date-time": "2025-01-01T00:00:00Z",
        "date": "2025-01-01",
        "time": "00:00:00",
        "duration": "P1D",
        "email": "someone@example.com",
        "hostname": "example.com",
        "uri": "https://example.com/",
        "ipv4": "127.0.0.1",
        "ipv6": "::1",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }
    value = formats.get(str(schema.get("format")), "a")
    return value * max(1, int(schema.get("minLength", 1))) if value == "a" else value


def schema_reply(body: dict[str, Any]) -> str | ModelResponse:
    """A script function: answer any request with an output made up from its schema.

    Native output (`output_config.format`, or a Chat Completions `response_format` as
    `ChatCompletionsServer` hands it on: `json_schema`, or a `json_object` with a
    `schema`) gets the JSON as text; the tool mode (a
    `final_result` tool announced) gets a call of the first final-result tool; otherwise
    the answer is a plain text.

    ```python
    agent = Agent(provider=ScriptedProvider(schema_reply), output_type=Forecast)
    ```
    """
    form = (body.get("output_config") or {}).get("format")
    if isinstance(form, Mapping) and isinstance(form.get("schema"), Mapping):
        return json.dumps(example_of(form["schema"]))
    chat = body.get("response_format") or {}
    chat = chat.get("json_schema") if chat.get("type") == "json_schema" else chat
    if isinstance(chat, Mapping) and isinstance(chat.get("schema"), Mapping):
        return json.dumps(example_of(chat["schema"]))  # json_schema, or json_object's schema
    for definition in body.get("tools") or []:
        name = str(definition.get("name", ""))
        if name.startswith("final_result"):
            made = example_of(definition.get("input_schema") or {})
            call = ToolUseBlock(id="toolu_01" + secrets.token_hex(11), name=name, input=made)
            return ModelResponse(content=[call], stop_reason="tool_use")
    return "a"
