"""Run the benchmarks: agentloop against a hand loop, the SDK's runner, pydantic-ai, openai-agents.

    python -m benchmarks                      # everything; writes benchmarks/RESULTS.md
    python -m benchmarks --scenario S2 --contender agentloop --runs 3 [--profile]

The local Messages-API server runs in its own process. Each repetition of a (scenario,
contender) pair runs in a fresh process (a warm-up, then one timed run), and a scenario's
contenders take turns, one repetition each (A B C, B C A, ...), so that a slow patch of
a shared machine falls on all of them alike. See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.contenders import CONTENDERS, available
from benchmarks.scenarios import (
    S2_TURNS,
    S4_ROUNDS,
    S5_RUNS_AT_ONCE,
    S8_ROUNDS,
    S8_SAMPLES,
    SCENARIOS,
    Scenario,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROFILES = HERE / "profiles"
S6_IDEAL = 8 * 0.1  # ceil(64 / 8) waves of 100 ms
S7_IDEAL = 1.25  # eager: every call finishes when the last block has streamed


# -- processes


@contextlib.contextmanager
def server_process() -> Iterator[str]:
    """Start `benchmarks.server` in its own process; yield its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.server"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"the benchmark server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)


BASELINE = "agentloop_baseline"
"""The `agentloop` contender on another source tree of agentloop (`--baseline DIR`)."""


def worker_command(contender: str, baseline: Path | None) -> list[str]:
    """The command of a worker process for `contender`."""
    if contender != BASELINE or baseline is None:
        return [sys.executable, "-m", "benchmarks.worker", "--contender", contender]
    # The same contender code, with `agentloop` (and only it) imported from the other tree:
    # a folder holding a link to its package goes first on the path.
    shadow = Path(tempfile.gettempdir()) / f"agentloop-baseline-{abs(hash(str(baseline)))}"
    if not (shadow / "agentloop").exists():
        shadow.mkdir(exist_ok=True)
        (shadow / "agentloop").symlink_to(baseline.resolve() / "agentloop")
    code = f"import sys; sys.path.insert(0, {str(shadow)!r}); "
    code += "from benchmarks.worker import main; main()"
    return [sys.executable, "-c", code, "--contender", "agentloop"]


def run_worker(
    scenario: Scenario,
    contender: str,
    base_url: str,
    runs: int,
    profile: Path | None,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """Run one contender on one scenario in a fresh process (a warm-up, then `runs` timed
    runs); return its records."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [
            *worker_command(contender, baseline),
            "--scenario",
            scenario.name,
            "--base-url",
            base_url,
            "--runs",
            str(runs),
            "--out",
            str(out),
        ]
        if profile is not None:
            command += ["--profile", str(profile)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{scenario.name}/{contender} failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
    return result


# -- measurements


@dataclass
class Row:
    """One contender's numbers on one scenario."""

    scenario: Scenario
    contender: str
    metric: str
    values: list[float]
    cpu: list[float]
    facts: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


def primary(scenario: Scenario, runs: list[dict[str, Any]]) -> tuple[str, list[float]]:
    """The scenario's headline metric for each run."""
    if scenario.name == "S2":
        return "ms per turn", [r["wall"] / S2_TURNS * 1000 for r in runs]
    if scenario.name == "S3":
        return "CPU µs per call", [r["cpu"] / 1000 * 1e6 for r in runs]
    if scenario.name == "S4":
        return "CPU ms per round", [r["cpu"] / S4_ROUNDS * 1000 for r in runs]
    if scenario.name == "S5":
        return "CPU ms per run", [r["cpu"] / S5_RUNS_AT_ONCE * 1000 for r in runs]
    if scenario.name == "S7":
        return "s to all tools done", [max(r["finished"]) for r in runs]
    if scenario.name == "S8":
        first, last = S8_SAMPLES
        growth = [(r["rss"][str(last)] - r["rss"][str(first)]) / (last - first) for r in runs]
        return "RSS KB per round", [g / 1024 for g in growth]
    return "wall s", [r["wall"] for r in runs]


def measure(
    scenario: Scenario,
    contenders: Sequence[str],
    base_url: str,
    runs: int,
    profile: bool,
    baseline: Path | None = None,
) -> list[Row]:
    """Every contender's `runs` repetitions, interleaved, each in a fresh process."""
    ready = [c for c in contenders if available(c) is None]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in ready}
    for repetition in range(runs):
        # Rotate the order too, so that no contender always runs first after another.
        shift = repetition % len(ready) if ready else 0
        for contender in ready[shift:] + ready[:shift]:
            part = PROFILES / f"{scenario.name}-{contender}.{repetition}.prof" if profile else None
            if part is not None:
                PROFILES.mkdir(exist_ok=True)
            started = time.perf_counter()
            result = run_worker(scenario, contender, base_url, 1, part, baseline)
            result["elapsed"] = time.perf_counter() - started
            results[contender].append(result)
            record = result["runs"][0]
            print(
                f"  {scenario.name} {contender:<20} {repetition + 1}/{runs}: "
                f"wall {record['wall']:.3f} s, CPU {record['cpu']:.3f} s",
                file=sys.stderr,
            )
    rows: list[Row] = []
    for contender in contenders:
        reason = available(contender)
        if reason is not None:
            rows.append(Row(scenario, contender, "", [], [], skipped=reason))
            continue
        row = summarise(scenario, contender, results[contender])
        rows.append(row)
        print(f"  {scenario.name} {contender:<20} {row.metric}: {fmt(row.median)}", file=sys.stderr)
        if profile:
            print(top_of_profile(merge_profiles(scenario, contender)), file=sys.stderr)
    return rows


