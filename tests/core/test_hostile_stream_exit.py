"""Leaving `run_stream` at random moments while eager tool calls run: `stream.result` is
always there, every call is answered, and the history is always valid to send again."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentloop import Agent, lint_history, tool
from agentloop.messages import parse_history
from agentloop.testing import SteppedProvider, reply, tool_call

# Moments tried per backend: a modest number by default, many more in the long profile
# of the property tests (`AGENTLOOP_HYPOTHESIS_PROFILE=long`, see docs/testing.md).
TRIALS = 1000 if os.environ.get("AGENTLOOP_HYPOTHESIS_PROFILE") == "long" else 100


@tool
async def work(steps: int) -> str:
    """Do some steps of work, each a checkpoint."""
    for _ in range(steps):
        await anyio.lowlevel.checkpoint()
    return f"did {steps}"


@tool
def blocking(micros: int) -> str:
    """Block a worker thread for a moment."""
    time.sleep(micros / 1e6)
    return f"blocked {micros}"


def script(rng: random.Random) -> list[Any]:
    turns = []
    for _ in range(rng.randint(1, 3)):
        calls = [
            tool_call("work", {"steps": rng.randint(0, 6)})
            if rng.random() < 0.5
            else tool_call("blocking", {"micros": rng.randint(0, 300)})
            for _ in range(rng.randint(1, 5))
        ]
        turns.append(reply("Working.", *calls))
    turns.append(reply("Done."))
    return turns


async def one_trial(rng: random.Random) -> None:
    agent = Agent(provider=SteppedProvider(script(rng)), tools=[work, blocking], tool_concurrency=3)
    leave_at = rng.randint(0, 40)
    how = rng.choice(["break", "cancel", "cancel_after_turn"])
    seen = 0
    async with agent.run_stream("go") as stream:
        async for _ in stream:
            seen += 1
            if seen >= leave_at:
                if how == "cancel":
                    stream.cancel()
                elif how == "cancel_after_turn":
                    stream.cancel(after_turn=True)
                else:
                    break
            # let tool tasks run between events, at random
            for _ in range(rng.randint(0, 3)):
                await anyio.lowlevel.checkpoint()
    result = stream.result
    assert result is not None, (leave_at, how)
    lint_history(parse_history(result.messages))
    answered = {
        b["tool_use_id"]
        for m in result.messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    }
    assert answered == {c.tool_use_id for c in result.tool_calls}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_leaving_a_stream_at_any_moment_keeps_the_partial_result(backend: str) -> None:
    rng = random.Random(f"stream-exit-{backend}")

    async def main() -> None:
        with anyio.fail_after(50):
            for _ in range(TRIALS):
                await one_trial(rng)

    anyio.run(main, backend=backend)


class CancelsOnlyTheCalls:
    """A streaming provider that lets the stream be cancelled while its own answer completes.

    It starts two eager calls, has the run cancelled, waits (shielded) until the calls
    have been cancelled, and then returns the whole response without a checkpoint: the
    moment at which a run used to lose its result.
    """

    def __init__(self) -> None:
        self.handle: Any = None
        self.cancelled = 0
        self.both_cancelled = anyio.Event()

    async def complete(self, request: Any) -> Any:
        raise AssertionError("streamed only")

    async def stream(self, request: Any, on_event: Any) -> Any:
        from agentloop.messages import ToolUseBlock
        from agentloop.providers.base import BlockStop, ModelResponse

        blocks = [ToolUseBlock(id=f"toolu_{i}", name="hang", input={}) for i in range(2)]
        for index, block in enumerate(blocks):
            await on_event(BlockStop(index, block))
        self.handle.cancel()
        with anyio.CancelScope(shield=True):
            await self.both_cancelled.wait()
        return ModelResponse(content=list(blocks), stop_reason="tool_use")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_calls_cancelled_while_the_response_completes_are_answered(backend: str) -> None:
    provider = CancelsOnlyTheCalls()

    @tool
    async def hang() -> str:
        """Wait until cancelled."""
        try:
            await anyio.sleep_forever()
        finally:
            provider.cancelled += 1
            if provider.cancelled == 2:
                provider.both_cancelled.set()
        return "never"

    async def main() -> Any:
        agent = Agent(provider=provider, tools=[hang])
        async with agent.run_stream("go") as stream:
            provider.handle = stream
            async for _ in stream:
                pass
        return stream.result

    result = anyio.run(main, backend=backend)
    assert result is not None and result.stop_reason == "cancelled"
    lint_history(parse_history(result.messages))
    assert [c.is_error for c in result.tool_calls] == [True, True]
