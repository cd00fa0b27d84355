"""A durable agent for tests/durable/test_durable_temporal.py's worker processes.

`python -m agentloop.durable.temporal worker _temporal_app:durable_agent ...` runs
it. The environment says where the model is (`AGENTLOOP_TEST_MODEL_URL`), where the
ledger of effects is (`AGENTLOOP_TEST_LEDGER`), whether `record` honours the idempotency
key (`AGENTLOOP_TEST_HONOUR_KEY=1`) and whether this worker stops dead right after an
effect (`AGENTLOOP_TEST_HANG_AFTER_EFFECT=1`: it prints `EFFECT DONE` and hangs, for the
test to kill it there).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import anyio

from agentloop import Agent, RunContext, tool
from agentloop.durable.temporal import TemporalAgent
from agentloop.testing import Paced, reply, tool_call

NAME = "ledger"


def ledger_script(body: dict[str, Any]) -> dict[str, Any]:
    """Round 1 records two items in parallel, round 2 ends (a function of the request)."""
    answered = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if answered == 0:
        return reply(
            "Recording.",
            tool_call("record", {"item": "a"}, id="toolu_rec_a"),
            tool_call("record", {"item": "b"}, id="toolu_rec_b"),
        )
    return reply("Recorded.")


def paced_ledger_script(body: dict[str, Any]) -> Paced:
    """`ledger_script`'s answer, streamed with pauses: a model still writing for a while."""
    return Paced(ledger_script(body), block_delay=0.5)


def read_ledger(path: Path) -> list[dict[str, str]]:
    """The effects written so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@tool
async def record(ctx: RunContext, item: str) -> str:
    """Write an item to the ledger (once per idempotency key, when the key is honoured)."""
    path = Path(os.environ["AGENTLOOP_TEST_LEDGER"])
    key = ctx.idempotency_key
    honour = os.environ.get("AGENTLOOP_TEST_HONOUR_KEY") == "1"
    if not (honour and any(e["key"] == key for e in read_ledger(path))):
        async with await anyio.open_file(path, "a") as ledger:
            await ledger.write(json.dumps({"key": key, "item": item}) + "\n")
    if item == "b" and os.environ.get("AGENTLOOP_TEST_HANG_AFTER_EFFECT") == "1":
        print("EFFECT DONE", flush=True)
        await anyio.sleep_forever()
    return f"recorded {item}"


def make_durable_agent() -> TemporalAgent:
    """The durable agent, its model at `AGENTLOOP_TEST_MODEL_URL`."""
    client = anthropic.AsyncAnthropic(
        base_url=os.environ.get("AGENTLOOP_TEST_MODEL_URL", "http://127.0.0.1:9"),
        api_key="sk-ant-local-test",
    )
    agent = Agent(client=client, tools=[record])
    return TemporalAgent(agent, name=NAME, heartbeat_timeout=timedelta(seconds=1.5))


durable_agent = make_durable_agent()