def summarise(scenario: Scenario, contender: str, results: list[dict[str, Any]]) -> Row:
    """One contender's row from the results of its worker processes."""
    records = [record for result in results for record in result["runs"]]
    bad = [text for r in records for text in r["texts"] if text != "done"]
    if bad:
        raise RuntimeError(f"{scenario.name}/{contender} ended wrongly: {bad[:3]}")
    metric, values = primary(scenario, records)
    last = results[-1]
    facts = {
        "max_in_flight": [r["max_in_flight"] for r in records],
        "wall": [r["wall"] for r in records],
        "peak_rss_growth": [r["peak_rss_growth"] for r in records],
        "peak_rss": last["peak_rss"],
        "threads": last["threads"],
        "tasks": last["tasks"],
        "rss": records[-1]["rss"],
        "history_bytes": records[-1].get("history_bytes"),
        "finished": records[-1]["finished"],
        "work_started": records[-1].get("work_started", {}),
        "block_closed": records[-1].get("block_closed", {}),
        "elapsed": sum(result["elapsed"] for result in results),
    }
    return Row(scenario, contender, metric, values, [r["cpu"] for r in records], facts)


def merge_profiles(scenario: Scenario, contender: str) -> Path:
    """Merge the repetitions' profiles into `<scenario>-<contender>.prof`."""
    parts = sorted(PROFILES.glob(f"{scenario.name}-{contender}.*.prof"))
    merged = PROFILES / f"{scenario.name}-{contender}.prof"
    pstats.Stats(*(str(p) for p in parts)).dump_stats(merged)
    for part in parts:
        part.unlink()
    return merged


def top_of_profile(path: Path, count: int = 25) -> str:
    """The top `count` entries by cumulative time, then agentloop's own."""
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(count)
    out.write("\n-- agentloop's own functions --\n")
    stats.print_stats(r"/agentloop/", count)
    return out.getvalue()


# -- targets


def ratio_to(row: Row, rows: Sequence[Row], contender: str) -> float:
    """The ratio of `row`'s median to `contender`'s on the same scenario (nan if absent)."""
    other = next((r for r in rows if r.scenario is row.scenario and r.contender == contender), None)
    return row.median / other.median if other and other.values else float("nan")


def verdict(row: Row, rows: Sequence[Row]) -> tuple[str, str]:
    """(target, met/missed) for agentloop's rows; empty for the others."""
    name = row.scenario.name
    ratio = ratio_to(row, rows, "hand")
    if row.contender != "agentloop":
        return "", ""
    if name == "S1":
        return "≤ 1.03x hand", judge(ratio, 1.03)
    if name == "S2":
        return "≤ 0.9x hand", judge(ratio, 0.9)
    if name == "S3":
        return "≤ 1.3x hand_gather", judge(ratio_to(row, rows, "hand_gather"), 1.3)
    if name == "S4":
        return "CPU ≤ 1.10x hand", judge(ratio, 1.10)
    if name == "S5":
        return "CPU ≤ 1.25x hand", judge(ratio, 1.25)
    if name == "S6":
        flights = set(row.facts["max_in_flight"])
        ideal = row.median / S6_IDEAL
        met = judge(ideal, 1.1)
        if flights != {8}:
            met = f"missed: {sorted(flights)} in flight, not 8; " + met
        return (
            f"8 in flight, ≤ 1.1x ideal {S6_IDEAL:.1f} s",
            f"{met} (in flight: {sorted(flights)})",
        )
    if name == "S8":
        return "growth ≤ 1.5x hand's (history only)", judge(ratio, 1.5)
    return "", ""


def judge(value: float, limit: float) -> str:
    if value != value:  # nan
        return "n/a"
    if value <= limit:
        return f"met ({value:.3f}x ≤ {limit}x)"
    return f"missed by {(value / limit - 1) * 100:.1f}% ({value:.3f}x > {limit}x)"


