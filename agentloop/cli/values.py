"""Value types for the command line's options, shared by `agentloop` and its `serve` command.

Each reads one option's text and raises `argparse.ArgumentTypeError` with a message that
says what was expected, so a bad value is one clear line. Counts and seconds are checked
by `agentloop.checks`, the rules `Agent` applies, so the command accepts what `Agent` does
(`inf` seconds: no limit).
"""

from __future__ import annotations

import argparse
import math

from agentloop.checks import parse_count, parse_seconds
from agentloop.errors import ConfigurationError

__all__ = ("finite_seconds", "port", "prompt", "seconds", "whole_number")


def prompt(value: str) -> str:
    """Text with something in it."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"expected some text to send, got {value!r}")
    return value


def whole_number(value: str) -> int:
    """A whole number >= 1, as `Agent` counts (`agentloop.checks.parse_count`)."""
    try:
        return parse_count("value", value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}") from exc


def seconds(value: str) -> float:
    """A number of seconds > 0, `inf` for no limit, as `Agent` takes them."""
    try:
        return parse_seconds("value", value)
    except ConfigurationError as exc:
        expected = f"expected a number of seconds > 0, got {value!r}"
        raise argparse.ArgumentTypeError(expected) from exc


def finite_seconds(value: str) -> float:
    """A finite number of seconds > 0: a duration that must end (a session's lifetime)."""
    number = seconds(value)
    if math.isinf(number):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {value!r}")
    return number


def port(value: str) -> int:
    """A TCP port number (0 for any free one)."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0-65535), got {value!r}")
    return number
