"""Deprecated: `RunStream` is now `agentloop.Run`, which `Agent.run_stream()` yields."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    """`RunStream`, the old name of `Run`, with a warning."""
    if name == "RunStream":
        warnings.warn(
            "agentloop.stream.RunStream is now agentloop.Run: agent.run_stream() yields a Run",
            DeprecationWarning,
            stacklevel=2,
        )
        from .run import Run

        return Run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
