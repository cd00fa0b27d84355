"""The engines the chaos suite plays runs on, and the servers they need (not a test module).

An `Engine` names the child's engine (tests/_chaos_child.py) and what its processes need:
environment variables, from a session fixture that starts a server (a throwaway PostgreSQL
cluster, Temporal's dev server) or skips, saying why.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Engine:
    """Where a run's steps are recorded, as the child process knows it."""

    name: str
    """The child's engine (`direct`, `dbos`, `temporal`)."""
    id: str
    """The test id."""
    durable: bool = True
    module: str | None = None
    """The adapter module the engine needs (skipped when it cannot be imported)."""
    server: str | None = None
    """The session fixture giving the environment of its processes (a server's address)."""
    env: dict[str, str] = field(default_factory=dict)

    def ready(self, request: pytest.FixtureRequest) -> Engine:
        """This engine with its server started, or the test skipped with the reason."""
        if self.module is not None and not _importable(self.module):
            pytest.skip(f"{self.module} is not available")
        if self.server is None:
            return self
        env: dict[str, str] = request.getfixturevalue(self.server)
        return replace(self, env={**self.env, **env})


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its package is missing
        return False


ENGINES = {
    "direct": Engine("direct", "direct", durable=False),
    "dbos-sqlite": Engine("dbos", "dbos-sqlite", module="agentloop.durable.dbos"),
    "dbos-postgres": Engine(
        "dbos", "dbos-postgres", module="agentloop.durable.dbos", server="postgres_server"
    ),
    "temporal": Engine(
        "temporal", "temporal", module="agentloop.durable.temporal", server="temporal_server"
    ),
}


# ---------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (Debian's `postgresql` package).

    PostgreSQL refuses to run as root; as root, the cluster belongs to the `postgres`
    user the package creates. The environment gives the server's URL without a database:
    each run gets a database of its own.
    """
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="agentloop-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    port = free_port()
    try:
        subprocess.run(
            [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
             "-l", str(root / "log.txt"), "-w", "-t", "60", "start"],
            check=True, capture_output=True, timeout=90,
        )  # fmt: skip
        yield {"AGENTLOOP_CHAOS_PG": f"postgresql://postgres@127.0.0.1:{port}"}
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def temporal_server(temporal_address: str) -> dict[str, str]:
    """Temporal's dev server (see tests/_temporal.py): the environment gives its address."""
    return {"AGENTLOOP_CHAOS_TEMPORAL": temporal_address}
