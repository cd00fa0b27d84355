"""The `agentloop` command: run an agent on a prompt, list plugins, list tools.

It sits on top of the library: it loads plugins (`agentloop.plugins`), builds an `Agent`
and runs it, and it is the one place that configures logging (structlog, to stderr).
Plugins add commands and `run` options, and shape a run (the tools exposed by default,
deps, a system prompt, an offline model, report sections, a final check) through the
hooks in `agentloop.hookspecs`; the command itself knows no plugin by name.

Exit codes: 0 success, 1 the run failed, 2 a usage or configuration error (including a
tool name registered by two plugins). Every error is one line on standard error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from functools import partial
from typing import Any, NoReturn, TextIO, TypeVar

import anyio
import structlog

from . import __version__
from .agent import DEFAULT_MODEL, Agent
from .arguments import prompt, seconds, whole_number
from .errors import AgentloopError, ConfigurationError
from .gateway.cli import add_serve_command, serve_command
from .hookspecs import RunSetup
from .plugins import ENV_VAR, PluginManager, default_manager, installed_plugins, pinned_plugins
from .providers.anthropic import AnthropicProvider
from .providers.base import Provider
from .result import RunResult, ToolCallRecord
from .tools import Tool

__all__ = ("main",)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_REPORTED_BY_THE_COMMAND = frozenset({"run.error", "plugin.load_failed"})
"""Events whose news the command prints itself: as its error line (a failed run, a failed
plugin the command uses), or in `agentloop plugins` (every plugin that failed)."""

_T = TypeVar("_T")


# --------------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on standard error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(manager: PluginManager) -> argparse.ArgumentParser:
    """The argument parser: `run`, `plugins`, `tools`, and the plugins' commands and options."""
    common = _Parser(add_help=False, allow_abbrev=False)
    common.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    common.add_argument("-v", "--verbose", action="store_true", help="log every event")

    parser = _Parser(
        prog="agentloop",
        description="Run agents on the Anthropic Messages API.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"agentloop {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", parents=[common], help="run an agent on a prompt", allow_abbrev=False
    )
    run.add_argument("prompt", type=prompt, help="what to ask")
    run.add_argument("--model", default=DEFAULT_MODEL, help="model name")
    run.add_argument("--system", help="system prompt")
    run.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="NAME",
        help="expose this plugin's tools (repeatable; default: the plugins that ask for it)",
    )
    run.add_argument(
        "--tool",
        action="append",
        dest="tools",
        metavar="NAME",
        help="expose only these tools (repeatable)",
    )
    run.add_argument("--max-rounds", type=whole_number, default=10, help="model requests")
    run.add_argument("--concurrency", type=whole_number, default=8, help="tool calls at once")
    run.add_argument("--timeout", type=seconds, default=30.0, help="seconds per tool call")
    run.add_argument("--max-tokens", type=whole_number, default=4096)
    run.add_argument("--json", action="store_true", help="print the RunResult as JSON")
    run.add_argument(
        "--offline",
        action="store_true",
        help="run on a plugin's offline model even with an API key",
    )
    model = run.add_argument_group("model provider")
    model.add_argument(
        "--provider",
        choices=("anthropic", "openai"),
        default="anthropic",
        help="the Messages API (default), or a Chat Completions server (Ollama, vLLM, ...)",
    )
    model.add_argument("--base-url", metavar="URL", help="the provider's base URL")
    model.add_argument("--api-key", metavar="KEY", help="the provider's API key")
    model.add_argument(
        "--compat",
        choices=("openai", "ollama", "vllm", "llamacpp"),
        help="with --provider openai: the server's quirks preset",
    )
    manager.call_each("agentloop_run_options", parser=run)
    run.set_defaults(handler=partial(run_command, manager=manager))

    plugins = commands.add_parser(
        "plugins", parents=[common], help="list installed plugins", allow_abbrev=False
    )
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(handler=partial(plugins_command, manager=manager))

    tools = commands.add_parser(
        "tools", parents=[common], help="list the plugins' tools", allow_abbrev=False
    )
    tools.add_argument("--schema", action="store_true", help="show each tool's JSON schema")
    tools.add_argument("--json", action="store_true", help="print JSON (includes schemas)")
    tools.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="NAME",
        help="list only this plugin's tools (repeatable)",
    )
    # The options that configure a plugin's tools for a run configure what is listed.
    manager.call_each("agentloop_run_options", parser=tools)
    tools.set_defaults(handler=partial(tools_command, manager=manager))

    serve = add_serve_command(commands, parents=[common], allow_abbrev=False)
    # The gateway's tools take the same plugin options as a run's.
    manager.call_each("agentloop_run_options", parser=serve)
    serve.set_defaults(handler=partial(serve_with_plugins, manager=manager))

    manager.call_each("agentloop_register_commands", register=_Commands(commands, common))
    return parser


