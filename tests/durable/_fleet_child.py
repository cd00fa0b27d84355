"""One process of a fleet sharing a PostgreSQL system database (not a test module).

`python tests/durable/_fleet_child.py DB_URL FOLDER BASE_URL SEEDS LEASE HELD` launches
DBOS through `agentloop.durable.dbos.launch` (a lease of LEASE seconds), then starts, or
attaches to, the chaos run of each seed in SEEDS (comma-separated; run id `fleet-<seed>`)
with the chaos agent of _chaos.py, whose tools act on FOLDER (one ledger for the whole
fleet). It writes each run's summary to FOLDER/result-<seed>.json, then stays in the
fleet, taking over dead processes' runs, until FOLDER/stop exists. The first process to
run the sync call HELD (a tool_use id) writes its pid to FOLDER/held once the call's
effect is in the ledger, and that call then waits until the test kills the process.

On stdout, one line each: `EXECUTOR <id>` once launched, `TAKEOVER <id>` for each dead
process whose runs it took over, `DONE <seed>` for each run it saw finish. The test kills
it with SIGKILL at seeded moments.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from _chaos import WAIT_LIMIT, Crash, World, chaos_agent, prompt_for, summary

from agentloop import AnthropicProvider


class Hold(Crash):
    """No crash point; the first run of the sync call `held` waits after its effect to be killed."""

    def __init__(self, folder: Path, held: str) -> None:
        super().__init__()
        self.folder = folder
        self.held = held

    def at(self, point: str, where: str = "") -> None:
        super().at(point, where)
        if (point, where) != ("after-effect", self.held):
            return
        try:
            claim = os.open(self.folder / "held.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # the call runs again after the takeover: it goes on
        os.close(claim)
        (self.folder / "held.tmp").write_text(str(os.getpid()))
        (self.folder / "held.tmp").rename(self.folder / "held")
        # A worker thread of the sync tool: the process's event loop (its lease) goes on.
        threading.Event().wait(WAIT_LIMIT * 6)
        raise AssertionError("the process holding the call was not killed")


async def main(
    url: str, folder: Path, base_url: str, seeds: list[int], lease: float, held: str
) -> None:
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
    world = World(folder, Hold(folder, held), recorded)
    durable = DurableAgent(chaos_agent(AnthropicProvider(client), world))
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
    url, folder, base_url, seeds, lease, held = sys.argv[1:7]
    numbers = [int(s) for s in seeds.split(",") if s]
    anyio.run(main, url, Path(folder), base_url, numbers, float(lease), held)
