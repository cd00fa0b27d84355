"""Dynamic tools: a tool's `prepare` and `max_uses`, and tools given to one run.

Every run talks to `MessagesServer` through the SDK, JSON and streamed (`http_agent`);
what a turn announced is read from the request the server got.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from _approval import forged

from agentloop import (
    Agent,
    Approve,
    Capability,
    ConfigurationError,
    RunContext,
    Tool,
    ToolError,
    lint_history,
    tool,
)
from agentloop.calls import AnnouncedTool, ToolCall, ToolDefinition, ToolResult
from agentloop.capabilities import NextCall
from agentloop.errors import DuplicateToolError
from agentloop.messages import parse_history
from agentloop.testing import reply, tool_call

ran: list[str] = []


@dataclass
class Deps:
    admin: bool = False


def valid(result: Any) -> None:
    lint_history(parse_history(result.messages))


def announced(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tools a request announced, by name."""
    return {t["name"]: t for t in request.get("tools", [])}


def outputs(result: Any) -> list[tuple[str, bool, str]]:
    return [(c.name, c.is_error, c.output) for c in result.tool_calls]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(f"lookup:{key}")
    return f"value of {key}"


def admins_only(ctx: RunContext[Deps], definition: ToolDefinition) -> ToolDefinition | None:
    return definition if ctx.deps.admin else None


@tool(prepare=admins_only)
def wipe(table: str) -> str:
    """Wipe a table."""
    ran.append(f"wipe:{table}")
    return f"wiped {table}"


async def test_prepare_hides_a_tool_and_a_call_of_it_is_not_run(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("wipe", {"table": "users"})), reply("I could not.")]
    script += [reply(tool_call("wipe", {"table": "logs"})), reply("Wiped.")]
    agent, server = http_agent(script, tools=[lookup, wipe])
    hidden = await agent.run("wipe users", deps=Deps(admin=False))
    assert list(announced(server.requests[0])) == ["lookup"]
    assert outputs(hidden)[0] == ("wipe", True, "Not run: the tool 'wipe' is not available now.")
    assert not hidden.tool_calls[0].ran
    shown = await agent.run("wipe logs", deps=Deps(admin=True))
    assert list(announced(server.requests[2])) == ["lookup", "wipe"]
    assert ran == ["wipe:logs"] and shown.text == "Wiped."
    valid(hidden)
    valid(shown)


def first_round_narrowed(ctx: RunContext[Any], definition: ToolDefinition) -> ToolDefinition:
    if ctx.round > 1:
        return definition
    schema = json.loads(json.dumps(definition.input_schema))
    schema["properties"]["unit"]["enum"] = ["c"]
    return replace(definition, description="Celsius only, this turn.", input_schema=schema)


@tool(prepare=first_round_narrowed)
async def weather(city: str, unit: str = "c") -> str:
    """Current weather."""
    ran.append(f"weather:{city}:{unit}")
    return f"20 {unit} in {city}"


async def test_prepare_changes_the_definition_for_one_turn(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("weather", {"city": "Paris"})), reply("20 degrees.")]
    agent, server = http_agent(script, tools=[weather], cache="off")
    result = await agent.run("weather?")
    first, second = (announced(r)["weather"] for r in server.requests)
    assert first["description"] == "Celsius only, this turn."
    assert first["input_schema"]["properties"]["unit"]["enum"] == ["c"]
    assert second == weather.definition.to_wire()  # the tool's own, the next turn
    assert "enum" not in second["input_schema"]["properties"]["unit"]
    assert ran == ["weather:Paris:c"] and result.text == "20 degrees."
    valid(result)


seen_by_prepare: list[tuple[int, bool]] = []


async def from_round_two_for_admins(
    ctx: RunContext[Deps], definition: ToolDefinition
) -> ToolDefinition | None:
    seen_by_prepare.append((ctx.round, ctx.deps.admin))
    return definition if ctx.round >= 2 and ctx.deps.admin else None


@tool(prepare=from_round_two_for_admins)
def audit(entry: str) -> str:
    """Write an audit entry."""
    ran.append(f"audit:{entry}")
    return "written"


