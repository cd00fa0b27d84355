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
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from agentloop import ConfigurationError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS

from .content import DEFAULT_MAX_RESULT_CHARS

__all__ = ("MCPConfigError", "MCPOAuth", "MCPServer", "load_config", "parse_config")

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_PROMPTED = re.compile(r"\$\{input:[^}]*\}")
"""VS Code's `${input:id}`: a value its editor prompts for (from the file's `inputs`)."""


class MCPConfigError(ConfigurationError):
    """An MCP server declaration or config file that cannot be used; the message says why."""


DEFAULT_CALLBACK_PORT = 33418
"""The port of the local page the browser is sent back to after an OAuth login."""


@dataclass(frozen=True, kw_only=True)
class MCPOAuth:
    """How to log in to an HTTP server that wants OAuth (see `agentloop_mcp.auth`).

    With the defaults, the server's authorization server is discovered from its metadata
    and agentloop registers itself as a client there (dynamic client registration).
    """

    client_id: str | None = None
    """A client registered beforehand with the authorization server; None registers one."""
    client_secret: str | None = None
    """That client's secret, when it has one."""
    scopes: tuple[str, ...] = ()
    """Scopes to ask for; the server's advertised ones when empty."""
    callback_port: int = DEFAULT_CALLBACK_PORT
    """The port on 127.0.0.1 where the browser is sent back with the authorization code."""
    client_name: str = "agentloop"
    """The name the authorization server shows on its consent page."""

    def __post_init__(self) -> None:
        if not 0 < self.callback_port < 65536:
            raise MCPConfigError(f"callback_port must be a TCP port, got {self.callback_port!r}")
        if self.client_secret is not None and self.client_id is None:
            raise MCPConfigError("client_secret needs the client_id it belongs to")

    @property
    def redirect_uri(self) -> str:
        """Where the authorization server sends the browser back to."""
        return f"http://127.0.0.1:{self.callback_port}/callback"


