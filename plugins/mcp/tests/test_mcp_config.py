"""Declaring servers in code and reading them from `mcpServers` config files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from agentloop import ConfigurationError

from agentloop_mcp import MCPConfigError, MCPSampling, MCPServer, load_config, parse_config

DOCS = Path(__file__).resolve().parents[3] / "docs" / "mcp.md"


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_servers_in_code() -> None:
    local = MCPServer.stdio("/usr/bin/my-server", ["--root", "/data"], env={"K": "v"}, prefix="fs")
    assert (local.name, local.transport, local.command, local.args) == (
        "my-server",
        "stdio",
        "/usr/bin/my-server",
        ("--root", "/data"),
    )
    assert local.env == {"K": "v"} and local.prefix == "fs"
    assert local.describe() == "/usr/bin/my-server --root /data"
    remote = MCPServer.http("https://tools.example.com/mcp", headers={"Authorization": "Bearer t"})
    assert (remote.name, remote.transport, remote.url) == (
        "tools_example_com",
        "http",
        "https://tools.example.com/mcp",
    )
    assert remote.describe() == "https://tools.example.com/mcp"  # headers are not shown


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: MCPServer.http("ftp://x/mcp"), "http:// or https://", id="scheme"),
        pytest.param(lambda: MCPServer.http("http:///mcp"), "http:// or https://", id="no-host"),
        pytest.param(lambda: MCPServer.stdio(""), "needs a command", id="no-command"),
        pytest.param(lambda: MCPServer.stdio("x", "a b"), "list of strings", id="args-string"),
        pytest.param(lambda: MCPServer.stdio("x", prefix="..."), "prefix '...'", id="prefix"),
        pytest.param(lambda: MCPServer.stdio("x", name=" "), "non-empty name", id="name"),
        pytest.param(lambda: MCPServer.stdio("x", protocol="1999"), "protocol", id="protocol"),
        pytest.param(
            lambda: MCPServer.stdio("x", connect_timeout=-1), "connect_timeout", id="connect"
        ),
        pytest.param(lambda: MCPServer.stdio("x", timeout=0), "timeout", id="timeout"),
        pytest.param(
            lambda: MCPServer.stdio("x", sampling_model=" "), "sampling_model", id="sampling-model"
        ),
        pytest.param(
            lambda: MCPServer.stdio("x", sampling_max_requests=0),
            "sampling_max_requests must be > 0",
            id="sampling-requests",
        ),
        pytest.param(
            lambda: MCPServer.stdio("x", sampling_max_tokens=-1),
            "sampling_max_tokens must be > 0",
            id="sampling-tokens",
        ),
        pytest.param(
            lambda: MCPSampling(max_requests=0), "max_requests and max_tokens", id="sampling"
        ),
    ],
)
def test_bad_declarations(make: Any, message: str) -> None:
    with pytest.raises(MCPConfigError, match=re.escape(message)):
        make()
    assert issubclass(MCPConfigError, ConfigurationError)


def test_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    monkeypatch.delenv("MCP_TEST_UNSET", raising=False)
    path = write(
        tmp_path,
        {
            "mcpServers": {
                "files": {
                    "command": "npx",
                    "args": ["-y", "files-server", "${MCP_TEST_UNSET:-/srv}"],
                    "env": {"TOKEN": "${MCP_TEST_TOKEN}"},
                    "prefix": "fs",
                    "alwaysAllow": ["read"],  # another client's key: ignored
                },
                "search": {
                    "type": "http",
                    "url": "https://search.example.com/mcp",
                    "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"},
                    "timeout": 5,
                },
                "old": {"command": "old-server", "disabled": True},
            }
        },
    )
    files, search = load_config(path)
    assert files == MCPServer.stdio(
        "npx", ["-y", "files-server", "/srv"], env={"TOKEN": "s3cret"}, name="files", prefix="fs"
    )
    assert search == MCPServer.http(
        "https://search.example.com/mcp",
        headers={"Authorization": "Bearer s3cret"},
        name="search",
        timeout=5,
    )


def test_configs_of_other_clients(tmp_path: Path) -> None:
    # VS Code: a `servers` root, with `type` on each entry.
    vscode = parse_config(
        {
            "servers": {
                "my.files": {"type": "stdio", "command": "files-server"},
                "remote": {"type": "http", "url": "https://h.example/api"},
                "legacy": {"type": "sse", "url": "https://h.example/events"},
            },
            "inputs": [],
        }
    )
    assert [(s.name, s.transport) for s in vscode] == [
        ("my.files", "stdio"),
        ("remote", "http"),
        ("legacy", "sse"),
    ]
    # Windsurf: `serverUrl`; Cursor: a bare `url` ending in /sse is the SSE transport.
    windsurf, cursor, modern = parse_config(
        {
            "mcpServers": {
                "w": {"serverUrl": "https://w.example/mcp"},
                "c": {"url": "https://c.example/sse"},
                "m": {"url": "https://m.example/mcp/"},
            }
        }
    )
    assert (windsurf.transport, windsurf.url) == ("http", "https://w.example/mcp")
    assert cursor.transport == "sse" and modern.transport == "http"


def test_per_server_options() -> None:
    [server] = parse_config(
        {
            "mcpServers": {
                "git.local": {
                    "command": "git-server",
                    "timeout": 5,
                    "connect_timeout": 2.5,
                    "protocol": "2025-06-18",
                    "include": ["git_*", "status"],
                    "exclude": ["git_push"],
                    "prefix": "git.local",
                    "instructions": True,
                    "max_result_chars": 5000,
                    "sampling_model": "claude-sonnet-5-5",
                    "sampling_max_requests": 3,
                    "sampling_max_tokens": 4000,
                }
            }
        }
    )
    assert server.name == "git.local" and server.timeout == 5
    assert (server.connect_timeout, server.protocol, server.mode) == (2.5, "2025-06-18", "legacy")
    assert [server.offers(n) for n in ("git_log", "status", "git_push", "rm")] == [
        True,
        True,
        False,
        False,
    ]
    assert server.instructions is True and server.max_result_chars == 5000
    assert (server.sampling, server.sampling_model) == (True, "claude-sonnet-5-5")
    assert (server.sampling_max_requests, server.sampling_max_tokens) == (3, 4000)
    assert MCPServer.stdio("x", protocol="2026-07-28").mode == "2026-07-28"
    assert MCPServer.stdio("x").mode == "auto"


def test_the_documented_example_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "t")
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(), re.DOTALL)
    example = next(json.loads(b) for b in blocks if "mcpServers" in b)
    servers = parse_config(example)
    assert [s.transport for s in servers] == ["stdio", "http"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param("{not json", "not valid JSON (line 1, column 2)", id="json"),
        pytest.param([], "expected a JSON object with an 'mcpServers' object", id="list"),
        pytest.param({}, "'mcpServers' must be an object of servers (missing)", id="missing"),
        pytest.param({"mcpServers": []}, "(a list)", id="servers-list"),
        pytest.param(
            {"mcpServers": {"a": "npx"}},
            "mcpServers.a: expected an object, got a string",
            id="entry",
        ),
        pytest.param(
            {"mcpServers": {"a": {}}}, "mcpServers.a: give either 'command'", id="neither"
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}}, "give either", id="both"
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": 3}}},
            "mcpServers.a.command: expected a non-empty string",
            id="command",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "args": "y"}}},
            "mcpServers.a.args: expected a list of strings",
            id="args",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}},
            "mcpServers.a.env: expected an object of strings",
            id="env",
        ),
        pytest.param(
            {"mcpServers": {"a": {"url": "http://h/mcp", "headers": []}}},
            "mcpServers.a.headers",
            id="headers",
        ),
        pytest.param(
            {"mcpServers": {"a": {"url": "h/mcp"}}},
            "mcpServers.a: MCP server 'a': url must be",
            id="url",
        ),
        pytest.param(
            {"mcpServers": {"a": {"type": "websocket", "url": "ws://h/ws"}}},
            "unsupported type 'websocket' (use 'stdio', 'http' or 'sse')",
            id="type",
        ),
        pytest.param(
            {"mcpServers": {"a": {"type": "stdio", "url": "http://h/mcp"}}},
            "type 'stdio' needs a 'command'",
            id="type-stdio",
        ),
        pytest.param(
            {"servers": {"a": {"command": "x", "include": "read"}}},
            "servers.a.include: expected a list of tool names",
            id="include",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "instructions": "yes"}}},
            "mcpServers.a.instructions: expected true or false",
            id="instructions",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "timeout": "5"}}},
            "mcpServers.a.timeout: expected a number",
            id="timeout",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "sampling_max_tokens": "5"}}},
            "mcpServers.a.sampling_max_tokens: expected a number of tokens",
            id="sampling-tokens",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "sampling_model": 5}}},
            "mcpServers.a.sampling_model: expected a model name",
            id="sampling-model",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "x", "sampling_max_requests": 0}}},
            "mcpServers.a: MCP server 'a': sampling_max_requests must be > 0",
            id="sampling-zero",
        ),
        pytest.param(
            {"mcpServers": {"a": {"command": "${MCP_TEST_NEVER_SET}"}}},
            "mcpServers.a.command: environment variable MCP_TEST_NEVER_SET is not set",
            id="variable",
        ),
    ],
)
def test_bad_config_files_say_where_and_why(tmp_path: Path, data: Any, message: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(MCPConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MCPConfigError, match="cannot read the MCP config"):
        load_config(tmp_path / "nope.json")


def test_a_null_max_result_chars_sends_results_whole() -> None:
    [whole, default] = parse_config(
        {"mcpServers": {"a": {"command": "x", "max_result_chars": None}, "b": {"command": "x"}}}
    )
    assert whole.max_result_chars is None
    assert default.max_result_chars == 1_000_000


def test_a_vs_code_input_variable_is_refused_clearly() -> None:
    entry = {
        "url": "https://example.com/mcp",
        "headers": {"Authorization": "Bearer ${input:token}"},
    }
    with pytest.raises(MCPConfigError) as caught:
        parse_config({"servers": {"gh": entry}}, origin="mcp.json")
    assert str(caught.value) == (
        "mcp.json: servers.gh.headers.Authorization: ${input:token} asks VS Code to prompt "
        "for a value, which agentloop does not do; write ${VARIABLE} and set that "
        "environment variable"
    )


def test_require_approval_is_read_and_checked() -> None:
    [server] = parse_config({"mcpServers": {"a": {"command": "x", "require_approval": "always"}}})
    assert server.require_approval == "always"
    assert MCPServer.stdio("x").require_approval == "never"
    with pytest.raises(MCPConfigError, match="require_approval must be 'never', 'always' or"):
        parse_config({"mcpServers": {"a": {"command": "x", "require_approval": "sometimes"}}})
