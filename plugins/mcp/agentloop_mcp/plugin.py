"""The agentloop plugin entry point: the tools of the MCP servers in `AGENTLOOP_MCP_CONFIG`.

Found through the `agentloop` entry-point group as `mcp = "agentloop_mcp.plugin"`. Hooks
are synchronous and only register; MCP tools need live connections. So when the
environment variable `AGENTLOOP_MCP_CONFIG` (or `--mcp-config`) names an `mcpServers`
config file, the hook starts those servers once per process on a background event loop
(see `agentloop_mcp.background`) and registers their tools; without it, the plugin
registers nothing. A server that fails is left out (on the command line, with one warning
line naming it and why) unless `--mcp-strict`. A server's sampling request during a call
is answered by the calling run's model (`agentloop run --model`), unless its config entry
says `"sampling": false`. The servers stop when the process exits.

Every command loads this module, so it imports the MCP SDK (over a second) only in the
hooks that start servers or run `agentloop mcp`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from agentloop import hookimpl
from agentloop.errors import AgentloopError, ConfigurationError
from agentloop.hookspecs import RunSetup

__all__ = (
    "CONFIG_ENV_VAR",
    "agentloop_register_commands",
    "agentloop_register_tools",
    "agentloop_run_options",
    "agentloop_run_setup",
)

CONFIG_ENV_VAR = "AGENTLOOP_MCP_CONFIG"
"""Path of the `mcpServers` config file whose servers' tools the plugin registers."""

ACTIONS = ("resources", "templates", "read", "prompts", "prompt", "login", "logout")
"""What `agentloop mcp` does: show a server's resources, one of them, its prompts, one of
them; log in to a server that wants OAuth, or forget its tokens."""

_cli: dict[str, Any] = {}
"""What the command line chose: `config` (the `--mcp-config` file, which wins over the
environment) and `strict`. Empty outside the `agentloop` command."""
_warned: set[str] = set()


@hookimpl
def agentloop_register_commands(register: Callable[..., argparse.ArgumentParser]) -> None:
    """Add `agentloop mcp`: a configured server's resources and prompts."""
    parser = register(
        "mcp",
        help="list and read an MCP server's resources and prompts; log in with OAuth",
        handler=_mcp_command,
    )
    parser.add_argument("action", choices=ACTIONS, help="what to show")
    parser.add_argument("server", help="the server's name in the config file")
    parser.add_argument("item", nargs="?", help="the resource URI (read) or prompt name (prompt)")
    parser.add_argument("arguments", nargs="*", help="the prompt's arguments, as KEY=VALUE")
    parser.add_argument(
        "--mcp-config", metavar="FILE", help="the MCP config file (or AGENTLOOP_MCP_CONFIG)"
    )


def _mcp_command(args: argparse.Namespace) -> int:
    """`agentloop mcp` (`agentloop_mcp.cli.mcp_command`)."""
    from .cli import mcp_command

    return mcp_command(args)


@hookimpl
def agentloop_run_options(parser: argparse.ArgumentParser) -> None:
    """Add `--mcp-config FILE` and `--mcp-strict` to `agentloop run` and `agentloop tools`."""
    group = parser.add_argument_group("mcp plugin")
    group.add_argument(
        "--mcp-config",
        metavar="FILE",
        help=f"an MCP config file whose servers' tools to offer (or {CONFIG_ENV_VAR}); "
        "exposes the mcp plugin's tools",
    )
    group.add_argument(
        "--mcp-strict",
        action="store_true",
        help="fail when any MCP server fails (default: leave it out with a warning)",
    )


@hookimpl
def agentloop_run_setup(args: argparse.Namespace) -> RunSetup | None:
    """Remember the command line's choices; a config file given exposes the plugin's tools.

    `--mcp-config` with `--plugin` naming other plugins only adds `mcp` to them: a config
    file is given to be used. When a server in it is declared with `"instructions": true`,
    its servers start here, so that their instructions become the run's system prompt
    (unless `--system`).
    """
    path = getattr(args, "mcp_config", None)
    _cli.clear()
    _cli["strict"] = bool(getattr(args, "mcp_strict", False))
    if path:
        _cli["config"] = str(path)
        plugins = getattr(args, "plugins", None)
        if plugins is not None and "mcp" not in plugins:
            plugins.append("mcp")
    if _cli["strict"]:
        _check_strict(args)
    if path:
        from .config import load_config

        system = None
        if any(server.instructions for server in load_config(path)):
            system = _source(path).instructions()
        return RunSetup(exposed_by_default=True, system=system)
    return None


def _check_strict(args: argparse.Namespace) -> None:
    """Refuse `--mcp-strict` where it means nothing; where it does, start the servers now.

    Strict means "an MCP server that fails stops the command": without a config file
    there is no server, and a command that does not use the plugin's tools starts none.
    Where the tools are used, the servers start here, so that a failure stops the
    command even where the plugin's failure alone would not (`agentloop tools` lists
    every plugin's tools; `--tool` picks from every plugin).

    Raises:
        ConfigurationError: `--mcp-strict` without servers or without the plugin's
            tools, or a server that failed.
    """
    path = _cli.get("config") or os.environ.get(CONFIG_ENV_VAR, "").strip()
    if not path:
        raise ConfigurationError(
            f"--mcp-strict needs MCP servers: give --mcp-config FILE (or set {CONFIG_ENV_VAR})"
        )
    if not _uses_tools(args):
        exposes = getattr(args, "command", None) == "run" and "config" not in _cli
        raise ConfigurationError(
            "--mcp-strict applies to the mcp plugin's tools, which this command does not "
            f"use: add --plugin mcp{' (or give --mcp-config FILE)' if exposes else ''}"
        )
    try:
        _source(path)
    except (AgentloopError, OSError) as exc:
        raise ConfigurationError(f"plugin 'mcp' failed: {type(exc).__name__}: {exc}") from exc


def _uses_tools(args: argparse.Namespace) -> bool:
    """Whether the command uses the plugin's tools, as `agentloop` chooses them."""
    plugins = getattr(args, "plugins", None)
    if plugins is not None:
        return "mcp" in plugins
    if getattr(args, "tools", None) is not None:
        return True  # picked by name from every plugin's tools
    command = getattr(args, "command", None)
    if command == "run":
        return "config" in _cli  # exposed by default when a config file is given
    return command != "serve"  # `tools` lists every plugin's; `serve` exposes none unasked


def _source(path: str) -> Any:
    """The shared source of `path`, with the terminal for servers' questions if there is one."""
    from .background import shared_source
    from .capabilities import terminal_elicitation

    ask = terminal_elicitation if _cli and sys.stdin.isatty() else None
    return shared_source(path, strict=bool(_cli.get("strict")), elicitation=ask)


@hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Register the tools of the servers in `--mcp-config` or `AGENTLOOP_MCP_CONFIG`."""
    path = _cli.get("config") or os.environ.get(CONFIG_ENV_VAR, "").strip()
    if not path:
        return
    source = _source(path)
    if _cli:
        for problem in [*source.errors, *source.skipped]:
            line = str(problem)
            if line not in _warned:
                _warned.add(line)
                print(f"agentloop: warning: {line}", file=sys.stderr)
    for mcp_tool in source.bridged():
        # The model sees names, and the server chose this one, not us: where another
        # plugin has it, that plugin's tool stays and this one is left out, with a warning.
        register(
            mcp_tool,
            gives_way=f"it is MCP server '{mcp_tool.server}''s {mcp_tool.mcp_name!r}: "
            'give that server a "prefix" in the MCP config to keep it',
        )