async def test_an_async_prepare_sees_the_turn_s_round_and_the_run_s_deps(http_agent: Any) -> None:
    ran.clear()
    seen_by_prepare.clear()
    script = [reply(tool_call("lookup", {"key": "k"}))]
    script += [reply(tool_call("audit", {"entry": "k read"})), reply("Done.")]
    agent, server = http_agent(script, tools=[lookup, audit])
    result = await agent.run("go", deps=Deps(admin=True))
    assert [list(announced(r)) for r in server.requests] == [
        ["lookup"],
        ["lookup", "audit"],
        ["lookup", "audit"],
    ]
    assert seen_by_prepare == [(1, True), (2, True), (3, True)]
    assert ran == ["lookup:k", "audit:k read"] and result.text == "Done."
    valid(result)


class SeesTools(Capability):
    """Records what `prepare_tools` is given, and marks each description."""

    def __init__(self) -> None:
        self.given: list[list[tuple[str, str]]] = []

    async def prepare_tools(
        self, ctx: RunContext[Any], tools: list[AnnouncedTool]
    ) -> list[AnnouncedTool]:
        definitions = [t for t in tools if isinstance(t, ToolDefinition)]
        self.given.append([(t.name, t.description) for t in definitions])
        return [replace(t, description=t.description + " [seen]") for t in definitions]


async def test_a_tool_s_prepare_comes_before_the_capabilities(http_agent: Any) -> None:
    sees = SeesTools()
    agent, server = http_agent(
        [reply("Nothing to do.")], tools=[lookup, wipe, weather], capabilities=[sees]
    )
    await agent.run("hi", deps=Deps(admin=False))
    assert sees.given == [[("lookup", "Look a key up."), ("weather", "Celsius only, this turn.")]]
    assert announced(server.requests[0])["weather"]["description"] == (
        "Celsius only, this turn. [seen]"
    )


@tool(max_uses=2)
def search(query: str) -> str:
    """Search the web (costly)."""
    ran.append(f"search:{query}")
    return f"results for {query}"


USED_UP = (
    "Not run: the tool 'search' may be called 2 times per run, and this run has used it "
    "up; it is no longer available. Go on without it."
)


async def test_max_uses_runs_n_calls_then_answers_is_error_and_hides_the_tool(
    http_agent: Any,
) -> None:
    ran.clear()
    script = [
        reply(tool_call("search", {"query": "a"})),
        reply(tool_call("search", {"query": "b"}), tool_call("search", {"query": "c"})),
        reply(tool_call("search", {"query": "d"}), tool_call("lookup", {"key": "k"})),
        reply("Done."),
    ]
    agent, server = http_agent(script, tools=[lookup, search])
    result = await agent.run("research")
    assert ran == ["search:a", "search:b", "lookup:k"]
    assert outputs(result) == [
        ("search", False, "results for a"),
        ("search", False, "results for b"),
        ("search", True, USED_UP),
        ("search", True, USED_UP),  # a call of the hidden tool says why it is gone
        ("lookup", False, "value of k"),
    ]
    assert [c.ran for c in result.tool_calls] == [True, True, False, False, True]
    assert [list(announced(r)) for r in server.requests] == [
        ["lookup", "search"],
        ["lookup", "search"],
        ["lookup"],
        ["lookup"],
    ]
    valid(result)


async def test_calls_of_one_turn_beyond_the_cap_the_first_run_in_order(http_agent: Any) -> None:
    """Streamed, calls start as their blocks close: the third must not start."""
    ran.clear()
    calls = [tool_call("search", {"query": q}) for q in "xyz"]
    agent, _ = http_agent([reply(*calls), reply("Done.")], tools=[search])
    async with agent.run_stream("research") as run:
        async for _ in run:
            pass
    # the two that ran are sync tools in worker threads: which one appends first is theirs
    assert sorted(ran) == ["search:x", "search:y"]
    assert [c.ran for c in run.result.tool_calls] == [True, True, False]
    assert outputs(run.result)[2] == ("search", True, USED_UP)
    valid(run.result)


class Refuses(Capability):
    """Answers the first call of `search` without running it."""

    def __init__(self) -> None:
        self.refused = False

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        if call.name == "search" and not self.refused:
            self.refused = True
            raise ToolError("Not now.")
        return await call_next(call)


async def test_calls_answered_without_running_use_nothing(http_agent: Any) -> None:
    ran.clear()
    once = search.replace(max_uses=1)
    script = [
        reply(tool_call("search", {"query": "refused"})),
        reply(tool_call("search", {"query": "ran"})),
        reply(tool_call("search", {"query": "over"})),
        reply("Done."),
    ]
    agent, server = http_agent(script, tools=[once], capabilities=[Refuses()])
    result = await agent.run("research")
    assert ran == ["search:ran"]
    assert [(c.is_error, c.ran) for c in result.tool_calls] == [
        (True, False),
        (False, True),
        (True, False),
    ]
    assert "may be called once per run" in result.tool_calls[2].output
    assert [list(announced(r)) for r in server.requests] == [["search"], ["search"], [], []]
    valid(result)


