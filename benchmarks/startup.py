"""Start-up of the `agentloop` command (`--version`, `--help`, `tools`) against a bare Python.

    python -m benchmarks.startup [--runs 15] [--checkout PATH]

Each command runs in a fresh interpreter, in turn with the others (so a busy machine slows
all of them alike). `--help` and `tools` run twice: with no plugin (`AGENTLOOP_PLUGINS=`)
and with the installed ones (cortex and mcp in the dev install; no MCP server configured,
so none is started). The table gives, per command, the median wall time with its spread,
the median CPU time (user + system, steadier than wall time on a shared machine), and the
ratio of the median wall time to the bare interpreter's (`python -c pass`). The command is
run as `python -m agentloop`, the code path of the console script, with this checkout (or
`--checkout`, for a before/after comparison) and its plugins first on the path. The targets:
`agentloop --version` within 0.5 s; `agentloop --help` and `agentloop tools` within 0.5 s
without plugins and 1 s with cortex and mcp.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_PLUGINS = {"AGENTLOOP_PLUGINS": ""}
"""The environment that loads no plugin."""


@dataclass(frozen=True)
class Command:
    """One timed command: its label, its arguments and what it adds to the environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    target: float | None = None
    """Seconds its median wall time should stay within, if it has a target."""


AGENTLOOP = [sys.executable, "-m", "agentloop"]
COMMANDS = [
    Command("python -c pass", [sys.executable, "-c", "pass"]),
    Command("python -c 'import agentloop'", [sys.executable, "-c", "import agentloop"]),
    Command("agentloop --version", [*AGENTLOOP, "--version"], target=0.5),
    Command("agentloop --help (no plugins)", [*AGENTLOOP, "--help"], NO_PLUGINS, 0.5),
    Command("agentloop tools (no plugins)", [*AGENTLOOP, "tools"], NO_PLUGINS, 0.5),
    Command("agentloop --help (plugins)", [*AGENTLOOP, "--help"], target=1.0),
    Command("agentloop tools (plugins)", [*AGENTLOOP, "tools"], target=1.0),
]
BASELINE = "python -c pass"


@dataclass
class Times:
    """The wall and CPU seconds of each run of one command."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: Command, env: dict[str, str], checkout: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `command`, from start to exit."""
    env = {**env, **command.env}
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(command.argv, env=env, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu() - cpu


def measure(runs: int, checkout: Path = ROOT) -> dict[str, Times]:
    """`runs` timings of each command, the commands taking turns."""
    # The checkout's own plugins too, so that a before/after comparison compares them.
    folders = [checkout, *sorted((checkout / "plugins").glob("*/"))]
    path = os.pathsep.join([*map(str, folders), os.environ.get("PYTHONPATH", "")]).rstrip(":")
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("AGENTLOOP_MCP_CONFIG", None)  # start-up without servers: none is started
    times = {command.name: Times() for command in COMMANDS}
    for round_ in range(runs + 1):
        for command in COMMANDS:
            wall, cpu = run_once(command, env, checkout)
            if round_:  # the first round warms the file cache and is dropped
                times[command.name].wall.append(wall)
                times[command.name].cpu.append(cpu)
    return times


def table(times: dict[str, Times]) -> str:
    """A Markdown table: medians, spread, ratio to the bare interpreter, target."""
    baseline = statistics.median(times[BASELINE].wall)
    rows = [
        "| command | median | min | max | CPU median | ratio to `python -c pass` | target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for command in COMMANDS:
        found = times[command.name]
        median = statistics.median(found.wall)
        target = ""
        if command.target is not None:
            met = "met" if median <= command.target else "MISSED"
            target = f"≤ {command.target * 1000:.0f} ms: {met}"
        rows.append(
            f"| `{command.name}` | {median * 1000:.0f} ms | {min(found.wall) * 1000:.0f} ms "
            f"| {max(found.wall) * 1000:.0f} ms | {statistics.median(found.cpu) * 1000:.0f} ms "
            f"| {median / baseline:.1f} | {target} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the agentloop to measure")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    print(
        f"{args.checkout}: {args.runs} runs each, Python {sys.version.split()[0]}, "
        f"load average {load:.1f} on {os.cpu_count()} CPUs\n"
    )
    print(table(measure(args.runs, args.checkout)))


if __name__ == "__main__":
    main()
