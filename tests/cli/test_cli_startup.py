"""The command's start-up: what `--help` and `tools` import, Ctrl-C while it starts, `--help`.

Each check runs the command in a fresh interpreter (what is imported is per process), with
the installed plugins (cortex and mcp in the dev install) or with none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import with_ctrl_c

from agentloop.plugins import ENV_VAR

# What a run needs and a listing does not: the SDKs, the MCP client, the agent, the test
# doubles (the cortex demo's model), the gateway.
RUN_ONLY = (
    "anthropic",
    "openai",
    "opentelemetry",
    "mcp",
    "agentloop.agent",
    "agentloop.testing",
    "agentloop.gateway.cli",
)


def imported_by(words: list[str], plugins: str | None) -> list[str]:
    """The modules of `RUN_ONLY` (and pydantic) that `agentloop WORDS` imported."""
    heavy = (*RUN_ONLY, "pydantic")
    script = (
        "import contextlib, io, json, sys\n"
        "from agentloop.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({words!r}) == 0\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "AGENTLOOP_MCP_CONFIG")}
    if plugins is not None:
        env[ENV_VAR] = plugins
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("words", [["--help"], ["tools"], ["run", "--help"]])
def test_listing_with_the_plugins_imports_nothing_a_run_needs(words: list[str]) -> None:
    assert imported_by(words, plugins=None) == ["pydantic"]  # the plugins' tools are models


@pytest.mark.parametrize("words", [["--help"], ["tools"], ["serve", "--help"]])
def test_without_plugins_help_imports_not_even_pydantic(words: list[str]) -> None:
    assert imported_by(words, plugins="") == []


def test_ctrl_c_while_the_command_starts_is_one_line() -> None:
    # The real SIGINT, delivered while the command imports its plugin manager.
    script = (
        "import builtins, os, signal\n"
        "from agentloop.cli import main\n"
        "real = builtins.__import__\n"
        "def importing(name, *args, **kwargs):\n"
        "    if name == 'agentloop.plugins':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = importing\n"
        "raise SystemExit(main(['tools']))\n"
    )
    env = {**os.environ, ENV_VAR: ""}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=with_ctrl_c,
    )
    assert (done.returncode, done.stdout) == (130, "")
    assert done.stderr == "agentloop: error: interrupted\n"


@pytest.mark.parametrize(
    ("words", "shown"),
    [
        pytest.param(
            ["run"], "--model MODEL         model name (default: claude-sonnet-5-5)", id="model"
        ),
        pytest.param(
            ["run"], "--max-rounds N        model requests (default: 10)", id="max-rounds"
        ),
        pytest.param(
            ["run"], "--concurrency N       tool calls at once (default: 8)", id="concurrency"
        ),
        pytest.param(["run"], "(default: 4096)", id="max-tokens"),
        pytest.param(["serve"], "tool calls at once (default: 8)", id="serve-concurrency"),
        pytest.param(["serve"], "seconds per tool call (default: 30.0)", id="serve-timeout"),
    ],
)
def test_help_shows_the_defaults(
    words: list[str],
    shown: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agentloop.cli import main

    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*words, "--help"]) == 0
    assert shown in capsys.readouterr().out
