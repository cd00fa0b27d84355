"""One process of a fleet running DBOS durable runs: its launch, its version, its lease.

`launch` starts DBOS for the runs of `agentloop.durable.dbos.DurableAgent` with a stable
application version, and keeps a lease for the process in the system database: a live
process renews its own, and takes over the unfinished runs of a process whose lease ran
out. DBOS by itself recovers, at launch, only the runs of its own executor id, and knows
nothing of which processes live, so a dead process's runs would wait for a process of its id.
`named` and `destroy` let a process stop DBOS also when its database is down (the gateway's).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, WorkflowStatus
from dbos import error as dbos_errors

from agentloop.checks import check_seconds
from agentloop.errors import ConfigurationError, VersionMismatchError
from agentloop.logs import get_logger

__all__ = ("APPLICATION_VERSION", "Lease", "check_version", "destroy", "launch", "named")

APPLICATION_VERSION = "agentloop-1"
"""The application version `launch` gives DBOS unless the configuration names one.

DBOS's own default is a hash of the registered workflows' source, of DBOS's version and of
the application's name: one more `DurableAgent`, or a new release of agentloop or DBOS,
changes it, and DBOS then recovers none of the runs of the version before. The runs of
`DurableAgent` replay from their recorded steps whatever else the process registers, so
they keep one version; it changes only with a release of agentloop whose records an older
one cannot replay, and its changelog says so.
"""

LEASES_TABLE = "agentloop_leases"
"""The table of the leases, in the system database beside DBOS's own tables."""

_UNDER_WAY = ("PENDING", "ENQUEUED")

_destroyed: set[str] = set()
"""The connection names (`named`) of the DBOS instances this process destroyed."""

_log = get_logger()

