"""Durable requests (`agentloop serve --durable dbos:URL`) with real processes.

The gateway runs as a subprocess in front of a scripted upstream. Its `ledger` tool
writes a line under the call's idempotency key, then waits for the test on a TCP
rendezvous; the test SIGKILLs the gateway while the tool waits, starts it again, and
the client sends the same request again. Durable, the retry attaches to the run: the
answer arrives, the ledger holds one line, the upstream was asked once per round.
Without `--durable` (the negative control), the retry runs the tool again.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import anyio
import anyio.abc
import pytest
from _gateway import GatewayProcess, Upstream, install_plugin, start_gateway

from agentloop.testing import reply, tool_call

pytestmark = pytest.mark.timeout(240)

LEDGER_ENV = "AGENTLOOP_GWTEST_LEDGER"
QUESTION = [{"role": "user", "content": "Charge order 42."}]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("durable-site") / "site")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("durable-logs")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


def texts(blocks: Any) -> list[str]:
    return [b.text for b in blocks if b.type == "text"]


def answered_tools(body: dict[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


@dataclass
class Rendezvous:
    """The test's side of the ledger tool's wait: the first call is never let go."""

    arrived: list[anyio.Event] = field(default_factory=lambda: [anyio.Event() for _ in range(3)])
    calls: int = 0

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()  # "started": the ledger line is written
            index = self.calls
            self.calls += 1
            self.arrived[index].set()
            if index == 0:  # held until the gateway dies, which closes the connection
                with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    await stream.receive()
                return
            await stream.send(b"go\n")


@dataclass
class Crash:
    message: Any
    run_ids: list[str | None]
    ledger: list[str]
    upstream_requests: int
    tool_runs: int
    gateway: GatewayProcess


async def crash_mid_tool(
    upstream: Upstream, site: Path, logs: Path, tmp: Path, args: list[str]
) -> Crash:
    """Ask, SIGKILL the gateway while its tool waits, start it again, ask again."""
    ledger = tmp / "ledger.txt"
    options = {
        "store": f"sqlite:///{tmp / 'sessions.db'}",
        "env": {LEDGER_ENV: str(ledger)},
        "args": ["--plugin", "gwledger", *args],
    }
    rendezvous = Rendezvous()
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)

        def answer(body: dict[str, Any]) -> Any:
            if answered_tools(body):
                return reply("Charged once.")
            return reply("Charging.", tool_call("ledger", {"entry": "charge-42", "port": port}))

        upstream.script(function=answer)
        first = await anyio.to_thread.run_sync(
            partial(start_gateway, upstream.url, site, logs, **options)
        )
        failures: list[Exception] = []
        first_done = anyio.Event()

        async def ask_first() -> None:
            try:
                async with first.client() as client:
                    await client.messages.create(model="m", max_tokens=50, messages=QUESTION)
            except anthropic.APIConnectionError as exc:
                failures.append(exc)
            first_done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(listener.serve, rendezvous.handle)
            group.start_soon(ask_first)
            with anyio.fail_after(60):
                await rendezvous.arrived[0].wait()
            # The tool's effect happened and the tool waits: the gateway dies now.
            first.stop(signal.SIGKILL)
            with anyio.fail_after(60):
                await first_done.wait()
            assert len(failures) == 1, "the first request must have failed with the gateway"
            second = await anyio.to_thread.run_sync(
                partial(start_gateway, upstream.url, site, logs, **options)
            )
            with anyio.fail_after(120):
                async with second.client() as client:
                    raw = await client.messages.with_raw_response.create(
                        model="m", max_tokens=50, messages=QUESTION
                    )
                    message = await raw.parse()
            group.cancel_scope.cancel()
    return Crash(
        message=message,
        run_ids=[raw.headers.get("agentloop-run-id")],
        ledger=ledger.read_text().splitlines(),
        upstream_requests=len(upstream.recorded),
        tool_runs=rendezvous.calls,
        gateway=second,
    )


async def test_a_retry_after_a_crash_attaches_to_the_durable_run(
    upstream: Upstream, site: Path, logs: Path, tmp_path: Path
) -> None:
    durable = f"dbos:sqlite:///{tmp_path / 'dbos.sqlite'}"
    crash = await crash_mid_tool(upstream, site, logs, tmp_path, ["--durable", durable])
    try:
        assert texts(crash.message.content) == ["Charging.", "Charged once."]
        # The call under way at the crash ran again, under the same idempotency key:
        # its effect happened once.
        assert crash.tool_runs == 2
        assert len(crash.ledger) == 1, crash.ledger
        key, entry = crash.ledger[0].split(" ", 1)
        assert entry == "charge-42"
        run_id = crash.run_ids[0]
        assert run_id is not None and key.startswith(run_id + ":toolu_")
        # Round one was recorded before the crash; only round two went upstream after it.
        assert crash.upstream_requests == 2

        # A retry of the finished request gets the recorded answer, JSON or streamed,
        # with no new upstream request and no new tool run.
        async with crash.gateway.client() as client:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=QUESTION
            )
            again = await raw.parse()
            async with client.messages.stream(
                model="m", max_tokens=50, messages=QUESTION
            ) as stream:
                streamed = await stream.get_final_message()
        assert again.model_dump() == crash.message.model_dump()
        assert raw.headers.get("agentloop-run-id") == run_id
        assert texts(streamed.content) == ["Charging.", "Charged once."]
        assert streamed.id == crash.message.id
        assert streamed.usage.output_tokens == crash.message.usage.output_tokens
        assert len(upstream.recorded) == 2
        assert (tmp_path / "ledger.txt").read_text().splitlines() == crash.ledger
    finally:
        assert crash.gateway.stop() == 0, crash.gateway.output()


async def test_without_durable_a_retry_after_a_crash_runs_the_tool_again(
    upstream: Upstream, site: Path, logs: Path, tmp_path: Path
) -> None:
    crash = await crash_mid_tool(upstream, site, logs, tmp_path, [])
    try:
        assert texts(crash.message.content) == ["Charging.", "Charged once."]
        assert crash.tool_runs == 2
        # Two runs, two idempotency keys: the effect happened twice.
        assert len(crash.ledger) == 2, crash.ledger
        assert len({line.split(" ", 1)[0] for line in crash.ledger}) == 2
        assert crash.upstream_requests == 3
        assert crash.run_ids == [None]
    finally:
        assert crash.gateway.stop() == 0, crash.gateway.output()
