"""`agentloop run` and `agentloop serve`: the plugins' setups, the tools, the provider, the run.

`run_command` asks each plugin for its `RunSetup`, picks the exposed tools and the
capabilities `--capability` names, builds the provider (the API, a Chat Completions
server, or a plugin's offline model) and an `Agent`, runs it (in the session `--session`
names, if any), and prints the report (`report`). `serve_with_plugins` hands the same
choice of tools, deps and capabilities to the gateway.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from agentloop.agent import Agent
from agentloop.errors import AgentloopError, ConfigurationError
from agentloop.gateway.cli import serve_command
from agentloop.hookspecs import RunSetup
from agentloop.plugins import ENV_VAR, PluginManager
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import Provider
from agentloop.result import RunResult
from agentloop.sessions.base import Session
from agentloop.sessions.named import open_session
from agentloop.tools import Tool

from .approve import decide
from .exits import EXIT_FAILED, EXIT_OK, error
from .logs import configure_logging
from .report import print_result, result_to_json

__all__ = (
    "choose_tools",
    "offline_model",
    "run_command",
    "run_deps",
    "run_setups",
    "serve_with_plugins",
)

_T = TypeVar("_T")


def run_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop run PROMPT`."""
    session = _session(args)
    setups = run_setups(manager, args)
    tools = choose_tools(manager, setups, plugins=args.plugins, tools=args.tools)
    capabilities = manager.select_capabilities(args.capabilities)
    sources = {t.source for t in tools}
    exposed = {name: setup for name, setup in setups.items() if name in sources}
    deps = run_deps(exposed)
    provider: Provider
    if args.provider == "openai" and not args.offline:
        from agentloop.providers.openai import provider_from_options

        provider = provider_from_options(args.base_url, args.api_key, args.compat)
    elif args.compat:
        raise ConfigurationError("--compat applies to --provider openai only")
    elif args.base_url or args.api_key:
        provider = AnthropicProvider(base_url=args.base_url, api_key=args.api_key)
    elif args.offline or not os.environ.get("ANTHROPIC_API_KEY"):
        owner, provider = offline_model(exposed, tools, sources)
        if not args.offline:
            print(
                "agentloop: ANTHROPIC_API_KEY is not set, so this runs the offline demo of "
                f"the {owner!r} plugin on a scripted model (set the key to talk to Claude).",
                file=sys.stderr,
            )
    else:
        provider = AnthropicProvider()
    systems = [setup.system for setup in exposed.values() if setup.system]
    if not args.json:
        configure_logging(json_logs=args.log_json, verbose=args.verbose, progress=sys.stdout)
    agent = Agent(
        model=args.model,
        provider=provider,
        system=args.system or "\n\n".join(systems) or None,
        tools=tools,
        max_rounds=args.max_rounds,
        tool_concurrency=args.concurrency,
        tool_timeout=args.timeout,
        max_tokens=args.max_tokens,
        approval_required=set(args.require_approval or ()),
        capabilities=capabilities,
    )
    result = anyio.run(_run, agent, provider, args.prompt, deps, session)
    if args.json:
        print(json.dumps(result_to_json(result), indent=2, ensure_ascii=False))
    else:
        sections: list[tuple[str, str]] = []
        for name, setup in exposed.items():
            if setup.report is not None:
                sections += _plugin_call(name, setup.report, result)
        print_result(result, sections, sys.stdout)
    problems = [
        problem
        for name, setup in exposed.items()
        if setup.check is not None and (problem := _plugin_call(name, setup.check, result))
    ]
    for problem in problems:
        error(problem)
    return EXIT_FAILED if problems else EXIT_OK


def _session(args: argparse.Namespace) -> Session | None:
    """The session `--session` names, in the store of `--session-db` (or the default)."""
    if args.session is None:
        for given, option in (
            (args.session_db, "--session-db"),
            (args.session_ttl, "--session-ttl"),
        ):
            if given is not None:
                raise ConfigurationError(f"{option} needs --session NAME")
        return None
    return open_session(args.session, args.session_db, ttl=args.session_ttl)


async def _run(
    agent: Agent, provider: Provider, prompt: str, deps: Any, session: Session | None
) -> RunResult:
    """The run, then the API client's connections closed (in the run's event loop).

    Calls that wait for approval are asked about on the terminal (`approve.decide`) and
    the run resumed with the answers, until it ends otherwise.
    """
    try:
        result = await agent.run(prompt, deps=deps, session=session)
        while result.stop_reason == "approval_required" and result.state is not None:
            decisions = await decide(
                result.approvals,
                agent.registry,
                interactive=sys.stdin.isatty(),
                stdin=sys.stdin,
                out=sys.stderr,
            )
            result = await agent.resume(
                result.state, decisions=decisions, deps=deps, session=session
            )
        return result
    finally:
        client = getattr(provider, "client", None)
        close = getattr(client, "close", None)
        if close is not None:
            await close()


def serve_with_plugins(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop serve`: the gateway, with the chosen plugins' tools, deps and capabilities.

    Unlike `agentloop run`, a gateway exposes no plugin by default: only what `--plugin`
    and `--tool` name.
    """
    setups = run_setups(manager, args)
    tools: list[Tool] = []
    deps = None
    if args.plugins is not None or args.tools is not None:
        tools = choose_tools(manager, setups, plugins=args.plugins, tools=args.tools)
        sources = {t.source for t in tools}
        deps = run_deps({name: s for name, s in setups.items() if name in sources})
    capabilities = manager.select_capabilities(args.capabilities)
    return serve_command(args, tools=tools, deps=deps, capabilities=capabilities)


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
    `plugins`, tools are picked by name from every plugin.
    """
    if plugins is None and tools is None:
        plugins = [name for name, setup in setups.items() if setup.exposed_by_default]
    chosen = manager.select(plugins=plugins, tools=tools)
    failed = [f for f in manager.failures if plugins is not None and f.name in plugins]
    if failed:
        raise ConfigurationError(f"plugin {failed[0].name!r} failed: {failed[0].error}")
    warn_left_out(manager)
    return chosen


def warn_left_out(manager: PluginManager) -> None:
    """Print each tool the catalogue left out for another plugin's (once per command)."""
    for line in manager.left_out:
        print(f"agentloop: warning: {line}", file=sys.stderr)


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
        for key, value in _plugin_call(name, setup.deps).items():
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
            return name, _plugin_call(name, setup.offline_model, tools)
    named = sorted(str(source) for source in sources if source)
    shown = f"the exposed plugins ({', '.join(named)})" if named else "no exposed plugin"
    pinned = os.environ.get(ENV_VAR)
    why = f"; {ENV_VAR}={pinned!r} pins the plugins" if pinned is not None else ""
    raise ConfigurationError(
        f"no offline model available: ANTHROPIC_API_KEY is not set and "
        f"{'none of ' if named else ''}{shown} provides one{why}. Set ANTHROPIC_API_KEY to "
        "talk to Claude, or install a plugin with an offline demo (see `agentloop plugins`)"
    )


def _plugin_call(name: str, function: Callable[..., _T], *args: Any) -> _T:
    """Call a plugin's part of a run; a failure becomes an error naming the plugin."""
    try:
        return function(*args)
    except AgentloopError:
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigurationError(f"plugin {name!r} failed: {detail}") from exc
