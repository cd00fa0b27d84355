"""One run of the chaos suite in a process of its own (not a test module).

`attempt(ENGINE, FOLDER, RUN_ID, PROMPT, BASE_URL)` is the body of that process. The test
starts it through a fork server (`ForkServer`: `python _chaos_child.py --serve`), a process
that has imported the SDK and the engines once (an import of the SDK alone takes seconds)
and forks one child per attempt; `python tests/durable/_chaos_child.py ENGINE FOLDER
RUN_ID PROMPT BASE_URL` plays an attempt by hand.

It runs the chaos agent (_chaos.py) on ENGINE against the scripted Messages API at
BASE_URL, its tools acting on FOLDER, and writes the run's summary to FOLDER/result.json.
It may die on the way: at the crash point `AGENTLOOP_CHAOS_CRASH` names, or by the
parent's SIGKILL. Started again with the same arguments, a durable engine carries the run
on from its record.

With `AGENTLOOP_CHAOS_STREAM=1`, a durable engine's run is started (or attached to) with
`run_stream` and every event is read, from the stream's first item: the attempt that
completes the run has read the events of every attempt, and writes them to
FOLDER/events.json (a JSON list of `agentloop.durable.streams.event_to_json` values).

Engines: `direct` (a plain `Agent.run`, no engine: what a restart without one does), and
the durable engines of `agentloop.durable` (`dbos`: the system database's URL comes from
`AGENTLOOP_CHAOS_DB`).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from _chaos import (
    APPROVE,
    Crash,
    World,
    chaos_agent,
    external_results,
    parse_prompt,
    plan,
    summary,
    until,
)

from agentloop import AnthropicProvider
from agentloop.durable.streams import event_to_json
from agentloop.errors import DecisionError
from agentloop.events import Event, ModelStreamEvent
from agentloop.result import RunResult

STREAM_ENV = "AGENTLOOP_CHAOS_STREAM"
"""Set to 1: the run is read with `run_stream`, its events written to events.json."""

Played = tuple[RunResult[Any], list[Event] | None]
"""A run's result, and the events it streamed (None when it was not read as a stream)."""


def streams() -> bool:
    return os.environ.get(STREAM_ENV) == "1"


async def read_all(stream: AsyncIterator[Event], crash: Crash) -> list[Event]:
    """Every event of a run's stream (dying at `mid-stream:<round>` on reading one)."""
    events = []
    async for event in stream:
        events.append(event)
        if isinstance(event, ModelStreamEvent):
            crash.read("mid-stream", str(event.round))
    return events


async def run_direct(folder: Path, run_id: str, prompt: str, base_url: str) -> Played:
    """A plain run: nothing survives this process (its run id is new every time)."""
    import anthropic

    crash = Crash.from_env()
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-local", max_retries=0)
    agent = chaos_agent(AnthropicProvider(client), World(folder, crash))
    seed, external = parse_prompt(prompt)
    result = await agent.run(prompt, external_tools=[APPROVE] if external else ())
    if result.pending:
        crash.at("external-wait")
        result = await agent.resume(result.state, results=external_results(seed))
    return result, None


async def run_dbos(folder: Path, run_id: str, prompt: str, base_url: str) -> Played:
    """A DBOS workflow on SQLite in FOLDER, or on a database of its own in PostgreSQL."""
    from datetime import timedelta

    import anthropic
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent

    server = os.environ.get("AGENTLOOP_CHAOS_PG")
    database = (
        f"sqlite:///{folder / 'dbos.sqlite'}"
        if server is None
        else f"{server}/{run_id.replace('-', '_')}"
    )

    async def recorded(run_id: str, tool_use_ids: list[str]) -> bool:
        steps = await DBOS.list_workflow_steps_async(run_id)
        done = {
            s["output"]["tool_use_id"]
            for s in steps
            if isinstance(s["output"], dict) and "tool_use_id" in s["output"]
        }
        return set(tool_use_ids) <= done

    crash = Crash.from_env()
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-local", max_retries=0)
    agent = chaos_agent(AnthropicProvider(client), World(folder, crash, recorded))
    durable = DurableAgent(agent)
    DBOS(
        config={
            "name": "chaos",
            "system_database_url": database,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.01,
        }
    )
    DBOS.launch()
    seed, external = parse_prompt(prompt)

    async def answer() -> None:
        # Until the run waits (it may already have, in an earlier attempt): then answer,
        # unless this is where the process dies.
        if await durable.waiting(run_id, wait_seconds=ATTEMPT_SECONDS) is None:
            return  # answered by an earlier attempt: the run no longer waits
        crash.at("external-wait")
        try:
            await durable.send_results(run_id, external_results(seed))
        except DecisionError:
            pass  # no longer waiting: the answer an earlier attempt sent got there

    arguments: dict[str, Any] = {
        "run_id": run_id,
        "external_tools": [APPROVE] if external else (),
        "wait_for_external": timedelta(minutes=5) if external else None,
    }
    events: list[Event] | None = None
    async with anyio.create_task_group() as tasks:
        if external:
            tasks.start_soon(answer)
        if streams():
            async with durable.run_stream(prompt, **arguments) as stream:
                events = await read_all(stream, crash)
            assert stream.result is not None
            result = stream.result
        else:
            result = await durable.run(prompt, **arguments)
        tasks.cancel_scope.cancel()
    DBOS.destroy()
    return result, events


def temporal_agent(agent: Any, run_id: str) -> Any:
    """The `TemporalAgent` of the run `run_id` (its worker's, and its replayer's)."""
    from datetime import timedelta

    from agentloop.durable.temporal import TemporalAgent

    # A killed worker's activities are given to the next one after a missed heartbeat.
    return TemporalAgent(
        agent, task_queue=f"chaos-{run_id}", heartbeat_timeout=timedelta(seconds=2)
    )


