"""The agentloop plugin entry point: the tools of the MCP servers in `AGENTLOOP_MCP_CONFIG`.

Found through the `agentloop` entry-point group as `mcp = "agentloop_mcp.plugin"`. Hooks
are synchronous and only register; MCP tools need live connections. So when the
environment variable `AGENTLOOP_MCP_CONFIG` names an `mcpServers` config file, the hook
starts those servers once per process on a background event loop (see
`agentloop_mcp.background`) and registers their tools; without it, the plugin registers
nothing. The servers stop when the process exits.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from agentloop import hookimpl

from .background import shared_source

__all__ = (
    "CONFIG_ENV_VAR",
    "agentloop_register_tools",
    "agentloop_run_options",
    "agentloop_run_setup",
)

CONFIG_ENV_VAR = "AGENTLOOP_MCP_CONFIG"
"""Path of the `mcpServers` config file whose servers' tools the plugin registers."""

_chosen: list[str] = []
"""The config file named with `--mcp-config`, which wins over the environment."""


@hookimpl
def agentloop_run_options(parser: argparse.ArgumentParser) -> None:
    """Add `--mcp-config FILE` to `agentloop run` and `agentloop tools`."""
    group = parser.add_argument_group("mcp plugin")
    group.add_argument(
        "--mcp-config",
        metavar="FILE",
        help=f"an mcpServers config file whose servers' tools to offer (or {CONFIG_ENV_VAR})",
    )


@hookimpl
def agentloop_run_setup(args: argparse.Namespace) -> None:
    """Remember the `--mcp-config` file, read when the tools are registered."""
    path = getattr(args, "mcp_config", None)
    if path:
        _chosen[:] = [str(path)]


@hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Register the tools of the servers in `--mcp-config` or `AGENTLOOP_MCP_CONFIG`."""
    path = _chosen[0] if _chosen else os.environ.get(CONFIG_ENV_VAR, "").strip()
    if not path:
        return
    for mcp_tool in shared_source(path).tools():
        register(mcp_tool)