def serve_with_plugins(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop serve`: the gateway, with the chosen plugins' tools and their `deps`.

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
    return serve_command(args, tools=tools, deps=deps)


class _Commands:
    """The `register` callable of `agentloop_register_commands`."""

    def __init__(
        self,
        commands: argparse._SubParsersAction[_Parser],
        common: _Parser,
    ) -> None:
        self.commands = commands
        self.common = common

    def __call__(
        self, name: str, *, help: str, handler: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        """Add the subcommand `name`; returns its parser for the plugin's arguments."""
        if name in self.commands.choices:
            raise ConfigurationError(f"the command {name!r} already exists")
        parser = self.commands.add_parser(
            name, parents=[self.common], help=help, allow_abbrev=False
        )
        parser.set_defaults(handler=handler)
        return parser


def main(argv: Sequence[str] | None = None, *, manager: PluginManager | None = None) -> int:
    """Run the `agentloop` command; returns the exit code.

    Args:
        argv: The arguments (default: `sys.argv[1:]`).
        manager: The plugins to use instead of the installed ones (for testing a
            plugin's part of the command without installing it).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    was_configured, saved = structlog.is_configured(), structlog.get_config()
    try:
        # Plugins load (and may log) before the parser that knows their options exists.
        json_logs, verbose = _logging_flags(words)
        configure_logging(json_logs=json_logs, verbose=verbose)
        if manager is None:
            manager = default_manager()
        try:
            args = build_parser(manager).parse_args(words)
        except SystemExit as exc:  # --help, --version and usage errors
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        configure_logging(json_logs=args.log_json, verbose=args.verbose)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except ConfigurationError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except AgentloopError as exc:
        _error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    finally:
        if was_configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()


def _logging_flags(words: Sequence[str]) -> tuple[bool, bool]:
    """`--log-json` and `-v` as given, read before the arguments are parsed."""
    options = words[: words.index("--")] if "--" in words else words
    return "--log-json" in options, "-v" in options or "--verbose" in options


def _error(message: str) -> None:
    print(f"agentloop: error: {message}", file=sys.stderr)


# --------------------------------------------------------------------------- logging


def configure_logging(
    *, json_logs: bool = False, verbose: bool = False, progress: TextIO | None = None
) -> None:
    """Send log events to stderr: console lines on a terminal, JSON lines with `json_logs`.

    Warnings and errors are shown (but not `run.error` and `plugin.load_failed`, which the
    commands report themselves); every event with `verbose` or `json_logs`. With
    `progress`, a line per model request and per tool call is written there.
    """
    everything = verbose or json_logs
    processors: list[Any] = [structlog.contextvars.merge_contextvars]
    processors.append(structlog.processors.add_log_level)
    if progress is not None:
        processors.append(ProgressPrinter(progress))
    processors.append(_Filter("debug" if everything else "warning", drop_reported=not everything))
    processors.append(structlog.processors.TimeStamper(fmt="iso"))
    if json_logs:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


class _Filter:
    """Drops events below a level, and those the command reports itself.

    It runs after the progress printer, so progress lines do not depend on the level.
    """

    def __init__(self, level: str, *, drop_reported: bool) -> None:
        self.minimum = _LEVELS[level]
        self.drop_reported = drop_reported

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if _LEVELS.get(str(event.get("level", "info")), 20) < self.minimum:
            raise structlog.DropEvent
        if self.drop_reported and event.get("event") in _REPORTED_BY_THE_COMMAND:
            raise structlog.DropEvent
        return event


class ProgressPrinter:
    """A structlog processor that prints a line per model request and per tool call.

    It watches the library's `model.request` and `tool.call` events and passes every
    event on unchanged, so progress works whatever the log level.
    """

    def __init__(self, out: TextIO) -> None:
        """Print progress lines to `out`."""
        self.out = out

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """Print a line for the events of interest; return `event` unchanged."""
        line = progress_line(event)
        if line is not None:
            print(line, file=self.out, flush=True)
        return event


def progress_line(event: MutableMapping[str, Any]) -> str | None:
    """The progress line for a log event, or None for events that do not make one."""
    name = event.get("event")
    if name == "model.request":
        return (
            f"[round {event.get('round')}] model answered: stop_reason={event.get('stop_reason')}"
            f", {event.get('input_tokens')} in / {event.get('output_tokens')} out tokens"
            f", {event.get('latency', 0):.2f} s"
        )
    if name == "tool.call":
        status = "error" if event.get("is_error") else "ok"
        return (
            f"[round {event.get('round')}]   tool {event.get('name')}: {status}"
            f" ({float(event.get('duration', 0)) * 1000:.1f} ms)"
        )
    return None


# --------------------------------------------------------------------------- run


def run_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop run PROMPT`."""
    setups = run_setups(manager, args)
    tools = choose_tools(manager, setups, plugins=args.plugins, tools=args.tools)
    sources = {t.source for t in tools}
    exposed = {name: setup for name, setup in setups.items() if name in sources}
    deps = run_deps(exposed)
    provider: Provider
    if args.provider == "openai" and not args.offline:
        from .providers.openai import provider_from_options

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
    )
    result = anyio.run(_run, agent, provider, args.prompt, deps)
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
        _error(problem)
    return EXIT_FAILED if problems else EXIT_OK


async def _run(agent: Agent, provider: Provider, prompt: str, deps: Any) -> RunResult:
    """The run, then the API client's connections closed (in the run's event loop)."""
    try:
        return await agent.run(prompt, deps=deps)
    finally:
        client = getattr(provider, "client", None)
        close = getattr(client, "close", None)
        if close is not None:
            await close()


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
    return chosen


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


def print_result(result: RunResult, sections: Sequence[tuple[str, str]], out: TextIO) -> None:
    """The human report: transcript, tool log, the plugins' sections, then the result."""
    for title, body in (
        ("Transcript", format_transcript(result.messages)),
        ("Tool log", format_tool_log(result.tool_calls)),
        *sections,
    ):
        print(f"\n== {title} ==\n{body}", file=out)
    usage = result.usage
    print(
        f"\n== Result ==\nstop_reason={result.stop_reason}, rounds={result.rounds}, "
        f"tokens: {usage.input_tokens} in / {usage.output_tokens} out\n\n{result.text}",
        file=out,
    )


