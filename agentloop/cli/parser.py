"""The command's argument parser: `run`, `plugins`, `tools`, `serve`, `chat`, plugins' part.

Plugins add `run` options (`agentloop_run_options`, also given to `tools`, `serve` and
`chat`) and commands of their own (`agentloop_register_commands`). Each subcommand's
handler is set as its `handler` default; usage errors are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from agentloop import __version__
from agentloop.defaults import DEFAULT_MODEL, DEFAULT_SESSIONS_ENV
from agentloop.errors import ConfigurationError
from agentloop.gateway.options import add_serve_command

from .chat import add_chat_options
from .exits import EXIT_USAGE
from .logs import logging_options
from .values import prompt, seconds, whole_number

if TYPE_CHECKING:
    from agentloop.plugins import PluginManager

__all__ = ("build_parser",)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless its text already speaks of it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS)
        if shown and action.option_strings and "default" not in text:
            text = f"{text} (default: %(default)s)".lstrip()
        return text


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on standard error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """An `argparse.ArgumentParser` that shows the options' defaults in its help."""
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(manager: PluginManager) -> argparse.ArgumentParser:
    """The argument parser: `run`, `plugins`, `tools`, and the plugins' commands and options."""
    common = _Parser(add_help=False, allow_abbrev=False, parents=[logging_options()])

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
    run.add_argument(
        "--capability",
        action="append",
        dest="capabilities",
        metavar="NAME",
        help="wrap the run in this plugin capability (repeatable; the first is the outermost)",
    )
    run.add_argument(
        "--require-approval",
        action="append",
        metavar="TOOL",
        help="ask before each call of this tool (repeatable; a tool may ask by itself)",
    )
    run.add_argument(
        "--max-rounds", type=whole_number, default=10, metavar="N", help="model requests"
    )
    run.add_argument(
        "--concurrency", type=whole_number, default=8, metavar="N", help="tool calls at once"
    )
    run.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds per tool call, inf for no limit",
    )
    run.add_argument(
        "--max-tokens",
        type=whole_number,
        default=4096,
        metavar="N",
        help="most tokens the model may write in each response",
    )
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
        choices=("openai", "ollama", "vllm", "llamacpp", "llama-cpp-python"),
        help="with --provider openai: the server's quirks preset",
    )
    kept = run.add_argument_group("session")
    kept.add_argument(
        "--session",
        metavar="NAME",
        help="continue the conversation NAME (made on first use) and keep this run in it",
    )
    kept.add_argument(
        "--session-db",
        metavar="PATH|URL",
        help=f"where sessions are kept: a SQLite file or redis://HOST:PORT/DB (default: "
        f"${DEFAULT_SESSIONS_ENV}, else ~/.local/share/agentloop/sessions.db)",
    )
    kept.add_argument(
        "--session-ttl",
        metavar="SECONDS",
        type=seconds,
        help="forget the conversation once it has not been written for SECONDS "
        "(default: kept until cleared)",
    )
    manager.call_each("agentloop_run_options", parser=run)
    run.set_defaults(handler=_later(".run", "run_command", manager=manager))

    plugins = commands.add_parser(
        "plugins", parents=[common], help="list installed plugins", allow_abbrev=False
    )
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(handler=_later(".listing", "plugins_command", manager=manager))

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
    tools.set_defaults(handler=_later(".listing", "tools_command", manager=manager))

    serve = add_serve_command(commands, parents=[common], allow_abbrev=False)
    # The gateway's tools take the same plugin options as a run's.
    manager.call_each("agentloop_run_options", parser=serve)
    serve.set_defaults(handler=_later(".run", "serve_with_plugins", manager=manager))

    chat = commands.add_parser(
        "chat", parents=[common], help="chat with an agent on a web page", allow_abbrev=False
    )
    add_chat_options(chat)
    manager.call_each("agentloop_run_options", parser=chat)
    chat.set_defaults(handler=_later(".chat", "chat_command", manager=manager))

    manager.call_each("agentloop_register_commands", register=_Commands(commands, common))
    return parser


def _later(module: str, name: str, **bound: Any) -> Callable[[argparse.Namespace], int]:
    """The handler `name` of `module` (in this package), imported when its command runs.

    Building the parser must not import what the commands use (the agent, the SDKs, the
    gateway): `agentloop --help` and `agentloop tools` would wait for all of it.
    """

    def handler(args: argparse.Namespace) -> int:
        command: Callable[..., int] = getattr(importlib.import_module(module, __package__), name)
        return command(args, **bound)

    return handler


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
