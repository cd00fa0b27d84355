"""`main()`: the entry point of the `agentloop` command (and of `python -m agentloop`).

It answers `agentloop --version` before importing anything else: plugins, the agent and
the SDKs take seconds to import, the version nothing. Otherwise it configures logging,
loads the plugins, parses the arguments and calls the subcommand's handler, turning
agentloop's errors into one line on stderr and an exit code (`exits`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agentloop import __version__

from .exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, error

if TYPE_CHECKING:
    import argparse

    from agentloop.plugins import PluginManager

__all__ = ("main",)


def main(argv: Sequence[str] | None = None, *, manager: PluginManager | None = None) -> int:
    """Run the `agentloop` command; returns the exit code.

    Args:
        argv: The arguments (default: `sys.argv[1:]`).
        manager: The plugins to use instead of the installed ones (for testing a
            plugin's part of the command without installing it).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--version"]:
        print(f"agentloop {__version__}")
        return EXIT_OK
    try:
        return _command(words, manager)
    except KeyboardInterrupt:  # at any point, start-up (imports, plugins) included
        error("interrupted")
        return EXIT_INTERRUPTED


def _command(words: list[str], manager: PluginManager | None) -> int:
    """The command after `--version`: logging, plugins, arguments, the handler."""
    # Imported here, so that `--version` does not wait for them.
    from agentloop.errors import AgentloopError, ConfigurationError
    from agentloop.plugins import default_manager

    from .logs import command_logging, configure_logging
    from .parser import build_parser

    with command_logging():
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
            error(str(exc))
            return EXIT_USAGE
        except AgentloopError as exc:
            error(str(exc))
            return EXIT_FAILED


def _logging_flags(words: Sequence[str]) -> tuple[bool, bool]:
    """`--log-json` and `-v` as given, read before the arguments are parsed."""
    options = words[: words.index("--")] if "--" in words else words
    return "--log-json" in options, "-v" in options or "--verbose" in options