def result_to_json(result: RunResult) -> dict[str, Any]:
    """The RunResult as JSON-ready data."""
    return {
        "text": result.text,
        "stop_reason": result.stop_reason,
        "rounds": result.rounds,
        "usage": dataclasses.asdict(result.usage),
        "tool_calls": [dataclasses.asdict(call) for call in result.tool_calls],
        "messages": result.messages,
        "run_id": result.run_id,
    }


def _short(value: Any, limit: int = 70) -> str:
    shown = " ".join(str(value).split())
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def format_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The run's history as readable lines: text, tool calls and their results."""
    lines: list[str] = []
    names: dict[str, str] = {}
    for message in messages:
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            lines.append(f"{role}: {content}")
            continue
        for block in content if isinstance(content, list) else []:
            kind = block.get("type")
            if kind == "text":
                lines.append(f"{role}: {block.get('text', '')}")
            elif kind == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
                given = block.get("input") or {}
                shown = ", ".join(f"{k}={_short(v, 50)!r}" for k, v in given.items())
                lines.append(f"{role} -> {block.get('name')}({shown})")
            elif kind == "tool_result":
                flag = " [error]" if block.get("is_error") else ""
                result = _short(_result_text(block.get("content"))) or "(empty)"
                name = names.get(str(block.get("tool_use_id")), "?")
                lines.append(f"tool {name}{flag} <- {result}")
            else:
                lines.append(f"{role}: [{kind}]")
    return "\n".join(lines)


def _result_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))


def format_tool_log(calls: Sequence[ToolCallRecord]) -> str:
    """A table of the run's tool calls: round, tool, is_error, duration."""
    if not calls:
        return "(no tool calls)"
    width = max(len("tool"), *(len(c.name) for c in calls))
    rows = [f"{'round':>5}  {'tool':<{width}}  {'is_error':<8}  duration"]
    rows += [
        f"{c.round:>5}  {c.name:<{width}}  {c.is_error!s:<8}  {c.duration * 1000:.1f} ms"
        for c in calls
    ]
    return "\n".join(rows)


# --------------------------------------------------------------------------- plugins, tools


def plugins_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop plugins`: loaded plugins, those switched off, then failures."""
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
        print(f"{info.name}{version}{dist}: {', '.join(info.tools) or '(no tools)'}")
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
        print(f"{item.name:<{width}}  [{item.source}]  {summary}")
        if args.schema:
            schema = json.dumps(item.input_schema, indent=2)
            print("\n".join("    " + line for line in schema.splitlines()))
    return EXIT_OK


def _tool_json(item: Tool) -> dict[str, Any]:
    return {
        "name": item.name,
        "plugin": item.source,
        "description": item.description,
        "input_schema": item.input_schema,
    }
