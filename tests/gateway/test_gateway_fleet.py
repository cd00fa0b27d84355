"""A fleet: three `agentloop serve --durable` replicas on one Postgres and one Redis.

Conversations with a hidden round (the gateway's `ledger` tool writes one line per
call, under its idempotency key) go to the replicas in turn, as a round-robin client
would send them. At the first seeded point the hidden call of one conversation is held
until the test has SIGKILLed the replica running it, which stays dead: a live replica
must take that run over when the dead one's lease runs out, and the test checks the
DBOS record (the run finished under a live replica's executor id) and the live replica's
`durable.takeover` log event. At the other seeded points a live replica is SIGKILLed and
started again; Redis is restarted once and PostgreSQL once. A client whose request fails
(a dead replica, a store that does not answer) sends the same request again to the next
replica, as a client would. The test reports conversations finished, answers lost, tool
effects made twice, hidden output leaked and the latency of a conversation (p50, p99),
and asserts none is lost, twice or leaked.

Small by default (`FLEET_CONVERSATIONS`, `FLEET_KILLS`); set
`AGENTLOOP_FLEET_CONVERSATIONS=100` (and `AGENTLOOP_FLEET_KILLS`,
`AGENTLOOP_FLEET_SEED`) for a longer run (docs/fleet.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import anyio
import anyio.abc
import pytest
from _gateway import GatewayProcess, Upstream, install_plugin, start_gateway
from support import free_port, postgres_process, redis_process

from agentloop.testing import reply, tool_call

pytestmark = [pytest.mark.timeout(900), pytest.mark.durable, pytest.mark.slow]

FLEET_CONVERSATIONS = int(os.environ.get("AGENTLOOP_FLEET_CONVERSATIONS", "20"))
FLEET_KILLS = max(1, int(os.environ.get("AGENTLOOP_FLEET_KILLS", "2")))  # the first: a takeover
SEED = int(os.environ.get("AGENTLOOP_FLEET_SEED", "7"))
REPLICAS = 3
AT_ONCE = 4
"""Conversations in flight at once."""
LEDGER_ENV = "AGENTLOOP_GWTEST_LEDGER"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("fleet-site") / "site")


def answer(port: int) -> Any:
    """The upstream: a hidden `ledger` call for the conversation's order, then the answer."""

    def respond(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            order = json.dumps(body["messages"]).split("Charge order ", 1)[1].split(".", 1)[0]
            return reply(f"Charged order {order}.")
        order = str(last).removeprefix("Charge order ").rstrip(".")
        return reply("Charging.", tool_call("ledger", {"entry": f"order-{order}", "port": port}))

    return respond


class Fleet:
    """The replicas, started and killed by the test; each start logs to a file of its own."""

    def __init__(self, start: Any) -> None:
        self.start = start
        self.ports = [free_port() for _ in range(REPLICAS)]
        self.replicas: list[GatewayProcess | None] = [None] * REPLICAS
        self.started: list[GatewayProcess] = []
        self.killed: set[int] = set()

    def up(self, index: int) -> None:
        replica = self.start(index, self.ports[index], len(self.started))
        self.replicas[index] = replica
        self.started.append(replica)

    def kill(self, index: int) -> None:
        replica = self.replicas[index]
        if replica is not None:
            replica.stop(signal.SIGKILL)
            self.killed.add(index)

    def running(self, pid: int) -> int:
        """The index of the replica whose process is `pid`."""
        (index,) = [i for i, r in enumerate(self.replicas) if r and r.process.pid == pid]
        return index

    def events(self, name: str) -> list[dict[str, Any]]:
        """The log events `name` of every replica started (JSON lines, `--log-json`)."""
        found = []
        for replica in self.started:
            for line in replica.output().splitlines():
                if line.startswith("{") and f'"{name}"' in line:
                    event = json.loads(line)
                    if event.get("event") == name:
                        found.append(event)
        return found

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def stop_all(self) -> None:
        for replica in self.replicas:
            if replica is not None:
                replica.stop(signal.SIGKILL)


class Ledger:
    """The test's side of the ledger tool's rendezvous (`started ENTRY PID`, then `go`).

    Every call goes on at once, but the first call of the held entry: it waits until its
    replica dies (its connection ends), so that replica dies with the run in flight.
    """

    def __init__(self, held: str) -> None:
        self.held = held
        self.holder: int | None = None
        """The process id of the replica that ran the held call first."""
        self.arrived = anyio.Event()
        self.calls: Counter[str] = Counter()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                said = b""
                while not said.endswith(b"\n"):
                    said += await stream.receive()
                _, entry, pid = said.decode().split()
                self.calls[entry] += 1
                if entry == self.held and self.holder is None:
                    self.holder = int(pid)
                    self.arrived.set()
                    await stream.receive()  # nothing comes: it ends when the replica dies
                    return
                await stream.send(b"go\n")
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass


def hidden_leaks(message: Any) -> int:
    """How many things of the hidden round a client's answer shows."""
    text = json.dumps(message.model_dump())
    return sum(text.count(mark) for mark in ('"ledger"', "wrote order-", "toolu_", '"tool_result"'))


@pytest.fixture
def services() -> Iterator[tuple[Any, Any]]:
    with postgres_process() as postgres, redis_process() as redis:
        yield postgres, redis


async def test_a_fleet_survives_killed_replicas_and_restarted_stores(
    site: Path, tmp_path: Path, services: tuple[Any, Any]
) -> None:
    postgres, redis = services
    database = f"{postgres.url}/fleet_{uuid.uuid4().hex[:10]}"
    ledger = tmp_path / "ledger.txt"
    upstream = Upstream()
    env = {LEDGER_ENV: str(ledger), "AGENTLOOP_GATEWAY_SECRET": "fleet-secret"}

    def start(index: int, port: int, count: int) -> GatewayProcess:
        args = ["--plugin", "gwledger", "--durable", f"dbos:{database}", "--log-json"]
        args += ["--durable-executor-id", f"replica-{index}", "--store-timeout", "3"]
        logs = tmp_path / f"start-{count}"
        logs.mkdir()
        return start_gateway(
            upstream.url,
            site,
            logs,
            store=redis.url,
            env=env,
            args=args,
            port=port,
            healthy_within=240,  # DBOS's launch on PostgreSQL, on a busy machine
        )

    fleet = Fleet(start)
    rng = random.Random(SEED)
    # After which conversation's start each fault happens. At the first kill, the replica
    # running that conversation's hidden call dies with it in flight, for good.
    kills = sorted(rng.sample(range(1, FLEET_CONVERSATIONS), FLEET_KILLS))
    held = kills[0]
    ledger_calls = Ledger(f"order-{held}")
    dead: int | None = None
    store_faults = {rng.randrange(1, FLEET_CONVERSATIONS): "redis"}
    store_faults.setdefault(rng.randrange(1, FLEET_CONVERSATIONS), "postgres")
    latencies: list[float] = []
    answers: dict[int, Any] = {}
    run_ids: dict[int, str | None] = {}
    leaks = 0
    turn = 0

    async def converse(number: int) -> None:
        nonlocal leaks, turn
        question = [{"role": "user", "content": f"Charge order {number}."}]
        started = time.monotonic()
        with anyio.fail_after(300):
            while True:
                url = fleet.urls()[turn % REPLICAS]
                turn += 1
                client = anthropic.AsyncAnthropic(
                    base_url=url, api_key="sk-fleet", max_retries=0, timeout=30
                )
                try:
                    async with client:
                        raw = await client.messages.with_raw_response.create(
                            model="m", max_tokens=50, messages=question
                        )
                        message = await raw.parse()
                    run_ids[number] = raw.headers.get("agentloop-run-id")
                    break
                except (anthropic.APIConnectionError, anthropic.APIStatusError):
                    await anyio.sleep(0.5)  # then the same request to the next replica
        latencies.append(time.monotonic() - started)
        answers[number] = message
        leaks += hidden_leaks(message)

    try:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            upstream.script(function=answer(port))
            async with anyio.create_task_group() as group:
                group.start_soon(listener.serve, ledger_calls.handle)
                for index in range(REPLICAS):
                    await anyio.to_thread.run_sync(fleet.up, index)
                slots = anyio.Semaphore(AT_ONCE)
                async with anyio.create_task_group() as conversations:
                    for number in range(FLEET_CONVERSATIONS):
                        await slots.acquire()
                        conversations.start_soon(in_slot, slots, converse, number)
                        if number == held:
                            with anyio.fail_after(300):
                                await ledger_calls.arrived.wait()
                            dead = fleet.running(cast(int, ledger_calls.holder))
                            await anyio.to_thread.run_sync(fleet.kill, dead)
                        elif number in kills:
                            victim = rng.choice([i for i in range(REPLICAS) if i != dead])
                            await anyio.to_thread.run_sync(fleet.kill, victim)
                            await anyio.to_thread.run_sync(fleet.up, victim)
                        fault = store_faults.get(number)
                        if fault == "redis":
                            await anyio.to_thread.run_sync(redis.restart)
                        elif fault == "postgres":
                            await anyio.to_thread.run_sync(postgres.stop)
                            await anyio.to_thread.run_sync(postgres.start)
                group.cancel_scope.cancel()
    finally:
        fleet.stop_all()
        upstream.stop()
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    effects = Counter(line.split(" ", 1)[1] for line in lines)
    takeover = taken_over(database, fleet, run_ids.get(held), f"replica-{dead}")
    report = {
        "conversations": FLEET_CONVERSATIONS,
        "finished": sum(
            1
            for number, message in answers.items()
            if [b.text for b in message.content if b.type == "text"][-1]
            == f"Charged order {number}."
        ),
        "answers_lost": FLEET_CONVERSATIONS - len(answers),
        "effects_twice": sum(1 for count in effects.values() if count > 1),
        "hidden_leaked": leaks,
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(sorted(latencies)[max(0, round(0.99 * len(latencies)) - 1)], 3),
        "kills": FLEET_KILLS,
        "takeover": takeover,
    }
    print("fleet report:", json.dumps(report))
    assert report["finished"] == FLEET_CONVERSATIONS, report
    assert report["answers_lost"] == 0 and report["hidden_leaked"] == 0, report
    assert report["effects_twice"] == 0, (report, effects)
    assert set(effects) == {f"order-{n}" for n in range(FLEET_CONVERSATIONS)}, effects
    # The held run: its call ran again after the takeover, and its effect happened once.
    assert ledger_calls.calls[f"order-{held}"] >= 2 and effects[f"order-{held}"] == 1


def taken_over(database: str, fleet: Fleet, run_id: str | None, dead: str) -> dict[str, Any]:
    """Check that a live replica took the dead one's held run over and finished it.

    From what the system records: DBOS's status of the run (finished, under the executor
    id of the live replica that dequeued it after the takeover), and the takeover's log
    event in a live replica. No replica that lived was ever taken over.
    """
    from dbos import DBOSClient

    assert run_id is not None, "the held conversation got no run id"
    client = DBOSClient(system_database_url=database)
    try:
        (status,) = client.list_workflows(workflow_ids=[run_id], load_input=False)
    finally:
        client.destroy()
    live = {f"replica-{i}" for i in range(REPLICAS)} - {dead}
    assert status.status == "SUCCESS", status
    assert status.executor_id in live, (status.executor_id, dead)
    events = fleet.events("durable.takeover")
    by = [e["executor_id"] for e in events if e["dead"] == dead and run_id in e["runs"]]
    assert by and set(by) <= live, events
    killed = {f"replica-{i}" for i in fleet.killed}
    assert {e["dead"] for e in events if e["runs"]} <= killed, (events, killed)
    return {"run": run_id, "dead": dead, "taken_over_by": by[0], "finished_by": status.executor_id}


async def in_slot(slots: anyio.Semaphore, function: Any, *args: Any) -> None:
    """`function(*args)`, then the slot its caller took is free again."""
    try:
        await function(*args)
    finally:
        slots.release()