@dataclass(frozen=True, kw_only=True)
class MCPServer:
    """How to reach one MCP server and how to name its tools.

    Build one with `MCPServer.stdio(...)` or `MCPServer.http(...)`, or read them from a
    file with `load_config`.
    """

    name: str
    """The server's name in logs and error messages (a config file's key); any text."""
    transport: Literal["stdio", "http", "sse"]
    """`"stdio"`: start `command` and talk over its stdin/stdout; `"http"`: streamable HTTP;
    `"sse"`: the legacy HTTP+SSE transport (a GET event stream and a POST endpoint)."""
    command: str | None = None
    """The executable to start (stdio)."""
    args: tuple[str, ...] = ()
    """Its arguments (stdio)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables for the process, on top of a minimal safe set (HOME, PATH, ...)."""
    cwd: str | None = None
    """Working directory of the process (stdio); the current one when None."""
    url: str | None = None
    """The endpoint, e.g. `http://127.0.0.1:8000/mcp` (http) or `.../sse` (sse)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers sent with every HTTP request, e.g. `Authorization` (http, sse)."""
    prefix: str | None = None
    """Tool names become `<prefix>_<name>`, to keep two servers' tools apart (characters
    the API does not allow in a name become `_`)."""
    timeout: float | None = None
    """Seconds a call of this server's tools may take; the agent's `tool_timeout` when None."""
    max_result_chars: int | None = DEFAULT_MAX_RESULT_CHARS
    """A tool result longer than this (characters of text plus base64 data) is cut, with a
    note saying so; None sends results whole."""
    connect_timeout: float | None = None
    """Seconds the server may take to start and answer; the tool source's when None."""
    protocol: str = "auto"
    """How to agree on the protocol version: `"auto"` asks the server (`server/discover`)
    and falls back to the initialize handshake when it gets no answer; `"legacy"` or a
    handshake-era version (`"2025-11-25"`, ...) goes straight to the handshake; a newer
    version (`"2026-07-28"`) is adopted without asking. A fixed choice saves the probe's
    wait on servers that ignore requests they do not know."""
    include: tuple[str, ...] | None = None
    """Offer only the tools whose names (on the server) match one of these patterns
    (`fnmatch` style: `read_*`); every tool when None."""
    exclude: tuple[str, ...] = ()
    """Never offer the tools whose names match one of these patterns."""
    instructions: bool = False
    """Add the server's `instructions` to the agent's system prompt (see
    `MCPToolSource.instructions()`)."""
    roots: tuple[str, ...] = ()
    """Directories the server may work in, offered as its roots (none by default)."""
    progress: bool = True
    """Send a `progressToken` with each call; the server's progress notifications become
    `ToolProgress` events of a streamed run and restart `idle_timeout`."""
    idle_timeout: float | None = None
    """Seconds a call may go without an answer or a progress notification (None: no such
    limit; `timeout` still bounds the whole call)."""
    elicitation: bool = True
    """Let the server ask the user questions, when the tool source has a handler."""
    sampling: bool = True
    """Let the server ask for a model response (`sampling/createMessage`), answered by the
    calling run's model (see `MCPSampling`) and counted in its usage."""
    sampling_model: str | None = None
    """The model that answers this server's sampling requests, from the calling run's
    provider; the run's own model (or `MCPSampling.model`) when None."""
    sampling_max_requests: int | None = None
    """Sampling requests this server may make while the tool source is open; further ones
    are refused. `MCPSampling.max_requests` (10) when None."""
    sampling_max_tokens: int | None = None
    """Tokens (input and output) this server's sampling requests may spend while the tool
    source is open. `MCPSampling.max_tokens` (20,000) when None."""
    require_approval: Literal["never", "always", "destructive"] = "never"
    """Calls of this server's tools that wait for a person's decision (agentloop's approval
    flow): `"always"` every call, `"destructive"` those of tools not marked read-only or
    `destructiveHint: false`, `"never"` none."""
    resources_tool: bool = False
    """Offer the model a tool `<prefix or name>_read_resource` that reads this server's
    resources by URI (its description lists them)."""
    auth: MCPOAuth | None = None
    """Log in with OAuth (http, sse): tokens come from `agentloop mcp login` and are kept
    on disk (see `agentloop_mcp.auth`); None sends only `headers`."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise MCPConfigError("an MCP server needs a non-empty name")
        where = f"MCP server {self.name!r}"
        if self.transport == "stdio":
            if not self.command:
                raise MCPConfigError(f"{where}: a stdio server needs a command")
        elif self.transport in ("http", "sse"):
            parts = urlsplit(self.url or "")
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise MCPConfigError(
                    f"{where}: url must be an http:// or https:// URL, got {self.url!r}"
                )
        else:
            raise MCPConfigError(f"{where}: transport must be 'stdio', 'http' or 'sse'")
        if self.auth is not None and self.transport == "stdio":
            raise MCPConfigError(f"{where}: OAuth (auth) is for servers reached over HTTP")
        if self.prefix is not None and not _safe_name(self.prefix, ""):
            raise MCPConfigError(f"{where}: prefix {self.prefix!r} has no usable character")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise MCPConfigError(f"{where}: idle_timeout must be > 0 seconds")
        if self.connect_timeout is not None and not self.connect_timeout > 0:
            raise MCPConfigError(f"{where}: connect_timeout must be > 0 seconds")
        if self.protocol not in ("auto", "legacy", *SUPPORTED_PROTOCOL_VERSIONS):
            raise MCPConfigError(
                f"{where}: protocol must be 'auto', 'legacy' or one of "
                f"{', '.join(SUPPORTED_PROTOCOL_VERSIONS)}; got {self.protocol!r}"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise MCPConfigError(f"{where}: timeout must be > 0 seconds, got {self.timeout!r}")
        if self.max_result_chars is not None and not self.max_result_chars > 0:
            raise MCPConfigError(f"{where}: max_result_chars must be > 0")
        if self.require_approval not in ("never", "always", "destructive"):
            raise MCPConfigError(
                f"{where}: require_approval must be 'never', 'always' or 'destructive', "
                f"got {self.require_approval!r}"
            )
        if self.sampling_model is not None and not self.sampling_model.strip():
            raise MCPConfigError(f"{where}: sampling_model must name a model")
        for limit in ("sampling_max_requests", "sampling_max_tokens"):
            value = getattr(self, limit)
            if value is not None and not value > 0:
                raise MCPConfigError(f"{where}: {limit} must be > 0, got {value!r}")

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
        transport: Literal["http", "sse"] | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server reached over HTTP: streamable HTTP, or the legacy HTTP+SSE transport.

        Args:
            url: The MCP endpoint, e.g. `"https://example.com/mcp"`.
            headers: Headers for every request (authorization, API keys).
            name: The server's name in messages; defaults to the URL's host.
            prefix: Tool names become `<prefix>_<name>`.
            timeout: Seconds a call may take (default: the agent's `tool_timeout`).
            transport: `"http"` (streamable HTTP) or `"sse"`; when None, a URL whose path
                ends in `/sse` is SSE and any other streamable HTTP.
            **options: Any other field of `MCPServer` (`max_result_chars`, ...).
        """
        parts = urlsplit(url)
        if transport is None:
            transport = "sse" if parts.path.rstrip("/").endswith("/sse") else "http"
        return cls(
            name=name or _safe_name(parts.hostname or "http"),
            transport=transport,
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

    @property
    def mode(self) -> str:
        """The SDK's connect mode for `protocol`: `auto`, `legacy`, or a version adopted."""
        if self.protocol == "auto" or self.protocol in MODERN_PROTOCOL_VERSIONS:
            return self.protocol
        return "legacy"

    def offers(self, tool: str) -> bool:
        """Whether `include` and `exclude` let the tool (its name on the server) through."""
        if self.include is not None and not any(fnmatchcase(tool, p) for p in self.include):
            return False
        return not any(fnmatchcase(tool, p) for p in self.exclude)


def _safe_name(text: str, fallback: str = "server") -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:64]
    return cleaned or fallback


