"""A durable gateway stopped while its database is down, in a process of its own (not a test).

`python tests/gateway/_store_down_child.py` starts a PostgreSQL cluster, serves a
`--durable` gateway on it in this process, and sends a request whose tool call is under
way when the cluster stops; the call then ends, so DBOS retries recording its result
against the stopped database. The gateway is then stopped (its lifespan shutdown), with
the database still down. It prints `CLOSED <seconds>` (how long the shutdown took) and
returns: the test times how long the process then takes to exit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

import anthropic
from _gateway import charge_upstream, durable_on, gateway_on, held_charge
from support import postgres_process

from agentloop.testing import MessagesServer


async def main() -> None:
    started, release = anyio.Event(), anyio.Event()

    charge = held_charge(started, release, [])
    upstream = MessagesServer(charge_upstream).start()
    with postgres_process() as postgres:
        config = durable_on(postgres.url, upstream.base_url, charge, store_timeout=2.0)
        try:
            async with gateway_on(config) as url:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)

                async def ask() -> None:
                    try:
                        await client.messages.create(
                            model="m",
                            max_tokens=50,
                            messages=[{"role": "user", "content": "Charge order 42."}],
                        )
                    except anthropic.APIError as exc:
                        print("ANSWERED", type(exc).__name__, flush=True)

                async with anyio.create_task_group() as group:
                    group.start_soon(ask)
                    with anyio.fail_after(60):
                        await started.wait()
                    await anyio.to_thread.run_sync(postgres.stop)
                    release.set()  # the call ends; DBOS cannot record its result
                await client.close()
                stopping = time.monotonic()
        finally:
            upstream.stop()
        print(f"CLOSED {time.monotonic() - stopping:.1f}", flush=True)


if __name__ == "__main__":
    anyio.run(main)
