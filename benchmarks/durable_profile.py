"""Where a round of a DBOS durable run spends its time: cProfile and the SQL of one run.

    python -m benchmarks.durable_profile [--rounds 100] [--engine sqlite --engine postgres]

The run is that of `benchmarks.durable` (a round: one model request, two parallel calls
of instant tools), on DBOS over SQLite and over PostgreSQL (a throwaway cluster, skipped
without Debian's `postgresql` package), each in this one process after a warm-up run.
Two views of the same timed run:

- every SQL statement, through SQLAlchemy's public `before_cursor_execute` and
  `after_cursor_execute` events on the `Engine` class (so on whatever engine DBOS makes),
  grouped by what it does, with its count per round and its time (in DBOS's worker
  threads, where `asyncio.to_thread` sends each database access);
- cProfile of the event loop's thread: the loop itself, the scripted model, DBOS's
  serialization (pickle, base64), and the time the loop waits for those threads.

Prints both; the tables go by hand into `RESULTS-durable-rounds.md`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa

from benchmarks.durable import bench_agent, postgres

T = r"(?:\w+\.)?"  # the schema, if any: main. on SQLite, dbos. on PostgreSQL
KINDS = (
    # (label, pattern on the statement): the first that matches names it.
    ("DBOS step write: its output", rf"^INSERT INTO {T}operation_outputs"),
    ("DBOS step write: the owner check before it", rf"^UPDATE {T}workflow_status SET owner_xid"),
    ("DBOS step write: the owner check before it", r"owner_xid\s+FROM .* FOR NO KEY UPDATE"),
    ("DBOS step check: workflow cancelled?", rf"^SELECT {T}workflow_status\.status\s+FROM"),
    ("DBOS step check: step recorded?", rf"^SELECT {T}operation_outputs\.output"),
    ("agentloop status read: cancel asked?", rf"^SELECT {T}workflow_status\.workflow_uuid, "),
    ("DBOS workflow start and end", r"workflow_status|workflow_input|workflow_output"),
)


class SqlLog:
    """Counts and times every statement any SQLAlchemy engine runs, by kind.

    Also each access: a connection taken from the pool and given back (a transaction,
    its statements, its commit, and SQLAlchemy's own work around them).
    """

    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.accesses: list[float] = []
        self.lock = threading.Lock()
        self.on = False

    def checkout(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        record.info["bench_out"] = time.perf_counter()

    def checkin(self, dbapi_conn: Any, record: Any) -> None:
        started = record.info.pop("bench_out", None)
        if self.on and started is not None:
            with self.lock:
                self.accesses.append(time.perf_counter() - started)

    def kind(self, statement: str) -> str:
        text = " ".join(statement.split())
        for label, pattern in KINDS:
            if re.search(pattern, text, re.IGNORECASE):
                return label
        return "other: " + text[:60]

    def before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        conn.info.setdefault("bench_started", []).append(time.perf_counter())

    def after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seconds = time.perf_counter() - conn.info["bench_started"].pop()
        if self.on:
            with self.lock:
                self.count[self.kind(statement)] += 1
                self.seconds[self.kind(statement)] += seconds

    @contextmanager
    def listening(self) -> Iterator[None]:
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self.before)
        sa.event.listen(sa.engine.Engine, "after_cursor_execute", self.after)
        sa.event.listen(sa.pool.Pool, "checkout", self.checkout)
        sa.event.listen(sa.pool.Pool, "checkin", self.checkin)
        try:
            yield
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", self.before)
            sa.event.remove(sa.engine.Engine, "after_cursor_execute", self.after)
            sa.event.remove(sa.pool.Pool, "checkout", self.checkout)
            sa.event.remove(sa.pool.Pool, "checkin", self.checkin)


def buckets(stats: pstats.Stats, wall: float) -> dict[str, float]:
    """Seconds of the event loop's thread during the run, by where they went."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]

    def own(test: Any) -> float:
        return float(sum(v[2] for (f, _, n), v in raw.items() if test(f, n)))

    found = {
        "idle: waiting for DBOS's threads (the database)": own(
            lambda f, n: "'poll' of 'select.epoll'" in n
        ),
        "the scripted model (it parses each request, as the API does)": float(
            sum(v[3] for (f, _, n), v in raw.items() if f.endswith("testing/scripted.py")
                and n == "complete")
        ),
        "serialization (DBOS's pickle and base64)": own(
            lambda f, n: "dbos/_serialization" in f or "pickle" in n or "base64" in f
        ),
        "DBOS's own Python (step and workflow wrappers)": own(
            lambda f, n: "/dbos/" in f and "_serialization" not in f
        ),
        "asyncio and anyio (tasks, hand-offs to threads)": own(
            lambda f, n: any(k in f for k in ("asyncio", "anyio", "concurrent/futures"))
        ),
    }  # fmt: skip
    found["agentloop's loop and the rest (pydantic, json, logging)"] = wall - sum(found.values())
    return found


async def one(rounds: int, where: str, log: SqlLog, prof: cProfile.Profile) -> dict[str, Any]:
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent

    durable = DurableAgent(bench_agent(rounds))
    DBOS(config={"name": "bench", "system_database_url": where, "log_level": "WARNING"})
    DBOS.launch()
    try:
        await durable.run("go", run_id=f"warm-{uuid.uuid4().hex}")
        log.on = True
        cpu, start = time.process_time(), time.perf_counter()
        prof.enable()
        result = await durable.run("go", run_id=f"timed-{uuid.uuid4().hex}")
        prof.disable()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        log.on = False
        assert result.rounds == rounds, result.stop_reason
    finally:
        DBOS.destroy()
    return {"wall": wall, "cpu": cpu}


def report(engine: str, rounds: int, timing: dict[str, Any], log: SqlLog, prof: Any) -> None:
    wall = timing["wall"]
    print(f"\n## DBOS/{engine}, {rounds} rounds: {wall / rounds * 1000:.2f} ms per round wall, "
          f"{timing['cpu'] / rounds * 1000:.2f} ms per round CPU (all threads), "
          f"load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| SQL statement | per round | ms per round | ms each |")
    print("|---|---|---|---|")
    for kind in sorted(log.seconds, key=log.seconds.__getitem__, reverse=True):
        n, s = log.count[kind], log.seconds[kind]
        print(f"| {kind} | {n / rounds:.2f} | {s / rounds * 1000:.2f} | {s / n * 1000:.3f} |")
    total_n, total_s = sum(log.count.values()), sum(log.seconds.values())
    print(f"| all statements | {total_n / rounds:.2f} | {total_s / rounds * 1000:.2f} | |")
    n, s = len(log.accesses), sum(log.accesses)
    median = statistics.median(log.accesses) if log.accesses else 0.0
    print(
        "| accesses (pool checkout to checkin: statements, commit, waits) | "
        f"{n / rounds:.2f} | {s / rounds * 1000:.2f} | {median * 1000:.3f} (median) |"
    )
    stats = pstats.Stats(prof)
    print("\n| the event loop's thread | ms per round | share of wall |")
    print("|---|---|---|")
    for label, s in sorted(buckets(stats, wall).items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {s / rounds * 1000:.2f} | {s / wall:.0%} |")
    stats.sort_stats("tottime").print_stats(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--engine", action="append", choices=("sqlite", "postgres"))
    args = parser.parse_args()
    for engine in args.engine or ["sqlite", "postgres"]:
        log, prof = SqlLog(), cProfile.Profile()
        with log.listening(), tempfile.TemporaryDirectory() as tmp, postgres() as pg:
            if engine == "sqlite":
                where = f"sqlite:///{Path(tmp) / 'profile.sqlite'}"
            elif pg is None:
                print("postgres: skipped (no postgresql installed)")
                continue
            else:
                where = f"{pg}/profile"
            timing = anyio.run(one, args.rounds, where, log, prof)
        report(engine, args.rounds, timing, log, prof)


if __name__ == "__main__":
    main()
