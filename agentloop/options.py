"""What a run takes besides its prompt: the options of `Agent.run`, `resume` and `start`.

Typed dicts, so that `Agent`'s entry points (`agentloop.agent`) pass them on to `Run`
(`agentloop.run`) with `**options` and type checkers still see each one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypedDict

from .calls import ToolDefinition
from .capabilities.base import Capability
from .context import DepsT
from .effects import Effects
from .limits import UsageLimits
from .messages import Message
from .sessions.base import Session
from .state import PausedRun
from .tools import Tool
from .turn import Emit

__all__ = ("ResumeOptions", "RunOptions", "StartOptions")


class RunOptions(TypedDict, Generic[DepsT], total=False):
    """What a run may be given besides its prompt and output type (`Agent.run`, ...).

    Generic in the type of `deps`, which is the agent's `deps_type`.
    """

    history: Iterable[Message | Mapping[str, Any]] | None
    deps: DepsT
    tools: Iterable[Tool | Callable[..., Any]]
    external_tools: Sequence[ToolDefinition | Mapping[str, Any]]
    session: Session | None
    usage_limits: UsageLimits | None
    capabilities: Sequence[Capability]


class ResumeOptions(TypedDict, Generic[DepsT], total=False):
    """What `Agent.resume` takes besides the paused run's state."""

    decisions: Mapping[str, Any] | None
    results: Mapping[str, Any] | None
    deps: DepsT
    tools: Iterable[Tool | Callable[..., Any]]
    session: Session | None
    capabilities: Sequence[Capability]


class StartOptions(RunOptions[DepsT], total=False):
    """What `Agent.start` takes besides `RunOptions`: a resumption, and an engine's hooks."""

    state: Mapping[str, Any] | PausedRun | None
    decisions: Mapping[str, Any] | None
    results: Mapping[str, Any] | None
    stream: bool
    on_event: Emit | None
    effects: Effects | None
    run_id: str | None
