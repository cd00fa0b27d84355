"""`@tool`: schemas from signatures and docstrings, context injection, options."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from agentloop import ConfigurationError, RunContext, Tool, tool
from agentloop.errors import DuplicateToolError
from agentloop.registry import ToolRegistry

if sys.version_info >= (3, 12):
    from typing import TypedDict
else:
    from typing_extensions import TypedDict


class Point(BaseModel):
    x: int
    y: int = 0


class Options(TypedDict):
    verbose: bool


def google(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Forecast for a city.

    Longer explanation that stays in the description.

    Args:
        city: City name, e.g. "Paris".
        unit: Temperature unit.
        days: How many days
            to forecast.

    Returns:
        The forecast.
    """
    return city


def numpy(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Forecast for a city.

    Longer explanation that stays in the description.

    Parameters
    ----------
    city : str
        City name, e.g. "Paris".
    unit : {"c", "f"}
        Temperature unit.
    days : int
        How many days
        to forecast.
    """
    return city


def sphinx(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Forecast for a city.

    Longer explanation that stays in the description.

    :param city: City name, e.g. "Paris".
    :param unit: Temperature unit.
    :param days: How many days
        to forecast.
    :returns: The forecast.
    """
    return city


@pytest.mark.parametrize("function", [google, numpy, sphinx], ids=["google", "numpy", "sphinx"])
def test_docstring_styles_give_the_same_schema(function: Any) -> None:
    t = tool(function)
    assert (
        t.description == "Forecast for a city.\n\nLonger explanation that stays in the description."
    )
    assert t.input_schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "city": {"type": "string", "description": 'City name, e.g. "Paris".'},
            "unit": {
                "type": "string",
                "enum": ["c", "f"],
                "default": "c",
                "description": "Temperature unit.",
            },
            "days": {"type": "integer", "default": 1, "description": "How many days to forecast."},
        },
        "required": ["city"],
    }


def test_annotated_models_typeddicts_and_context() -> None:
    seen: list[Any] = []

    @tool(name="plot", description="Plot a point.", timeout=3)
    async def draw(
        point: Point,
        options: Options,
        ctx: RunContext[dict[str, str]],
        label: Annotated[str, Field(description="Text next to the point", max_length=10)] = "p",
    ) -> str:
        seen.append((point, options, ctx.deps, label))
        return "ok"

    assert (draw.name, draw.description, draw.timeout) == ("plot", "Plot a point.", 3)
    schema = draw.input_schema
    assert set(schema["properties"]) == {"point", "options", "label"}
    assert schema["properties"]["label"] == {
        "type": "string",
        "default": "p",
        "description": "Text next to the point",
        "maxLength": 10,
    }
    assert schema["$defs"]["Point"]["properties"]["x"] == {"type": "integer"}
    assert schema["$defs"]["Options"]["required"] == ["verbose"]
    assert schema["required"] == ["point", "options"]
    args = draw.validate({"point": {"x": 1}, "options": {"verbose": True}})
    assert args["point"] == Point(x=1, y=0)


def test_context_parameter_is_injected_not_shown() -> None:
    @tool
    def who(ctx: RunContext[str]) -> str:
        return ctx.deps

    assert who.input_schema == {"type": "object", "additionalProperties": False, "properties": {}}


def test_star_parameters_cannot_be_described() -> None:
    def varargs(*args: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"\*args cannot be described to the model"):
        tool(varargs)


def test_invalid_names_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="invalid tool name"):
        tool(name="has space")(google)


def test_tool_is_still_callable() -> None:
    assert tool(google)("Rome") == "Rome"
    assert isinstance(tool(google), Tool) and repr(tool(google)) == "Tool('google')"


def test_registry_refuses_duplicate_names_and_keeps_order() -> None:
    registry = ToolRegistry([google, tool(name="second")(numpy)])
    with pytest.raises(DuplicateToolError, match="'google' is registered twice"):
        registry.register(tool(google), source="weather-plugin")
    assert registry.names == ["google", "second"]
    assert [d.name for d in registry.definitions()] == ["google", "second"]
    assert "google" in registry and len(registry) == 2 and registry.get("nope") is None


def test_field_description_wins_over_the_docstring() -> None:
    @tool
    def f(a: Annotated[int, Field(description="from Field")], b: int = 0) -> int:
        """Doc.

        Args:
            a: from the docstring.
            b: only in the docstring.
        """
        return a + b

    assert f.input_schema["properties"]["a"]["description"] == "from Field"
    assert f.input_schema["properties"]["b"]["description"] == "only in the docstring."


def test_options_apply_when_called_with_the_function() -> None:
    made = tool(google, name="forecast", timeout=2, eager=False)
    assert (made.name, made.timeout, made.eager) == ("forecast", 2, False)
