"""A fleet of three processes on one PostgreSQL database, killed at seeded moments.

Each process (_fleet_child.py) launches DBOS through `agentloop.durable.dbos.launch` and
starts a share of the chaos runs (_chaos.py). First, the process running one sync call
of the first run holds it after its effect, and the test SIGKILLs that process then:
it dies with the run in flight. Then the test SIGKILLs a seeded process each time the
fleet's ledger reaches a seeded length. Each dead process gets a replacement (a new
executor id) that attaches to its runs. No one recovers anything by hand: the live
processes take over a dead one's runs when its lease runs out.

Then every run must have finished once (its workflow a success) with the result of an
uninterrupted `Agent.run`, each keyed effect must be in the ledger once, only processes
that were killed may have been taken over, and no call may have been started by two
processes that both lived to the end. The held run must have been taken over: DBOS
records it finished under the executor id of a process that lived.

`AGENTLOOP_FLEET_RUNS=50` plays 50 runs (10 by default), with a kill per ten runs (at
least three).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from _chaos import KEYED, ChaosModel, effects_by_key, plan, read_lines, until
from _dbos import _lines
from _durable_engines import postgres_server  # noqa: F401  (the session's server)
from test_durable_chaos import reference

from agentloop.testing import MessagesServer

RUNS = int(os.environ.get("AGENTLOOP_FLEET_RUNS", "10"))
KILLS = max(3, RUNS // 10)

pytestmark = [pytest.mark.durable, pytest.mark.timeout(150 + 15 * RUNS)]

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

CHILD = Path(__file__).parent / "_fleet_child.py"
LEASE_SECONDS = 2.0
"""Short, so a dead process is taken over quickly; a live one renews every third of it."""


@dataclass
class Member:
    """A process of the fleet, and what it said."""

    process: anyio.abc.Process
    seeds: list[int]
    executor: str | None = None
    killed: bool = False
    held: bool = False
    """Killed while it held the held call (`_fleet_child.Hold`)."""
    takeovers: list[str] = field(default_factory=list)


async def _listen(member: Member) -> None:
    async for line in _lines(member.process):
        word, _, rest = line.partition(" ")
        if word == "EXECUTOR":
            member.executor = rest
        elif word == "TAKEOVER":
            member.takeovers.append(rest)


def held_call(seed: int) -> str:
    """The tool_use id of the sync call of `seed`'s second round: the call held for a kill."""
    (call,) = [c for c in plan(seed)[1] if c.name == "note_sync"]
    return call.id


async def _fleet(url: str, folder: Path, seeds: list[int], rng: random.Random) -> list[Member]:
    members: list[Member] = []
    with ExitStack() as files:
        async with MessagesServer(ChaosModel(folder)) as server:
            await _play(url, folder, seeds, rng, server, members, files)
    return members


async def _play(
    url: str,
    folder: Path,
    seeds: list[int],
    rng: random.Random,
    server: MessagesServer,
    members: list[Member],
    files: ExitStack,
) -> None:
    async with anyio.create_task_group() as group:

        async def spawn(share: list[int]) -> Member:
            arguments = [url, str(folder), server.base_url, ",".join(map(str, share))]
            log = folder / f"stderr-{len(members)}.txt"
            stderr = files.enter_context(open(log, "w"))  # noqa: ASYNC230 (a local file)
            process = await anyio.open_process(
                [sys.executable, str(CHILD), *arguments, str(LEASE_SECONDS), held_call(seeds[0])],
                stderr=stderr,
            )
            member = Member(process, share)
            members.append(member)
            group.start_soon(_listen, member)
            return member

        for index in range(3):
            await spawn(seeds[index::3])

        async def finished() -> bool:
            return all((folder / f"result-{seed}.json").exists() for seed in seeds)

        async def kill(victim: Member) -> None:
            victim.process.kill()
            await victim.process.wait()
            victim.killed = True
            await spawn(victim.seeds)  # a replacement, which attaches to its runs

        async def holding() -> bool:
            return (folder / "held").exists()

        # The held call's effect is in the ledger, and its process waits: it dies now.
        await until(holding, 60 + 5 * len(seeds))
        pid = int((folder / "held").read_text())
        (holder,) = [m for m in members if m.process.pid == pid]
        holder.held = True

        async def known() -> bool:
            return holder.executor is not None  # its EXECUTOR line, read

        await until(known)
        await kill(holder)

        ledger = folder / "ledger.jsonl"
        for threshold in sorted(rng.sample(range(2, 4 * len(seeds)), KILLS - 1)):

            async def reached(threshold: int = threshold) -> bool:
                known = any(m.executor and not m.killed for m in members)
                return known and (len(read_lines(ledger)) >= threshold or await finished())

            await until(reached, 120)
            if await finished():
                break
            await kill(rng.choice([m for m in members if m.executor and not m.killed]))

        await until(finished, 130 + 5 * len(seeds))
        (folder / "stop").touch()
        with anyio.fail_after(60):
            for member in members:
                if not member.killed:
                    code = await member.process.wait()
                    assert code == 0, (folder / f"stderr-{members.index(member)}.txt").read_text()
        group.cancel_scope.cancel()


