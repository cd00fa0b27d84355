"""Random model behaviour never produces a history the API would refuse."""

from __future__ import annotations

import itertools
import json
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import Agent, ToolError, lint_history, tool
from agentloop.messages import parse_history
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.testing import ScriptedProvider, reply


@tool
def ok(n: int) -> str:
    """Returns its input."""
    return str(n)


@tool
async def slow() -> str:
    """Outlives the timeout."""
    await anyio.sleep(1)
    return "late"


@tool
def fails(reason: str = "x") -> str:
    """Raises."""
    raise ToolError(reason)


@tool
def crashes() -> str:
    """Raises something unexpected."""
    raise KeyError("k")


BLOCKS = st.sampled_from(
    ["text", "ok", "bad_input", "unknown", "slow", "fails", "crashes", "server", "thinking"]
)
STOPS = st.sampled_from(
    [
        "tool_use",
        "tool_use",
        "end_turn",
        "max_tokens",
        "pause_turn",
        "refusal",
        "stop_sequence",
        "model_context_window_exceeded",
        "new_reason",
    ]
)
TURNS = st.lists(st.tuples(st.lists(BLOCKS, max_size=6), STOPS), min_size=1, max_size=6)


def build(turns: list[tuple[list[str], str]]) -> Any:
    ids = itertools.count()
    served = iter(turns)

    def block(kind: str) -> list[dict[str, Any]]:
        n = next(ids)
        call = {"type": "tool_use", "id": f"toolu_{n:04d}", "input": {}}
        if kind == "text":
            return [{"type": "text", "text": f"text {n}"}]
        if kind == "thinking":
            return [{"type": "thinking", "thinking": f"thought {n}", "signature": f"sig{n}"}]
        if kind == "server":
            use = {
                "type": "server_tool_use",
                "id": f"srvtoolu_{n:04d}",
                "name": "web_search",
                "input": {"query": "q"},
            }
            return [
                use,
                {"type": "web_search_tool_result", "tool_use_id": use["id"], "content": []},
            ]
        name = {
            "ok": "ok",
            "bad_input": "ok",
            "unknown": "missing_tool",
            "slow": "slow",
            "fails": "fails",
            "crashes": "crashes",
        }[kind]
        call["name"] = name
        if kind == "ok":
            call["input"] = {"n": n}
        elif kind == "bad_input":
            call["input"] = {"n": "not a number", "extra": True}
        return [call]

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        try:
            kinds, stop = next(served)
        except StopIteration:
            return reply("final answer")
        content = [b for kind in kinds for b in block(kind)]
        return reply(*content, stop_reason=stop)

    return respond


class WireChecked(ScriptedProvider):
    """A scripted provider that checks the bytes of each request against its messages.

    For every message a run sends, the JSON on the wire must equal a fresh serialisation
    of its content, whatever caching the messages do.
    """

    async def complete(self, request: ModelRequest) -> ModelResponse:
        sent = json.loads(request.to_json())
        fresh = [m.model_dump(mode="json", exclude_unset=True) for m in request.messages]
        assert sent["messages"] == fresh
        return await super().complete(request)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=TURNS,
    max_rounds=st.integers(min_value=1, max_value=8),
    concurrency=st.integers(min_value=1, max_value=4),
)
def test_random_model_behaviour_keeps_every_request_valid(
    turns: list[tuple[list[str], str]], max_rounds: int, concurrency: int
) -> None:
    provider = WireChecked(build(turns))  # lints every request it receives
    agent = Agent(
        provider=provider,
        tools=[ok, slow, fails, crashes],
        max_rounds=max_rounds,
        tool_concurrency=concurrency,
        tool_timeout=0.02,
    )
    result = anyio.run(agent.run, "start")
    lint_history(parse_history(result.messages))
    uses = [
        b["id"]
        for m in result.messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert [c.tool_use_id for c in result.tool_calls] == uses
    assert result.rounds == len(provider.requests) <= max_rounds
    assert result.usage.requests == result.rounds
