"""One set of rules for the numbers a run is configured with, used by every entry point.

`Agent`, the gateway's configuration and the command line all check counts and seconds
here, so they agree on what is allowed (`math.inf` seconds means "no limit"; a count is a
whole number >= 1) and say so in the same words.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigurationError

__all__ = ("check_count", "check_seconds", "parse_count", "parse_seconds")


def check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    """`value` if it is a whole number >= `minimum` (1 unless told otherwise).

    Raises:
        ConfigurationError: it is not (a bool, a float, less than `minimum`).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be a whole number >= {minimum}, not {value!r}")
    return value


def check_seconds(name: str, value: Any, *, finite: bool = False) -> float:
    """`value` as float if it is a number of seconds > 0; `math.inf` means no limit.

    With `finite`, `math.inf` is refused too: a duration that must end (a lease).

    Raises:
        ConfigurationError: it is not (a bool, NaN, zero or less, not a number, or
            infinite with `finite`).
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value <= 0
        or (finite and math.isinf(value))
    ):
        kind = "a finite number" if finite else "a number"
        raise ConfigurationError(f"{name} must be {kind} of seconds > 0, not {value!r}")
    return float(value)


def parse_count(name: str, text: str) -> int:
    """A count written as text (an option's value), checked by `check_count`."""
    try:
        value: Any = int(text)
    except ValueError:
        value = text
    return check_count(name, value)


def parse_seconds(name: str, text: str) -> float:
    """Seconds written as text (`inf` for no limit), checked by `check_seconds`."""
    try:
        value: Any = float(text)
    except ValueError:
        value = text
    return check_seconds(name, value)
