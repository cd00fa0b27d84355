"""The examples run as written, offline, and print what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_quickstart() -> None:
    done = run_example("quickstart.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Paris is sunny at 21 °C, and 2 + 3 = 5.",
        "  get_weather({'city': 'Paris'}) -> Paris: 21 °C, sunny",
        "  add({'a': 2, 'b': 3}) -> 5.0",
    ]
    assert done.stderr == ""


def test_service_answers_concurrent_requests_on_one_agent() -> None:
    done = run_example("service.py")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:-1] == [
        "ada: Good news: order 1042 is shipped.",
        "ada: Good news: order 1044 is delivered.",
        "ada: Sorry: ada has no order 1043.",
        "grace: Good news: order 1043 is packing.",
        "grace: Sorry: grace has no order 1042.",
        "grace: Sorry: grace has no order 1044.",
    ]
    summary = lines[-1]
    assert summary.startswith("answered 24/24 requests (0 failed) in ")
    peak = int(summary.split("up to ")[1].split()[0])
    assert peak > 1, "runs should overlap on the shared Agent"


def test_streaming_progress_display() -> None:
    done = run_example("streaming_progress.py")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["-- round 1", "I'll fetch the three pages at once."]
    started = [i for i, line in enumerate(lines) if line.endswith(") started")]
    finished = [i for i, line in enumerate(lines) if line.startswith("   < fetch_page ok")]
    assert len(started) == len(finished) == 3 and max(started) < min(finished)
    assert lines[-1] == "done: end_turn after 2 rounds"
