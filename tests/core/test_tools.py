"""`@tool`: schemas from signatures and docstrings, context injection, options."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from agentloop import Agent, ConfigurationError, RunContext, Tool, hookimpl, raw_tools, tool
from agentloop.errors import DuplicateToolError
from agentloop.plugins import PluginManager
from agentloop.registry import ToolRegistry
from agentloop.testing import reply, tool_call

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


# --------------------------------------------------------------------------- docstrings


def test_sections_other_than_parameters_are_not_sent() -> None:
    @tool
    def fetch(url: str, retries: int = 3) -> str:
        """Fetch a page.

        Follows redirects.

        Args:
            url (str): The address.
            retries: How often to try again.

        Returns:
            The body.

        Raises:
            IOError: The host is down.

        Examples:
            >>> fetch("https://example.org")
        """
        return url

    assert fetch.description == "Fetch a page.\n\nFollows redirects."
    assert fetch.input_schema["properties"]["url"]["description"] == "The address."
    assert fetch.input_schema["properties"]["retries"]["description"] == "How often to try again."


def google_forms(x: int, y: int, *, unit: str = "px") -> str:
    """Move the cursor.
    Both lines are the summary.

    Args:
        x, y: The position.

    Keyword Args:
        unit: Unit of x and y.

    Attributes:
        unit: Not a parameter section: never sent.
    """
    return unit


def numpy_forms(x: int, y: int, *, unit: str = "px") -> str:
    """Move the cursor.
    Both lines are the summary.

    Parameters
    ----------
    x, y : int
        The position.

    Other Parameters
    ----------------
    unit : str
        Unit of x and y.
    """
    return unit


def sphinx_forms(x: int, y: int, *, unit: str = "px") -> str:
    """Move the cursor.
    Both lines are the summary.

    :param int x: The position.
    :param y: The position.
    :type y: int
    :keyword unit: Unit of x and y.
    :raises ValueError: Off screen.
    """
    return unit


@pytest.mark.parametrize(
    "function", [google_forms, numpy_forms, sphinx_forms], ids=["google", "numpy", "sphinx"]
)
def test_parameter_forms_of_each_style(function: Callable[..., str]) -> None:
    made = tool(function)
    assert made.description == "Move the cursor.\nBoth lines are the summary."
    described = {k: v.get("description") for k, v in made.input_schema["properties"].items()}
    assert described == {"x": "The position.", "y": "The position.", "unit": "Unit of x and y."}


@pytest.mark.parametrize(
    ("doc", "description"),
    [
        pytest.param(None, "", id="none"),
        pytest.param("   ", "", id="blank"),
        pytest.param("Just a summary.", "Just a summary.", id="summary"),
        # docstring_parser cannot read a Sphinx type with spaces; the tool still builds.
        pytest.param(
            "Summary.\n\n:param dict[str, int] a: A map.",
            "Summary.\n\n:param dict[str, int] a: A map.",
            id="unreadable-field",
        ),
    ],
)
def test_missing_or_unreadable_docstrings_still_make_a_tool(
    doc: str | None, description: str
) -> None:
    def f(a: int) -> int:
        return a

    f.__doc__ = doc
    made = tool(f)
    assert made.description == description
    assert "description" not in made.input_schema["properties"]["a"]


def test_documented_names_that_are_not_parameters_are_ignored() -> None:
    @tool
    def f(a: int) -> int:
        """Doc.

        Args:
            a: The a.
            b: No such parameter.
        """
        return a

    assert set(f.input_schema["properties"]) == {"a"}
    assert f.input_schema["properties"]["a"]["description"] == "The a."


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(0, id="zero"),
        pytest.param(-1, id="negative"),
        pytest.param(math.nan, id="nan"),
        pytest.param("5", id="string"),
        pytest.param(True, id="bool"),
    ],
)
def test_a_timeout_that_would_fail_every_call_is_refused(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"tool 'google': timeout must be .* above 0"):
        tool(google, timeout=timeout)
    with pytest.raises(ConfigurationError, match="timeout must be"):
        tool(google).replace(timeout=timeout)


def test_an_infinite_timeout_means_none() -> None:
    assert tool(google, timeout=math.inf).timeout == math.inf


def test_a_parameter_json_schema_cannot_describe_is_named() -> None:
    def apply(values: list[int], fn: Callable[[int], int]) -> list[int]:
        return [fn(v) for v in values]

    with pytest.raises(ConfigurationError, match=r"tool 'apply': parameter 'fn' has a type"):
        tool(apply)


def test_abandon_false_is_for_sync_tools() -> None:
    async def waits() -> None:
        return None

    with pytest.raises(ConfigurationError, match="abandon=False is for sync tools"):
        tool(abandon=False)(waits)
    assert tool(abandon=False)(google).abandon is False


# --------------------------------------------------------------------------- raw tools

LOOKUP = {
    "name": "lookup",
    "description": "Look a key up.",
    "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}


def test_raw_tools_are_plain_tools_with_the_schema_given() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def executor(name: str, args: dict[str, Any]) -> tuple[bool, str]:
        seen.append((name, args))
        return True, "ok"

    (made,) = raw_tools([LOOKUP], executor)
    assert type(made) is Tool and not made.is_async
    assert made.definition.to_wire() == LOOKUP
    # Input is the executor's to check: nothing is refused on the way in.
    assert made.validate({"key": 3, "extra": True}) == {"key": 3, "extra": True}
    assert made.bind({"key": "k"}, lambda: pytest.fail("no RunContext wanted"))() == "ok"
    assert seen == [("lookup", {"key": "k"})]


def test_tool_with_an_explicit_input_schema() -> None:
    def search(arguments: dict[str, Any]) -> str:
        """Search the index."""
        return str(sorted(arguments))

    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    made = Tool(search, input_schema=schema)
    assert (made.description, made.input_schema) == ("Search the index.", schema)
    assert made.bind(made.validate({"q": "x", "n": 1}), lambda: pytest.fail())() == "['n', 'q']"


async def test_raw_tools_keep_their_schema_and_extras_through_a_plugin(serve: Any) -> None:
    async def executor(name: str, args: dict[str, Any]) -> tuple[bool, str]:
        return (args.get("key") != "missing"), f"{name}:{args.get('key')}"

    class Plugin:
        @hookimpl
        def agentloop_register_tools(self, register: Any) -> None:
            for made in raw_tools([LOOKUP], executor):
                register(made, timeout=5)

    manager = PluginManager()
    manager.register(Plugin(), "raw")
    (made,) = manager.tools()
    assert (made.source, made.timeout, made.definition.to_wire()) == ("raw", 5, LOOKUP)
    server = serve(
        [
            reply(tool_call("lookup", {"key": "k"}), tool_call("lookup", {"key": "missing"})),
            reply("ok"),
        ]
    )
    result = await Agent(client=server.client(), tools=[made]).run("go")
    assert [(c.output, c.is_error) for c in result.tool_calls] == [
        ("lookup:k", False),
        ("lookup:missing", True),
    ]
    assert server.requests[0]["tools"] == [LOOKUP]


def test_replace_keeps_what_it_is_not_told_to_change() -> None:
    original = tool(google, timeout=2)
    changed = original.replace(name="forecast", eager=False, abandon=False)
    assert (changed.name, changed.timeout, changed.eager, changed.abandon) == (
        "forecast",
        2,
        False,
        False,
    )
    assert changed.definition.name == "forecast"
    assert changed.input_schema == original.input_schema and original.name == "google"


# --------------------------------------------------------------------------- typing

DOCS = Path(__file__).parents[2] / "docs"
TYPING = Path(__file__).parents[1] / "typing"


def _snippet(page: str, marker: str) -> str:
    """The first python block of `page` that holds `marker`."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)
    return next(b for b in blocks if marker in b)


def test_the_docs_plugin_tool_is_the_one_type_checked_strictly() -> None:
    """The tool of docs/plugins.md type-checks strictly (and a bare `ctx: RunContext` too).

    `.ci/run` type-checks tests/typing with `mypy --strict`: plugin_tool.py holds the page's
    block, run_context.py the case with explicit type arguments.
    """
    assert _snippet("plugins.md", "ctx: RunContext") in (TYPING / "plugin_tool.py").read_text()
