"""The plugin hooks: how installed packages give agentloop their tools.

Plugins are found through the `agentloop` entry-point group (see `agentloop.plugins`) and
implement the hooks below with `@agentloop.hookimpl`. Hooks are synchronous and only
register things; tools run later, in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

__all__ = ("PROJECT_NAME", "hookimpl", "hookspec")

PROJECT_NAME = "agentloop"
"""The pluggy project name and the entry-point group plugins register under."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification (used in this module only)."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation: `@agentloop.hookimpl`."""


@hookspec
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Register the plugin's tools.

    Called for each plugin whenever a `PluginManager` builds its tool catalogue: the
    first time tools are asked for, and again after further plugins are loaded or
    registered; never per run. Call
    `register(function_or_tool)` for each tool; `register` accepts what `@tool` accepts
    (a plain function, a `Tool`, or the keyword options `name=`, `description=`,
    `timeout=`, `eager=`). The registering plugin is recorded as the tool's source.
    Not `firstresult`: every plugin's implementation is called.

    :param register: callable that adds one tool to the plugin manager's catalogue.
    :return: nothing; return values are ignored.
    """
