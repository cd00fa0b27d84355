"""A tool's own deps: a plugin's tools get the plugin's deps, the application's the run's.

`deps=` and `deps_factory=` (on `Tool`, `@tool`, `Tool.replace` and a plugin's `register`)
replace the run's `deps` in the call's `RunContext`; a factory runs inside the call, so
its failure is the call's `is_error` result. The runs go through the SDK to
`MessagesServer`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from agentloop import (
    Agent,
    ConfigurationError,
    PluginManager,
    RunContext,
    Tool,
    ToolError,
    hookimpl,
)
from agentloop.testing import MessagesServer, reply, tool_call


@dataclass(frozen=True)
class Shop:
    """The application's deps."""

    owner: str


@dataclass(frozen=True)
class Orders:
    """A plugin's deps."""

    status: dict[str, str]


def whose_shop(ctx: RunContext[Shop]) -> str:
    """The application's tool: reads the run's deps."""
    return ctx.deps.owner


def lookup_order(order_id: str, ctx: RunContext[Orders]) -> str:
    """The plugin's tool: reads the plugin's deps."""
    return ctx.deps.status[order_id]


async def lookup_order_async(order_id: str, ctx: RunContext[Orders]) -> str:
    """The plugin's tool, async."""
    return ctx.deps.status[order_id]


made_in: list[str] = []


def make_orders() -> Orders:
    made_in.append(threading.current_thread().name)
    return Orders({"A1": "shipped"})


class AcmePlugin:
    """Registers its tools with its own deps, one as an object and one from a factory."""

    @hookimpl
    def agentloop_register_tools(self, register: Any) -> None:
        register(lookup_order, deps=Orders({"A1": "shipped"}))
        register(lookup_order_async, deps_factory=make_orders)


def acme_tools() -> list[Tool]:
    manager = PluginManager()
    manager.register(AcmePlugin(), name="acme")
    return manager.select(plugins=["acme"])


async def run_calls(tools: list[Any], *calls: Any, deps: Any) -> list[tuple[bool, str]]:
    async with MessagesServer([reply(*calls), reply("done")]) as server:
        result = await Agent(client=server.client(), tools=tools).run("go", deps=deps)
    return [(c.is_error, c.output) for c in result.tool_calls]


async def test_plugin_tools_get_the_plugins_deps_and_the_applications_tools_the_runs() -> None:
    made_in.clear()
    calls = [
        tool_call("whose_shop", {}),
        tool_call("lookup_order", {"order_id": "A1"}),
        tool_call("lookup_order_async", {"order_id": "A1"}),
        tool_call("lookup_order_async", {"order_id": "A1"}),
    ]
    outcome = await run_calls([whose_shop, *acme_tools()], *calls, deps=Shop("Ada"))
    assert outcome == [(False, "Ada"), (False, "shipped"), (False, "shipped"), (False, "shipped")]
    assert len(made_in) == 2  # the factory is called at each call


async def test_a_sync_tools_factory_runs_in_its_worker_thread() -> None:
    made_in.clear()
    tool = Tool(lookup_order, deps_factory=make_orders)
    outcome = await run_calls([tool], tool_call("lookup_order", {"order_id": "A1"}), deps=None)
    assert outcome == [(False, "shipped")]
    assert len(made_in) == 1 and made_in[0] != threading.main_thread().name


def failing_factory() -> Orders:
    raise RuntimeError("the order book is gone")


def refusing_factory() -> Orders:
    raise ToolError("the order book is closed on Sundays")


@pytest.mark.parametrize(
    ("factory", "output"),
    [
        pytest.param(
            failing_factory,
            "Tool 'lookup_order' failed: RuntimeError: the order book is gone",
            id="exception",
        ),
        pytest.param(refusing_factory, "the order book is closed on Sundays", id="tool-error"),
    ],
)
@pytest.mark.parametrize("function", [lookup_order, lookup_order_async], ids=["sync", "async"])
async def test_a_failing_factory_is_the_calls_error_and_the_run_goes_on(
    factory: Any, output: str, function: Any
) -> None:
    tool = Tool(function, name="lookup_order", deps_factory=factory)
    call = tool_call("lookup_order", {"order_id": "A1"})
    assert await run_calls([tool], call, deps=None) == [(True, output)]


async def test_replace_gives_a_plugins_tools_other_deps() -> None:
    (plain, from_factory) = acme_tools()
    mine = Orders({"A1": "lost"})
    tools = [plain.replace(deps=mine), from_factory.replace(deps=mine)]
    assert (tools[1].deps, tools[1].deps_factory) == (mine, None)
    calls = [
        tool_call("lookup_order", {"order_id": "A1"}),
        tool_call("lookup_order_async", {"order_id": "A1"}),
    ]
    assert await run_calls(tools, *calls, deps=None) == [(False, "lost"), (False, "lost")]
    assert plain.replace(timeout=3).deps == Orders({"A1": "shipped"})  # other options keep it


def test_deps_and_a_factory_together_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"give deps .* or deps_factory .*not both"):
        Tool(lookup_order, deps=Orders({}), deps_factory=make_orders)
    with pytest.raises(ConfigurationError, match="deps_factory must be a function"):
        Tool(lookup_order, deps_factory=Orders({}))  # type: ignore[arg-type]
