"""The `agentloop` command: offline demo, real-API path (against the local server), JSON
output, logging and exit codes. Runs go through a subprocess, as a user would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from agentloop.cli import main
from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, RawResponse

NO_KEY_NOTICE = "ANTHROPIC_API_KEY is not set"

needs_cortex = pytest.mark.skipif(
    not any(ep.name == "cortex" for ep in metadata.entry_points(group="agentloop")),
    reason="the agentloop-cortex plugin is not installed",
)


def agentloop(*args: str, key: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m agentloop ARGS` with no API key (unless given) and no plugin pin."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", ENV_VAR)
    }
    if key is not None:
        clean["ANTHROPIC_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "agentloop", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
    )


# --------------------------------------------------------------------------- offline demo


@needs_cortex
def test_run_without_key_runs_the_offline_demo(tmp_path: Path) -> None:
    done = agentloop("run", "I like sailing", "--cortex-root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert NO_KEY_NOTICE in done.stderr and "offline demo" in done.stderr
    out = done.stdout
    for expected in (
        "[round 1] model answered: stop_reason=tool_use",
        "[round 2]   tool write_file: ok",
        "== Transcript ==",
        "user: I like sailing",
        "assistant -> read_file(filename='memory.md')",
        "assistant -> read_file(filename='soul.md')",
        "== Tool log ==",
        "== Cortex files ==",
        "stop_reason=end_turn, rounds=3",
    ):
        assert expected in out
    memory = (tmp_path / "default" / "memory.md").read_text()
    assert "Note 1: the user said 'I like sailing'" in memory
    assert out.rstrip().endswith("soul.md is still empty, so I have no settled voice yet.")


@needs_cortex
def test_demo_extends_memory_on_a_second_run(tmp_path: Path) -> None:
    root = ["--cortex-root", str(tmp_path), "--persona", "ada"]
    assert agentloop("run", "I like sailing", *root).returncode == 0
    done = agentloop("run", "I moved to Lisbon", *root)
    assert done.returncode == 0, done.stderr
    memory = (tmp_path / "ada" / "memory.md").read_text()
    assert memory.count("- Note ") == 2
    assert memory.index("'I like sailing'") < memory.index("Note 2: the user said 'I moved")
    assert "memory.md now holds 2 note(s)" in done.stdout


@needs_cortex
def test_run_json_output(tmp_path: Path) -> None:
    done = agentloop("run", "hello", "--json", "--cortex-root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) >= {"text", "stop_reason", "rounds", "usage", "tool_calls", "messages"}
    assert (result["stop_reason"], result["rounds"]) == ("end_turn", 3)
    assert result["usage"]["input_tokens"] == 30
    calls = [(c["round"], c["name"], c["is_error"]) for c in result["tool_calls"]]
    assert calls == [(1, "read_file", False), (2, "write_file", False), (2, "read_file", False)]
    # Round 2 asked for both calls in one assistant turn; both answered in one user turn.
    turn = result["messages"][3]
    assert [b["type"] for b in turn["content"]] == ["text", "tool_use", "tool_use"]
    answers = result["messages"][4]["content"]
    assert [b["tool_use_id"] for b in answers] == [b["id"] for b in turn["content"][1:]]


@needs_cortex
def test_offline_flag_with_a_key_and_json_logs(tmp_path: Path) -> None:
    done = agentloop(
        "run", "hi", "--offline", "--log-json", "--cortex-root", str(tmp_path), key="sk-unused"
    )
    assert done.returncode == 0, done.stderr
    assert NO_KEY_NOTICE not in done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "run.start" and names[-1] == "run.end"
    assert names.count("tool.call") == 3
    assert all("timestamp" in e and "level" in e for e in events)


def test_demo_needs_the_cortex_tools(tmp_path: Path) -> None:
    done = agentloop("run", "hi", "--cortex-root", str(tmp_path), **{ENV_VAR: ""})
    assert done.returncode == 2
    assert "the offline demo calls the cortex tools" in done.stderr


# --------------------------------------------------------------------------- real API path


def test_run_with_a_key_talks_to_the_api(tmp_path: Path) -> None:
    with MessagesServer(["Hello from the model."]) as server:
        done = agentloop(
            "run",
            "Say hello",
            "--model",
            "claude-test",
            "--system",
            "Be brief.",
            "--max-tokens",
            "100",
            "--cortex-root",
            str(tmp_path),
            key="sk-ant-test",
            ANTHROPIC_BASE_URL=server.base_url,
        )
    assert done.returncode == 0, done.stderr
    assert NO_KEY_NOTICE not in done.stderr
    assert done.stdout.rstrip().endswith("Hello from the model.")
    assert "(no tool calls)" in done.stdout
    request = server.requests[0]
    assert (request["model"], request["system"], request["max_tokens"]) == (
        "claude-test",
        "Be brief.",
        100,
    )
    assert request["messages"] == [{"role": "user", "content": "Say hello"}]


def test_api_error_exits_1(tmp_path: Path) -> None:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "nope"}}
    with MessagesServer([RawResponse(status=400, json=error)]) as server:
        done = agentloop(
            "run", "hi", "--cortex-root", str(tmp_path), key="k", ANTHROPIC_BASE_URL=server.base_url
        )
    assert done.returncode == 1
    assert "agentloop: error:" in done.stderr and "nope" in done.stderr


# --------------------------------------------------------------------------- listing, usage


def test_plugins_command() -> None:
    done = agentloop("plugins", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    installed = {ep.name for ep in metadata.entry_points(group="agentloop")}
    assert {p["name"] for p in listed["plugins"]} == installed
    assert listed["failures"] == []
    done = agentloop("plugins")
    assert done.returncode == 0
    for name in installed:
        assert any(line.startswith(f"{name} ") for line in done.stdout.splitlines())


def test_plugins_command_with_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "")
    assert main(["plugins"]) == 0
    assert capsys.readouterr().out == "no plugins installed\n"
    assert main(["tools"]) == 0
    assert capsys.readouterr().out == "no plugin tools installed\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "required: COMMAND", id="no-command"),
        pytest.param(["run"], "required: prompt", id="no-prompt"),
        pytest.param(["run", "hi", "--max-rounds", "0"], "must be >= 1", id="bad-number"),
        pytest.param(
            ["run", "hi", "--plugin", "nope"], "unknown plugin name(s): nope", id="plugin"
        ),
        pytest.param(["run", "hi", "--tool", "nope"], "unknown tool name(s): nope", id="tool"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("agentloop ")
