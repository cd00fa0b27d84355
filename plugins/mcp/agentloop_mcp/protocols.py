"""What `protocol: auto` learned about a server, remembered for the next connection.

A server that ignores `server/discover` costs the probe's whole wait (10 s) on every
connect under `protocol: auto`; one written in the usual style is switched to the
handshake era on its first question. Both answers are kept per server (its command line
or URL), in this process and in a small JSON file in the user's cache directory, so the
next connect (a reconnect, the next `agentloop run`) goes straight to the handshake.
`AGENTLOOP_MCP_PROTOCOL_CACHE` names another file; set to an empty string, nothing is
written to disk. An entry is trusted for a week, then the server is asked again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from agentloop.logs import get_logger
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from .config import MCPServer

__all__ = ("CACHE_ENV_VAR", "known_mode", "no_back_channel_message", "remember_handshake")

_log = get_logger()

CACHE_ENV_VAR = "AGENTLOOP_MCP_PROTOCOL_CACHE"
"""The cache file's path; an empty string keeps the answers in memory only."""

_MAX_AGE = 7 * 24 * 3600.0
_seen: dict[str, float] = {}


def known_mode(server: MCPServer) -> str:
    """The connect mode for `server`: `legacy` when `auto` learned it, else its own."""
    if server.protocol != "auto":
        return server.mode
    key = server.describe()
    seen = _seen.get(key) or _load().get(key)
    if seen is not None and time.time() - seen < _MAX_AGE:
        return "legacy"
    return server.mode


def remember_handshake(server: MCPServer) -> None:
    """Note that `server`, under `protocol: auto`, is best reached with the handshake."""
    if server.protocol != "auto":
        return
    key = server.describe()
    _seen[key] = time.time()
    path = _path()
    if path is None:
        return
    entries = _load()
    entries[key] = _seen[key]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        temporary.replace(path)
    except OSError as exc:  # a cache: never worth failing a connection over
        _log.debug("mcp.protocol_cache_unwritable", path=str(path), error=str(exc))


def _path() -> Path | None:
    chosen = os.environ.get(CACHE_ENV_VAR)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentloop" / "mcp-protocols.json"


def _load() -> dict[str, float]:
    path = _path()
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def no_back_channel_message(
    server: MCPServer, tool: str, version: str | None, *, handshake_refused: bool
) -> str:
    """The one line a call gets when its server could not ask the client its question."""
    asked = (
        f"MCP server '{server.name}' asked this client a question (sampling, elicitation "
        f"or roots) during '{tool}', but"
    )
    if handshake_refused:
        return (
            f"{asked} protocol {version} gives a server no channel for requests and the "
            "server does not accept the initialize handshake (`protocol: legacy`)."
        )
    if version in MODERN_PROTOCOL_VERSIONS:
        how = (
            'set its `protocol` option to "legacy" (the initialize handshake) so it can'
            if server.protocol != "legacy"
            else "it cannot on this protocol"
        )
        return f"{asked} protocol {version} gives a server no channel for requests; {how}."
    return (
        f"{asked} its transport gives it no channel for requests (JSON responses over "
        "HTTP); the server's `protocol` option cannot change that."
    )
