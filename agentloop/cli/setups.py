"""The plugins' part of a command: their `RunSetup`s, the tools chosen, deps, the model.

`agentloop run`, `chat`, `serve` and `tools` ask each plugin for its `RunSetup` and
choose the tools, the model and the system prompt the same way; this module does it
without importing the agent or the SDKs, so `agentloop tools` stays quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentloop.errors import AgentloopError, ConfigurationError
from agentloop.hookspecs import RunSetup
from agentloop.plugins import ENV_VAR, PluginManager

if TYPE_CHECKING:
    from agentloop.providers.base import Provider
    from agentloop.tools import Tool

__all__ = (
    "choose_tools",
    "offline_model",
    "plugin_call",
    "provider_for",
    "run_deps",
    "run_setups",
    "system_prompt",
    "warn_left_out",
)

_T = TypeVar("_T")


def run_setups(manager: PluginManager, args: argparse.Namespace) -> dict[str, RunSetup]:
    """Each plugin's `RunSetup` for this run, by plugin name, in load order.

    Raises:
        ConfigurationError: a plugin returned something other than a `RunSetup`.
    """
    setups: dict[str, RunSetup] = {}
    for name, setup in manager.call_each("agentloop_run_setup", args=args):
        if not isinstance(setup, RunSetup):
            raise ConfigurationError(
                f"plugin {name!r}: agentloop_run_setup returned {type(setup).__name__}, "
                "not a RunSetup"
            )
        setups[name] = setup
    return setups


def choose_tools(
    manager: PluginManager,
    setups: Mapping[str, RunSetup],
    *,
    plugins: Sequence[str] | None,
    tools: Sequence[str] | None,
) -> list[Tool]:
    """The tools a run exposes: the chosen plugins' tools, narrowed by `tools`.

    With neither, the plugins whose setup has `exposed_by_default`; with `tools` but no
    `plugins`, tools are picked by name from every plugin. A chosen plugin whose setup
    names its `tools` for this run exposes those instead.
    """
    if plugins is None and tools is None:
        plugins = [name for name, setup in setups.items() if setup.exposed_by_default]
    chosen = manager.select(plugins=plugins, tools=tools)
    failed = [f for f in manager.failures if plugins is not None and f.name in plugins]
    if failed:
        raise ConfigurationError(f"plugin {failed[0].name!r} failed: {failed[0].error}")
    warn_left_out(manager)
    exposed: list[Tool] = []
    for item in chosen:
        setup = setups.get(item.source or "")
        if setup is None or setup.tools is None:
            exposed.append(item)
        elif item.source not in {t.source for t in exposed}:
            exposed += [_from_plugin(t, item.source) for t in setup.tools]
    return exposed


def warn_left_out(manager: PluginManager) -> None:
    """Print each tool the catalogue left out for another plugin's (once per command)."""
    for line in manager.left_out:
        print(f"agentloop: warning: {line}", file=sys.stderr)


def _from_plugin(item: Tool, plugin: str | None) -> Tool:
    """A copy of `item` recorded as the tool of `plugin`."""
    copy = item.replace()
    copy.source = plugin
    return copy


def run_deps(exposed: Mapping[str, RunSetup]) -> dict[str, Any] | None:
    """The run's `deps`: the exposed plugins' entries in one dict (None when there are none).

    Raises:
        ConfigurationError: a plugin refused its options, or two plugins gave one key.
    """
    deps: dict[str, Any] = {}
    owners: dict[str, str] = {}
    for name, setup in exposed.items():
        if setup.deps is None:
            continue
        for key, value in plugin_call(name, setup.deps).items():
            if key in deps:
                raise ConfigurationError(
                    f"plugins {owners[key]!r} and {name!r} both set deps[{key!r}]"
                )
            deps[key], owners[key] = value, name
    return deps or None


def offline_model(
    exposed: Mapping[str, RunSetup], tools: Sequence[Tool], sources: set[str | None]
) -> tuple[str, Provider]:
    """The offline model of the first exposed plugin that has one, and that plugin's name.

    Raises:
        ConfigurationError: no exposed plugin has one, or it cannot drive the tools.
    """
    for name, setup in exposed.items():
        if setup.offline_model is not None:
            return name, plugin_call(name, setup.offline_model, tools)
    named = sorted(str(source) for source in sources if source)
    shown = f"the exposed plugins ({', '.join(named)})" if named else "no exposed plugin"
    pinned = os.environ.get(ENV_VAR)
    why = f"; {ENV_VAR}={pinned!r} pins the plugins" if pinned is not None else ""
    raise ConfigurationError(
        f"no offline model available: ANTHROPIC_API_KEY is not set and "
        f"{'none of ' if named else ''}{shown} provides one{why}. Set ANTHROPIC_API_KEY to "
        "talk to Claude, or install a plugin with an offline demo (see `agentloop plugins`)"
    )


def provider_for(
    exposed: Mapping[str, RunSetup], tools: Sequence[Tool], *, offline: bool
) -> Provider:
    """The model a command talks to: Claude with an API key, else a plugin's offline model.

    Without `ANTHROPIC_API_KEY` (and without `offline`, which asks for the demo on
    purpose) a line on stderr says that the scripted demo runs instead of Claude.

    Args:
        exposed: The exposed plugins' setups, by plugin name.
        tools: The tools the run exposes.
        offline: Run the first exposed plugin's offline model even with a key.

    Raises:
        ConfigurationError: an offline model is needed and no exposed plugin has one.
    """
    if offline or not os.environ.get("ANTHROPIC_API_KEY"):
        owner, provider = offline_model(exposed, tools, {t.source for t in tools})
        if not offline:
            print(
                "agentloop: ANTHROPIC_API_KEY is not set, so this runs the offline demo of "
                f"the {owner!r} plugin on a scripted model (set the key to talk to Claude).",
                file=sys.stderr,
            )
        return provider
    # Imported here, not at the top: `agentloop tools` does not import the SDK.
    from agentloop.providers.anthropic import AnthropicProvider

    return AnthropicProvider()


def system_prompt(given: str | None, exposed: Mapping[str, RunSetup]) -> str | None:
    """The run's system prompt: `given` (`--system`), else the exposed plugins' prompts."""
    systems = [setup.system for setup in exposed.values() if setup.system]
    return given or "\n\n".join(systems) or None


def plugin_call(name: str, function: Callable[..., _T], *args: Any) -> _T:
    """Call a plugin's part of a run; a failure becomes an error naming the plugin."""
    try:
        return function(*args)
    except AgentloopError:
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigurationError(f"plugin {name!r} failed: {detail}") from exc
