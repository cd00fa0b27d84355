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
import sys
from typing import Any, TextIO

import anyio

from agentloop.agent import Agent
from agentloop.errors import ConfigurationError
from agentloop.events import RequestRetry, ToolUserContent
from agentloop.gateway.cli import serve_command
from agentloop.plugins import PluginManager
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import Provider
from agentloop.result import RunResult
from agentloop.run import Run
from agentloop.sessions.base import Session
from agentloop.sessions.named import open_session, sqlite_path
from agentloop.tools import Tool

from .approve import decide
from .exits import EXIT_FAILED, EXIT_OK, error
from .logs import configure_logging
from .report import print_result, result_to_json, user_content_lines
from .setups import (
    choose_tools,
    plugin_call,
    provider_for,
    run_deps,
    run_setups,
    system_prompt,
)

__all__ = ("run_command", "serve_with_plugins")


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
    else:
        provider = provider_for(exposed, tools, offline=args.offline)
    if not args.json:
        configure_logging(json_logs=args.log_json, verbose=args.verbose, progress=sys.stdout)
    agent = Agent(
        model=args.model,
        provider=provider,
        system=system_prompt(args.system, exposed),
        tools=tools,
        max_rounds=args.max_rounds,
        tool_concurrency=args.concurrency,
        tool_timeout=args.timeout,
        max_tokens=args.max_tokens,
        approval_required=set(args.require_approval or ()),
        capabilities=capabilities,
    )
    shown = sys.stderr if args.json else sys.stdout  # standard output is the JSON's alone
    result = anyio.run(_run, agent, provider, args.prompt, deps, session, shown)
    if args.json:
        print(json.dumps(result_to_json(result), indent=2, ensure_ascii=False))
    else:
        sections: list[tuple[str, str]] = []
        for name, setup in exposed.items():
            if setup.report is not None:
                sections += plugin_call(name, setup.report, result)
        print_result(result, sections, sys.stdout)
    problems = [
        problem
        for name, setup in exposed.items()
        if setup.check is not None and (problem := plugin_call(name, setup.check, result))
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
    if args.session_db is not None:
        # A typo in a folder name would otherwise start an empty store somewhere new.
        path = sqlite_path(args.session_db)
        if path is not None and not path.parent.is_dir():
            raise ConfigurationError(
                f"--session-db: no such folder: {path.parent} (create it first)"
            )
    return open_session(args.session, args.session_db, ttl=args.session_ttl)


async def _run(
    agent: Agent,
    provider: Provider,
    prompt: str,
    deps: Any,
    session: Session | None,
    shown: TextIO,
) -> RunResult:
    """The run, then the API client's connections closed (in the run's event loop).

    Calls that wait for approval are asked about on the terminal (`approve.decide`) and
    the run resumed with the answers, until it ends otherwise. Each retry of a model
    request is told on standard error as it begins its wait; content a tool shows the
    user is printed on `shown` as it comes.
    """
    try:
        result = await _told(agent.start(prompt, deps=deps, session=session, stream=False), shown)
        while result.stop_reason == "approval_required" and result.state is not None:
            decisions = await decide(
                result.approvals,
                agent.registry,
                interactive=sys.stdin.isatty(),
                stdin=sys.stdin,
                out=sys.stderr,
            )
            resumed = agent.start(
                state=result.state, decisions=decisions, deps=deps, session=session, stream=False
            )
            result = await _told(resumed, shown)
        return result
    finally:
        client = getattr(provider, "client", None)
        close = getattr(client, "close", None)
        if close is not None:
            await close()


async def _told(run: Run[Any], shown: TextIO) -> RunResult:
    """`run`'s result, each `RequestRetry` printed on standard error as it happens.

    An unreachable API otherwise shows nothing for the seconds its retries take. A
    tool's content for the user (`ToolUserContent`) is printed on `shown`.
    """
    async with run:
        async for event in run:
            if isinstance(event, ToolUserContent):
                for line in user_content_lines(event):
                    print(line, file=shown, flush=True)
            elif isinstance(event, RequestRetry):
                print(
                    f"agentloop: retrying in {event.wait:.1f} s: {event.reason}",
                    file=sys.stderr,
                    flush=True,
                )
    return run.result


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
