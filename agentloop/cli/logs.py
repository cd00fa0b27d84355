"""The command's logging: structlog for the stdlib, one handler on stderr, progress lines.

The library writes its events to the stdlib logger `agentloop` (`agentloop.logs`); the
command configures structlog for the stdlib (`ProcessorFormatter`) and puts one handler on
the root logger, so the library's events, the tools' own structlog events and other
libraries' warnings come out alike: console lines, or JSON lines with `--log-json`.
`command_logging()` puts structlog and `logging` back as they were when the command ends.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from agentloop.logs import stdlib_logger

__all__ = (
    "ProgressPrinter",
    "command_logging",
    "configure_logging",
    "logging_options",
    "progress_line",
)

_HANDLER_NAME = "agentloop-command"
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_REPORTED_BY_THE_COMMAND = frozenset({"run.error", "plugin.load_failed", "plugin.tool_left_out"})
"""Events whose news the command prints itself: as its error line (a failed run, a failed
plugin the command uses), in `agentloop plugins` (every plugin that failed), or as a
warning line (a tool left out for another plugin's of its name)."""


def logging_options() -> argparse.ArgumentParser:
    """A parent parser with the logging options every command takes: `--log-json`, `-v`."""
    options = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    options.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    options.add_argument("-v", "--verbose", action="store_true", help="log every event")
    return options


def configure_logging(
    *, json_logs: bool = False, verbose: bool = False, progress: TextIO | None = None
) -> None:
    """Send log events to stderr: console lines on a terminal, JSON lines with `json_logs`.

    Warnings and errors are shown (but not `run.error` and `plugin.load_failed`, which the
    commands report themselves, and a tool's exception without its traceback); every
    agentloop event, tracebacks included, with `verbose` or `json_logs`. With
    `progress`, a line per model request and per tool call is written there. Calling it
    again replaces the previous configuration.
    """
    everything = verbose or json_logs
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
    ]
    if progress is not None:
        processors.append(ProgressPrinter(progress))
    processors += [
        _Filter("debug" if everything else "warning", drop_reported=not everything),
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ]
    structlog.configure(
        processors=processors,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    rendering: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if json_logs:
        rendering += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        rendering.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=rendering,
            foreign_pre_chain=[  # records of other libraries' stdlib loggers
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso"),
            ],
        )
    )
    root = logging.getLogger()
    _remove_handler(root)
    root.addHandler(handler)
    stdlib_logger.setLevel(logging.DEBUG)  # the level is chosen by `_Filter`, above


@contextmanager
def command_logging() -> Iterator[None]:
    """Put structlog's configuration and the loggers back as they were when the block ends."""
    was_configured, saved = structlog.is_configured(), structlog.get_config()
    level = stdlib_logger.level
    try:
        yield
    finally:
        _remove_handler(logging.getLogger())
        stdlib_logger.setLevel(level)
        if was_configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()


def _remove_handler(root: logging.Logger) -> None:
    for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(handler)
        handler.close()


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
        if self.drop_reported and event.get("event") == "tool.exception":
            # The call's is_error result already tells the model and the report; one line
            # (its `error` field) is enough here, and `-v` keeps the traceback.
            event.pop("exc_info", None)
            event["hint"] = "-v shows the traceback"
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
