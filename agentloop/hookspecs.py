"""The plugin hooks: how installed packages give agentloop their tools, capabilities and commands.

Plugins are found through the `agentloop` entry-point group (see `agentloop.plugins`) and
implement the hooks below with `@agentloop.hookimpl`. Hooks are synchronous and only
register things; tools run later, in the registry, and capabilities around a run.
`agentloop_register_tools` and `agentloop_register_capabilities` serve every agent; the
other hooks shape the `agentloop` command (`agentloop.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # plugins import this module at start-up: keep the SDKs out of it
    from .providers.base import Provider
    from .result import RunResult
    from .tools import Tool

__all__ = ("PROJECT_NAME", "RunSetup", "hookimpl", "hookspec")

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
    `timeout=`, `eager=`, `deps=`, `deps_factory=`). `deps=` (an object) or
    `deps_factory=` (a function of no arguments making it at each call) is what the tool
    gets as `RunContext.deps` instead of the run's, so the plugin's tools work the same
    under `agentloop run`, `agentloop serve` and in a service; a service may still give
    them other deps with `tool.replace(deps=...)`. The registering plugin is recorded as
    the tool's source.
    Two plugins registering one name is a `DuplicateToolError`, unless one registered
    its tool with `gives_way="how to keep it"`: that one is left out, with a warning
    (`PluginManager.left_out`).
    Not `firstresult`: every plugin's implementation is called.

    :param register: callable that adds one tool to the plugin manager's catalogue.
    :return: nothing; return values are ignored.
    """


@hookspec
def agentloop_register_capabilities(register: Callable[..., Any]) -> None:
    """Register the plugin's capabilities (`agentloop.Capability`), each under a name.

    Called for each plugin whenever a `PluginManager` builds its capability catalogue:
    the first time capabilities are asked for, and again after further plugins are
    loaded or registered; never per run. Call `register(name, capability)` for each
    one: `name` is what `agentloop run --capability NAME` and
    `PluginManager.select_capabilities` pick it by, and `capability` is a `Capability`
    instance (shared by every agent that picks it: keep per-run state in `for_run`) or a
    factory `() -> Capability` called each time an agent picks it (a `Capability`
    subclass whose constructor takes no arguments is one). The registering plugin is
    recorded as the capability's source. Not `firstresult`: every plugin's
    implementation is called. Installing a plugin never adds a capability to a run by
    itself: a service or the command names the ones it wants.

    :param register: callable that adds one named capability to the plugin manager's
        catalogue.
    :return: nothing; return values are ignored.
    """


@hookspec
def agentloop_register_commands(
    register: Callable[..., argparse.ArgumentParser],
) -> None:
    """Add subcommands to the `agentloop` command.

    Called once per invocation of the command, for each loaded plugin on its own, before
    the arguments are parsed. Call `register(name, *, help, handler)` for each command:
    it returns the command's `argparse.ArgumentParser`, to which the plugin adds its
    arguments. The command already takes `-v` and `--log-json`, and logging is configured
    before `handler` runs. `handler(args: argparse.Namespace) -> int` gets the parsed
    arguments and returns the exit code; raising `ConfigurationError` exits 2 and any
    other `AgentloopError` exits 1, each with one line on standard error.
    Not `firstresult`: every plugin's implementation is called. A plugin whose
    implementation raises (a command name that is taken, say) is recorded in
    `PluginManager.failures` and adds nothing.

    :param register: callable that adds one subcommand and returns its parser.
    :return: nothing; return values are ignored.
    """


@hookspec
def agentloop_run_options(parser: argparse.ArgumentParser) -> None:
    """Add options to `agentloop run` (and to `agentloop tools`, which lists what they configure).

    Called once per invocation of the command, for each loaded plugin on its own, while
    the `run` parser is built. Add the options the plugin reads back in
    `agentloop_run_setup`, preferably in an argument group named after the plugin
    (`parser.add_argument_group("weather plugin")`), and with long names that say whose
    they are (`--weather-units`). Not `firstresult`: every plugin's implementation is
    called. A plugin whose implementation raises (an option name that is taken, say) is
    recorded in `PluginManager.failures`.

    :param parser: the `agentloop run` argument parser.
    :return: nothing; return values are ignored.
    """


@hookspec
def agentloop_run_setup(args: argparse.Namespace) -> RunSetup | None:
    """Say what the plugin contributes to an `agentloop run`.

    Called once per `agentloop run` (and `agentloop tools`), for each loaded plugin on its
    own, after the arguments are parsed and before the tools are chosen (so a plugin whose
    tools depend on an option, such as a config file, can read it here). Keep it cheap
    and free of side effects beyond that: validating the plugin's options belongs in
    `RunSetup.deps`, which is called only when the run exposes the plugin's tools. Not
    `firstresult`: every plugin's implementation is called. Raise `ConfigurationError`
    for options that make no sense together, whether or not the plugin's tools are
    exposed (the command stops: one `agentloop: error:` line, exit 2). A plugin whose
    implementation raises anything else is recorded in `PluginManager.failures` and
    contributes nothing.

    :param args: the parsed arguments of `agentloop run`, the plugin's options included.
    :return: a `RunSetup`, or None to contribute nothing.
    """


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What one plugin contributes to an `agentloop run` (see `agentloop_run_setup`).

    Everything but `exposed_by_default` applies only when the run exposes the plugin's
    tools (with `--plugin`, `--tool`, or by default).
    """

    exposed_by_default: bool = False
    """Expose this plugin's tools when the command names neither `--plugin` nor `--tool`."""
    deps: Callable[[], Mapping[str, Any]] | None = None
    """Builds the plugin's entries of the run's `deps` mapping (`{"weather": config}`), and
    checks the plugin's options on the way: raise `ConfigurationError` (exit 2) for a bad
    one. The run's `deps` is one dict merged from every exposed plugin's entries; two
    plugins giving one key is a `ConfigurationError`."""
    system: str | None = None
    """A system prompt for runs without `--system`; several plugins' are joined by a blank
    line."""
    offline_model: Callable[[Sequence[Tool]], Provider] | None = None
    """Builds a scripted model for runs without `ANTHROPIC_API_KEY` (or with `--offline`),
    given the tools the run exposes; raise `ConfigurationError` when it cannot drive them.
    The first exposed plugin (in load order) that has one provides the model."""
    report: Callable[[RunResult], Sequence[tuple[str, str]]] | None = None
    """Sections `(title, text)` the command prints after the tool log of a finished run
    (not with `--json`)."""
    check: Callable[[RunResult], str | None] | None = None
    """Looks at a finished run and returns why it failed at the plugin's job (printed as
    one error line, exit 1), or None when it did not."""
    tools: Sequence[Tool] | None = None
    """The tools the plugin exposes in this run in place of those it registered, when
    one of its options chose another set (None: the registered ones)."""
