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

Versions and fleets: `DURABLE_FLEET=1` launches through `agentloop.durable.dbos.launch`
(its default version, a new executor id, a lease of `DURABLE_LEASE` seconds);
`DURABLE_VERSION=<v>` names the application version (`default`: none, DBOS's own hash or
agentloop's); `DURABLE_UPGRADE=1` registers one more durable agent, as a new release of
the app would. Attaching to a run of another version prints `MISMATCH <json>` (the
error's `run_version`, `version` and message) instead of `RESULT`.

`DURABLE_MAX_RECOVERY=<n>` gives the durable agent `max_recovery_attempts=n`;
`DURABLE_MAX_USES=<n>` gives `record` `max_uses=n`.
`DURABLE_CAPABILITY=1` gives the agent the `Witness` capability, whose effects (a line in
WORKDIR/witness.jsonl per response and per result it sees) are not keyed: one repeated
shows. With it, the call that hangs waits for the other call's step to be recorded
before it says `EFFECT`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from _chaos import until

from agentloop import Agent, AnthropicProvider, Capability, RunContext, tool
from agentloop.calls import ToolCall, ToolResult
from agentloop.capabilities import NextCall, NextRequest
from agentloop.events import TextDelta
from agentloop.providers.base import ModelRequest, ModelResponse
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
        if os.environ.get("DURABLE_CAPABILITY") == "1":
            await until(partial(others_recorded, ctx.run_id, ctx.tool_use_id))
        print(f"EFFECT {item}", flush=True)
        await anyio.sleep_forever()
    return result


async def others_recorded(run_id: str, tool_use_id: str) -> bool:
    """Whether the steps of the run's calls other than `tool_use_id` are recorded."""
    from dbos import DBOS

    steps = await DBOS.list_workflow_steps_async(run_id)
    done = {s["output"].get("tool_use_id") for s in steps if isinstance(s["output"], dict)}
    return {"toolu_a", "toolu_b"} - {tool_use_id} <= done


class Witness(Capability):
    """Writes a line for each response and each result it sees, and marks the results."""

    def __init__(self, workdir: str) -> None:
        self.lines = Path(workdir) / "witness.jsonl"

    def write(self, entry: dict[str, Any]) -> None:
        with self.lines.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        response = await call_next(request)
        self.write({"response": ctx.round})
        return response

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        result = await call_next(call)
        self.write({"result": call.id})
        return replace(result, content=f"{result.text} (witnessed)")


def make_agent(server: MessagesServer, max_uses: int | None = None, **options: Any) -> Agent:
    """The app's agent, over the real SDK client talking to `server`."""
    return Agent(
        provider=AnthropicProvider(server.client()),
        tools=[record if max_uses is None else record.replace(max_uses=max_uses)],
        name="ledger",
        **options,
    )


def dbos_config(url: str, version: str | None = "tests") -> Any:
    """DBOS's configuration for the tests' app on the system database `url`."""
    config = {
        "name": "agentloop-tests",
        "system_database_url": url,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.01,
    }
    return config if version is None else {**config, "application_version": version}


async def _main(
    url: str, run_id: str, workdir: str, launch: Callable[[], AbstractAsyncContextManager[Any]]
) -> None:
    from agentloop.durable.dbos import DurableAgent
    from agentloop.durable.records import result_to_json
    from agentloop.errors import VersionMismatchError

    streams = os.environ.get("DURABLE_STREAM") == "1"
    async with (
        MessagesServer(paced_script if streams else script) as server,
        AsyncExitStack() as stack,
    ):
        recoveries = int(os.environ.get("DURABLE_MAX_RECOVERY", "100"))
        max_uses = os.environ.get("DURABLE_MAX_USES")
        witness = [Witness(workdir)] if os.environ.get("DURABLE_CAPABILITY") == "1" else []
        agent = make_agent(
            server, None if max_uses is None else int(max_uses), capabilities=witness
        )
        durable = DurableAgent(agent, max_recovery_attempts=recoveries)
        if os.environ.get("DURABLE_UPGRADE") == "1":
            DurableAgent(make_agent(server), name="ledger-audit")  # what the release added
        await stack.enter_async_context(launch())  # recovers what an earlier process left
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
            if os.environ.get("DURABLE_VERSION_CHECK") == "1":
                try:
                    await durable.result(run_id)
                except VersionMismatchError as exc:
                    found = {"run_version": exc.run_version, "version": exc.version}
                    print("MISMATCH " + json.dumps({**found, "message": str(exc)}), flush=True)
                    return
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
    version = os.environ.get("DURABLE_VERSION", "tests")
    config = dbos_config(url, None if version == "default" else version)

    @asynccontextmanager
    async def launch() -> AsyncIterator[None]:
        if os.environ.get("DURABLE_FLEET") == "1":
            from agentloop.durable.dbos import launch as launch_fleet

            lease = float(os.environ.get("DURABLE_LEASE", "15"))
            async with launch_fleet(config, lease_seconds=lease):
                yield
        else:
            DBOS(config=config)
            DBOS.launch()
            yield

    try:
        anyio.run(_main, url, run_id, workdir, launch)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
