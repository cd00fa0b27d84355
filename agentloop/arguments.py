"""Value types for the command line's options, shared by `agentloop` and its `serve` command.

Each reads one option's text and raises `argparse.ArgumentTypeError` with a message that
says what was expected, so a bad value is one clear line.
"""

from __future__ import annotations

import argparse
import math

__all__ = ("port", "prompt", "seconds", "whole_number")


def prompt(value: str) -> str:
    """Text with something in it."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"expected some text to send, got {value!r}")
    return value


def whole_number(value: str) -> int:
    """A whole number >= 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def seconds(value: str) -> float:
    """A finite number of seconds > 0."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
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
