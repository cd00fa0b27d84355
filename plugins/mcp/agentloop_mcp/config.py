"""Which MCP servers to use: declared in code, or read from an `mcpServers` config file.

An `MCPServer` only describes how to reach a server (a command to start over stdio, or a
streamable-HTTP URL) and how to name its tools; nothing here connects. `load_config`
reads the JSON shape MCP clients already share and turns each entry into an `MCPServer`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from agentloop import ConfigurationError

from .content import DEFAULT_MAX_RESULT_CHARS

__all__ = ("MCPConfigError", "MCPServer", "load_config", "parse_config")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class MCPConfigError(ConfigurationError):
    """An MCP server declaration or config file that cannot be used; the message says why."""


@dataclass(frozen=True, kw_only=True)
class MCPServer:
    """How to reach one MCP server and how to name its tools.

    Build one with `MCPServer.stdio(...)` or `MCPServer.http(...)`, or read them from a
    file with `load_config`.
    """

    name: str
    """The server's name in logs and error messages (a config file's key)."""
    transport: Literal["stdio", "http"]
    """`"stdio"`: start `command` and talk over its stdin/stdout; `"http"`: streamable HTTP."""
    command: str | None = None
    """The executable to start (stdio)."""
    args: tuple[str, ...] = ()
    """Its arguments (stdio)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables for the process, on top of a minimal safe set (HOME, PATH, ...)."""
    cwd: str | None = None
    """Working directory of the process (stdio); the current one when None."""
    url: str | None = None
    """The endpoint, e.g. `http://127.0.0.1:8000/mcp` (http)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers sent with every HTTP request, e.g. `Authorization` (http)."""
    prefix: str | None = None
    """Tool names become `<prefix>_<name>`, to keep two servers' tools apart."""
    timeout: float | None = None
    """Seconds a call of this server's tools may take; the agent's `tool_timeout` when None."""
    max_result_chars: int | None = DEFAULT_MAX_RESULT_CHARS
    """A tool result longer than this (characters of text plus base64 data) is cut, with a
    note saying so; None sends results whole."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise MCPConfigError(
                f"MCP server name {self.name!r}: use 1-64 letters, digits, '_' or '-'"
            )
        where = f"MCP server {self.name!r}"
        if self.transport == "stdio":
            if not self.command:
                raise MCPConfigError(f"{where}: a stdio server needs a command")
        elif self.transport == "http":
            parts = urlsplit(self.url or "")
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise MCPConfigError(
                    f"{where}: url must be an http:// or https:// URL, got {self.url!r}"
                )
        else:
            raise MCPConfigError(f"{where}: transport must be 'stdio' or 'http'")
        if self.prefix is not None and not _NAME.match(self.prefix):
            raise MCPConfigError(
                f"{where}: prefix {self.prefix!r}: use 1-64 letters, digits, '_' or '-'"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise MCPConfigError(f"{where}: timeout must be > 0 seconds, got {self.timeout!r}")
        if self.max_result_chars is not None and not self.max_result_chars > 0:
            raise MCPConfigError(f"{where}: max_result_chars must be > 0")

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server started as a subprocess and spoken to over its stdin and stdout.

        Args:
            command: The executable, e.g. `"npx"` or `sys.executable`.
            args: Its arguments.
            env: Extra environment variables for the process.
            cwd: Its working directory.
            name: The server's name in messages; defaults to the command's file name.
            prefix: Tool names become `<prefix>_<name>`.
            timeout: Seconds a call may take (default: the agent's `tool_timeout`).
            **options: Any other field of `MCPServer` (`max_result_chars`, ...).
        """
        if isinstance(args, str):
            raise MCPConfigError(f"args must be a list of strings, not the string {args!r}")
        default = _safe_name(Path(command).name) if command else "stdio"
        return cls(
            name=name or default,
            transport="stdio",
            command=command,
            args=tuple(args),
            env=dict(env or {}),
            cwd=None if cwd is None else os.fspath(cwd),
            prefix=prefix,
            timeout=timeout,
            **options,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server reached over streamable HTTP.

        Args:
            url: The MCP endpoint, e.g. `"https://example.com/mcp"`.
            headers: Headers for every request (authorization, API keys).
            name: The server's name in messages; defaults to the URL's host.
            prefix: Tool names become `<prefix>_<name>`.
            timeout: Seconds a call may take (default: the agent's `tool_timeout`).
            **options: Any other field of `MCPServer` (`max_result_chars`, ...).
        """
        host = urlsplit(url).hostname or "http"
        return cls(
            name=name or _safe_name(host),
            transport="http",
            url=url,
            headers=dict(headers or {}),
            prefix=prefix,
            timeout=timeout,
            **options,
        )

    def describe(self) -> str:
        """The command line or URL, for messages (header and environment values left out)."""
        if self.transport == "stdio":
            return " ".join([str(self.command), *self.args])
        return str(self.url)


def _safe_name(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:64]
    return cleaned or "server"


# --------------------------------------------------------------------------- config files


def load_config(path: str | os.PathLike[str]) -> list[MCPServer]:
    """The servers of a config file in the shape MCP clients share.

    ```json
    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "some-mcp-server", "/data"]},
        "search": {"url": "https://example.com/mcp",
                   "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}
    ```

    Each entry has either `command` (with optional `args`, `env`, `cwd`) or `url` (with
    optional `headers`); optional `type` (`"stdio"`, `"http"` or `"streamable-http"`),
    `prefix`, `timeout` and `disabled` are understood too, and other keys are ignored (they
    belong to other clients). `${VAR}` and `${VAR:-default}` in strings are replaced with
    environment variables, so secrets need not be written in the file.

    Raises:
        MCPConfigError: the file cannot be read, is not JSON, or an entry is invalid; the
            message names the file and the entry.
    """
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MCPConfigError(f"{where}: cannot read the MCP config: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MCPConfigError(
            f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from exc
    return parse_config(data, origin=where)


def parse_config(data: Any, *, origin: str = "MCP config") -> list[MCPServer]:
    """The servers of an already-parsed config (see `load_config`), in file order.

    Args:
        data: The decoded JSON: an object with an `mcpServers` object.
        origin: Named in error messages (a file name).

    Raises:
        MCPConfigError: the shape is wrong; the message names the entry and the key.
    """
    if not isinstance(data, Mapping):
        raise MCPConfigError(f"{origin}: expected a JSON object with an 'mcpServers' object")
    entries = data.get("mcpServers")
    if not isinstance(entries, Mapping):
        found = "missing" if entries is None else f"a {_json_type(entries)}"
        raise MCPConfigError(f"{origin}: 'mcpServers' must be an object of servers ({found})")
    servers = []
    for name, entry in entries.items():
        server = _parse_entry(str(name), entry, f"{origin}: mcpServers.{name}")
        if server is not None:
            servers.append(server)
    return servers


def _parse_entry(name: str, entry: Any, where: str) -> MCPServer | None:
    if not isinstance(entry, Mapping):
        raise MCPConfigError(f"{where}: expected an object, got a {_json_type(entry)}")
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type")
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp"):
        hint = " (use streamable HTTP)" if kind == "sse" else ""
        raise MCPConfigError(f"{where}: unsupported type {kind!r}{hint}")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise MCPConfigError(
            f"{where}: give either 'command' (a server started over stdio) or 'url' "
            "(a streamable-HTTP server)"
        )
    if kind == "stdio" and not has_command:
        raise MCPConfigError(f"{where}: type 'stdio' needs a 'command'")
    if kind not in (None, "stdio") and not has_url:
        raise MCPConfigError(f"{where}: type {kind!r} needs a 'url'")
    prefix = _optional_string(entry, "prefix", where)
    timeout = entry.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise MCPConfigError(f"{where}.timeout: expected a number of seconds")
    try:
        if has_command:
            command = _string(entry, "command", where)
            return MCPServer.stdio(
                command,
                _strings(entry, "args", where),
                env=_string_map(entry, "env", where),
                cwd=_optional_string(entry, "cwd", where),
                name=_server_name(name, where),
                prefix=prefix,
                timeout=timeout,
            )
        return MCPServer.http(
            _string(entry, "url", where),
            headers=_string_map(entry, "headers", where),
            name=_server_name(name, where),
            prefix=prefix,
            timeout=timeout,
        )
    except MCPConfigError as exc:
        if str(exc).startswith(where):
            raise
        raise MCPConfigError(f"{where}: {exc}") from exc


def _server_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise MCPConfigError(f"{where}: server names use 1-64 letters, digits, '_' or '-'")
    return name


def _string(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise MCPConfigError(f"{where}.{key}: expected a non-empty string")
    return _expand(value, f"{where}.{key}")


def _optional_string(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    if entry.get(key) is None:
        return None
    return _string(entry, key, where)


def _strings(entry: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MCPConfigError(f"{where}.{key}: expected a list of strings")
    return [_expand(v, f"{where}.{key}[{i}]") for i, v in enumerate(value)]


def _string_map(entry: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise MCPConfigError(f"{where}.{key}: expected an object of strings")
    return {str(k): _expand(v, f"{where}.{key}.{k}") for k, v in value.items()}


def _expand(value: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name)
        if found is not None:
            return found
        if default is not None:
            return default
        raise MCPConfigError(
            f"{where}: environment variable {name} is not set (write ${{{name}:-default}} "
            "for a default)"
        )

    return _VARIABLE.sub(replace, value)


def _json_type(value: Any) -> str:
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__
