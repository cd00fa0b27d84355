"""One contender on one scenario, in its own process: a warm-up, then N timed runs.

    python -m benchmarks.worker --scenario S1 --contender agentloop --base-url URL --runs 1 \
        --out result.json [--profile out.prof]

`benchmarks.run` starts one such process per repetition (`--runs 1`). Wall time is
`time.perf_counter()`, CPU time `time.process_time()` of this process only (the server
runs in another one), memory the growth of the RSS high-water mark during the run. The
JSON written to `--out` holds one record per run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from anthropic import AsyncAnthropic

from benchmarks.contenders import CONTENDERS, Run
from benchmarks.scenarios import (
    SCENARIOS,
    Scenario,
    high_water_rss,
    peak_rss,
    reset_peak_rss,
    reset_probe,
)


async def run_at_once(run: Run, count: int) -> dict[str, Any]:
    """Run `count` conversations together, as a service would: the first one's facts, with
    every one's final text."""
    facts: list[dict[str, Any]] = [{}] * count

    async def one(index: int) -> None:
        facts[index] = await run()

    async with anyio.create_task_group() as group:
        for index in range(count):
            group.start_soon(one, index)
    return {**facts[0], "texts": [f["text"] for f in facts]}


async def measure(
    scenario: Scenario, contender: str, base_url: str, runs: int, profile: Path | None
) -> dict[str, Any]:
    # No connect timeout of its own (the SDK's is 5 s): S5 starts hundreds of connections at
    # once, which a loaded machine can take longer than that to serve.
    client = AsyncAnthropic(base_url=base_url, api_key="sk-bench", max_retries=0, timeout=600.0)
    run = CONTENDERS[contender](client, scenario)  # the setup a service does once
    if scenario.warmup:
        # One conversation, even where a timed run starts many: it brings in what is loaded
        # once, and leaves the memory of a whole batch to be measured.
        await run()
    profiler = cProfile.Profile() if profile else None
    records: list[dict[str, Any]] = []
    for _ in range(runs):
        gc.collect()
        probe = reset_probe()
        rss_before = reset_peak_rss()
        cpu_started = time.process_time()
        probe.started = wall_started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        facts = await run_at_once(run, scenario.at_once)
        wall = time.perf_counter() - wall_started
        cpu = time.process_time() - cpu_started
        if profiler is not None:
            profiler.disable()
        rss_growth = high_water_rss() - rss_before
        history = facts.pop("history", None)
        if history is not None:
            facts["history_bytes"] = len(json.dumps(history))
        records.append(
            {
                "wall": wall,
                "cpu": cpu,
                "peak_rss_growth": rss_growth,
                "max_in_flight": probe.max_in_flight,
                "finished": probe.finished,
                "work_started": probe.work_started,
                "block_closed": probe.block_closed,
                "rss": probe.rss,
                **facts,
            }
        )
    await client.close()
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    return {
        "runs": records,
        "peak_rss": peak_rss(),
        "threads": threading.active_count(),
        "tasks": len(asyncio.all_tasks()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--contender", required=True, choices=sorted(CONTENDERS))
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--log", action="store_true", help="keep agentloop's INFO logs")
    args = parser.parse_args(argv)
    if not args.log:
        # The usual production setting: the stdlib level drops INFO events before they are built.
        logging.getLogger("agentloop").setLevel(logging.WARNING)
    scenario = SCENARIOS[args.scenario]
    result = anyio.run(measure, scenario, args.contender, args.base_url, args.runs, args.profile)
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
