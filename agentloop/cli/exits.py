"""The command's exit codes and its one-line error messages, shared by every subcommand.

Exit codes: 0 success, 1 the run failed, 2 a usage or configuration error (including a
tool name registered by two plugins), 130 interrupted. Every error is one line on stderr.
"""

from __future__ import annotations

import sys

__all__ = ("EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "error")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def error(message: str) -> None:
    """Print `agentloop: error: <message>` on standard error."""
    print(f"agentloop: error: {message}", file=sys.stderr)