# -- report


def fmt(value: float) -> str:
    if value != value:
        return "—"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| Scenario | Contender | Metric | Median | Min | Max | CPU s (median) | vs hand "
        "| Target | Verdict |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        if row.skipped:
            lines.append(
                f"| {row.scenario.name} | {row.contender} | skipped: {row.skipped} | | | | | | | |"
            )
            continue
        hand = next((r for r in rows if r.scenario is row.scenario and r.contender == "hand"), None)
        ratio = f"{row.median / hand.median:.2f}x" if hand and hand.values else "—"
        target, met = verdict(row, rows)
        lines.append(
            f"| {row.scenario.name} | {row.contender} | {row.metric} | {fmt(row.median)} "
            f"| {fmt(min(row.values))} | {fmt(max(row.values))} "
            f"| {fmt(statistics.median(row.cpu))} | {ratio} | {target} | {met} |"
        )
    return "\n".join(lines)


def notes(rows: Sequence[Row]) -> str:
    out: list[str] = []
    for row in rows:
        if row.skipped:
            continue
        name = row.scenario.name
        if name == "S3" and row.contender == "agentloop":
            out.append(
                f"- S3 agentloop: {fmt(row.median)} µs of CPU per call; "
                f"{ratio_to(row, rows, 'hand'):.2f}x the task-group hand loop (`hand`), "
                f"{ratio_to(row, rows, 'hand_gather'):.2f}x the `asyncio.gather` hand loop "
                "(`hand_gather`); "
                f"{ratio_to(row, rows, 'agentloop_untraced'):.2f}x itself with the tracing "
                "hooks stubbed out (`agentloop_untraced`): what tracing costs when it is off."
            )
        if name == "S4" and row.contender == "agentloop" and row.facts["history_bytes"]:
            out.append(
                f"- S4: the history ends at {row.facts['history_bytes'] / 1000:.0f} kB as JSON "
                "(agentloop's `result.messages`)."
            )
        if name == "S5":
            growth = statistics.median(memory_per_run(row))
            hand = [r for r in rows if r.scenario is row.scenario and r.contender == "hand"]
            versus = ""
            if hand and hand[0].values:
                versus = f"; {growth / statistics.median(memory_per_run(hand[0])):.2f}x hand"
            out.append(
                f"- S5 {row.contender}: peak RSS growth per run {fmt(growth)} KB (min "
                f"{fmt(min(memory_per_run(row)))}, max {fmt(max(memory_per_run(row)))}{versus}); "
                f"wall {statistics.median(row.facts['wall']):.2f} s for the {S5_RUNS_AT_ONCE} runs."
            )
        if name == "S6":
            out.append(
                f"- S6 {row.contender}: largest number in flight per run "
                f"{row.facts['max_in_flight']}; wall median {row.median:.3f} s vs ideal "
                f"{S6_IDEAL:.1f} s ({row.median / S6_IDEAL:.2f}x)."
            )
        if name == "S7":
            done = ", ".join(f"{t:.2f}" for t in sorted(row.facts["finished"]))
            out.append(
                f"- S7 {row.contender}: tool calls finished at [{done}] s after the run started "
                f"(last run); ideal eager {S7_IDEAL} s, non-eager 2.25 s."
            )
            started, closed = row.facts["work_started"], row.facts["block_closed"]
            if started and closed:
                first = min(closed, key=lambda k: closed[k])
                lag = (started[first] - closed[first]) * 1000
                out.append(
                    f"  First call: its block closed at {closed[first]:.3f} s, the tool started "
                    f"at {started[first]:.3f} s ({lag:.1f} ms later); the last block closed at "
                    f"{max(closed.values()):.3f} s."
                )
        if name == "S8":
            rss = {int(k): v / 2**20 for k, v in row.facts["rss"].items()}
            history = row.facts.get("history_bytes")
            history_note = (
                f", history {history / 2**20:.2f} MiB as JSON ({history / S8_ROUNDS:.0f} B/round)"
                if history
                else ""
            )
            out.append(
                f"- S8 {row.contender}: RSS {rss[S8_SAMPLES[0]]:.1f} MiB at round "
                f"{S8_SAMPLES[0]}, {rss[S8_SAMPLES[1]]:.1f} MiB at round {S8_SAMPLES[1]}; "
                f"peak {row.facts['peak_rss'] / 2**20:.1f} MiB; wall {row.facts['wall'][0]:.1f} s"
                f"{history_note}; live threads at the end {row.facts['threads']}, asyncio "
                f"tasks {row.facts['tasks']}."
            )
    return "\n".join(out)


