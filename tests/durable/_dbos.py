"""DBOS for the tests: a fresh system database per test, on SQLite and on PostgreSQL.

The fixtures `database` (a URL, once per engine: a SQLite file, or a new database on a
PostgreSQL server of the module's own when PostgreSQL is installed) and `launch` (DBOS
launched on it once the test has registered its durable agents, destroyed at the end),
and `child`: the tests' DBOS app (tests/durable/_durable_app.py) run in a process of its
own. A fixture skips its test when dbos or PostgreSQL is missing, saying which.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import _durable_app as app
import anyio
import anyio.abc
import pytest
from support import postgres_cluster

APP = Path(__file__).parent / "_durable_app.py"


DBOS_MISSING = "dbos is not installed (pip install 'agentloop-runner[dbos]')"


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of this module's own, in a temporary directory; its base URL."""
    with postgres_cluster() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh DBOS system database: a SQLite file, or a new database on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    base = request.getfixturevalue("postgres")
    return f"{base}/agentloop_{uuid.uuid4().hex[:12]}"  # DBOS creates it


@pytest.fixture
def launch(database: str) -> Iterator[Callable[[], None]]:
    """`launch()` DBOS on `database`, once the test's durable agents are registered."""
    dbos = pytest.importorskip("dbos", reason=DBOS_MISSING)
    yield lambda: (dbos.DBOS(config=app.dbos_config(database)), dbos.DBOS.launch())[-1]
    dbos.DBOS.destroy(destroy_registry=True)


async def _lines(process: anyio.abc.Process) -> AsyncIterator[str]:
    assert process.stdout is not None
    buffer = b""
    async for chunk in process.stdout:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode()


async def child(
    database: str, run_id: str, workdir: Path, until: str | None = None, **env: str
) -> dict[str, str]:
    """Run tests/durable/_durable_app.py; killed with SIGKILL at the line starting with `until`.

    Returns its output lines by their first word.
    """
    seen: dict[str, str] = {}
    environment = {**os.environ, **env}
    process = await anyio.open_process(
        [sys.executable, str(APP), database, run_id, str(workdir)],
        env=environment,
        stderr=subprocess.DEVNULL,
    )
    async with process:
        with anyio.fail_after(60):
            async for line in _lines(process):
                word, _, rest = line.partition(" ")
                seen[word] = rest
                if until is not None and word == until:
                    process.send_signal(signal.SIGKILL)
                    break
            await process.wait()
    if until is None:
        assert process.returncode == 0, seen
    else:
        assert process.returncode == -signal.SIGKILL
    return seen
