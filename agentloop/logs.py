"""Where agentloop's log events go: the application's structlog, else the stdlib `logging`.

Every module logs through `get_logger()`. A library stays silent until the application
decides otherwise: with structlog configured (`structlog.configure(...)`), events go
through the application's structlog pipeline; without it, they go to the stdlib logger
`agentloop`, which has a `NullHandler`, so nothing is printed unless the application
configured `logging`. structlog's unconfigured default (print everything to stdout) is
never used.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import structlog

__all__ = ("LOGGER_NAME", "Logger", "get_logger", "stdlib_logger")

LOGGER_NAME = "agentloop"
"""The name of agentloop's structlog logger and of its stdlib logger."""

stdlib_logger = logging.getLogger(LOGGER_NAME)
"""The stdlib logger events go to when structlog is not configured."""
stdlib_logger.addHandler(logging.NullHandler())


class Logger:
    """agentloop's logger: structlog's interface, routed at emit time.

    `bind()` and the level methods (`debug`, `info`, `warning`, `error`, `exception`,
    `critical`) take an event name and keyword fields, as structlog's do. While
    structlog is configured, `bind()` returns a logger of the application's structlog
    configuration, so a run's events take the application's own path (and
    `structlog.testing.capture_logs()` sees them). Otherwise each event becomes a record
    of the stdlib logger `agentloop`, built only when that logger is enabled for its level.
    """

    __slots__ = ("_context",)

    def __init__(self, context: Mapping[str, Any] | None = None) -> None:
        """A logger whose events carry `context`."""
        self._context: dict[str, Any] = dict(context or {})

    def bind(self, **values: Any) -> Any:
        """A logger whose events also carry `values`."""
        if structlog.is_configured():
            return structlog.get_logger(LOGGER_NAME).bind(**self._context, **values)
        return Logger({**self._context, **values})

    def debug(self, event: str, **fields: Any) -> None:
        """Log `event` at debug level."""
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log `event` at info level."""
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log `event` at warning level."""
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log `event` at error level."""
        self._emit(logging.ERROR, "error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log `event` at error level with the exception being handled."""
        fields.setdefault("exc_info", True)
        self._emit(logging.ERROR, "exception", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        """Log `event` at critical level."""
        self._emit(logging.CRITICAL, "critical", event, fields)

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            bound = structlog.get_logger(LOGGER_NAME).bind(**self._context)
            getattr(bound, method)(event, **fields)
        elif stdlib_logger.isEnabledFor(level):
            exc_info = fields.pop("exc_info", None)
            values = {**structlog.contextvars.get_contextvars(), **self._context, **fields}
            message = " ".join([event, *(f"{key}={value!r}" for key, value in values.items())])
            stdlib_logger.log(
                level,
                message,
                exc_info=exc_info,
                extra={"event": event, "fields": values},
                stacklevel=3,  # the line that logged, not this module
            )


_root = Logger()


def get_logger() -> Any:
    """The logger agentloop logs its events with (see `Logger`).

    Typed `Any`, like `structlog.get_logger()`: while structlog is configured, `bind()`
    returns one of structlog's bound loggers.
    """
    return _root
