"""Durable runs, long and short: ms per round at 10 and 100 rounds, and what DBOS records.

    python -m benchmarks.durable_rounds [--runs 2] [--repeats 2] [--rounds 10 --rounds 100]

The runs are those of `benchmarks.durable` (a round: one model request, two parallel
calls of instant tools), measured by its workers for plain, DBOS on SQLite and on
PostgreSQL, and Temporal, once per run length. Then, for DBOS on SQLite, where a round's
time goes: the bytes each step records (a step keeps its output only: the response, not
the history sent, so it is the same size in round 1 and in round 100), and the time of
the two kinds of database access a step makes (DBOS's write of its output; the read of
the run's status with which agentloop's step checks `DurableAgent.cancel`), each timed
alone. Writes `benchmarks/RESULTS-durable-rounds.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
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
    """One DBOS run of `rounds` rounds on SQLite at `where`; timings of its accesses."""
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent

    durable = DurableAgent(bench_agent(rounds))
    DBOS(config={"name": "bench", "system_database_url": where, "log_level": "WARNING"})
    DBOS.launch()
    try:
        start = time.perf_counter()
        await durable.run("go", run_id="recorded")
        run_seconds = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(reads):
            await DBOS.get_workflow_status_async("recorded")
        read_seconds = (time.perf_counter() - start) / reads
    finally:
        DBOS.destroy()
    return {"run": run_seconds, "status_read": read_seconds}


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
        "status_read_ms": timing["status_read"] * 1000,
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
        "tool step | workflow input | one status read (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in found:
        first, last = f["model_step_bytes"]
        rows.append(
            f"| {f['rounds']} | {f['ms_per_round']:.1f} | {f['steps_per_round']:.1f} | "
            f"{first} B, {last} B | {f['tool_step_bytes']} B | {f['workflow_input_bytes']} B | "
            f"{f['status_read_ms']:.2f} |"
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
        "input. A status read is the read each agentloop step makes to see whether "
        "`DurableAgent.cancel` asked the run to stop (three a round here).\n\n"
        + "\n".join(rows)
        + "\n"
    )


if __name__ == "__main__":
    main()
