"""`ModelRequest.to_dict/from_dict`: a request travels to another process as JSON values.

A durable engine's worker rebuilds each request from what the workflow recorded; the
rebuilt request must be equal to the original and put the same body on the wire.
"""

from __future__ import annotations

import json

import pytest

from agentloop import Agent, ConfigurationError, tool
from agentloop.messages import Message, TextBlock, ThinkingBlock
from agentloop.providers.base import ModelRequest
from agentloop.providers.caching import cache_marker
from agentloop.request import build_request
from agentloop.runstate import new_state
from agentloop.testing import ScriptedProvider
from agentloop.tools import ToolDefinition


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


def full_request() -> ModelRequest:
    return ModelRequest(
        model="claude-sonnet-5-5",
        messages=[
            Message.user("hi"),
            Message.of_blocks(
                "assistant",
                [
                    ThinkingBlock(thinking="signed", signature="sig"),
                    ThinkingBlock(thinking="unsigned, from another vendor"),
                    TextBlock(text="hello"),
                ],
            ),
            Message.user([TextBlock(text="more")]),
        ],
        max_tokens=1024,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[
            lookup.definition,
            ToolDefinition("other", "Another.", {"type": "object"}, {"strict": True}),
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
        metadata={"user_id": "u1"},
        stop_sequences=["END"],
        container="container_1",
        params={"temperature": 0.2, "extra_headers": {"x-test": "1"}},
        output_format={"name": "out", "schema": {"type": "object", "properties": {}}},
        cache=cache_marker("1h"),
    )


def test_a_request_round_trips_through_json_values() -> None:
    request = full_request()
    data = json.loads(json.dumps(request.to_dict()))
    again = ModelRequest.from_dict(data)
    assert again == request
    assert again.to_wire() == request.to_wire()
    assert again.to_json() == request.to_json()
    assert isinstance(again.tools[0], ToolDefinition) and isinstance(again.tools[2], dict)
    assert again.cache == request.cache is not None


def test_an_agent_s_request_round_trips() -> None:
    agent = Agent(provider=ScriptedProvider([]), tools=[lookup], system="Be brief.")
    config = agent.config
    state = new_state(config, agent.registry, (), history=None, prompt="hi", deps=None)
    tools = [*state.registry.definitions(), *state.external]
    messages = state.history.messages
    request = build_request(config, state, messages, tools, config.request_params)
    assert ModelRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({}, id="empty"),
        pytest.param({**full_request().to_dict(), "messages": [{"role": 3}]}, id="bad-history"),
    ],
)
def test_what_to_dict_did_not_write_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="not a recorded request"):
        ModelRequest.from_dict(data)
