"""Which tool calls wait for the caller, and the caller's answers to them.

A turn asks the run's `Gate` about each call before it starts it: a call of an external
tool is handed back to be run by the caller, and a call that needs approval waits for a
person's `Approve` or `Deny`. Both end the run after the turn's other calls, with a state
that `Agent.resume` continues (see `agentloop.state` and `agentloop.resume`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from .calls import ToolCall
from .context import RunContext
from .errors import ConfigurationError
from .logs import get_logger
from .registry import ToolRegistry

__all__ = (
    "ApprovalPolicy",
    "ApprovalRule",
    "Approve",
    "Decision",
    "Deny",
    "Gate",
    "Waiting",
    "agent_rule",
)

_log = get_logger()

ApprovalRule = Callable[[RunContext[Any], dict[str, Any]], bool | str]
"""`rule(ctx, input)`, called once per call: True (or a reason, as a non-empty string)
when the call needs approval, False when it may run."""

ApprovalPolicy = bool | ApprovalRule
"""A tool's `requires_approval`: always, never, or decided per call by a rule."""


@dataclass(frozen=True)
class Approve:
    """Let a call that waits for approval run, with the model's input or an edited one."""

    input: dict[str, Any] | None = None
    """The input to run the call with instead of the model's (validated again); `None`
    runs it as the model asked."""


@dataclass(frozen=True)
class Deny:
    """Refuse a call that waits for approval: the model gets an `is_error` result."""

    reason: str = "the call was denied"
    """What the model is told, so it can act on it (ask, try something else, stop)."""


Decision = Approve | Deny
"""A person's answer to a call that waits for approval."""


@dataclass(frozen=True)
class Waiting:
    """Why a call does not run in its turn."""

    kind: Literal["approval", "external"]
    """`"approval"`: it waits for a decision; `"external"`: the caller runs it."""
    reason: str
    """Why it waits, for the person deciding (and the logs)."""


class Gate:
    """Which calls of a run wait: those of external tools, and those needing approval.

    A call needs approval when its tool's `requires_approval` says so or when the agent's
    `approval_required` does (either one is enough). A call whose input the tool refuses
    never waits: it does not run, and the model is told what to fix. A rule that raises
    is taken to mean "needs approval": a broken policy must not let a sensitive call
    through.
    """

    def __init__(
        self,
        registry: ToolRegistry | None = None,
        *,
        external_names: Collection[str] = frozenset(),
        approval_required: Collection[str] | ApprovalRule | None = None,
    ) -> None:
        """A gate over the tools of `registry`, the run's external tools and the agent's rule."""
        self.registry = registry
        self.external_names = frozenset(external_names)
        self.approval_required = approval_required

    def check(self, call: ToolCall, ctx: RunContext[Any]) -> Waiting | None:
        """Whether `call` waits, and why; None: it runs.

        `ctx` is the turn's context: a rule that is a function gets the call's
        (`ctx.for_call(call)`), made only then.
        """
        if call.name in self.external_names:
            return Waiting("external", f"'{call.name}' is an external tool: the caller runs it")
        tool = self.registry.get(call.name) if self.registry is not None else None
        if tool is None:
            return None  # answered "unknown tool" by the registry; nothing to approve
        policies = [
            (tool.requires_approval, f"tool '{call.name}' requires approval"),
            (self._agent_policy(call.name), f"the agent requires approval for '{call.name}'"),
        ]
        if all(policy is False for policy, _ in policies):
            return None
        try:
            tool.validate(call.input)
        except ValidationError:
            return None  # answered with what is wrong, without running: nothing to approve
        call_ctx = ctx.for_call(call)
        for policy, whose in policies:
            reason = _ask(policy, call_ctx, call.input, whose)
            if reason is not None:
                return Waiting("approval", reason)
        return None

    def _agent_policy(self, name: str) -> ApprovalPolicy:
        rule = self.approval_required
        if rule is None:
            return False
        if callable(rule):
            return rule
        return name in rule


def _ask(
    policy: ApprovalPolicy, ctx: RunContext[Any], input: dict[str, Any], whose: str
) -> str | None:
    """The reason `policy` gives for the call to wait, or None when it may run."""
    if policy is True:
        return whose
    if policy is False:
        return None
    try:
        verdict = policy(ctx, dict(input))
    except Exception as exc:
        _log.exception("approval.rule_failed", tool_use_id=ctx.tool_use_id, name=ctx.tool_name)
        return f"{whose}: its approval rule failed ({type(exc).__name__}: {exc})"
    if isinstance(verdict, str):
        return f"{whose}: {verdict}" if verdict else None
    return whose if verdict else None


def agent_rule(value: Any) -> Collection[str] | ApprovalRule | None:
    """`Agent(approval_required=...)` checked: tool names, a rule, or None.

    Raises:
        ConfigurationError: anything else.
    """
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Collection):
        raise ConfigurationError(
            "approval_required must be a set of tool names or a function (ctx, input) -> bool, "
            f"not {value!r}"
        )
    names = frozenset(value)
    if not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"approval_required must hold tool names, not {value!r}")
    return names