# --------------------------------------------------------------------------- config files


def load_config(path: str | os.PathLike[str]) -> list[MCPServer]:
    """The servers of a config file in the shapes MCP clients use.

    ```json
    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "some-mcp-server", "/data"]},
        "search": {"url": "https://example.com/mcp",
                   "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}
    ```

    The root is `mcpServers` (Claude Desktop, Claude Code, Cursor, Windsurf) or `servers`
    (VS Code). Each entry has either `command` (with optional `args`, `env`, `cwd`) or
    `url` (Windsurf: `serverUrl`; with optional `headers`). Optional `type` is `"stdio"`,
    `"http"` (also `"streamable-http"`, `"streamableHttp"`) or `"sse"` (legacy HTTP+SSE);
    without it a URL whose path ends in `/sse` is SSE, any other streamable HTTP. The
    options of `MCPServer` are understood too: `prefix`, `timeout`, `connect_timeout`,
    `protocol`, `include`, `exclude`, `instructions`, `max_result_chars`, `roots`,
    `progress`, `idle_timeout`, `elicitation`, `sampling`, `sampling_model`,
    `sampling_max_requests`, `sampling_max_tokens`, `resources_tool`, `require_approval`,
    and `auth` (`"oauth"`, or an object with `client_id`, `client_secret`, `scopes`,
    `callback_port`, `client_name`: see `MCPOAuth`); `disabled: true`
    leaves an entry out, and other keys are ignored (they belong to other clients).
    `${VAR}` and `${VAR:-default}` in strings are replaced with environment variables, so
    secrets need not be written in the file.

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
        data: The decoded JSON: an object with an `mcpServers` (or `servers`) object.
        origin: Named in error messages (a file name).

    Raises:
        MCPConfigError: the shape is wrong; the message names the entry and the key.
    """
    if not isinstance(data, Mapping):
        raise MCPConfigError(f"{origin}: expected a JSON object with an 'mcpServers' object")
    root = "mcpServers" if "mcpServers" in data or "servers" not in data else "servers"
    entries = data.get(root)
    if not isinstance(entries, Mapping):
        found = "missing" if entries is None else f"a {_json_type(entries)}"
        raise MCPConfigError(
            f"{origin}: '{root}' must be an object of servers ({found}); the root is "
            "'mcpServers' (or 'servers', as VS Code writes it)"
        )
    servers = []
    for name, entry in entries.items():
        server = _parse_entry(str(name), entry, f"{origin}: {root}.{name}")
        if server is not None:
            servers.append(server)
    return servers


_HTTP_TYPES = ("http", "streamable-http", "streamableHttp", "streamable_http")
_OPTIONS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "prefix": (str, "a string"),
    "timeout": ((int, float), "a number of seconds"),
    "connect_timeout": ((int, float), "a number of seconds"),
    "protocol": (str, "a string"),
    "include": (list, "a list of tool names or patterns"),
    "exclude": (list, "a list of tool names or patterns"),
    "instructions": (bool, "true or false"),
    "max_result_chars": (int, "a number of characters"),
    "roots": (list, "a list of directories"),
    "progress": (bool, "true or false"),
    "idle_timeout": ((int, float), "a number of seconds"),
    "elicitation": (bool, "true or false"),
    "sampling": (bool, "true or false"),
    "sampling_model": (str, "a model name"),
    "sampling_max_requests": (int, "a number of requests"),
    "sampling_max_tokens": (int, "a number of tokens"),
    "resources_tool": (bool, "true or false"),
    "require_approval": (str, "'never', 'always' or 'destructive'"),
}


