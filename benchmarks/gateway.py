"""The gateway's cost against a bare hop and against LiteLLM, paired and repeated.

    python -m benchmarks.gateway [--repeats 3] [--rounds 300] [--stream-rounds 60]
                                 [--clients 50] [--load-seconds 5] [--no-litellm] [--no-write]

Servers, each its own process on 127.0.0.1: the paced scripted upstream and the bare hop
(`benchmarks.gateway_servers`); `python -m agentloop.gateway` with no tools (a
passthrough) and with the test plugin's tools (`tests/gateway_plugin`), both on this
checkout's code and the default SQLite store; the LiteLLM proxy (`anthropic/<model>` with
`api_base` at the same upstream) when it is installed. This process is the client
(`benchmarks.gateway_measures`). Each repeat runs, on every path in a rotating order:
paired JSON rounds, paired streamed rounds, then 50 clients for a few seconds each.
`benchmarks.gateway_report` turns the repeats into `benchmarks/RESULTS-gateway.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2

from benchmarks import gateway_measures as measures
from benchmarks.gateway_report import Repeat, Run, report

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "gateway_plugin"
RESULTS = Path(__file__).resolve().parent / "RESULTS-gateway.md"
PIP = (sys.executable, "-m", "pip", "-q", "--disable-pip-version-check")
SERVERS = (sys.executable, "-m", "benchmarks.gateway_servers")
GATEWAY = (sys.executable, "-m", "agentloop.gateway")
WARMUP = 20


@dataclass
class Server:
    """One server process of the run, and how to read its CPU and memory."""

    name: str
    url: str
    health: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def stats(self) -> measures.ProcessStats:
        return measures.ProcessStats(self.process.pid)


def progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTLOOP_"))}
    return {**env, **extra}


def spawn(
    name: str, command: Sequence[str], port: int, health: str, work: Path, **env: str
) -> Server:
    """Start `command` (its output goes to `work/<name>.log`); `ready` waits for it."""
    log = work / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=work, env=clean_env(**env), stdout=out, stderr=subprocess.STDOUT
        )
    return Server(name, f"http://127.0.0.1:{port}", health, process, log)


def ready(server: Server, seconds: float = 240) -> None:
    """Wait until the server's health path answers 200 (servers start slowly on a busy
    machine: they all import at once)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace")[-600:]
            raise RuntimeError(f"exited with {server.process.returncode}: {tail}")
        try:
            if httpx2.get(server.url + server.health, timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.1)
    stop(server.process)
    raise RuntimeError(f"did not answer {server.health} within {seconds:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def install_plugin(work: Path) -> Path:
    site, source = work / "site", work / "plugin"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    command = [*PIP, "install", "--no-deps", "--target", str(site), str(source)]
    subprocess.run(command, check=True, capture_output=True)
    return site


def spawn_litellm(upstream: str, work: Path) -> Server:
    """The LiteLLM proxy: no database, no telemetry, quiet logs, its config in `work`."""
    executable = Path(sys.executable).with_name("litellm")
    if importlib.util.find_spec("litellm") is None or not executable.exists():
        raise RuntimeError("not installed (`pip install -e '.[bench]'` brings `litellm[proxy]`)")
    model = {"model": f"anthropic/{measures.PLAIN['model']}", "api_base": upstream}
    model["api_key"] = "sk-upstream"
    config = {
        "model_list": [{"model_name": measures.PLAIN["model"], "litellm_params": model}],
        "litellm_settings": {"telemetry": False},
        # It refuses to start without a master key; the benchmark's key is that key.
        "general_settings": {"master_key": measures.API_KEY},
    }
    (work / "litellm.yaml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    command = [str(executable), "--config", "litellm.yaml", "--host", "127.0.0.1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    env |= {"LITELLM_LOG": "WARNING", "DISABLE_SCHEMA_UPDATE": "True"}
    return spawn(
        "litellm", [*command, "--port", str(port)], port, "/health/liveliness", work, **env
    )


def start_servers(args: argparse.Namespace, work: Path) -> tuple[list[Server], list[str]]:
    """Every path's server (the upstream is `direct`'s), and notes on what was skipped.

    All start at once, then each is waited for.
    """
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    pacing = ["--pace", str(args.pace), "--deltas", str(args.deltas)]
    command = [*SERVERS, "upstream", "--port", str(port), *pacing]
    servers = [spawn("direct", command, port, "/healthz", work, PYTHONPATH=str(ROOT))]
    port = free_port()
    command = [*SERVERS, "hop", "--port", str(port), "--upstream", upstream]
    servers.append(spawn("hop", command, port, "/healthz", work, PYTHONPATH=str(ROOT)))
    notes, litellm = [], None
    if not args.litellm:
        notes.append("LiteLLM skipped: --no-litellm")
    else:
        try:
            litellm = spawn_litellm(upstream, work)
        except RuntimeError as exc:
            notes.append(f"LiteLLM skipped: {exc}")
    site = install_plugin(work)
    for name, plugin in (("agentloop", []), ("agentloop+tools", ["--plugin", "gwtest"])):
        port = free_port()
        command = [*GATEWAY, "--upstream", upstream, "--port", str(port), *plugin]
        command += ["--store", f"sqlite:///{work / name}.db"]
        path = os.pathsep.join([str(ROOT), str(site)])  # this checkout's agentloop
        servers.append(spawn(name, command, port, "/healthz", work, PYTHONPATH=path))
    for server in servers:
        try:
            ready(server)
        except RuntimeError as exc:
            for other in [*servers, *([litellm] if litellm else [])]:
                stop(other.process)
            raise SystemExit(f"{server.name}: {exc}") from exc
    if litellm is not None:
        try:
            ready(litellm)
            servers.append(litellm)
        except RuntimeError as exc:
            stop(litellm.process)
            notes.append(f"LiteLLM skipped: {' '.join(str(exc).split())}")
    return servers, notes


async def one_repeat(servers: list[Server], args: argparse.Namespace, i: int) -> Repeat:
    targets = {s.name: s.url for s in servers}
    checks = {name: measures.Checks() for name in targets}
    progress(f"repeat {i + 1} of {args.repeats}: JSON rounds")
    json_times = await measures.paired_json(targets, args.rounds, checks)
    progress(f"repeat {i + 1} of {args.repeats}: streamed rounds")
    streams = await measures.paired_stream(targets, args.stream_rounds, checks)
    progress(f"repeat {i + 1} of {args.repeats}: {args.clients} clients on each path")
    loads = {}
    for server in measures.rotated(servers, i):
        loads[server.name] = await measures.load(
            server.url, args.clients, args.load_seconds, checks[server.name], server.stats
        )
    memory = {s.name: s.stats.memory() for s in servers}
    return Repeat(json_times, streams, loads, memory, checks)


async def run(args: argparse.Namespace) -> Run:
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        progress("starting the servers")
        servers, notes = start_servers(args, Path(tmp))
        try:
            progress("warming up")
            targets = {s.name: s.url for s in servers}
            warm = {name: measures.Checks() for name in targets}
            await measures.paired_json(targets, WARMUP, warm)
            await measures.paired_stream(targets, WARMUP, warm)
            repeats = []
            for i in range(args.repeats):
                repeats.append(await one_repeat(servers, args, i))
            tools = next(s.url for s in servers if s.name == "agentloop+tools")
            progress("mixed turns")
            mixed = await measures.mixed_turns(tools, args.clients)
        finally:
            for server in servers:
                stop(server.process)
    return Run(vars(args), repeats, notes, mixed, [s.name for s in servers])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway")
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats (3 or more give a spread)"
    )
    parser.add_argument("--rounds", type=int, default=300, help="paired JSON rounds per repeat")
    parser.add_argument("--stream-rounds", type=int, default=60, help="paired SSE rounds")
    parser.add_argument("--pace", type=float, default=0.02, help="upstream seconds per delta")
    parser.add_argument("--deltas", type=int, default=3, help="text deltas per stream")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients")
    parser.add_argument("--load-seconds", type=float, default=5.0, help="per path per repeat")
    parser.add_argument("--no-litellm", dest="litellm", action="store_false")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1 or args.stream_rounds < 1 or args.clients < 1:
        parser.error("--repeats, --rounds, --stream-rounds and --clients must be at least 1")
    text = report(anyio.run(run, args))
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
