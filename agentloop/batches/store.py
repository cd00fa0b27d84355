"""Where a batch job keeps what survives a restart: its runs' effects and its pending batches.

`agentloop.batches.run_batch` records every model response and tool result of its runs
here (by run and round, or by tool_use id), and the id of each batch sent and not yet
collected. Run again with the same job after a crash, it replays each run from these
records and waits for the pending batches instead of sending their requests again. One
SQLite file (or `:memory:`, for a job nothing will pick up again).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from agentloop.storage import connect_sqlite

__all__ = ("BatchStore",)

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_effects (
    job TEXT NOT NULL, run INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (job, run, key)
);
CREATE TABLE IF NOT EXISTS batch_pending (
    job TEXT NOT NULL, batch_id TEXT NOT NULL, custom_ids TEXT NOT NULL,
    PRIMARY KEY (job, batch_id)
);
"""

_RECORD = "INSERT OR REPLACE INTO batch_effects VALUES (?, ?, ?, ?)"

Effect = tuple[int, str, dict[str, Any]]
"""One recorded effect: the run's index, its key (`model:2`, `tool:toolu_...`), its JSON."""


class BatchStore:
    """A batch job's records in a SQLite file (see the module).

    ```python
    results = await agent.run_batch(prompts, job="nightly", store=BatchStore("jobs.db"))
    ```
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        """Keep records in the SQLite file at `path` (made if missing).

        Args:
            path: The file; `":memory:"` keeps them for this process only, so a restart
                starts the job over (and `run_batch` cancels the batches it leaves).
        """
        self.path = str(path)
        """Where the records are kept."""
        self._db = connect_sqlite(Path(self.path), _SCHEMA)
        self._lock = threading.Lock()

    @property
    def durable(self) -> bool:
        """Whether the records outlive this process (a file, not `:memory:`)."""
        return self.path != ":memory:"

    async def effects(self, job: str) -> dict[int, dict[str, dict[str, Any]]]:
        """The recorded effects of `job`: by run index, then by key."""
        rows = await self._run(
            "SELECT run, key, value FROM batch_effects WHERE job = ?", (job,), fetch=True
        )
        found: dict[int, dict[str, dict[str, Any]]] = {}
        for run, key, value in rows:
            found.setdefault(run, {})[key] = json.loads(value)
        return found

    async def pending(self, job: str) -> dict[str, str]:
        """The custom ids of `job`'s batches sent and not collected, each with its batch id."""
        rows = await self._run(
            "SELECT batch_id, custom_ids FROM batch_pending WHERE job = ?", (job,), fetch=True
        )
        return {custom: batch for batch, ids in rows for custom in json.loads(ids)}

    async def sent(self, job: str, batch_id: str, custom_ids: Iterable[str]) -> None:
        """Record that `batch_id` was sent with `custom_ids`."""
        await self._run(
            "INSERT OR REPLACE INTO batch_pending VALUES (?, ?, ?)",
            (job, batch_id, json.dumps(sorted(custom_ids))),
        )

    async def collected(self, job: str, batch_id: str, effects: Iterable[Effect]) -> None:
        """Record a batch's responses, and that it is no longer pending (one transaction)."""
        rows = [(job, run, key, json.dumps(value)) for run, key, value in effects]
        await anyio.to_thread.run_sync(partial(self._collected, job, batch_id, rows))

    async def record(self, job: str, effect: Effect) -> None:
        """Record one effect of a run (a tool result)."""
        run, key, value = effect
        await self._run(_RECORD, (job, run, key, json.dumps(value)))

    async def forget(self, job: str) -> None:
        """Delete `job`'s records (once its results are kept elsewhere)."""
        await anyio.to_thread.run_sync(partial(self._forget, job))

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def _collected(self, job: str, batch_id: str, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO batch_effects VALUES (?, ?, ?, ?)", rows
                )
                self._db.execute(
                    "DELETE FROM batch_pending WHERE job = ? AND batch_id = ?", (job, batch_id)
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _forget(self, job: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM batch_effects WHERE job = ?", (job,))
            self._db.execute("DELETE FROM batch_pending WHERE job = ?", (job,))

    async def _run(self, sql: str, args: tuple[Any, ...], *, fetch: bool = False) -> list[Any]:
        return await anyio.to_thread.run_sync(partial(self._execute, sql, args, fetch))

    def _execute(self, sql: str, args: tuple[Any, ...], fetch: bool) -> list[Any]:
        with self._lock:
            cursor = self._db.execute(sql, args)
            return cursor.fetchall() if fetch else []
