"""The tools and agent configuration the approval tests share with their subprocesses.

A resumed run needs an `Agent` configured as the one that paused it; a subprocess
imports this module to build that agent again, as a service's other replica would.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentloop import Agent, AnthropicProvider, RunContext, tool

ran: list[tuple[str, dict[str, Any]]] = []
"""The calls the tools of this process ran: (tool name, arguments)."""


def over_limit(ctx: RunContext, input: dict[str, Any]) -> bool | str:
    """Refunds above 100 need a person's approval."""
    amount = input.get("amount", 0)
    return f"amount {amount} is over the limit of 100" if amount > 100 else False


@tool(requires_approval=over_limit)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    ran.append(("refund", {"order": order, "amount": amount}))
    return f"refunded {amount} on {order}"


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    ran.append(("lookup", {"order": order}))
    return f"order {order}: shipped"


def delete_user(user: str) -> str:
    """Delete a user (a plugin's tool: the plugin cannot know the service's policy)."""
    ran.append(("delete_user", {"user": user}))
    return f"deleted {user}"


CLIENT_TOOL = {
    "name": "client_search",
    "description": "Search the client's files.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def make_agent(client: Any, *, stream: bool = False, asks: bool = True, **options: Any) -> Agent:
    """The agent every approval test (and subprocess) uses, over `client`.

    `asks=False`: the same tools with no call waiting for approval, for comparison.
    """
    options.setdefault("approval_required", {"delete_user"} if asks else None)
    # The tests compare what is sent with the history: no cache breakpoints on the wire.
    options.setdefault("cache", "off")
    return Agent(
        provider=AnthropicProvider(client, stream=stream),
        tools=[refund if asks else refund.replace(requires_approval=False), lookup, delete_user],
        **options,
    )


SUB_AGENTS = ("researcher", "clerk")
"""The tool names of `make_team`'s sub-agents, outermost first."""


def make_team(*clients: Any, stream: bool = False, asks: bool = True, **options: Any) -> Agent:
    """Agents calling each other as tools (`Agent.as_tool`), one per client, outermost first.

    The last is `make_agent`'s (its tools may wait for approval), given `external_tools`
    when `options` has them; each other one has `lookup` and the next as tools, named
    `SUB_AGENTS` in order. Returns the first: the parent. Other `options` go to every agent.
    """
    *callers, last = clients
    external = options.pop("external_tools", ())
    options.setdefault("cache", "off")
    agent = make_agent(last, stream=stream, asks=asks, name=SUB_AGENTS[len(callers) - 1], **options)
    tool = agent.as_tool(external_tools=external)
    for depth in reversed(range(len(callers))):
        agent = Agent(
            provider=AnthropicProvider(callers[depth], stream=stream),
            tools=[tool, lookup],
            name=SUB_AGENTS[depth - 1] if depth else "parent",
            **options,
        )
        tool = agent.as_tool()
    return agent


def forged(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`state` changed and its checksum recomputed, as only a deliberate forger would."""
    body = {k: v for k, v in {**state, **changes}.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "checksum": "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()}