_metadata = sa.MetaData()
_leases = sa.Table(
    LEASES_TABLE,
    _metadata,
    sa.Column("executor_id", sa.String(255), primary_key=True),
    sa.Column("holder", sa.String(64), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)


class _Destroyed(RuntimeError):
    """A connection asked for by a DBOS thread that outlived its DBOS (see `destroy`)."""


def _refuse_destroyed(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    name = cparams.get("application_name")
    if name in _destroyed:
        raise _Destroyed(f"DBOS {name!r} was destroyed: it connects to its database no more")


# DBOS makes its engines itself: this sees their connections by the name `named` gives them.
sa.event.listen(sa.Engine, "do_connect", _refuse_destroyed)


def named(config: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`config` whose PostgreSQL connections carry a name of their own, for `destroy`.

    Args:
        config: DBOS's configuration (`DBOSConfig`), with its `system_database_url`.

    Returns:
        The configuration to give DBOS, and the name (None for SQLite, whose database
        cannot go away under a running process).
    """
    settings = dict(config)
    url = sa.make_url(str(settings.get("system_database_url")))
    if url.get_backend_name() != "postgresql":
        return settings, None
    name = f"agentloop-{uuid.uuid4().hex[:12]}"
    engine_kwargs = dict(settings.get("db_engine_kwargs") or {})
    engine_kwargs["connect_args"] = {
        **(engine_kwargs.get("connect_args") or {}),
        "application_name": name,
    }
    settings["db_engine_kwargs"] = engine_kwargs
    return settings, name


async def destroy(name: str | None, *, destroy_registry: bool = False) -> None:
    """`DBOS.destroy`, also when the database is down; then refuse DBOS's connections.

    DBOS retries a statement that lost its database without end, in its own executor's
    threads, and `DBOS.destroy` does not stop them: with the database gone for good, they
    would keep the process from exiting. Once DBOS is destroyed, each new connection of
    the DBOS named `name` (`named`) fails with an error DBOS does not retry, so such a
    thread ends at its next try (DBOS waits at most 90 s between two).

    Args:
        name: The name `named` gave the DBOS's connections (None: SQLite).
        destroy_registry: Also forget the registered workflows (`DBOS.destroy`'s).
    """
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(lambda: DBOS.destroy(destroy_registry=destroy_registry))
    if name is not None:
        _destroyed.add(name)


def check_version(run_id: str, status: WorkflowStatus) -> None:
    """Refuse to wait for a run under way that no process of this version will run.

    Raises:
        VersionMismatchError: the run is pending or enqueued under another
            application version than this process's.
    """
    version = DBOS.application_version
    if status.status not in _UNDER_WAY or status.app_version in (None, version):
        return
    raise VersionMismatchError(
        f"run {run_id!r} is under way on application version {status.app_version!r}, and "
        f"this process runs version {version!r}: DBOS hands a run only to a process of its "
        "own version, so no process of this version will finish it. Keep a process of "
        f"version {status.app_version!r} running until its runs end (drain it), or give this "
        f"process application_version={status.app_version!r} if its agents record and "
        "replay as that version's do (see 'Rolling upgrades' in the durable runs docs).",
        run_id=run_id,
        run_version=str(status.app_version),
        version=version,
    )


@dataclass
class Lease:
    """This process in the fleet, as `launch` gives it."""

    executor_id: str
    """The process's executor id in DBOS: the runs it executes are recorded under it."""
    application_version: str
    """The application version of the process: it runs and recovers only runs of it."""
    seconds: float
    """How long the lease lasts unrenewed; it is renewed every third of that."""
    taken_over: list[str] = field(default_factory=list)
    """The executor ids of the dead processes whose runs this one took over."""


class _Leases:
    """The lease table, through a connection pool of its own (blocking: call in a thread)."""

    def __init__(self, url: str) -> None:
        address = sa.make_url(url)
        if address.drivername in ("postgresql", "postgres"):
            address = address.set(drivername="postgresql+psycopg")  # DBOS's own driver
        # A pooled connection may have outlived a restart of the database: ping it first.
        self.engine = sa.create_engine(address, pool_size=2, max_overflow=0, pool_pre_ping=True)
        self.created = False

    def create(self) -> None:
        if self.created:
            return
        try:
            _metadata.create_all(self.engine, checkfirst=True)
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
            # Another process created it at the same moment (PostgreSQL's catalog says so).
            _metadata.create_all(self.engine, checkfirst=True)
        self.created = True

    def claim(self, executor_id: str, holder: str, seconds: float) -> bool:
        """Take the lease of `executor_id` if it is free, expired or already `holder`'s."""
        self.create()
        now = time.time()
        with self.engine.begin() as connection:
            taken = connection.execute(
                sa.update(_leases)
                .where(_leases.c.executor_id == executor_id)
                .where(sa.or_(_leases.c.holder == holder, _leases.c.expires_at < now))
                .values(holder=holder, expires_at=now + seconds)
            )
            if taken.rowcount:
                return True
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    sa.insert(_leases).values(
                        executor_id=executor_id, holder=holder, expires_at=now + seconds
                    )
                )
        except sa.exc.IntegrityError:
            return False  # a live holder has it
        return True

    def renew(self, executor_id: str, holder: str, seconds: float) -> bool:
        """Extend `holder`'s lease of `executor_id`; False if it is no longer `holder`'s."""
        with self.engine.begin() as connection:
            renewed = connection.execute(
                sa.update(_leases)
                .where(_leases.c.executor_id == executor_id)
                .where(_leases.c.holder == holder)
                .values(expires_at=time.time() + seconds)
            )
        return bool(renewed.rowcount)

    def expired(self, own: str) -> list[str]:
        """The executor ids whose lease ran out, other than `own`."""
        with self.engine.begin() as connection:
            rows = connection.execute(
                sa.select(_leases.c.executor_id)
                .where(_leases.c.expires_at < time.time())
                .where(_leases.c.executor_id != own)
            )
            return [str(row[0]) for row in rows]

    def release(self, executor_id: str, holder: str, *, drop: bool) -> None:
        """End `holder`'s lease: `drop` deletes it, else it expires now (to be taken over)."""
        with self.engine.begin() as connection:
            mine = (_leases.c.executor_id == executor_id, _leases.c.holder == holder)
            if drop:
                connection.execute(sa.delete(_leases).where(*mine))
            else:
                connection.execute(sa.update(_leases).where(*mine).values(expires_at=0.0))


@asynccontextmanager
async def launch(config: Mapping[str, Any], *, lease_seconds: float = 15.0) -> AsyncIterator[Lease]:
    """Launch DBOS as one process of a fleet sharing a system database; destroy it on exit.

    ```python
    durable = DurableAgent(agent)  # every durable agent first: launching recovers runs
    async with launch({"name": "billing", "system_database_url": "postgresql://..."}):
        result = await durable.run("Charge order 42", run_id="order-42")
    ```

    The configuration is DBOS's (`DBOSConfig`), with two defaults of agentloop's own:
    `application_version` is `APPLICATION_VERSION`, and `executor_id` is new for each
    process (host name and a random part). While the block runs, the process renews a
    lease in the system database every third of `lease_seconds`; a process whose lease
    has run out for `lease_seconds` is dead, and one live process takes over its
    unfinished runs of this version (`DBOS.resume_workflow`), which then go on in
    whichever process picks them from DBOS's queue. A process given the executor id of
    one that died waits for that lease to run out before it launches, and then recovers
    its runs itself. Leaving the block destroys DBOS and lets the lease run out at once,
    so the fleet takes over what was under way.

    Args:
        config: DBOS's configuration; `system_database_url` is required.
        lease_seconds: How long a process may go without renewing its lease before the
            fleet counts it dead. Longer than any pause of the process (its event loop
            blocked, its host swapping): a live process taken for dead has its runs
            executed elsewhere too (DBOS then refuses its records, but its tools may
            act once more, which `RunContext.idempotency_key` absorbs).

    Yields:
        The process's `Lease`: its executor id, version, and the processes it took over.

    Raises:
        ConfigurationError: no `system_database_url`, a bad `lease_seconds`, or an
            executor id whose lease a live process keeps renewing.
    """
    lease_seconds = check_seconds("lease_seconds", lease_seconds, finite=True)
    url = config.get("system_database_url")
    if not isinstance(url, str) or not url:
        raise ConfigurationError("launch needs config['system_database_url'] (SQLite or Postgres)")
    settings, name = named(config)
    if settings.get("application_version") is None:
        settings["application_version"] = APPLICATION_VERSION
    if settings.get("executor_id") is None:
        settings["executor_id"] = f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
    lease = Lease(settings["executor_id"], settings["application_version"], lease_seconds)
    leases = _Leases(url)
    holder = uuid.uuid4().hex
    try:
        try:
            await _claim(leases, lease, holder)
        except sa.exc.OperationalError:
            pass  # no database yet (DBOS creates it): no lease to wait for
        DBOS(config=cast(DBOSConfig, settings))
        DBOS.launch()
        try:
            await _claim(leases, lease, holder)
            async with anyio.create_task_group() as group:
                group.start_soon(_keep, leases, lease, holder)
                yield lease
                group.cancel_scope.cancel()
        finally:
            await destroy(name)
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(
                        lambda: leases.release(lease.executor_id, holder, drop=False)
                    )
                except sa.exc.SQLAlchemyError as exc:
                    # The database is down: the lease runs out by itself instead.
                    _log.warning(
                        "durable.lease_failed", executor_id=lease.executor_id, error=str(exc)
                    )
    finally:
        leases.engine.dispose()


async def _claim(leases: _Leases, lease: Lease, holder: str) -> None:
    """Take this process's lease, waiting while the one of a dead process of its id lasts."""
    deadline = time.monotonic() + 2 * lease.seconds
    while not await anyio.to_thread.run_sync(
        lambda: leases.claim(lease.executor_id, holder, lease.seconds)
    ):
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"executor id {lease.executor_id!r} belongs to a live process, which keeps "
                "renewing its lease: give each process of the fleet its own executor_id"
            )
        await anyio.sleep(lease.seconds / 10)


async def _keep(leases: _Leases, lease: Lease, holder: str) -> None:
    """Renew the lease, and take over the processes whose lease ran out, until cancelled."""
    while True:
        await anyio.sleep(lease.seconds / 3)
        try:
            if not await anyio.to_thread.run_sync(
                lambda: leases.renew(lease.executor_id, holder, lease.seconds)
            ):
                # Taken for dead (a pause longer than the lease): its runs went elsewhere.
                _log.error("durable.lease_lost", executor_id=lease.executor_id)
                await anyio.to_thread.run_sync(
                    lambda: leases.claim(lease.executor_id, holder, lease.seconds)
                )
            for dead in await anyio.to_thread.run_sync(lambda: leases.expired(lease.executor_id)):
                await _take_over(leases, lease, holder, dead)
        except (sa.exc.SQLAlchemyError, dbos_errors.DBOSException) as exc:
            # The database is unreachable for now: the next beat tries again.
            _log.warning("durable.lease_failed", executor_id=lease.executor_id, error=str(exc))


async def _take_over(leases: _Leases, lease: Lease, holder: str, dead: str) -> None:
    """Resume the runs the process `dead` left under way, unless another process does."""
    if not await anyio.to_thread.run_sync(lambda: leases.claim(dead, holder, lease.seconds)):
        return  # another live process is taking it over
    pending = await DBOS.list_workflows_async(
        status="PENDING", executor_id=dead, load_input=False, load_output=False
    )
    mine = [s.workflow_id for s in pending if s.app_version in (None, lease.application_version)]
    for run_id in mine:
        await DBOS.resume_workflow_async(run_id)
    others = sorted({str(s.app_version) for s in pending} - {lease.application_version})
    _log.info(
        "durable.takeover",
        executor_id=lease.executor_id,
        dead=dead,
        runs=mine,
        left_to_other_versions=others,
    )
    if dead not in lease.taken_over:
        lease.taken_over.append(dead)
    if not others:
        await anyio.to_thread.run_sync(lambda: leases.release(dead, holder, drop=True))