@tool(max_uses=1)
def lookup_once(key: str) -> str:
    """Look a key up, once."""
    ran.append(f"lookup_once:{key}")
    return f"value of {key}"


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    ran.append(f"refund:{order}")
    return f"refunded {order}"


@pytest.mark.parametrize("written_by", ["this", "version 2"])
async def test_max_uses_counts_the_calls_before_a_pause(http_agent: Any, written_by: str) -> None:
    ran.clear()
    waits = tool_call("refund", {"order": "A1"})
    script = [
        reply(tool_call("lookup_once", {"key": "A1"}), waits),
        reply(tool_call("lookup_once", {"key": "A2"})),
        reply("Refunded."),
    ]
    agent, server = http_agent(script, tools=[lookup_once, refund])
    paused = await agent.run("refund A1")
    assert paused.stop_reason == "approval_required" and ran == ["lookup_once:A1"]
    state = json.loads(json.dumps(paused.state))
    if written_by == "version 2":  # before the log said which calls ran: all did
        calls = [{k: v for k, v in c.items() if k != "ran"} for c in state["tool_calls"]]
        state = forged(state, version=2, tool_calls=calls)
    result = await agent.resume(state, decisions={waits["id"]: Approve()})
    assert ran == ["lookup_once:A1", "refund:A1"]
    assert list(announced(server.requests[1])) == ["refund"]
    assert result.tool_calls[-1].is_error and "once per run" in result.tool_calls[-1].output
    valid(result)


@tool
def translate(text: str) -> str:
    """Translate a text."""
    ran.append(f"translate:{text}")
    return text.upper()


async def test_tools_given_to_one_run_are_its_alone(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("translate", {"text": "hi"})), reply("HI."), reply("Plain.")]
    script += [reply(tool_call("translate", {"text": "yo"})), reply("YO.")]
    agent, server = http_agent(script, tools=[lookup])
    result = await agent.run("translate hi", tools=[translate])
    assert list(announced(server.requests[0])) == ["lookup", "translate"]
    assert result.text == "HI." and ran == ["translate:hi"]
    await agent.run("hello")
    assert list(announced(server.requests[2])) == ["lookup"]
    assert agent.registry.names == ["lookup"]

    def shout(text: str) -> str:
        """Shout a text (a plain function: wrapped as a tool)."""
        ran.append(f"shout:{text}")
        return text.upper()

    async with agent.run_stream("translate yo", tools=[translate, shout]) as run:
        async for _ in run:
            pass
    assert list(announced(server.requests[3])) == ["lookup", "translate", "shout"]
    assert run.result.text == "YO." and ran[-1] == "translate:yo"
    valid(run.result)


async def test_a_run_tool_may_be_dynamic_too(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("search", {"query": q})) for q in "abc"] + [reply("Done.")]
    agent, server = http_agent(script)
    result = await agent.run("research", tools=[search])
    assert ran == ["search:a", "search:b"] and result.tool_calls[2].output == USED_UP
    assert [list(announced(r)) for r in server.requests] == [["search"]] * 2 + [[]] * 2


@tool(name="lookup")
def other_lookup(key: str) -> str:
    """Another lookup."""
    return key


