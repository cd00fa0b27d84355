"""One contender on one scenario, in its own process: a warm-up, then N timed runs.

    python -m benchmarks.worker --scenario S1 --contender agentloop --base-url URL --runs 5 \
        --out result.json [--profile out.prof]

Wall time is `time.perf_counter()`, CPU time `time.process_time()` of this process only
(the server runs in another one). The JSON written to `--out` holds one record per run.
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

from benchmarks.contenders import CONTENDERS
from benchmarks.scenarios import SCENARIOS, Scenario, peak_rss, reset_probe


async def measure(
    scenario: Scenario, contender: str, base_url: str, runs: int, profile: Path | None
) -> dict[str, Any]:
    client = AsyncAnthropic(base_url=base_url, api_key="sk-bench", max_retries=0)
    run = CONTENDERS[contender](client, scenario)  # the setup a service does once
    if scenario.warmup:
        await run()
    profiler = cProfile.Profile() if profile else None
    records: list[dict[str, Any]] = []
    for _ in range(runs):
        gc.collect()
        probe = reset_probe()
        cpu = time.process_time()
        probe.started = wall = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        facts = await run()
        if profiler is not None:
            profiler.disable()
        records.append(
            {
                "wall": time.perf_counter() - wall,
                "cpu": time.process_time() - cpu,
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