def _parse_entry(name: str, entry: Any, where: str) -> MCPServer | None:
    if not isinstance(entry, Mapping):
        raise MCPConfigError(f"{where}: expected an object, got a {_json_type(entry)}")
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type")
    if kind is not None and kind not in ("stdio", "sse", *_HTTP_TYPES):
        raise MCPConfigError(f"{where}: unsupported type {kind!r} (use 'stdio', 'http' or 'sse')")
    url_key = "serverUrl" if "serverUrl" in entry and "url" not in entry else "url"
    has_command, has_url = "command" in entry, url_key in entry
    if has_command == has_url:
        raise MCPConfigError(
            f"{where}: give either 'command' (a server started over stdio) or 'url' "
            "(a server over HTTP)"
        )
    if kind == "stdio" and not has_command:
        raise MCPConfigError(f"{where}: type 'stdio' needs a 'command'")
    if kind not in (None, "stdio") and not has_url:
        raise MCPConfigError(f"{where}: type {kind!r} needs a 'url'")
    options = _options(entry, where)
    if entry.get("auth") is not None:
        options["auth"] = _oauth(entry["auth"], f"{where}.auth")
    try:
        if has_command:
            return MCPServer.stdio(
                _string(entry, "command", where),
                _strings(entry, "args", where),
                env=_string_map(entry, "env", where),
                cwd=_optional_string(entry, "cwd", where),
                name=name,
                **options,
            )
        transport: Literal["http", "sse"] | None = (
            "sse" if kind == "sse" else "http" if kind in _HTTP_TYPES else None
        )
        return MCPServer.http(
            _string(entry, url_key, where),
            headers=_string_map(entry, "headers", where),
            name=name,
            transport=transport,
            **options,
        )
    except (MCPConfigError, TypeError) as exc:
        if str(exc).startswith(where):
            raise
        raise MCPConfigError(f"{where}: {exc}") from exc


_NULLABLE = frozenset({"max_result_chars"})
"""Options whose None means something other than their default (`null`: results whole)."""


def _options(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The entry's `MCPServer` options, each checked for its JSON type."""
    options: dict[str, Any] = {}
    for key, (kinds, expected) in _OPTIONS.items():
        value = entry.get(key)
        if value is None:
            if key in _NULLABLE and key in entry:
                options[key] = None  # `null` written out: the field's None, not its default
            continue
        if isinstance(value, bool) and kinds is not bool:
            raise MCPConfigError(f"{where}.{key}: expected {expected}")
        if not isinstance(value, kinds):
            raise MCPConfigError(f"{where}.{key}: expected {expected}")
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise MCPConfigError(f"{where}.{key}: expected {expected}")
            value = tuple(value)
        elif isinstance(value, str):
            value = _expand(value, f"{where}.{key}")
        options[key] = value
    return options


def _oauth(value: Any, where: str) -> MCPOAuth:
    """`"auth": "oauth"`, or an object of `MCPOAuth` fields."""
    if value == "oauth":
        return MCPOAuth()
    if not isinstance(value, Mapping):
        raise MCPConfigError(f'{where}: expected "oauth" or an object (client_id, scopes, ...)')
    unknown = sorted(
        set(value)
        - {"type", "client_id", "client_secret", "scopes", "callback_port", "client_name"}
    )
    if unknown or value.get("type", "oauth") != "oauth":
        what = f"unknown key {unknown[0]!r}" if unknown else "type must be 'oauth'"
        raise MCPConfigError(f"{where}: {what}")
    scopes = value.get("scopes", [])
    if isinstance(scopes, str):
        scopes = scopes.split()
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise MCPConfigError(f"{where}.scopes: expected a list of strings")
    port = value.get("callback_port", DEFAULT_CALLBACK_PORT)
    if isinstance(port, bool) or not isinstance(port, int):
        raise MCPConfigError(f"{where}.callback_port: expected a port number")
    try:
        return MCPOAuth(
            client_id=_optional_string(value, "client_id", where),
            client_secret=_optional_string(value, "client_secret", where),
            scopes=tuple(_expand(s, f"{where}.scopes") for s in scopes),
            callback_port=port,
            client_name=_optional_string(value, "client_name", where) or "agentloop",
        )
    except MCPConfigError as exc:
        if str(exc).startswith(where):
            raise
        raise MCPConfigError(f"{where}: {exc}") from exc


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
    prompted = _PROMPTED.search(value)
    if prompted is not None:
        raise MCPConfigError(
            f"{where}: {prompted.group(0)} asks VS Code to prompt for a value, which "
            f"agentloop does not do; write ${{VARIABLE}} and set that environment variable"
        )

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
