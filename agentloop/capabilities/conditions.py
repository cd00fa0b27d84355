"""The failures `Fallback` and `Retries` act on, named as their `on=` takes them.

A condition is a string: a kind of failed request (`"overloaded"`, `"server_error"`,
`"rate_limit"`, `"connection"`, each an `agentloop.errors` class) or, for a fallback, a
response the model gave but that is no answer (`"refusal"`, and `"context_length"`,
which is also the API's refusal of a prompt that is too long).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from agentloop.compaction import is_length_refusal
from agentloop.errors import (
    APIConnectionError,
    ConfigurationError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
)
from agentloop.providers.base import ModelResponse

__all__ = (
    "ERRORS",
    "FAILURES",
    "Condition",
    "check_conditions",
    "failed",
    "refused",
)

Condition = Literal[
    "overloaded", "server_error", "rate_limit", "connection", "refusal", "context_length"
]
"""A condition `Fallback(on=...)` and `Retries(on=...)` name."""

ERRORS: Mapping[str, type[ProviderError]] = {
    "overloaded": OverloadedError,
    "server_error": ServerError,
    "rate_limit": RateLimitError,
    "connection": APIConnectionError,
}
"""The conditions that are a failed request: 529, another 5xx, 429, no (whole) answer."""

FAILURES = frozenset(ERRORS)
"""What retrying the same request can fix (`Retries`' conditions, and its default)."""

_STOP_REASONS = {"refusal": "refusal", "context_length": "model_context_window_exceeded"}
"""The conditions that are a response, by the stop reason it ends with."""


def check_conditions(on: Any, allowed: Collection[str], where: str) -> frozenset[str]:
    """`on` as a set of condition names, each one of `allowed`.

    Raises:
        ConfigurationError: `on` is not a non-empty list of names, or names one that
            `where` does not know.
    """
    if isinstance(on, (str, bytes)) or not isinstance(on, Collection) or not on:
        raise ConfigurationError(
            f"{where}(on=...) must be a non-empty list of conditions, e.g. "
            f"on=('overloaded', 'server_error'), not {on!r}"
        )
    unknown = [name for name in on if name not in allowed]
    if unknown:
        raise ConfigurationError(
            f"{where}(on=...): unknown condition {unknown[0]!r}; the conditions are "
            + ", ".join(repr(name) for name in sorted(allowed))
        )
    return frozenset(on)


def failed(error: BaseException, conditions: Collection[str]) -> str | None:
    """The condition of `conditions` that the failed request `error` meets, or None."""
    if not isinstance(error, ProviderError):
        return None
    for name in conditions:
        kind = ERRORS.get(name)
        if kind is not None and isinstance(error, kind):
            return name
    if "context_length" in conditions and is_length_refusal(error):
        return "context_length"
    return None


def refused(response: ModelResponse, conditions: Collection[str]) -> str | None:
    """The condition of `conditions` that `response` meets by its stop reason, or None."""
    for name, stop_reason in _STOP_REASONS.items():
        if name in conditions and response.stop_reason == stop_reason:
            return name
    return None
