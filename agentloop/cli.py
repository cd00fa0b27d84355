"""The `agentloop` command: run an agent, list plugins, list tools.

It sits on top of the library: it loads plugins (`agentloop.plugins`), builds an `Agent`
and runs it, and it is the one place that configures structlog (to stderr). Without an
API key, `agentloop run` runs the offline demo (`agentloop.demo`) on a scripted model.

Exit codes: 0 success, 1 the run failed, 2 a usage or configuration error (including a
tool name registered by two plugins).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import structlog

from . import __version__
from .agent import DEFAULT_MODEL, Agent
from .demo import check_demo_tools, cortex_config, demo_provider, format_tool_log, print_demo_report
from .errors import AgentloopError, ConfigurationError
from .plugins import PluginManager, default_manager
from .result import RunResult
from .tools import Tool

__all__ = ("main",)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DEFAULT_PLUGIN = "cortex"
_CORTEX_SYSTEM = (
    "You have persistent files that outlive this conversation: memory.md, soul.md and "
    "relationship.md. Read them when they may help, and update them when you learn "
    "something worth keeping."
)
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its `run`, `plugins` and `tools` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    common.add_argument("-v", "--verbose", action="store_true", help="also log info events")

    parser = argparse.ArgumentParser(
        prog="agentloop", description="Run agents on the Anthropic Messages API."
    )
    parser.add_argument("--version", action="version", version=f"agentloop {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", parents=[common], help="run an agent on a prompt")
    run.add_argument("prompt", help="what to ask")
    run.add_argument("--model", default=DEFAULT_MODEL, help="model name")
    run.add_argument("--system", help="system prompt")
    run.add_argument("--persona", default="default", help="cortex persona (default: default)")
    run.add_argument("--cortex-root", type=Path, default=Path("cortex"), help="cortex directory")
    run.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="NAME",
        help="expose this plugin's tools (repeatable; default: cortex, if installed)",
    )
    run.add_argument(
        "--tool",
        action="append",
        dest="tools",
        metavar="NAME",
        help="expose only these tools (repeatable)",
    )
    run.add_argument("--max-rounds", type=_positive_int, default=10)
    run.add_argument("--concurrency", type=_positive_int, default=8, help="tool calls at once")
    run.add_argument("--timeout", type=_positive_float, default=30.0, help="seconds per tool")
    run.add_argument("--max-tokens", type=_positive_int, default=4096)
    run.add_argument("--json", action="store_true", help="print the RunResult as JSON")
    run.add_argument(
        "--offline", action="store_true", help="run the offline demo even with an API key"
    )
    run.set_defaults(handler=run_command)

    plugins = commands.add_parser("plugins", parents=[common], help="list installed plugins")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(handler=plugins_command)

    tools = commands.add_parser("tools", parents=[common], help="list the plugins' tools")
    tools.add_argument("--schema", action="store_true", help="show each tool's JSON schema")
    tools.add_argument("--json", action="store_true", help="print JSON (includes schemas)")
    tools.set_defaults(handler=tools_command)
    return parser


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `agentloop` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    saved = structlog.get_config()
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        configure_logging(json_logs=args.log_json, verbose=args.verbose)
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
        structlog.configure(**saved)


def _error(message: str) -> None:
    print(f"agentloop: error: {message}", file=sys.stderr)


# --------------------------------------------------------------------------- logging


def configure_logging(
    *, json_logs: bool = False, verbose: bool = False, progress: TextIO | None = None
) -> None:
    """Send log events to stderr: console lines on a terminal, JSON lines with `json_logs`.

    Warnings and errors are shown; info events too with `verbose` or `json_logs`.
    With `progress`, a line per model request and per tool call is written there.
    """
    processors: list[Any] = [structlog.contextvars.merge_contextvars]
    processors.append(structlog.processors.add_log_level)
    if progress is not None:
        processors.append(ProgressPrinter(progress))
    processors.append(_LevelFilter("info" if verbose or json_logs else "warning"))
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


class _LevelFilter:
    """Drops events below a level (after the progress printer has seen them)."""

    def __init__(self, level: str) -> None:
        self.minimum = _LEVELS[level]

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if _LEVELS.get(str(event.get("level", "info")), 20) < self.minimum:
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


def run_command(args: argparse.Namespace) -> int:
    """`agentloop run PROMPT`."""
    offline = args.offline or not os.environ.get("ANTHROPIC_API_KEY")
    if offline and not args.offline:
        print(
            "agentloop: ANTHROPIC_API_KEY is not set, so this runs the offline demo on the "
            "built-in scripted model (set the key to talk to Claude).",
            file=sys.stderr,
        )
    if not args.json:
        configure_logging(json_logs=args.log_json, verbose=args.verbose, progress=sys.stdout)
    tools = choose_tools(default_manager(), plugins=args.plugins, tools=args.tools)
    cortex = any(t.source == "cortex" for t in tools)
    deps = cortex_config(args.cortex_root, args.persona) if cortex else None
    if offline:
        check_demo_tools(tools)
    agent = Agent(
        model=args.model,
        provider=demo_provider() if offline else None,
        system=args.system or (_CORTEX_SYSTEM if cortex else None),
        tools=tools,
        max_rounds=args.max_rounds,
        tool_concurrency=args.concurrency,
        tool_timeout=args.timeout,
        max_tokens=args.max_tokens,
    )
    result = anyio.run(partial(agent.run, args.prompt, deps=deps))
    if args.json:
        print(json.dumps(result_to_json(result), indent=2, ensure_ascii=False))
    else:
        print_result(result, deps if offline else None, sys.stdout)
    return EXIT_OK


def choose_tools(
    manager: PluginManager, *, plugins: Sequence[str] | None, tools: Sequence[str] | None
) -> list[Tool]:
    """The tools a CLI run exposes: the chosen plugins (default cortex), narrowed by `tools`.

    With `tools` but no `plugins`, tools are picked by name from every plugin.
    """
    if plugins is None and tools is None:
        installed = {info.name for info in manager.plugins()}
        plugins = [DEFAULT_PLUGIN] if DEFAULT_PLUGIN in installed else None
    return manager.select(plugins=plugins, tools=tools)


def print_result(result: RunResult, demo_config: Any, out: TextIO) -> None:
    """The human summary: demo report (offline), tool table, stop reason, final text."""
    if demo_config is not None:
        print_demo_report(result, demo_config, out)
    else:
        print(f"\n== Tool calls ==\n{format_tool_log(result.tool_calls)}", file=out)
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


# --------------------------------------------------------------------------- plugins, tools


def plugins_command(args: argparse.Namespace) -> int:
    """`agentloop plugins`: installed plugins with version and tools, then failures."""
    manager = default_manager()
    infos = manager.plugins()
    if args.json:
        data = {
            "plugins": [dataclasses.asdict(info) for info in infos],
            "failures": [dataclasses.asdict(failure) for failure in manager.failures],
        }
        print(json.dumps(data, indent=2))
    else:
        if not infos:
            print("no plugins installed")
        for info in infos:
            version = f" {info.version}" if info.version else ""
            dist = f" ({info.dist})" if info.dist else ""
            print(f"{info.name}{version}{dist}: {', '.join(info.tools) or '(no tools)'}")
        for failure in manager.failures:
            print(f"FAILED {failure.name} ({failure.value or 'no entry point'}): {failure.error}")
    return EXIT_OK


def tools_command(args: argparse.Namespace) -> int:
    """`agentloop tools`: every plugin tool with its plugin (and schema)."""
    manager = default_manager()
    catalogue = manager.tools()
    if args.json:
        print(json.dumps([_tool_json(t) for t in catalogue], indent=2))
        return EXIT_OK
    if not catalogue:
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
