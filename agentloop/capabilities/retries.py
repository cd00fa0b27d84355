"""Retries of a round's model request, as one policy an agent or a run chooses.

Without `Retries`, a failed request is retried where it fails: the SDK client retries
an error status or a lost connection (`max_retries`, 2 by default, honouring
`retry-after` up to the provider's `max_retry_wait`), and `AnthropicProvider` retries a
stream that fails before its first block. With `Retries`, the capability retries the
whole request (`Capability.wrap_request`) with its own policy, and the requests it sends
go out without those retries (`agentloop.providers.retried_by_caller`), so one policy
decides, not two nested ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import anyio
import tenacity

from agentloop.checks import check_count, check_seconds
from agentloop.errors import ConfigurationError, ProviderError
from agentloop.logs import get_logger
from agentloop.providers import retried_by_caller
from agentloop.providers.base import ModelRequest, ModelResponse, retry_after

from .base import Capability, NextRequest
from .conditions import FAILURES, Condition, check_conditions, failed

if TYPE_CHECKING:
    from agentloop.context import RunContext

__all__ = ("Retries",)

_log = get_logger()


class Retries(Capability):
    """Retry a failed model request: `attempts` in all, with backoff, honouring `retry-after`.

    ```python
    agent = Agent(capabilities=[Retries(attempts=5, backoff=1.0)])
    ```

    The policy, for each request of the run:

    - A failure of one of `on` (by default all: `"overloaded"` 529, `"server_error"`
      other 5xx, `"rate_limit"` 429, `"connection"` no whole answer, in a stream too) is
      retried, up to `attempts` requests in all; any other failure is raised at once.
    - Before retry n (from 1) it waits `backoff * 2 ** (n - 1)` seconds, at most
      `max_backoff`, less up to 25 % jitter (the SDK's own schedule); or longer, when the
      error answer's `retry-after` asks for longer. An answer asking for more than
      `max_wait` is raised at once, with its headers, rather than waited for.
    - A request whose response streamed a tool call before it failed is not retried
      (the call may have started: see `ProviderError.tool_use_streamed`). A response
      shown in part and then dropped is announced by a `ResponseReplaced` event.
    - The requests it sends go out without the SDK client's own retries (and without
      `AnthropicProvider`'s retry of a failed empty stream): the defaults,
      `Retries(attempts=3, backoff=0.5, max_backoff=8.0)`, retry as those do, with a
      `model.retry` log event before each wait.

    Give it first (`Agent(capabilities=[Retries(), Fallback(...)])`) to retry the whole
    fallback sequence, or after `Fallback` to retry each model before falling back.
    """

    name = "retries"

    def __init__(
        self,
        attempts: int = 3,
        *,
        on: Collection[Condition] = ("overloaded", "server_error", "rate_limit", "connection"),
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_wait: float = 60.0,
    ) -> None:
        """Retry each model request of a run by this policy.

        Args:
            attempts: Requests in all, the first included (1: no retry).
            on: The failures retried (`"overloaded"`, `"server_error"`, `"rate_limit"`,
                `"connection"`).
            backoff: Seconds before the first retry (0: none); doubled for each next one.
            max_backoff: The longest backoff, in seconds.
            max_wait: The longest `retry-after` waited for, in seconds.

        Raises:
            ConfigurationError: `attempts` is not a whole number >= 1, a time is not a
                number of seconds >= 0 (> 0 for `max_wait`), or `on` names a condition
                that is not a failed request.
        """
        for label, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigurationError(
                    f"Retries({label}=...) must be a number of seconds >= 0, not {value!r}"
                )
        self.attempts = check_count("Retries(attempts=...)", attempts)
        """Requests in all, the first included."""
        self.on = check_conditions(on, FAILURES, "Retries")
        """The failures retried."""
        self.backoff = float(backoff)
        """Seconds before the first retry, doubled for each next one."""
        self.max_backoff = float(max_backoff)
        """The longest backoff, in seconds."""
        self.max_wait = check_seconds("Retries(max_wait=...)", max_wait)
        """The longest `retry-after` waited for, in seconds."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        """The response, after as many tries as the policy allows."""
        log = ctx.log or _log

        async def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "model.retry",
                attempt=state.attempt_number,
                wait=round(state.upcoming_sleep, 3),
                error=str(error),
                error_type=type(error).__name__,
            )

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception(self._retried),
            sleep=anyio.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        with retried_by_caller(ctx.run_id):
            async for attempt in retrying:
                with attempt:
                    return await call_next(request)
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    def _retried(self, error: BaseException) -> bool:
        """Whether the policy retries `error`."""
        if not isinstance(error, ProviderError) or error.tool_use_streamed:
            return False
        if failed(error, self.on) is None:
            return False
        asked = retry_after(error.headers)
        return asked is None or asked <= self.max_wait

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Seconds before the next try: the backoff, or the `retry-after` if longer."""
        backoff = min(self.backoff * 2 ** (state.attempt_number - 1), self.max_backoff)
        backoff *= 1 - 0.25 * random.random()  # jitter, as the SDK's
        error = state.outcome.exception() if state.outcome is not None else None
        asked = retry_after(error.headers) if isinstance(error, ProviderError) else None
        return float(max(backoff, asked or 0.0))

    def __repr__(self) -> str:
        return (
            f"Retries(attempts={self.attempts}, on={tuple(sorted(self.on))!r}, "
            f"backoff={self.backoff:g}, max_backoff={self.max_backoff:g}, "
            f"max_wait={self.max_wait:g})"
        )
