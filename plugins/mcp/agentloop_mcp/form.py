"""The terminal form for a server's question (elicitation), one field at a time.

Used by `terminal_elicitation` (capabilities.py) on the command line. Each field shows its
type, its bounds, its choices and its default; an answer is checked against the field's
schema and asked again until it fits, so the server gets content it accepts. The user can
decline (`!decline`) or cancel (`!cancel`, Ctrl-D) at any field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

import jsonschema
import mcp.types as mcp_types

__all__ = ("CANCEL", "DECLINE", "ask_form")

DECLINE = "!decline"
"""Typed at any field: the user declines to answer (the server may go on without it)."""
CANCEL = "!cancel"
"""Typed at any field (or Ctrl-D): the user cancels (the server should stop)."""

_TRUE = ("y", "yes", "true", "1")
_FALSE = ("n", "no", "false", "0")


def ask_form(
    schema: dict[str, Any], out: TextIO, read: Callable[[], str]
) -> mcp_types.ElicitResult:
    """Ask each field of `schema` (a flat object schema) with `read`; the user's answer.

    Raises:
        EOFError: never; the end of input cancels.
    """
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    required = set(schema.get("required") or ())
    print(
        f"  (Enter takes the default or skips an optional field; {DECLINE} declines, "
        f"{CANCEL} or Ctrl-D cancels)",
        file=out,
    )
    content: dict[str, Any] = {}
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        choices = _choices(spec)
        for number, (value, label) in enumerate(choices, 1):
            shown = f"{label} ({value})" if label != str(value) else label
            print(f"    {number}) {shown}", file=out)
        while True:
            print(_prompt(name, spec, name in required, choices), end="", file=out, flush=True)
            try:
                answer = read().strip()
            except EOFError:
                return mcp_types.ElicitResult(action="cancel")
            if answer == DECLINE:
                return mcp_types.ElicitResult(action="decline")
            if answer == CANCEL:
                return mcp_types.ElicitResult(action="cancel")
            if not answer:
                if "default" in spec:
                    content[name] = spec["default"]
                    break
                if name not in required:
                    break
                print("    this field needs an answer; try again", file=out)
                continue
            value, problem = _parse(answer, spec, choices)
            if problem is None:
                content[name] = value
                break
            print(f"    {problem}; try again", file=out)
    return mcp_types.ElicitResult(action="accept", content=content)


def _prompt(name: str, spec: dict[str, Any], required: bool, choices: list[Any]) -> str:
    kind = spec.get("type", "string")
    parts = [
        "list of choices, comma-separated" if kind == "array" else kind,
        *_bounds(spec),
    ]
    if choices:
        parts.append(f"1-{len(choices)} or the value")
    if kind == "boolean":
        parts.append("y/n")
    if "default" in spec:
        parts.append(f"default {spec['default']!r}")
    elif not required:
        parts.append("optional")
    hint = f" ({spec['description']})" if spec.get("description") else ""
    title = spec.get("title") or name
    return f"  {title}{hint} [{', '.join(parts)}]: "


def _bounds(spec: dict[str, Any]) -> list[str]:
    shown = []
    for key, words in (
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("format", "{}"),
    ):
        if key in spec:
            text = words.format(spec[key]) if "{}" in words else f"{words} {spec[key]}"
            shown.append(text)
    return shown


def _choices(spec: dict[str, Any]) -> list[tuple[Any, str]]:
    """The field's choices as (value, label): `enum` (with `enumNames`), titled `oneOf`."""
    source = spec.get("items", {}) if spec.get("type") == "array" else spec
    if not isinstance(source, dict):
        return []
    if isinstance(source.get("enum"), list):
        names = source.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(source["enum"]) else None
        return [(v, str(labels[i] if labels else v)) for i, v in enumerate(source["enum"])]
    options = source.get("oneOf") or source.get("anyOf")
    if isinstance(options, list):
        return [
            (o["const"], str(o.get("title") or o["const"]))
            for o in options
            if isinstance(o, dict) and "const" in o
        ]
    return []


def _parse(answer: str, spec: dict[str, Any], choices: list[Any]) -> tuple[Any, str | None]:
    """The typed value of `answer`, or why it does not fit the field's schema."""
    kind = spec.get("type", "string")
    value: Any = answer
    if kind == "array":
        value = [_choice(part.strip(), choices) for part in answer.split(",") if part.strip()]
    elif choices:
        value = _choice(answer, choices)
    elif kind == "boolean":
        if answer.lower() not in (*_TRUE, *_FALSE):
            return None, "answer y or n"
        value = answer.lower() in _TRUE
    elif kind == "integer":
        try:
            value = int(answer)
        except ValueError:
            return None, f"{answer!r} is not a whole number"
    elif kind == "number":
        try:
            value = float(answer)
        except ValueError:
            return None, f"{answer!r} is not a number"
    validator_class = jsonschema.validators.validator_for(spec, jsonschema.Draft202012Validator)
    checker = validator_class.FORMAT_CHECKER
    try:
        error = jsonschema.exceptions.best_match(
            validator_class(spec, format_checker=checker).iter_errors(value)
        )
    except jsonschema.SchemaError:
        return value, None  # a schema we cannot check with: the server will
    return (value, None) if error is None else (None, error.message)


def _choice(answer: str, choices: list[tuple[Any, str]]) -> Any:
    """A choice by its number, its value or its label; the answer itself when none fits."""
    if answer.isdigit() and 1 <= int(answer) <= len(choices):
        return choices[int(answer) - 1][0]
    for value, label in choices:
        if answer in (str(value), label):
            return value
    return answer
