"""The gateway benchmark's repeats, turned into tables and verdicts (RESULTS-gateway.md).

Every figure is computed inside one repeat first (a percentile of that repeat's paired
differences, a throughput ratio of that repeat's loads), then shown as the median over
the repeats with the lowest and highest in brackets. Verdicts read the medians.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.gateway_measures import Checks, Load, Streamed, quantile

ROOT = Path(__file__).resolve().parents[1]
GATEWAYS = ("agentloop", "agentloop+tools")
TARGETS = {
    "json": 0.001,  # added p50 beyond the same-run hop, seconds
    "first_byte": 0.002,
    "throughput": 0.8,  # times the hop's
}


@dataclass
class Repeat:
    """One repeat's raw figures, by path name."""

    json: dict[str, list[float]]
    stream: dict[str, list[Streamed]]
    loads: dict[str, Load]
    memory: dict[str, tuple[float, float]]
    checks: dict[str, Checks]


@dataclass
class Run:
    """The whole run: its options, its repeats, and what it noted or checked aside."""

    options: dict[str, Any]
    repeats: list[Repeat]
    notes: list[str]
    mixed: tuple[int, list[str]]
    names: list[str]


def paired(a: Sequence[float], b: Sequence[float], q: float) -> float:
    """The `q` quantile of the per-round differences a - b."""
    return quantile([x - y for x, y in zip(a, b, strict=True)], q)


def first_bytes(r: Repeat, name: str) -> list[float]:
    return [s.first_byte for s in r.stream[name]]


def cpu_per_1000(load: Load) -> float:
    return load.cpu / load.requests * 1000


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def shown(values: Sequence[float], scale: float = 1000, digits: int = 2) -> str:
    """Median (lowest-highest) over the repeats; milliseconds by default."""
    m, lo, hi = (v * scale for v in (median(values), min(values), max(values)))
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


# --------------------------------------------------------------------------- tables


