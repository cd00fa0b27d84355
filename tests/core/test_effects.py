"""`agentloop.effects`: a run's model requests and tool calls go through one seam.

What a durable engine does, done here in memory: the first run records each effect's
outcome as JSON; a replay gets every outcome from the record, performing nothing, and
ends with the same history, usage and tool log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agentloop import Agent, RunContext, tool
from agentloop.effects import OnEvent, Send
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.testing import ScriptedProvider, reply, tool_call
from agentloop.tools import ToolCall, ToolResult

performed: list[str] = []


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    performed.append(key)
    return f"value of {key}"


@tool
def broken(key: str) -> str:
    """Always fails."""
    performed.append(f"broken:{key}")
    raise ValueError(f"no {key}")


class Recorder:
    """Records each outcome by its place in the run; a replay reads them back."""

    def __init__(self, record: dict[str, Any] | None = None) -> None:
        self.replaying = record is not None
        self.record: dict[str, Any] = {} if record is None else record
        self.order: list[str] = []

    async def model(
        self, request: ModelRequest, round_: int, send: Send, stream: OnEvent | None
    ) -> ModelResponse:
        key = f"model:{round_}"
        self.order.append(key)
        if not self.replaying:
            self.record[key] = (await send(stream)).to_json()
        return ModelResponse.from_json(self.record[key])

    async def tool(
        self, call: ToolCall, round_: int, run: Callable[[], Awaitable[ToolResult]]
    ) -> ToolResult:
        key = f"tool:{round_}:{call.id}"
        self.order.append(key)  # before any await: calls arrive in tool_use order
        if not self.replaying:
            self.record[key] = (await run()).to_json()
        return ToolResult.from_json(self.record[key])


async def _run_with(agent: Agent, effects: Recorder, run_id: str) -> Any:
    async with agent.start("go", stream=False, effects=effects, run_id=run_id) as run:
        pass
    return run.result


async def test_a_replay_from_recorded_effects_performs_nothing_and_ends_the_same() -> None:
    a, b, c = (tool_call("lookup", {"key": k}) for k in "abc")
    bad = tool_call("broken", {"key": "d"})
    script = [reply("Looking.", a, b, bad), reply("Once more.", c), reply("Done.")]
    performed.clear()
    first = Recorder()
    agent = Agent(provider=ScriptedProvider(script), tools=[lookup, broken])
    result = await _run_with(agent, first, "run-1")
    assert sorted(performed) == ["a", "b", "broken:d", "c"]
    assert first.order == [
        "model:1",
        f"tool:1:{a['id']}",
        f"tool:1:{b['id']}",
        f"tool:1:{bad['id']}",
        "model:2",
        f"tool:2:{c['id']}",
        "model:3",
    ]
    assert result.run_id == "run-1" and result.stop_reason == "end_turn"

    performed.clear()
    replay = Recorder(first.record)
    # A provider with nothing left to say: a request reaching it would fail the run.
    again = Agent(provider=ScriptedProvider([]), tools=[lookup, broken])
    replayed = await _run_with(again, replay, "run-1")
    assert performed == []
    assert replay.order == first.order
    assert replayed.messages == result.messages
    assert replayed.usage == result.usage and replayed.rounds == result.rounds == 3
    assert [(r.tool_use_id, r.is_error, r.output) for r in replayed.tool_calls] == [
        (r.tool_use_id, r.is_error, r.output) for r in result.tool_calls
    ]
    assert [r.is_error for r in result.tool_calls] == [False, False, True, False]


async def test_the_run_id_an_engine_gives_is_the_idempotency_key_s_prefix() -> None:
    keys: list[str] = []

    @tool
    async def remember(ctx: RunContext, fact: str) -> str:
        """Remember a fact."""
        keys.append(ctx.idempotency_key)
        return "ok"

    call = tool_call("remember", {"fact": "x"})
    agent = Agent(
        provider=ScriptedProvider([reply("Noting.", call), reply("ok")]), tools=[remember]
    )
    await _run_with(agent, Recorder(), "wf-42")
    assert keys == [f"wf-42:{call['id']}"]
