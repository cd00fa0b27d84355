"""The engines the chaos suite plays runs on, and the servers they need (not a test module).

An `Engine` names the child's engine (_chaos_child.py) and what its processes need:
environment variables, from a session fixture that starts a server (a throwaway PostgreSQL
cluster, Temporal's dev server) or skips, saying why.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest
from support import postgres_cluster


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (Debian's `postgresql` package).

    Started by tests/support.py. The environment gives the server's URL without a database:
    each run gets a database of its own.
    """
    with postgres_cluster() as url:
        yield {"AGENTLOOP_CHAOS_PG": url}


@pytest.fixture(scope="session")
def temporal_server(temporal_address: str) -> dict[str, str]:
    """Temporal's dev server (see _temporal.py): the environment gives its address."""
    return {"AGENTLOOP_CHAOS_TEMPORAL": temporal_address}
