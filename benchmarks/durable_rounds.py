"""Durable runs, long and short: ms per round at 10 and 100 rounds, and what DBOS records.

    python -m benchmarks.durable_rounds [--runs 2] [--repeats 2] [--rounds 10 --rounds 100]

The runs are those of `benchmarks.durable` (a round: one model request, two parallel
calls of instant tools), measured by its workers for plain, DBOS on SQLite and on
PostgreSQL, and Temporal, once per run length. Then, for DBOS on SQLite, where a round's
time goes: the bytes each step records (a step keeps its output only: the response, not
the history sent, so it is the same size in round 1 and in round 100), and the time of
the reads of the run's status with which agentloop's steps check `DurableAgent.cancel`
(counted and timed through SQLAlchemy's statement events), and `DBOS.get_workflow_status`
after the run, which loads the run's output too. Writes
`benchmarks/RESULTS-durable-rounds.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from benchmarks.durable import ENGINES, _versions, bench_agent, measure, table

RESULTS = Path(__file__).with_name("RESULTS-durable-rounds.md")


async def _recorded(rounds: int, where: str, reads: int) -> dict[str, Any]:
    """One DBOS run of `rounds` rounds on SQLite at `where`; its status reads, timed."""
    import sqlalchemy as sa
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent

    # The reads of the run's status (with the attributes `cancel` sets), seen through
    # SQLAlchemy's public statement events: how many, and how long each statement runs.
    seen: list[float] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = " ".join(statement.split())
        if text.startswith("SELECT") and "workflow_status.attributes" in text:
            seen.append(time.perf_counter() - conn.info["bench_started"])

    durable = DurableAgent(bench_agent(rounds))
    DBOS(config={"name": "bench", "system_database_url": where, "log_level": "WARNING"})
    DBOS.launch()
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)
    sa.event.listen(sa.engine.Engine, "after_cursor_execute", after)
    try:
        start = time.perf_counter()
        await durable.run("go", run_id="recorded")
        run_seconds = time.perf_counter() - start
        in_run = seen[1:]  # the first: the caller's, whether a run of that id exists
        start = time.perf_counter()
        for _ in range(reads):
            await DBOS.get_workflow_status_async("recorded")
        status_seconds = (time.perf_counter() - start) / reads
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", before)
        sa.event.remove(sa.engine.Engine, "after_cursor_execute", after)
        DBOS.destroy()
    return {
        "run": run_seconds,
        "reads_per_round": len(in_run) / rounds,
        "read": statistics.median(in_run),
        "status_after": status_seconds,
    }


def recorded(rounds: int) -> dict[str, Any]:
    """What a DBOS run on SQLite records per step, and the time of a step's accesses."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.sqlite"
        timing = anyio.run(_recorded, rounds, f"sqlite:///{path}", 200)
        database = sqlite3.connect(path)
        steps = database.execute(
            "SELECT function_name, length(output), started_at_epoch_ms, completed_at_epoch_ms"
            " FROM operation_outputs ORDER BY function_id"
        ).fetchall()
        (inputs,) = database.execute("SELECT length(inputs) FROM workflow_input").fetchone()
        database.close()
    model = [s for s in steps if s[0].endswith(".model")]
    tools = [s for s in steps if s[0].endswith(".tool")]
    return {
        "rounds": rounds,
        "ms_per_round": timing["run"] / rounds * 1000,
        "reads_per_round": timing["reads_per_round"],
        "read_ms": timing["read"] * 1000,
        "status_after_ms": timing["status_after"] * 1000,
        "model_step_bytes": (model[0][1], model[-1][1]),
        "tool_step_bytes": max(s[1] for s in tools),
        "steps_per_round": len(steps) / rounds,
        "workflow_input_bytes": inputs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, action="append")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--recorded", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recorded:  # a worker process: one DBOS run, its records
        print(json.dumps(recorded(args.recorded)))
        return
    lengths = args.rounds or [10, 100]
    load = os.getloadavg()
    sections = []
    for rounds in lengths:
        rows = table(measure(list(ENGINES), rounds, args.runs, args.repeats, False))
        print("\n".join(rows), flush=True)
        sections.append(f"### {rounds} rounds\n\n" + "\n".join(rows))
    found = []
    for rounds in lengths:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.durable_rounds", "--recorded", str(rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        found.append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = [
        "| rounds | ms per round | steps per round | model step (round 1, last) | "
        "tool step | workflow input | status reads per round | one, in the run (ms) | "
        "get_workflow_status after the run (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in found:
        first, last = f["model_step_bytes"]
        rows.append(
            f"| {f['rounds']} | {f['ms_per_round']:.1f} | {f['steps_per_round']:.1f} | "
            f"{first} B, {last} B | {f['tool_step_bytes']} B | {f['workflow_input_bytes']} B | "
            f"{f['reads_per_round']:.1f} | {f['read_ms']:.3f} | {f['status_after_ms']:.2f} |"
        )
    command = f"python -m benchmarks.durable_rounds --runs {args.runs} --repeats {args.repeats}"
    RESULTS.write_text(
        "# Benchmarks: durable runs of 10 and 100 rounds\n\n"
        f"`{command}`: the runs of `benchmarks.durable` ({args.repeats} interleaved worker "
        f"processes per engine, {args.runs} timed runs each after a warm-up), at each "
        f"length. {_versions()}, {time.strftime('%Y-%m-%d')}, load average {load[0]:.1f} "
        f"before and {os.getloadavg()[0]:.1f} after. On a shared 2-core machine: read the "
        "times as ranges.\n\n"
        + "\n\n".join(sections)
        + "\n\n### What DBOS on SQLite records per round\n\n"
        "One run per length, in a process of its own. A step records its output only "
        "(pickled, then base64): the model step's is the response, whatever the length "
        "of the history sent, and the history is recorded once, with the workflow's "
        "input. A status read is the read with which agentloop's steps see whether "
        "`DurableAgent.cancel` asked the run to stop (the model step's, and one shared by "
        "the calls of a turn), timed as a statement; `get_workflow_status` after the run "
        "also loads the run's output, its whole history, so it grows with the run.\n\n"
        + "\n".join(rows)
        + "\n"
    )


if __name__ == "__main__":
    main()
