"""Durable runs across versions of the app: upgrades, a version mismatch, the attach warning.

A process of the tests' DBOS app (_durable_app.py) starts a run and dies in a tool; a
process of the next release (one more durable agent registered) must finish it. A run
under way on another application version is refused at once, with an error naming both
versions, instead of a wait no process of this version would ever end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import _durable_app as app
import pytest
from _dbos import child

from agentloop.durable.records import result_from_json

pytestmark = [pytest.mark.durable, pytest.mark.timeout(180)]

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")


ONE_ENGINE = pytest.mark.parametrize("database", ["sqlite"], indirect=True)
"""What a test checks of the version is the engine's alike: SQLite will do."""


def _keys(workdir: Path) -> list[str]:
    ledger = (workdir / "ledger.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["key"] for line in ledger)


def test_launch_gives_a_stable_version_unless_the_configuration_names_one(
    tmp_path: Path,
) -> None:
    from dbos import DBOS

    from agentloop import Agent
    from agentloop.durable.dbos import APPLICATION_VERSION, DurableAgent, launch
    from agentloop.testing import ScriptedProvider

    async def version_of(names: list[str], config: dict[str, str]) -> tuple[str, str]:
        for name in names:
            DurableAgent(Agent(provider=ScriptedProvider([]), name=name))
        async with launch(config, lease_seconds=5) as lease:
            assert DBOS.executor_id == lease.executor_id
            found = (DBOS.application_version, lease.executor_id)
        DBOS.destroy(destroy_registry=True)
        return found

    import anyio

    url = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    config = app.dbos_config(url, None)
    one, first_id = anyio.run(version_of, ["one"], config)
    two, second_id = anyio.run(version_of, ["one", "two"], config)
    assert one == two == APPLICATION_VERSION
    assert first_id != second_id  # each process its own executor id
    named, _ = anyio.run(version_of, ["one"], {**config, "application_version": "v7"})
    assert named == "v7"


async def test_a_run_started_before_an_upgrade_finishes_after_it(
    tmp_path: Path, database: str
) -> None:
    # Release A starts the run and dies in b's tool; release B (one more durable agent,
    # a new executor id) takes it over once A's lease runs out, and finishes it.
    fleet = {"DURABLE_FLEET": "1", "DURABLE_VERSION": "default", "DURABLE_LEASE": "1"}
    crashed = await child(
        database, "upgrade-1", tmp_path, until="EFFECT", DURABLE_HANG="b", **fleet
    )
    assert crashed["EFFECT"] == "b"
    upgraded = await child(database, "upgrade-1", tmp_path, DURABLE_UPGRADE="1", **fleet)
    result = result_from_json(json.loads(upgraded["RESULT"]))
    assert result.stop_reason == "end_turn" and result.text == "Both recorded."
    assert upgraded["REQUESTS"] == "1"  # round 1 was recorded by release A
    assert _keys(tmp_path) == ["upgrade-1:toolu_a", "upgrade-1:toolu_b"]


@ONE_ENGINE
async def test_dbos_s_own_version_strands_a_run_and_attaching_says_so_at_once(
    tmp_path: Path, database: str
) -> None:
    # Without agentloop's version, DBOS hashes the registered workflows: release B's
    # version differs, it recovers nothing, and attaching names both versions.
    plain = {"DURABLE_VERSION": "default"}
    await child(database, "stranded-1", tmp_path, until="EFFECT", DURABLE_HANG="b", **plain)
    upgraded = await child(
        database, "stranded-1", tmp_path, DURABLE_UPGRADE="1", DURABLE_VERSION_CHECK="1", **plain
    )
    mismatch = json.loads(upgraded["MISMATCH"])
    assert mismatch["run_version"] != mismatch["version"]
    assert repr(mismatch["run_version"]) in mismatch["message"]
    assert repr(mismatch["version"]) in mismatch["message"]
    assert "drain" in mismatch["message"] and "RESULT" not in upgraded


@ONE_ENGINE
async def test_a_run_of_a_version_being_drained_is_refused_then_finished_by_its_own(
    tmp_path: Path, database: str
) -> None:
    await child(
        database, "drain-1", tmp_path, until="EFFECT", DURABLE_HANG="b", DURABLE_VERSION="v1"
    )
    newer = await child(
        database, "drain-1", tmp_path, DURABLE_VERSION="v2", DURABLE_VERSION_CHECK="1"
    )
    assert json.loads(newer["MISMATCH"])["run_version"] == "v1"
    assert json.loads(newer["MISMATCH"])["version"] == "v2"
    # A process of v1 drains it: recovers and finishes the run.
    drained = await child(database, "drain-1", tmp_path, DURABLE_VERSION="v1")
    assert result_from_json(json.loads(drained["RESULT"])).text == "Both recorded."
    assert _keys(tmp_path) == ["drain-1:toolu_a", "drain-1:toolu_b"]


@pytest.fixture
def dbos_warnings() -> Iterator[list[str]]:
    """The warnings DBOS logs (its logger does not propagate to the root's)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("dbos").addHandler(handler)
    yield seen
    logging.getLogger("dbos").removeHandler(handler)


@ONE_ENGINE
async def test_attaching_to_a_recovered_run_logs_no_queue_warning(
    tmp_path: Path,
    database: str,
    launch: Callable[[], None],
    dbos_warnings: list[str],
) -> None:
    from agentloop.durable.dbos import DurableAgent
    from agentloop.testing import MessagesServer

    await child(database, "quiet-1", tmp_path, until="EFFECT", DURABLE_HANG="b")
    async with MessagesServer(app.script) as server:
        durable = DurableAgent(app.make_agent(server))
        launch()  # recovers the run through DBOS's queue
        deps = {"ledger": str(tmp_path / "ledger.jsonl")}
        result = await durable.run("Record a and b.", run_id="quiet-1", deps=deps)
    assert result.text == "Both recorded."
    assert not [w for w in dbos_warnings if "already exists in queue" in w], dbos_warnings
