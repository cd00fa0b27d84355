"""Configuration of the cortex plugin, and how a tool call finds it in the run's `deps`.

The configuration never comes from globals or the environment: every run says where its
persona lives by passing a `CortexConfig` as (or inside) `agent.run(..., deps=...)`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop import ToolError

__all__ = (
    "NOT_CONFIGURED",
    "CortexConfig",
    "config_from_deps",
    "config_problem",
    "persona_problem",
)

NOT_CONFIGURED = (
    "cortex is not configured for this run: pass deps=CortexConfig(root=..., persona=...)"
)
"""The tool error a call gets when its run's `deps` carry no `CortexConfig`."""

_PERSONA = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, kw_only=True)
class CortexConfig:
    """Where one persona's cortex files live and how much they may hold.

    Pass it to a run as `deps=CortexConfig(...)`, as an attribute `deps.cortex`, or as
    `deps["cortex"]` of a mapping.

    Raises:
        ValueError: a field is invalid (see `config_problem`).
    """

    root: Path
    """Directory holding one subdirectory per persona; created on the first write."""
    persona: str
    """Name of the persona's directory under `root`: 1-64 ASCII letters, digits, '-', '_'
    or '.', not starting with a dot."""
    max_bytes: int = 256 * 1024
    """Largest size a file may reach, in bytes of its UTF-8 encoding."""
    history: int = 20
    """How many previous versions are kept per file (0 keeps none)."""

    def __post_init__(self) -> None:
        try:
            root = Path(self.root)
        except TypeError:
            raise ValueError(f"invalid cortex root {self.root!r}: it must be a path") from None
        object.__setattr__(self, "root", root)
        problem = config_problem(self)
        if problem is not None:
            raise ValueError(problem)


def persona_problem(persona: object) -> str | None:
    """Why `persona` is not a valid persona name, or None if it is."""
    if not isinstance(persona, str) or _PERSONA.fullmatch(persona) is None:
        return (
            f"invalid persona name {persona!r}: use 1-64 ASCII letters, digits, '-', '_' "
            "or '.', not starting with '.'"
        )
    return None


def config_problem(config: CortexConfig) -> str | None:
    """Why `config` cannot be used, or None if it can."""
    problem = persona_problem(config.persona)
    if problem is not None:
        return problem
    if not isinstance(config.root, Path) or not str(config.root) or "\0" in str(config.root):
        return f"invalid cortex root {config.root!r}"
    max_bytes: Any = config.max_bytes
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        return f"max_bytes must be a positive integer, not {max_bytes!r}"
    history: Any = config.history
    if isinstance(history, bool) or not isinstance(history, int) or history < 0:
        return f"history must be an integer >= 0, not {history!r}"
    return None


def config_from_deps(deps: object) -> CortexConfig:
    """The `CortexConfig` a run's `deps` carry.

    `deps` may be a `CortexConfig`, have a `cortex` attribute holding one, or be a mapping
    with a `"cortex"` key holding one.

    Raises:
        ToolError: no `CortexConfig` was found.
    """
    if isinstance(deps, CortexConfig):
        return deps
    candidate: object = None
    if isinstance(deps, Mapping):
        candidate = deps.get("cortex")
    elif deps is not None:
        candidate = getattr(deps, "cortex", None)
    if isinstance(candidate, CortexConfig):
        return candidate
    raise ToolError(NOT_CONFIGURED)
