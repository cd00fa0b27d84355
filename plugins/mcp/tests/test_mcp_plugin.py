"""The pluggy plugin: `AGENTLOOP_MCP_CONFIG` names the servers; tools run from any loop."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import pytest
from _mcp_support import SERVER_SCRIPT, ConnectionLog, pid_alive
from agentloop import Agent, PluginManager
from agentloop.testing import ScriptedProvider, reply, tool_call

import agentloop_mcp.plugin
from agentloop_mcp import list_config_tools
from agentloop_mcp.background import close_all


@pytest.fixture
def config(tmp_path: Path, conn_log: ConnectionLog) -> Path:
    path = tmp_path / "mcp.json"
    server = {
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "env": {"MCP_TEST_CONN_LOG": str(conn_log.path)},
        "prefix": "t",
    }
    path.write_text(json.dumps({"mcpServers": {"test": server}}))
    return path


@pytest.fixture(autouse=True)
def _close_shared() -> Iterator[None]:
    yield
    close_all()
    agentloop_mcp.plugin._cli.clear()  # what a command line chose ends with its test
    agentloop_mcp.plugin._warned.clear()  # and so do the warnings it printed once


def manager() -> PluginManager:
    pm = PluginManager()
    pm.register(agentloop_mcp.plugin, name="mcp")
    return pm


def test_registered_under_the_agentloop_entry_point_group() -> None:
    found = {ep.name: ep.value for ep in metadata.entry_points(group="agentloop")}
    assert found["mcp"] == "agentloop_mcp.plugin"


def test_without_a_config_the_plugin_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(agentloop_mcp.plugin.CONFIG_ENV_VAR, raising=False)
    pm = manager()
    assert pm.tools() == []
    assert pm.failures == []


async def test_config_servers_tools_run_in_an_agent(
    config: Path, conn_log: ConnectionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTLOOP_MCP_CONFIG", str(config))
    tools = manager().select(plugins=["mcp"])
    assert "t_echo" in [t.name for t in tools]
    assert all(t.source == "mcp" for t in tools)
    # A second manager (another plugin_tools() call) shares the same servers.
    assert [t.name for t in manager().select(plugins=["mcp"])] == [t.name for t in tools]
    assert len(conn_log.pids()) == 1

    script = [
        reply(
            tool_call("t_echo", {"text": "hi"}),
            tool_call("t_add", {"a": 2, "b": 3}),
            tool_call("t_add", {"a": "2"}),
            tool_call("t_fail", {"message": "nope"}),
        ),
        reply("done"),
    ]
    agent = Agent(provider=ScriptedProvider(script), tools=tools)
    result = await agent.run("go")
    assert [(c.output, c.is_error) for c in result.tool_calls] == [
        ("hi", False),
        ("5", False),
        (
            "Invalid input for tool 't_add'. Fix these and call it again:\n"
            "- a: '2' is not of type 'integer' (got \"2\")\n"
            "- b: required argument is missing",
            True,
        ),
        ("Error executing tool fail: nope", True),
    ]

    # A call cut off on the agent's side is cancelled on the source's loop too.
    by_name = {t.name: t for t in tools}
    with anyio.move_on_after(0.5) as scope:
        await by_name["t_block"](tag="b")
    assert scope.cancelled_caught
    assert await by_name["t_echo"](text="after") == "after"

    [pid] = conn_log.pids()
    close_all()
    assert not pid_alive(pid)


def test_a_bad_config_is_a_plugin_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOOP_MCP_CONFIG", str(tmp_path / "missing.json"))
    pm = manager()
    assert pm.tools() == []
    [failure] = pm.failures
    assert failure.name == "mcp"
    assert "cannot read the MCP config" in failure.error


def test_list_config_tools_for_the_command_line(config: Path, conn_log: ConnectionLog) -> None:
    infos = {info.name: info for info in list_config_tools(config)}
    echo = infos["t_echo"]
    assert (echo.server, echo.mcp_name, echo.description, echo.retryable) == (
        "test",
        "echo",
        "Return the text unchanged.",
        True,
    )
    assert infos["t_dotted_name"].mcp_name == "dotted.name"
    assert infos["t_add"].retryable is False
    [pid] = conn_log.pids()
    assert not pid_alive(pid)  # listed, then stopped


def test_the_tools_command_lists_a_config_servers_tools(config: Path) -> None:
    """`agentloop tools --plugin mcp --mcp-config FILE`, as a user runs it."""
    import os
    import subprocess

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AGENTLOOP_PLUGINS", "AGENTLOOP_MCP_CONFIG")
    }
    command = [sys.executable, "-m", "agentloop", "tools", "--plugin", "mcp", "--mcp-config"]
    done = subprocess.run(
        [*command, str(config), "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed and {t["plugin"] for t in listed} == {"mcp"}
    assert all(t["name"].startswith("t_") for t in listed)

    missing = subprocess.run(
        [*command, str(config.parent / "nope.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "nope.json" in missing.stderr


def test_a_config_on_the_command_line_exposes_the_tools_and_instructions(
    config: Path, tmp_path: Path
) -> None:
    """`--mcp-config` needs no `--plugin mcp`; `instructions: true` gives the system prompt."""
    import argparse

    setup = agentloop_mcp.plugin.agentloop_run_setup(
        argparse.Namespace(mcp_config=str(config), mcp_strict=False, plugins=None)
    )
    assert setup is not None and setup.exposed_by_default and setup.system is None
    chosen = ["cortex"]
    agentloop_mcp.plugin.agentloop_run_setup(
        argparse.Namespace(mcp_config=str(config), mcp_strict=False, plugins=chosen)
    )
    assert chosen == ["cortex", "mcp"]  # the config file is given to be used

    data = json.loads(config.read_text())
    data["mcpServers"]["test"]["instructions"] = True
    told = tmp_path / "told.json"
    told.write_text(json.dumps(data))
    setup = agentloop_mcp.plugin.agentloop_run_setup(
        argparse.Namespace(mcp_config=str(told), mcp_strict=False, plugins=None)
    )
    assert setup is not None
    assert setup.system == "## MCP server test\n\nCall test-server's echo to echo."


def test_the_mcp_command_shows_resources_and_prompts(config: Path) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOOP_")}
    env["AGENTLOOP_MCP_PROTOCOL_CACHE"] = os.environ["AGENTLOOP_MCP_PROTOCOL_CACHE"]

    def mcp(*words: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "agentloop", "mcp", *words, "--mcp-config", str(config)]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    listed = mcp("resources", "test")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "notes://today  today (text/plain): Today's notes.\n"
    assert mcp("read", "test", "notes://today").stdout == "buy milk\n"
    templates = mcp("templates", "test")
    assert templates.stdout == "notes://day/{day}  day (text/plain): One day's notes.\n"
    assert mcp("prompts", "test").stdout == "review(code): Review a piece of code.\n"
    filled = mcp("prompt", "test", "review", "code=x = 1")
    assert filled.stdout == "user: Please review:\nx = 1\n"
    unknown = mcp("prompts", "ghost")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().endswith(
        "no MCP server 'ghost' in " + str(config) + " (servers: test)"
    )


GHOST = {"mcpServers": {"ghost": {"command": "/nonexistent/mcp-server"}}}
NO_SERVERS = (
    "agentloop: error: --mcp-strict needs MCP servers: give --mcp-config FILE "
    "(or set AGENTLOOP_MCP_CONFIG)"
)
NOT_USED = (
    "agentloop: error: --mcp-strict applies to the mcp plugin's tools, which this command "
    "does not use: add --plugin mcp"
)


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """`agentloop WORDS...` in this process, with the cortex and mcp plugins: (code, stderr)."""
    from agentloop.cli import main

    monkeypatch.setenv("AGENTLOOP_PLUGINS", "cortex,mcp")
    monkeypatch.delenv("AGENTLOOP_MCP_CONFIG", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    def run(*words: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(words))
        return code, capsys.readouterr().err

    yield run


@pytest.mark.parametrize(
    ("words", "from_env", "refused"),
    [
        pytest.param(("run", "hi", "--mcp-strict"), False, NO_SERVERS, id="run-no-config"),
        pytest.param(("tools", "--mcp-strict"), False, NO_SERVERS, id="tools-no-config"),
        pytest.param(
            ("tools", "--plugin", "mcp", "--mcp-strict"), False, NO_SERVERS, id="tools-mcp"
        ),
        pytest.param(
            ("run", "hi", "--mcp-strict"),
            True,
            NOT_USED + " (or give --mcp-config FILE)",
            id="run-env-config-not-exposed",
        ),
        pytest.param(
            ("run", "hi", "--plugin", "cortex", "--mcp-strict"),
            True,
            NOT_USED + " (or give --mcp-config FILE)",
            id="run-other-plugin",
        ),
        pytest.param(
            ("tools", "--plugin", "cortex", "--mcp-strict"), True, NOT_USED, id="tools-other"
        ),
        pytest.param(
            ("serve", "--upstream", "http://127.0.0.1:9", "--mcp-strict"),
            True,
            NOT_USED,
            id="serve-no-plugin",
        ),
    ],
)
def test_mcp_strict_where_it_means_nothing_is_a_usage_error(
    command: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    words: tuple[str, ...],
    from_env: bool,
    refused: str,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # a run that went ahead would write here
    if from_env:
        path = tmp_path / "ghost.json"
        path.write_text(json.dumps(GHOST))
        monkeypatch.setenv("AGENTLOOP_MCP_CONFIG", str(path))
    code, err = command(*words)
    assert (code, err) == (2, refused + "\n")
    assert not (tmp_path / "cortex").exists()


@pytest.mark.parametrize(
    "words",
    [
        pytest.param(("tools",), id="tools"),
        pytest.param(("tools", "--plugin", "cortex"), id="tools-other-plugin"),
        pytest.param(("run", "hi", "--offline"), id="run"),
    ],
)
def test_mcp_strict_makes_a_failed_server_an_error_wherever_the_config_is_used(
    command: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # cortex keeps its files in the working directory
    path = tmp_path / "ghost.json"
    path.write_text(json.dumps(GHOST))
    lenient, warned = command(*words, "--mcp-config", str(path))
    assert lenient == 0
    assert warned.startswith("agentloop: warning: MCP server 'ghost' left out")
    code, err = command(*words, "--mcp-config", str(path), "--mcp-strict")
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith("agentloop: error: plugin 'mcp' failed: MCPConnectError: ")
    assert "'ghost'" in line


RAW_SERVER = Path(__file__).with_name("raw_server.py")


@pytest.mark.parametrize("words", [("tools",), ("run", "hi", "--offline")], ids=["tools", "run"])
def test_a_tool_another_plugin_has_is_left_out_with_one_warning(
    command: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: tuple[str, ...]
) -> None:
    """cortex has `read_file`; so does this server (as server-filesystem does)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # cortex keeps its files in the working directory
    listing = [{"name": n, "inputSchema": {"type": "object"}} for n in ("read_file", "list_dir")]
    server = {
        "command": sys.executable,
        "args": [str(RAW_SERVER), "--tools", json.dumps(listing)],
        "protocol": "legacy",
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"files": server}}))
    code, err = command(*words, "--mcp-config", str(path))
    assert code == 0, err
    [line] = [line for line in err.splitlines() if "warning" in line]
    assert line == (
        "agentloop: warning: tool 'read_file' of plugin 'mcp' left out: plugin 'cortex' "
        "registers a tool of that name; it is MCP server 'files''s 'read_file': give that "
        'server a "prefix" in the MCP config to keep it'
    )
    manager = PluginManager()
    manager.load_entry_points()
    tools = {t.name: t.source for t in manager.tools()}
    assert tools["read_file"] == "cortex" and tools["list_dir"] == "mcp"
    assert manager.left_out == [line.removeprefix("agentloop: warning: ")]


@pytest.mark.parametrize("words", [("tools",), ("run", "hi", "--offline")], ids=["tools", "run"])
def test_a_server_writing_stray_lines_is_one_warning_line(
    command: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    server = {
        "command": sys.executable,
        "args": [str(RAW_SERVER), "--garbage"],  # a stray line for each line it reads
        "protocol": "legacy",
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"chatty": server}}))
    code, err = command(*words, "--mcp-config", str(path))
    assert code == 0, err
    assert "Traceback" not in err and "Failed to parse" not in err
    [line] = [line for line in err.splitlines() if "chatty" in line]
    assert "mcp.not_a_message" in line and "this is not JSON-RPC" in line
