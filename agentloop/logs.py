"""The logger agentloop's modules log their events with: structlog over the stdlib `logging`.

Every event (`run.start`, `tool.call`, ...) is a structlog event written to the stdlib
logger `agentloop`, which has a `NullHandler`: nothing is printed until the application
configures logging. Its processors are the application's structlog configuration, or, while
there is none, a plain chain for the stdlib: filter by the logger's level first, then a
record whose message is `event key=value ...`. structlog's own defaults are never used:
they render every event (locals in tracebacks included) for a console, before the level
is known. `run_id`, `round` and `tool_use_id` come from structlog's contextvars.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import structlog
from structlog.typing import EventDict, Processor

__all__ = ("LOGGER_NAME", "get_logger", "stdlib_logger")

LOGGER_NAME = "agentloop"
"""The name of the stdlib logger every agentloop event goes to."""

stdlib_logger = logging.getLogger(LOGGER_NAME)
"""The stdlib logger every agentloop event goes to (silent until the application logs)."""
stdlib_logger.addHandler(logging.NullHandler())

# The frames between the module that logs and `logging`: structlog's stdlib BoundLogger
# method and its two `_proxy_to_logger`. The record then points at the line that logged.
_STRUCTLOG_FRAMES = 3


def _as_record(
    logger: Any, method: str, event: EventDict
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of the stdlib call: `event key=value ...`, the fields as `extra`."""
    exc_info = event.pop("exc_info", None)
    name = event.pop("event", "")
    message = " ".join([str(name), *(f"{key}={value!r}" for key, value in event.items())])
    extra = {"event": name, "fields": event}
    return (message,), {
        "exc_info": exc_info,
        "extra": extra,
        "stacklevel": 1 + _STRUCTLOG_FRAMES,
    }


_PLAIN: tuple[Processor, ...] = (
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    _as_record,
)


class _Processors:
    """The processor chain, read when each event is logged (see the module docstring)."""

    def __iter__(self) -> Iterator[Processor]:
        if structlog.is_configured():
            return iter(structlog.get_config()["processors"])
        return iter(_PLAIN)


def get_logger() -> structlog.stdlib.BoundLogger:
    """The logger for a module's events: structlog's stdlib BoundLogger over `stdlib_logger`.

    Bound loggers follow structlog's configuration as it changes (so
    `structlog.testing.capture_logs()` sees their events), and they always write to
    `stdlib_logger`, never to structlog's default of printing to standard output.
    """
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        stdlib_logger, processors=_Processors(), wrapper_class=structlog.stdlib.BoundLogger
    )
    return logger
