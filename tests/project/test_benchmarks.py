"""The benchmarks still run: their server subclasses the scripted model of agentloop.testing.

A change to `ScriptedModel`'s methods once broke every scenario without a test failing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_scenario_runs_end_to_end() -> None:
    command = ["-m", "benchmarks", "--scenario", "S3", "--contender", "agentloop", "--runs", "1"]
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| S3 | agentloop |"))
    per_call = float(row.split("|")[4])
    assert per_call > 0, row
