"""The retries of a model request, done by the providers rather than inside the SDKs.

Each provider sends through its client with the SDK's own retries off
(`with_options(max_retries=0)`) and hands each attempt to `send_with_retries`, which
retries what the SDKs would retry, as often as the client's `max_retries` allows, with
their backoff: the `retry-after-ms` / `retry-after` the API asked for, or 0.5 s doubling
up to 8 s, less up to a quarter. Unlike the SDKs' hidden loop, each wait is told: a
`RequestRetry` event of the run (its stream and its `on_event`) and a `model.retry` log line.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from agentloop import errors
from agentloop.events import RequestRetry
from agentloop.logs import get_logger
from agentloop.progress import emit_event

from .base import retry_after

__all__ = ("retry_reason", "retryable", "send_with_retries")

T = TypeVar("T")

_MAX_DELAY = 8.0
"""The longest backoff between two attempts, as the SDKs have it."""

_RETRYABLE = (
    errors.APIConnectionError,
    errors.RateLimitError,
    errors.OverloadedError,
    errors.ServerError,
)


class NotRetried(Exception):
    """Wraps an attempt's failure that must not be retried (e.g. after streamed content)."""

    def __init__(self, error: errors.ProviderError) -> None:
        super().__init__(str(error))
        self.error = error


def retryable(error: errors.ProviderError) -> bool:
    """Whether the SDKs would send the request again after `error`.

    The API's `x-should-retry` header decides when sent; otherwise a lost or refused
    connection, a timeout, 408, 409, 429 and any 5xx (overloaded included) are retried.
    """
    should = error.headers.get("x-should-retry")
    if should in ("true", "false"):
        return should == "true"
    return isinstance(error, _RETRYABLE) or error.status_code in (408, 409)


def retry_reason(error: errors.ProviderError) -> str:
    """A few words on why a request is sent again: "connection refused", "429 rate limited"."""
    cause = error.__cause__
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
            return "connection refused"
        if isinstance(cause, TimeoutError) or "timed out" in str(cause).lower():
            return "timed out"
        cause = cause.__cause__ or cause.__context__
    if isinstance(error, errors.APIConnectionError):
        return "connection failed"
    words = {429: "rate limited", 529: "overloaded"}
    if error.status_code is not None:
        return f"{error.status_code} {words.get(error.status_code, 'error')}".rstrip()
    kind = type(error).__name__.removesuffix("Error").lower()
    return kind or "error"


async def send_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    max_wait: float | None = None,
    first_delay: float = 0.5,
) -> T:
    """`attempt()`'s result, retried after a retryable `ProviderError`.

    Args:
        attempt: Sends the request once; raises `ProviderError`s, or `NotRetried` around
            one that must not be sent again.
        max_retries: How many times to send it again at most (the client's `max_retries`).
        max_wait: The longest `retry-after` worth waiting for: an error asking for more
            is raised at once, saying so. None: a `retry-after` over 60 s is ignored for
            the backoff, as the SDKs do.
        first_delay: The first backoff (seconds) when the API names no wait; it doubles
            with each retry, up to 8 s.

    Raises:
        ProviderError: the last attempt's failure, or one that is not retryable.
    """
    retries = 0
    while True:
        try:
            return await attempt()
        except NotRetried as wrapped:
            raise wrapped.error from wrapped.error.__cause__
        except errors.ProviderError as error:
            if retries >= max_retries or not retryable(error):
                raise
            asked = retry_after(error.headers)
            if asked is not None and max_wait is not None and asked > max_wait:
                raise type(error)(
                    f"{error} (not retried: retry-after {asked:g} s is over max_retry_wait)",
                    status_code=error.status_code,
                    request_id=error.request_id,
                    body=error.body,
                    headers=error.headers,
                ) from error.__cause__
            if asked is None or asked > (max_wait or 60.0):
                backoff = min(first_delay * 2**retries, _MAX_DELAY)
                wait = backoff * (1 - 0.25 * random.random())
            else:
                wait = asked
            retries += 1
            reason = retry_reason(error)
            await emit_event(RequestRetry(retries, wait, reason))
            get_logger().info("model.retry", attempt=retries, wait=round(wait, 3), reason=reason)
            await anyio.sleep(wait)
