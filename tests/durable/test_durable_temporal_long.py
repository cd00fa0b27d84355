"""A long run on Temporal: hundreds of rounds of 4 kB results, as a plain run ends them.

A workflow run records its conversation once (each model activity gets what is new), so
its history grows with the rounds; the run may continue as new workflow runs
(`max_history_bytes`) and must still end with the plain run's messages, usage and log,
its result holding the conversation once (400 rounds: 1.7 MB, under the 2 MB limit).

Marked slow and small by default (`AGENTLOOP_TEMPORAL_ROUNDS`, 60 rounds);
`AGENTLOOP_TEMPORAL_ROUNDS=400` plays the long case. History bytes per round are
reported by `python -m benchmarks.temporal_history`.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="temporalio is not installed")

from temporalio.client import Client

from agentloop import Agent, tool
from agentloop.durable.temporal import TemporalAgent
from agentloop.testing import ScriptedProvider, reply, tool_call

pytestmark = [pytest.mark.durable, pytest.mark.slow, pytest.mark.timeout(1200)]

ROUNDS = int(os.environ.get("AGENTLOOP_TEMPORAL_ROUNDS", "60"))


def script(rounds: int) -> Any:
    """A call of `read` per round, then an answer: a function of the request."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        round_ = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
        if round_ > rounds:
            return reply("Read them all.", usage={"input_tokens": 9, "output_tokens": 4})
        call = tool_call("read", {"number": round_}, id=f"toolu_read_{round_}")
        return reply(call, usage={"input_tokens": 3 * round_, "output_tokens": 2})

    return answer


@tool
async def read(number: int) -> str:
    """A 4 kB page."""
    return f"{number:05d} " + "x" * 4090


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(script(ROUNDS)), tools=[read], max_rounds=ROUNDS + 1)


async def test_a_run_of_many_rounds_of_4_kb_results_ends_as_a_plain_run(
    temporal_address: str,
) -> None:
    plain = await agent().run("Read every page.")
    client = await Client.connect(temporal_address)
    durable = TemporalAgent(agent(), name="pages")
    queue, run_id = f"q-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Read every page.", run_id=run_id, task_queue=queue)
    assert result.rounds == plain.rounds == ROUNDS + 1
    assert result.messages == plain.messages
    assert (result.stop_reason, result.usage, result.text) == (
        plain.stop_reason,
        plain.usage,
        plain.text,
    )
    assert [(c.tool_use_id, c.output) for c in result.tool_calls] == [
        (c.tool_use_id, c.output) for c in plain.tool_calls
    ]


async def test_a_continued_run_carries_its_tool_log_once_not_beside_its_messages() -> None:
    import json

    from agentloop.durable.temporal.carry import carried_calls, restored_calls

    result = await Agent(provider=ScriptedProvider(script(30)), tools=[read], max_rounds=31).run(
        "Read every page."
    )
    carried = carried_calls(result.messages, result.tool_calls)
    # The 4 kB outputs are in the messages once; the log does not carry them again.
    assert len(json.dumps(carried)) < 0.1 * len(json.dumps(result.messages))
    assert restored_calls(result.messages, json.loads(json.dumps(carried))) == result.tool_calls