@pytest.mark.parametrize(
    ("tools", "options", "error", "match"),
    [
        pytest.param(
            [other_lookup],
            {},
            ConfigurationError,
            r"the run's tool 'lookup' \(test_dynamic_tools\.other_lookup\) has the name of "
            r"the agent's tool 'lookup' \(test_dynamic_tools\.lookup\)",
            id="agent-clash",
        ),
        pytest.param(
            [translate, translate.replace(description="again")],
            {},
            DuplicateToolError,
            "'translate' is registered twice",
            id="run-clash",
        ),
        pytest.param(
            [translate],
            {"external_tools": [{"name": "translate", "input_schema": {"type": "object"}}]},
            ConfigurationError,
            "external tool name",
            id="external-clash",
        ),
        pytest.param("translate", {}, ConfigurationError, "tools must be a list", id="a-str"),
        pytest.param([42], {}, ConfigurationError, "@tool needs a function", id="not-callable"),
    ],
)
async def test_run_tools_that_cannot_work_are_refused_before_any_request(
    http_agent: Any, tools: Any, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    agent, server = http_agent([reply("unused")], tools=[lookup])
    with pytest.raises(error, match=match):
        await agent.run("go", tools=tools, **options)
    assert server.requests == []


async def test_resuming_a_run_that_used_run_tools_needs_them_again(http_agent: Any) -> None:
    ran.clear()
    waits = tool_call("refund", {"order": "B2"})
    agent, _ = http_agent([reply(waits), reply("Refunded.")], tools=[lookup])
    paused = await agent.run("refund B2", tools=[refund])
    assert paused.stop_reason == "approval_required"
    with pytest.raises(ConfigurationError, match=r"resume\(\.\.\., tools=\[\.\.\.\]\)"):
        await agent.resume(paused.state, decisions={waits["id"]: Approve()})
    result = await agent.resume(paused.state, decisions={waits["id"]: Approve()}, tools=[refund])
    assert result.text == "Refunded." and ran == ["refund:B2"]
    valid(result)


def named_otherwise(ctx: RunContext[Any], definition: ToolDefinition) -> ToolDefinition:
    return replace(definition, name="renamed")


def wire_dict(ctx: RunContext[Any], definition: ToolDefinition) -> Any:
    return definition.to_wire()


@pytest.mark.parametrize(
    ("prepare", "match"),
    [
        pytest.param(named_otherwise, "named 'renamed'; a tool keeps its name", id="renamed"),
        pytest.param(wire_dict, "prepare returned dict, not a ToolDefinition", id="dict"),
    ],
)
async def test_a_prepare_that_returns_what_cannot_work_ends_the_run(
    http_agent: Any, prepare: Any, match: str
) -> None:
    agent, server = http_agent([reply("unused")], tools=[lookup.replace(prepare=prepare)])
    with pytest.raises(ConfigurationError, match=match) as raised:
        await agent.run("go")
    assert server.requests == []
    assert raised.value.result is not None and raised.value.result.stop_reason == "error"
    valid(raised.value.result)


class Broken(Exception):
    """What a faulty `prepare` raises."""


def fails_from_round_two(ctx: RunContext[Any], definition: ToolDefinition) -> ToolDefinition:
    if ctx.round > 1:
        raise Broken("prepare failed")
    return definition


async def test_an_exception_raised_by_prepare_ends_the_run_as_itself(http_agent: Any) -> None:
    ran.clear()
    flaky = lookup.replace(prepare=fails_from_round_two)
    agent, server = http_agent([reply(tool_call("lookup", {"key": "k"})), reply("unused")])
    run = agent.start("go", tools=[flaky])
    with pytest.raises(Broken, match="prepare failed"):
        async with run:
            pass
    assert len(server.requests) == 1 and ran == ["lookup:k"]
    assert run.result.stop_reason == "error"
    assert outputs(run.result) == [("lookup", False, "value of k")]
    valid(run.result)


def one_argument(definition: ToolDefinition) -> ToolDefinition:
    return definition


@pytest.mark.parametrize(
    ("options", "match"),
    [
        pytest.param({"prepare": "hide"}, "prepare must be a function", id="prepare-str"),
        pytest.param({"prepare": one_argument}, "prepare must be a function", id="one-arg"),
        pytest.param({"max_uses": 0}, "max_uses must be a whole number from 1", id="zero"),
        pytest.param({"max_uses": -2}, "max_uses must be a whole number", id="negative"),
        pytest.param({"max_uses": 1.5}, "max_uses must be a whole number", id="float"),
        pytest.param({"max_uses": True}, "max_uses must be a whole number", id="bool"),
        pytest.param({"max_uses": "2"}, "max_uses must be a whole number", id="str"),
    ],
)
def test_prepare_and_max_uses_are_checked_when_the_tool_is_made(
    options: dict[str, Any], match: str
) -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match=match):
        tool(**options)(f)
    with pytest.raises(ConfigurationError, match=match):
        Tool(f, **options)
    with pytest.raises(ConfigurationError, match=match):
        Tool(f).replace(**options)


def test_the_options_are_kept_by_replace() -> None:
    made = Tool(lookup.function, prepare=admins_only, max_uses=3)
    assert (made.prepare, made.max_uses) == (admins_only, 3)
    copy = made.replace(name="look")
    assert (copy.prepare, copy.max_uses, copy.name) == (admins_only, 3, "look")
    assert Agent(tools=[copy]).registry.get("look") is copy
