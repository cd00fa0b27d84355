"""The application the durable-run tests run, in their own process and in child processes.

A scripted model answering as a pure function of the request (so a process that
recovers a run gets the same answers), and a tool whose effect (a line in a ledger file)
happens once per `RunContext.idempotency_key`. Run as a script, it is one process of a
durable app: `python tests/durable/_durable_app.py DB_URL RUN_ID WORKDIR` starts (or recovers)
the run `RUN_ID` and prints what happened on stdout, one line each:

- `EFFECT <item>` when the tool has made its effect (with `DURABLE_HANG=<item>` in the
  environment, that call then hangs, waiting to be killed);
- `WAITING` when the run waits for external results (`DURABLE_WAIT=1`);
- `DELTA <text>` for each `TextDelta` of the run's events (`DURABLE_STREAM=1`: the run is
  read with `run_stream`, its model's answers paced by `paced_script`);
- `RESULT <json>` and `REQUESTS <n>` (model requests this process sent) at the end.

`DURABLE_MAX_RECOVERY=<n>` gives the durable agent `max_recovery_attempts=n`;
`DURABLE_MAX_USES=<n>` gives `record` `max_uses=n`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from agentloop import Agent, AnthropicProvider, RunContext, tool
from agentloop.events import TextDelta
from agentloop.testing import MessagesServer, Paced, reply, tool_call

EXTERNAL = {
    "name": "ask_user",
    "description": "Ask the user.",
    "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
}


def script(request: dict[str, Any]) -> dict[str, Any]:
    """Round 1: two parallel calls (and the external one when announced); round 2: done."""
    rounds = sum(1 for m in request["messages"] if m["role"] == "assistant")
    if rounds == 0:
        calls = [
            tool_call("record", {"item": "a"}, id="toolu_a"),
            tool_call("record", {"item": "b"}, id="toolu_b"),
        ]
        if any(t["name"] == "ask_user" for t in request.get("tools", [])):
            calls.append(tool_call("ask_user", {"question": "Colour?"}, id="toolu_ask"))
        return reply("Recording both.", *calls, usage={"input_tokens": 30, "output_tokens": 7})
    if not any(t["name"] == "record" for t in request.get("tools", [])):
        return reply("Recorded what I could.", usage={"input_tokens": 50, "output_tokens": 4})
    return reply("Both recorded.", usage={"input_tokens": 50, "output_tokens": 3})


def paced_script(request: dict[str, Any]) -> Paced:
    """`script`'s answer, streamed with pauses: a model still writing it for a while."""
    return Paced(script(request), block_delay=0.4)


def ledger_once(path: Path, key: str, result: str) -> str:
    """Append `(key, result)` to the ledger unless `key` is there; the recorded result."""
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        entry = json.loads(line)
        if entry["key"] == key:
            return str(entry["result"])
    with path.open("a") as ledger:
        ledger.write(json.dumps({"key": key, "result": result}) + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return result


@tool
async def record(ctx: RunContext[dict[str, str]], item: str) -> str:
    """Record an item, once per call whatever the retries."""
    result = ledger_once(Path(ctx.deps["ledger"]), ctx.idempotency_key, f"recorded {item}")
    if os.environ.get("DURABLE_HANG") == item:
        print(f"EFFECT {item}", flush=True)
        await anyio.sleep_forever()
    return result


def make_agent(server: MessagesServer, max_uses: int | None = None, **options: Any) -> Agent:
    """The app's agent, over the real SDK client talking to `server`."""
    return Agent(
        provider=AnthropicProvider(server.client()),
        tools=[record if max_uses is None else record.replace(max_uses=max_uses)],
        name="ledger",
        **options,
    )


def dbos_config(url: str) -> Any:
    """DBOS's configuration for the tests' app on the system database `url`."""
    return {
        "name": "agentloop-tests",
        "system_database_url": url,
        "application_version": "tests",
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.01,
    }


async def _main(url: str, run_id: str, workdir: str, launch: Callable[[], None]) -> None:
    from agentloop.durable.dbos import DurableAgent
    from agentloop.durable.records import result_to_json

    streams = os.environ.get("DURABLE_STREAM") == "1"
    async with MessagesServer(paced_script if streams else script) as server:
        recoveries = int(os.environ.get("DURABLE_MAX_RECOVERY", "100"))
        max_uses = os.environ.get("DURABLE_MAX_USES")
        agent = make_agent(server, None if max_uses is None else int(max_uses))
        durable = DurableAgent(agent, max_recovery_attempts=recoveries)
        launch()  # recovers a run an earlier process left unfinished
        wait = os.environ.get("DURABLE_WAIT") == "1"
        arguments: dict[str, Any] = {
            "run_id": run_id,
            "deps": {"ledger": str(Path(workdir) / "ledger.jsonl")},
            "external_tools": [EXTERNAL] if wait else (),
            "wait_for_external": timedelta(seconds=60) if wait else None,
        }

        async def announce_wait() -> None:
            if await durable.waiting(run_id, wait_seconds=30) is not None:
                print("WAITING", flush=True)

        async with anyio.create_task_group() as group:
            if wait:
                group.start_soon(announce_wait)
            if streams:
                async with durable.run_stream("Record a and b.", **arguments) as stream:
                    async for event in stream:
                        if isinstance(event, TextDelta):
                            print(f"DELTA {event.text}", flush=True)
                assert stream.result is not None
                result = stream.result
            else:
                result = await durable.run("Record a and b.", **arguments)
        print("RESULT " + json.dumps(result_to_json(result)), flush=True)
        print(f"REQUESTS {len(server.model.requests)}", flush=True)


def main() -> None:
    """Start or recover one run (see the module)."""
    from dbos import DBOS

    url, run_id, workdir = sys.argv[1:4]

    def launch() -> None:
        DBOS(config=dbos_config(url))
        DBOS.launch()

    try:
        anyio.run(_main, url, run_id, workdir, launch)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
