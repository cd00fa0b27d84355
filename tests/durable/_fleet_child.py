"""One process of a fleet sharing a PostgreSQL system database (not a test module).

`python tests/durable/_fleet_child.py DB_URL FOLDER BASE_URL SEEDS LEASE` launches DBOS
through `agentloop.durable.dbos.launch` (a lease of LEASE seconds), then starts, or
attaches to, the chaos run of each seed in SEEDS (comma-separated; run id `fleet-<seed>`)
with the chaos agent of _chaos.py, whose tools act on FOLDER (one ledger for the whole
fleet). It writes each run's summary to FOLDER/result-<seed>.json, then stays in the
fleet, taking over dead processes' runs, until FOLDER/stop exists.

On stdout, one line each: `EXECUTOR <id>` once launched, `TAKEOVER <id>` for each dead
process whose runs it took over, `DONE <seed>` for each run it saw finish. The test kills
it with SIGKILL at seeded moments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from _chaos import Crash, World, chaos_agent, prompt_for, summary

from agentloop import AnthropicProvider


async def main(url: str, folder: Path, base_url: str, seeds: list[int], lease: float) -> None:
    import anthropic
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent, launch

    async def recorded(run_id: str, tool_use_ids: list[str]) -> bool:
        steps = await DBOS.list_workflow_steps_async(run_id)
        done = {
            s["output"]["tool_use_id"]
            for s in steps
            if isinstance(s["output"], dict) and "tool_use_id" in s["output"]
        }
        return set(tool_use_ids) <= done

    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-local", max_retries=0)
    durable = DurableAgent(chaos_agent(AnthropicProvider(client), World(folder, Crash(), recorded)))
    config = {
        "name": "fleet",
        "system_database_url": url,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.01,
    }
    async with launch(config, lease_seconds=lease) as member:
        print(f"EXECUTOR {member.executor_id}", flush=True)

        async def play(seed: int) -> None:
            result = await durable.run(prompt_for(seed), run_id=f"fleet-{seed}")
            (folder / f"result-{seed}.json").write_text(json.dumps(summary(result)))
            print(f"DONE {seed}", flush=True)

        async def stay() -> None:
            told = 0
            while not (folder / "stop").exists():
                for dead in member.taken_over[told:]:
                    print(f"TAKEOVER {dead}", flush=True)
                told = len(member.taken_over)
                await anyio.sleep(0.05)  # polls a file another process writes

        async with anyio.create_task_group() as group:
            for seed in seeds:
                group.start_soon(play, seed)
            group.start_soon(stay)
    await client.close()


if __name__ == "__main__":
    url, folder, base_url, seeds, lease = sys.argv[1:6]
    numbers = [int(s) for s in seeds.split(",") if s]
    anyio.run(main, url, Path(folder), base_url, numbers, float(lease))
