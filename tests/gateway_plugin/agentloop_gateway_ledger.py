"""A tool for the durable-request tests: a ledger write that honours its idempotency key."""

import os
from pathlib import Path

import anyio
from agentloop_gateway_testtools import rendezvous

import agentloop

LEDGER_ENV = "AGENTLOOP_GWTEST_LEDGER"
"""The environment variable naming the ledger file."""


async def ledger(entry: str, port: int, ctx: agentloop.RunContext) -> str:
    """Write `entry` to the ledger (once per call), then wait on `port` until the test says go.

    The effect is recorded with the call's idempotency key and skipped when that key is
    already there, so a call that runs again changes nothing twice. The test is told the
    entry and this process's id (`started ENTRY PID`): which gateway runs the call.
    """
    await anyio.to_thread.run_sync(write_once, ctx.idempotency_key, entry)
    await rendezvous(port, f"{entry} {os.getpid()}")
    return f"wrote {entry}"


def write_once(key: str, entry: str) -> None:
    """Append `key entry` to the ledger unless a line holds `key` already."""
    path = Path(os.environ[LEDGER_ENV])
    written = path.read_text().splitlines() if path.exists() else []
    if any(line.split(" ", 1)[0] == key for line in written):
        return
    with path.open("a") as out:
        out.write(f"{key} {entry}\n")
        out.flush()
        os.fsync(out.fileno())


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(ledger, timeout=60.0)