def _statuses(url: str) -> dict[str, tuple[str, str]]:
    """Each run's DBOS status and the executor id it is recorded under."""
    import sqlalchemy as sa

    engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT workflow_uuid, status, executor_id FROM dbos.workflow_status")
            )
            return {str(row[0]): (str(row[1]), str(row[2])) for row in rows}
    finally:
        engine.dispose()


def test_a_fleet_of_three_finishes_every_run_once_whatever_process_is_killed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: dict[str, str] = request.getfixturevalue("postgres_server")
    url = f"{server['AGENTLOOP_CHAOS_PG']}/fleet_{uuid.uuid4().hex[:12]}"
    folder = tmp_path / "fleet"
    folder.mkdir()
    seeds = list(range(500, 500 + RUNS))
    expected = {seed: reference(seed, False, tmp_path / "reference" / str(seed)) for seed in seeds}

    began = time.monotonic()
    members = anyio.run(_fleet, url, folder, seeds, random.Random(RUNS))

    killed = {m.executor for m in members if m.killed}
    statuses = _statuses(url)
    keyed = [e for e in read_lines(folder / "ledger.jsonl") if e["tool"] in KEYED]
    taken = {dead for m in members for dead in m.takeovers}
    report = {
        "runs": RUNS,
        "finished": sum(statuses[f"fleet-{seed}"][0] == "SUCCESS" for seed in seeds),
        "effects_twice": sum(n > 1 for n in effects_by_key(keyed).values()),
        "kills": len(killed),
        "taken_over": len(taken),
        "seconds": round(time.monotonic() - began, 1),
    }
    print("durable fleet report:", json.dumps(report))
    assert len(killed) >= 1, "no process was killed: the test proved nothing"
    for seed in seeds:
        found: dict[str, Any] = json.loads((folder / f"result-{seed}.json").read_text())
        assert found == expected[seed], f"run {seed} differs from an uninterrupted run"
    assert {statuses[f"fleet-{seed}"][0] for seed in seeds} == {"SUCCESS"}
    assert set(effects_by_key(keyed).values()) == {1}
    assert taken and taken <= killed, f"took over {taken - killed}, which lived"
    # The held run died in flight with its process; a live process took it over and
    # finished it, and the held call's effect (made before the kill) is there once.
    (holder,) = [m for m in members if m.held]
    assert holder.executor in taken
    finished_by = statuses[f"fleet-{seeds[0]}"][1]
    assert finished_by not in killed and finished_by in {m.executor for m in members}
    (note,) = [c.note for c in plan(seeds[0])[1] if c.id == held_call(seeds[0])]
    assert [e["note"] for e in keyed].count(note) == 1
    survivors = {m.process.pid for m in members if not m.killed}
    started: dict[str, set[int]] = {}
    for start in read_lines(folder / "starts.jsonl"):
        started.setdefault(start["key"], set()).add(start["pid"])
    twice = {key: pids & survivors for key, pids in started.items() if len(pids & survivors) > 1}
    assert not twice, f"calls started by two processes that both lived: {twice}"


async def test_launch_refuses_the_executor_id_of_a_live_process(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from agentloop.durable.dbos import launch
    from agentloop.errors import ConfigurationError

    url = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    config = {"name": "fleet", "system_database_url": url, "executor_id": "worker-1"}
    async with launch(config, lease_seconds=30):
        pass  # leaves its lease run out: the id is free again
    engine = sa.create_engine(url)
    with engine.begin() as connection:  # a live process of that id renews its lease
        connection.execute(
            sa.text("UPDATE agentloop_leases SET holder = 'other', expires_at = :t"),
            {"t": time.time() + 3600},
        )
    engine.dispose()
    with pytest.raises(ConfigurationError, match="'worker-1' belongs to a live process"):
        async with launch(config, lease_seconds=0.2):
            pytest.fail("launched beside a live process of its executor id")


@pytest.mark.parametrize("lease", [0, -1, 0.0, float("inf"), float("nan"), True, "15", None])
async def test_launch_refuses_a_bad_lease_before_touching_the_database(
    tmp_path: Path, lease: Any
) -> None:
    from agentloop.durable.dbos import launch
    from agentloop.errors import ConfigurationError

    path = tmp_path / "dbos.sqlite"
    config = {"name": "fleet", "system_database_url": f"sqlite:///{path}"}
    with pytest.raises(
        ConfigurationError, match="lease_seconds must be a finite number of seconds > 0"
    ):
        async with launch(config, lease_seconds=lease):
            pytest.fail(f"launched with lease_seconds={lease!r}")
    assert not path.exists()