async def run_temporal(folder: Path, run_id: str, prompt: str, base_url: str) -> Played:
    """A Temporal workflow on the dev server at `AGENTLOOP_CHAOS_TEMPORAL`; this process is
    its worker (its only one: the run has a task queue of its own) and its client."""
    from datetime import timedelta

    import anthropic
    from temporalio.client import Client, WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    client = await Client.connect(os.environ["AGENTLOOP_CHAOS_TEMPORAL"])

    async def recorded(run_id: str, tool_use_ids: list[str]) -> bool:
        """Whether the history holds the completion of those calls' activities."""
        try:
            history = await client.get_workflow_handle(run_id).fetch_history()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False  # not started yet
            raise
        scheduled = {
            e.event_id: e.activity_task_scheduled_event_attributes.activity_id
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        }
        done = {
            scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
            for e in history.events
            if e.HasField("activity_task_completed_event_attributes")
        }
        return all(any(a.endswith(f":{i}") for a in done) for i in tool_use_ids)

    crash = Crash.from_env()
    anthropic_client = anthropic.AsyncAnthropic(
        base_url=base_url, api_key="sk-ant-local", max_retries=0
    )
    agent = chaos_agent(AnthropicProvider(anthropic_client), World(folder, crash, recorded))
    durable = temporal_agent(agent, run_id)
    seed, external = parse_prompt(prompt)

    async def answer() -> None:
        # The run waits once the other calls of its external round are recorded; then
        # answer (the update is refused until the workflow waits), unless this is where
        # the process dies.
        round_calls = next(
            calls for calls in plan(seed, external=True) if any(c.name == "approve" for c in calls)
        )
        others = [c.id for c in round_calls if c.name not in ("approve", "hang")]
        await until(lambda: recorded(run_id, others), ATTEMPT_SECONDS)
        crash.at("external-wait")
        handle = client.get_workflow_handle(run_id)

        async def answered() -> bool:
            try:
                await handle.execute_update("external_results", external_results(seed))
            except (WorkflowUpdateFailedError, RPCError):
                # Refused: not waiting (yet, or any more: an earlier attempt's answer got
                # there); or aborted: the run ended meanwhile. Either way the run goes on.
                return False
            return True

        await until(answered, ATTEMPT_SECONDS)

    arguments: dict[str, Any] = {
        "run_id": run_id,
        "external_tools": [APPROVE] if external else (),
        "wait_for_external": timedelta(minutes=5) if external else None,
    }
    events: list[Event] | None = None
    # No workflow cache: no sticky queue for the next worker to wait out after a kill,
    # and every workflow task replays the run from its history.
    async with durable.worker(client, max_cached_workflows=0), anyio.create_task_group() as tasks:
        if external:
            tasks.start_soon(answer)
        if streams():
            async with durable.run_stream(client, prompt, **arguments) as stream:
                events = await read_all(stream, crash)
            assert stream.result is not None
            result = stream.result
        else:
            result = await durable.run(client, prompt, **arguments)
        tasks.cancel_scope.cancel()
    return result, events


ENGINES = {"direct": run_direct, "dbos": run_dbos, "temporal": run_temporal}


ATTEMPT_SECONDS = 90.0
"""The longest one attempt may take (the test's limit)."""
PRELOAD = ("dbos", "agentloop.durable.dbos", "temporalio.client", "agentloop.durable.temporal")
"""What the fork server imports once for all attempts, besides this module (if present)."""


def attempt(
    engine: str,
    folder: str,
    run_id: str,
    prompt: str,
    base_url: str,
    env: dict[str, str] | None = None,
    stderr: str | None = None,
) -> None:
    """Play the run on `engine` until it completes (result.json, and events.json when it
    was read as a stream) or this process dies.

    `env` is set first (the crash point, the engine's server); `stderr` is where this
    process writes its errors.
    """
    if stderr is not None:
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        sys.stderr = open(2, "w", closefd=False)
    os.environ.update(env or {})
    result, events = anyio.run(ENGINES[engine], Path(folder), run_id, prompt, base_url)
    if events is not None:
        _write(Path(folder) / "events.json", [event_to_json(e) for e in events])
    _write(Path(folder) / "result.json", summary(result))


def _write(path: Path, data: Any) -> None:
    """Write `data` to `path` as JSON, whole or not at all."""
    path.with_suffix(".tmp").write_text(json.dumps(data))
    os.replace(path.with_suffix(".tmp"), path)


# ---------------------------------------------------------------- the fork server


def serve() -> None:
    """Fork one child per command line on stdin; report its pid, then how it ended.

    A command is `{"args": [...]}` (the arguments of `attempt`); the answers are
    `{"pid": n}` at once and `{"status": code}` when the child has ended (minus the signal
    that killed it, as `subprocess` reports it).
    """
    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    for line in sys.stdin:
        args = json.loads(line)["args"]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                attempt(*args)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"status": code}), flush=True)


class ForkServer:
    """The test's side of `serve`: start an attempt, wait for it with a deadline, kill it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buffer = b""

    def start(self, *args: Any) -> int:
        """Fork a child playing `attempt(*args)`; its pid."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"args": args}).encode() + b"\n")
        self.process.stdin.flush()
        answer = self._read(120.0)
        assert answer is not None, "the fork server did not answer"
        pid: int = answer["pid"]
        return pid

    def wait(self, seconds: float) -> int | None:
        """How the child ended (0, or minus a signal), or None if it still runs after `seconds`."""
        answer = self._read(seconds)
        return None if answer is None else int(answer["status"])

    def _read(self, seconds: float) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + seconds
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the fork server ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        attempt(*sys.argv[1:6])
