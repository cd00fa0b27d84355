"""`agentloop plugins` and `agentloop tools`: what is installed, loaded, switched off, failed.

Both read the `PluginManager` the command was given and print text or JSON; neither runs
anything but the plugins' `agentloop_run_setup` (so a plugin reads its options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from agentloop.plugins import ENV_VAR, PluginManager, installed_plugins, pinned_plugins

from .exits import EXIT_OK
from .setups import choose_tools, run_setups, warn_left_out

if TYPE_CHECKING:
    from agentloop.tools import Tool

__all__ = ("plugins_command", "tools_command")


def plugins_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop plugins`: loaded plugins (tools, capabilities), those switched off, failures."""
    infos = manager.plugins()
    off = _switched_off(manager)
    if args.json:
        data = {
            "plugins": [dataclasses.asdict(info) for info in infos],
            "switched_off": [{"name": name, "dist": dist} for name, dist in off.items()],
            "failures": [dataclasses.asdict(failure) for failure in manager.failures],
        }
        print(json.dumps(data, indent=2))
        return EXIT_OK
    if not infos and off:
        print(f"no plugins loaded: {ENV_VAR}={os.environ.get(ENV_VAR)!r} switches them off")
    elif not infos:
        print("no plugins installed")
    for info in infos:
        version = f" {info.version}" if info.version else ""
        dist = f" ({info.dist})" if info.dist else ""
        wraps = f"; capabilities: {', '.join(info.capabilities)}" if info.capabilities else ""
        print(f"{info.name}{version}{dist}: {', '.join(info.tools) or '(no tools)'}{wraps}")
    for name, dist in off.items():
        print(f"{name} ({dist}): installed, switched off by {ENV_VAR}")
    for failure in manager.failures:
        print(f"FAILED {failure.name} ({failure.value or 'no entry point'}): {failure.error}")
    return EXIT_OK


def _switched_off(manager: PluginManager) -> dict[str, str]:
    """Installed plugins that `AGENTLOOP_PLUGINS` leaves out: name -> distribution."""
    if pinned_plugins() is None:
        return {}
    loaded = {info.name for info in manager.plugins()}
    return {name: dist for name, dist in installed_plugins().items() if name not in loaded}


def tools_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop tools`: every plugin tool with its plugin (and schema)."""
    run_setups(manager, args)  # plugins read their options (e.g. a config file) here
    if args.plugins:
        catalogue = choose_tools(manager, {}, plugins=args.plugins, tools=None)
    else:
        catalogue = manager.tools()
        warn_left_out(manager)
    if args.json:
        print(json.dumps([_tool_json(t) for t in catalogue], indent=2))
        return EXIT_OK
    if not catalogue:
        off = _switched_off(manager)
        if off:
            print(f"no plugin tools: {ENV_VAR} switches off {', '.join(off)}")
        else:
            print("no plugin tools installed")
    width = max((len(t.name) for t in catalogue), default=0)
    for item in catalogue:
        summary = item.description.strip().splitlines()[0] if item.description.strip() else ""
        print(f"{item.name:<{width}}  [{_label(item)}]  {summary}")
        if args.schema:
            schema = json.dumps(item.input_schema, indent=2)
            print("\n".join("    " + line for line in schema.splitlines()))
    return EXIT_OK


def _label(item: Tool) -> str:
    """The tool's plugin, then where inside it the tool comes from, when the tool says.

    A tool a plugin forwards from elsewhere (an MCP server's) may name it in `origin`.
    """
    origin = getattr(item, "origin", None)
    return f"{item.source}:{origin}" if isinstance(origin, str) and origin else str(item.source)


def _tool_json(item: Tool) -> dict[str, Any]:
    origin = getattr(item, "origin", None)
    return {
        "name": item.name,
        "plugin": item.source,
        "origin": origin if isinstance(origin, str) else None,
        "description": item.description,
        "input_schema": item.input_schema,
    }
