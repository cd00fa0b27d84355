"""DBOS for the tests: a fresh system database per test, on SQLite and on PostgreSQL.

The fixtures `database` (a URL, once per engine: a SQLite file, or a new database on a
PostgreSQL server of the module's own when PostgreSQL is installed) and `launch` (DBOS
launched on it once the test has registered its durable agents, destroyed at the end),
and `child`: the tests' DBOS app (tests/_durable_app.py) run in a process of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path

import _durable_app as app
import anyio
import anyio.abc
import pytest
from _gateway import free_port
from dbos import DBOS

APP = Path(__file__).parent / "_durable_app.py"


def _postgres_bin() -> Path | None:
    """Where PostgreSQL's server programs are, if it is installed."""
    found = shutil.which("pg_ctl")
    if found is not None:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return versions[-1].parent if versions else None


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of this module's own, in a temporary directory; its base URL."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    home = Path(tempfile.mkdtemp(prefix="agentloop-pg-"))
    # The server refuses to run as root: as root, run it as the `postgres` user.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(home, "postgres")
    data, port = home / "data", free_port()
    run = partial(subprocess.run, check=True, stdout=subprocess.DEVNULL, timeout=120)
    run([*as_user, bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust"])
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [*as_user, bin_dir / "pg_ctl", "-D", data, "-l", home / "log"]
    run([*pg_ctl, "-o", options, "-w", "start"])  # -w: returns once it accepts connections
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        run([*pg_ctl, "-m", "immediate", "stop"])
        shutil.rmtree(home, ignore_errors=True)


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
    yield lambda: (DBOS(config=app.dbos_config(database)), DBOS.launch())[-1]
    DBOS.destroy(destroy_registry=True)


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
    """Run tests/_durable_app.py; killed with SIGKILL at the line starting with `until`.

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