def json_table(run: Run) -> list[str]:
    lines = [
        "| path | p50 ms | added p50 ms | added p99 ms | beyond the hop p50 ms "
        "| beyond the hop p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in run.names:
        row = [name, shown([quantile(r.json[name], 0.5) for r in run.repeats])]
        for base in ("direct", "hop"):
            for q in (0.5, 0.99):
                if name in (base, "direct"):
                    row.append("")
                else:
                    row.append(shown([paired(r.json[name], r.json[base], q) for r in run.repeats]))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def streamed(run: Run, name: str) -> str:
    """How the path passed the paced stream on: as it came, holding `message_start` until
    the first delta, or buffered (`message_start` not well before the end), by the medians
    of each repeat."""
    pace = run.options["pace"]

    def gap(r: Repeat, later: str) -> float:
        return median([getattr(s, later) - s.first_byte for s in r.stream[name]])

    if any(gap(r, "end") < pace * run.options["deltas"] / 2 for r in run.repeats):
        return "NO (buffered)"
    if any(gap(r, "first_delta") < pace / 2 for r in run.repeats):
        return "holds `message_start` until the first delta"
    return "yes"


def stream_table(run: Run) -> list[str]:
    lines = [
        "| path | first byte p50 ms | added p50 ms | added p99 ms | beyond the hop p50 ms "
        "| beyond the hop p99 ms | first delta p50 ms | end p50 ms | streamed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in run.names:
        row = [name, shown([quantile(first_bytes(r, name), 0.5) for r in run.repeats])]
        for base in ("direct", "hop"):
            for q in (0.5, 0.99):
                if name in (base, "direct"):
                    row.append("")
                    continue
                figure = [
                    paired(first_bytes(r, name), first_bytes(r, base), q) for r in run.repeats
                ]
                row.append(shown(figure))
        for part in ("first_delta", "end"):
            row.append(
                shown(
                    [quantile([getattr(s, part) for s in r.stream[name]], 0.5) for r in run.repeats]
                )
            )
        row.append(streamed(run, name))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def load_table(run: Run) -> list[str]:
    lines = [
        "| path | requests/s | x the hop's | latency p50 ms | latency p99 ms "
        "| CPU ms per 1000 requests | RSS MiB | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in run.names:
        row = [name, shown([r.loads[name].throughput for r in run.repeats], 1, 0)]
        ratio = [r.loads[name].throughput / r.loads["hop"].throughput for r in run.repeats]
        row.append(shown(ratio, 1, 2))
        for q in (0.5, 0.99):
            row.append(shown([quantile(r.loads[name].latencies, q) for r in run.repeats]))
        row.append(shown([cpu_per_1000(r.loads[name]) for r in run.repeats], 1000, 0))
        row.append(f"{run.repeats[-1].memory[name][0]:.0f}")
        row.append(f"{max(r.memory[name][1] for r in run.repeats):.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


# --------------------------------------------------------------------------- verdicts


def figures(run: Run, name: str) -> dict[str, float]:
    """The medians over the repeats that the verdicts read, for one path."""
    return {
        "json": median([paired(r.json[name], r.json["hop"], 0.5) for r in run.repeats]),
        "json_added": median([paired(r.json[name], r.json["direct"], 0.5) for r in run.repeats]),
        "first_byte": median(
            [paired(first_bytes(r, name), first_bytes(r, "hop"), 0.5) for r in run.repeats]
        ),
        "first_byte_added": median(
            [paired(first_bytes(r, name), first_bytes(r, "direct"), 0.5) for r in run.repeats]
        ),
        "throughput": median(
            [r.loads[name].throughput / r.loads["hop"].throughput for r in run.repeats]
        ),
        "cpu": median([cpu_per_1000(r.loads[name]) for r in run.repeats]),
        "rss": run.repeats[-1].memory[name][0],
    }


def verdict_table(run: Run) -> list[str]:
    def met(ok: bool) -> str:
        return "met" if ok else "**NOT met**"

    gateways = [g for g in GATEWAYS if g in run.names]
    lines = ["| target | " + " | ".join(gateways) + " |", "|---|" + "---|" * len(gateways)]
    ours = {g: figures(run, g) for g in gateways}
    rows = [
        ("JSON: ≤ 1 ms beyond the same-run hop at p50", "json", "{:.2f} ms", 1000),
        (
            "first streamed byte: ≤ 2 ms beyond the same-run hop at p50",
            "first_byte",
            "{:.2f} ms",
            1000,
        ),
        (
            f"throughput at {run.options['clients']} clients: ≥ 0.8x the hop's",
            "throughput",
            "{:.3f}x",
            1,
        ),
    ]
    for label, key, form, scale in rows:
        cells = []
        for g in gateways:
            value = ours[g][key]
            ok = value >= TARGETS[key] if key == "throughput" else value <= TARGETS[key]
            cells.append(f"{met(ok)} ({form.format(value * scale)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "litellm" in run.names:
        theirs = figures(run, "litellm")
        comparisons = [
            ("JSON added p50 (vs direct)", "json_added", "{:.2f} ms", 1000, False),
            ("first byte added p50 (vs direct)", "first_byte_added", "{:.2f} ms", 1000, False),
            ("throughput (x the hop's)", "throughput", "{:.2f}x", 1, True),
            ("CPU ms per 1000 requests", "cpu", "{:.0f}", 1000, False),
            ("RSS MiB", "rss", "{:.0f}", 1, False),
        ]
        for label, key, form, scale, higher in comparisons:
            cells = []
            for g in gateways:
                mine, other = ours[g][key], theirs[key]
                ok = mine > other if higher else mine < other
                ratio = f"{mine / other:.2f}x LiteLLM's" if other else "n/a"
                cells.append(
                    f"{met(ok)} ({form.format(mine * scale)} vs "
                    f"{form.format(other * scale)}: {ratio})"
                )
            lines.append(f"| ahead of LiteLLM: {label} | " + " | ".join(cells) + " |")
    return lines


# --------------------------------------------------------------------------- page


def environment(run: Run) -> list[str]:
    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "agentloop") else ""
    options = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in run.options.items() if not isinstance(v, bool)
    )
    return [
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; agentloop at "
        f"`{git('rev-parse', '--short', 'HEAD')}`{dirty}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu}); {platform.platform()}; load average at "
        f"the end {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min)",
        f"- Python {platform.python_version()}; anthropic {version('anthropic')}; uvicorn "
        f"{version('uvicorn')} ({http}, {loop}); aiohttp {version('aiohttp')}; "
        f"LiteLLM {version('litellm')}",
        f"- Options: {options}",
    ]


def report(run: Run) -> str:
    o = run.options
    n = len(run.repeats)
    ok, failures = run.mixed
    problems = [
        f"- {name}: {len(c.errors)} failed answers (first: `{c.errors[0]}`)"
        for r in run.repeats
        for name, c in r.checks.items()
        if c.errors
    ]
    lost = sorted({name for r in run.repeats for name, c in r.checks.items() if c.lost_beta})
    lines = [
        "# Gateway benchmark results",
        "",
        *environment(run),
        "",
        "The client, the upstream, the hop and every gateway share this machine's cores with "
        "other work, so absolute figures move from run to run. That is why every figure "
        "compares paths inside one repeat: latencies are paired differences (the same request "
        "through each path back to back, the order rotating each round and reversed every other "
        "cycle; p50 and p99 are taken "
        "over those differences), throughputs are ratios within the repeat. Each cell is the "
        f"median over {n} repeats, with the lowest and highest in brackets.",
        "",
        "Paths: `direct` (client -> upstream), `hop` (a bare ASGI app on the same uvicorn "
        "forwarding every header and streaming the answer back with the gateway's HTTP "
        "client), `agentloop` (`python -m agentloop.gateway`, no plugin: a passthrough), "
        "`agentloop+tools` (the same with the test plugin's two tools announced upstream), "
        "`litellm` (the LiteLLM proxy, `anthropic/<model>` with `api_base` at the same "
        "upstream, no database, telemetry off, logs at WARNING, its bundled model cost map "
        "(`LITELLM_LOCAL_MODEL_COST_MAP`, no network), and the master key it requires to "
        "start (the benchmark's key)). Both agentloop gateways use "
        "the default SQLite session store.",
        *[f"- {note}" for note in run.notes],
        "",
        f"## Plain JSON request, one at a time ({o['rounds']} paired rounds per repeat)",
        "",
        *json_table(run),
        "",
        f"## Streamed request, one at a time ({o['stream_rounds']} paired rounds per repeat)",
        "",
        f"The upstream sends `message_start` at once, then {o['deltas']} text deltas "
        f"{o['pace'] * 1000:.0f} ms apart. First byte: when the client has received the "
        "`message_start` event; a buffering path would show it only at the end "
        "(`streamed` says whether it came well before the end, and before the first delta).",
        "",
        *stream_table(run),
        "",
        f"## {o['clients']} clients at once ({o['load_seconds']:g} s per path per repeat)",
        "",
        "Plain JSON requests back to back from each client; requests per second count every "
        "request until the last one in flight has finished. The client and the upstream "
        "share the cores with the path's server, so a ratio says what the machine does per "
        "path, not what a server alone could do. CPU is the path's own server process (for "
        "`direct`, the upstream's) over the load; RSS after the last repeat, peak over the run.",
        "",
        *load_table(run),
        "",
        "## Verdicts (medians over the repeats)",
        "",
        *verdict_table(run),
        "",
        "## Checks",
        "",
        f"- Mixed turns through `agentloop+tools`, {o['clients']} conversations at once (the "
        "gateway's `lookup` and the client's tool in one answer, then the client's result): "
        f"{ok} of {o['clients']} completed as expected.",
        *[f"  - `{f}`" for f in failures],
        "- `anthropic-beta` reached the upstream on every request of every path"
        if not lost
        else f"- `anthropic-beta` did NOT reach the upstream through: {', '.join(lost)}",
        *(problems or ["- every answer was the expected one (status 200, the upstream's text)"]),
    ]
    return "\n".join(lines) + "\n"
