"""Start-up time: `agentloop --version` and `import agentloop`, against a bare interpreter.

    python -m benchmarks.startup [--runs 15] [--checkout PATH]

Each command runs in a fresh interpreter, in turn with the others (so a busy machine slows
all of them alike); the table gives the median wall time with its spread, and the median
minus the bare interpreter's (`python -c pass`) as what agentloop itself costs. The
command is run as `python -m agentloop --version`, the code path of the console script,
with this checkout (or `--checkout`, for a before/after comparison) first on the path.
The target: `agentloop --version` within 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import agentloop'": [sys.executable, "-c", "import agentloop"],
    "agentloop --version": [sys.executable, "-m", "agentloop", "--version"],
}
BASELINE = "python -c pass"


def wall_time(command: list[str], env: dict[str, str]) -> float:
    """Seconds from start to exit of one run of `command`."""
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=env["CHECKOUT"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(runs: int, checkout: Path = ROOT) -> dict[str, list[float]]:
    """`runs` wall times of each command, the commands taking turns."""
    path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "CHECKOUT": str(checkout)}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs + 1):  # the first round warms the file cache and is dropped
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command, env))
    return {name: found[1:] for name, found in times.items()}


def table(times: dict[str, list[float]]) -> str:
    """A Markdown table: median, spread and cost above the baseline, in milliseconds."""
    baseline = statistics.median(times[BASELINE])
    rows = [
        "| command | median | min | max | above `python -c pass` |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, found in times.items():
        median = statistics.median(found)
        above = "" if name == BASELINE else f"{(median - baseline) * 1000:.0f} ms"
        rows.append(
            f"| `{name}` | {median * 1000:.0f} ms | {min(found) * 1000:.0f} ms "
            f"| {max(found) * 1000:.0f} ms | {above} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the agentloop to measure")
    args = parser.parse_args(argv)
    print(f"{args.checkout}: {args.runs} runs each, Python {sys.version.split()[0]}\n")
    print(table(measure(args.runs, args.checkout)))


if __name__ == "__main__":
    main()