def memory_per_run(row: Row) -> list[float]:
    """S5: the growth of the RSS high-water mark over a batch, in KB per run of the batch."""
    return [growth / S5_RUNS_AT_ONCE / 1024 for growth in row.facts["peak_rss_growth"]]


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = []
    for package in (
        "agentloop-runner",
        "anthropic",
        "httpx2",
        "anyio",
        "pydantic",
        "pydantic-ai-slim",
        "openai-agents",
        "litellm",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{package} {metadata.version(package)}")
    return (
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n"
        f"- Machine: {os.cpu_count()} CPUs (nproc), {model}; {platform.platform()}\n"
        f"- Python {platform.python_version()} ({platform.python_implementation()})\n"
        f"- Packages: {', '.join(versions)}"
    )


COMMENTARY = """\
## Reading the numbers

- The machine is small and shared: medians of S1 and S2 move by 5-20 % between
  invocations (compare the min and max columns); a verdict within a few percent of its
  limit can flip from one run to the next.
- `sdk_runner` runs a turn's tool calls one after another (`_generate_tool_call_response`
  awaits each in a loop), hence ~50 x 100 ms in S1. With `stream=True,
  run_tools_eagerly=True` it runs each call inside the stream's event iterator as soon as
  the next event shows the model has moved on from it (the next `content_block_start`, or
  `message_delta` with `stop_reason: tool_use`): eager, but one call at a time, and the
  stream is not read while a call runs (S7: 2.85 s against agentloop's 1.26 s).
- S4 and S8: the wall time grows with the history for every contender, as the server
  parses the whole history every round, and so does the client's CPU: every contender on
  the `AsyncAnthropic` client (agentloop included) sends it through `messages.create`,
  which copies it (`anthropic/_utils/_prepare.py: copy_tree`) and JSON-encodes it again
  every round, about 650 kB at the end of S4. That work is the same for all of them; the
  ratios show what each adds on top.
- S5's CPU goes mostly to the HTTP stack, alike for every contender on `AsyncAnthropic`:
  for each request httpcore's pool looks at every connection it holds
  (`_assign_requests_to_connections`, `has_expired`), hundreds with 200 runs at once, and
  with 100 connections kept alive (the SDK's default) the others are opened and closed
  within the batch. In a profile, about a third of the time of both agentloop and the
  hand loop is in that pool.
- S3's task-group hand loop (`hand`) is bimodal on this machine (about 50 or about 80 µs
  per call from one process to the next, which its min and max show). Its target is
  against `hand_gather`, the loop most hand-written code on asyncio has: `asyncio.gather`
  makes one plain asyncio task per call, far cheaper than an anyio task. agentloop runs
  every call as an anyio task of its own, under a cancel scope for its timeout, after
  validating its input and taking its slots: one plain path, which costs more CPU per
  instant call than both hand loops.
- "live threads at the end 2": the main thread and the idle worker thread left by the
  event loop's `getaddrinfo`, for both contenders.
"""


def report(rows: Sequence[Row], command: str, elapsed: float) -> str:
    return (
        "# Benchmark results\n\n"
        f"{machine()}\n"
        f"- Command: `{command}` (took {elapsed:.0f} s)\n\n"
        f"{table(rows)}\n\n"
        "Each repetition ran in a fresh process (a warm-up, then one timed run), the "
        "contenders of a scenario taking turns. Ratios are medians against the hand-written "
        "loop (`hand`) of the same invocation; targets apply to `agentloop`.\n\n"
        f"{notes(rows)}\n\n"
        f"{COMMENTARY}"
    )


# -- command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--contender", action="append", choices=sorted(CONTENDERS))
    parser.add_argument("--runs", type=int, help="timed runs per pair (default: per scenario)")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed runs")
    parser.add_argument("--write", action="store_true", help="write RESULTS.md for a subset too")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a source tree of another agentloop (a git worktree of an older commit): "
        f"measured as `{BASELINE}` beside `agentloop`, interleaved",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows: list[Row] = []
    with server_process() as base_url:
        for scenario in (SCENARIOS[s] for s in args.scenario or SCENARIOS):
            if scenario.name == "S7" and not hasattr(_agent_class(), "run_stream"):
                print("S7: pending: needs run_stream", file=sys.stderr)
                continue
            contenders = [
                c for c in scenario.contenders if not args.contender or c in args.contender
            ]
            if args.baseline is not None and "agentloop" in contenders:
                contenders.insert(contenders.index("agentloop") + 1, BASELINE)
            runs = args.runs or scenario.runs
            rows += measure(scenario, contenders, base_url, runs, args.profile, args.baseline)
    elapsed = time.perf_counter() - started
    command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(rows, command.strip(), elapsed)
    print(text)
    if args.write or not (args.scenario or args.contender or args.runs):
        (HERE / "RESULTS.md").write_text(text)


def _agent_class() -> type:
    from agentloop import Agent

    return Agent


if __name__ == "__main__":
    main()
