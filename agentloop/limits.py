"""Usage limits: the budget a run may spend, checked at the round boundary.

`UsageLimits` is the user's budget (requests, tokens, tool calls, US dollars). Each run
keeps a `Meter`: before a request it refuses one that would certainly go over a limit
(from the running totals, or exactly through the API's `count_tokens` when asked), and
after a response it names the limit the response crossed, so the loop can answer the
turn's calls without running them and end with `UsageLimitExceeded`. Cost comes from the
`genai-prices` table (`price`), never from a guess.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .checks import check_count
from .errors import ConfigurationError, UsageLimitExceeded
from .pricing import add_costs, cost_of, table_provider
from .result import Spent, Usage

if TYPE_CHECKING:
    from .providers.base import ModelRequest, ModelResponse, Provider
    from .result import RunResult

__all__ = (
    "LIMIT_REACHED",
    "Breach",
    "Meter",
    "Spent",
    "UsageLimitExceeded",
    "UsageLimits",
    "check_before_request",
    "check_provider",
    "input_tokens",
    "price",
    "tighter",
)

LIMIT_REACHED = (
    "Not run: the run's usage limit ({limit} = {bound:g}) was reached, so the run stopped."
)
"""The `is_error` text of a call the response that crossed a limit asked for."""


_BUILDING: ContextVar[bool] = ContextVar("agentloop_limits_building", default=False)
"""Set while agentloop derives limits from a user's (a sub-run's): warned of once, there."""


@contextmanager
def _building() -> Iterator[None]:
    token = _BUILDING.set(True)
    try:
        yield
    finally:
        _BUILDING.reset(token)


@dataclass(frozen=True, kw_only=True)
class UsageLimits:
    """The most one run may use. `None` (the default) leaves a quantity unbounded.

    Token counts are the provider's own, summed over the run's requests (and those of
    sub-agents run as its tools, see `Agent.as_tool`). A response that comes without
    counts (`Usage.uncounted_requests`) leaves the token and cost limits unenforceable:
    the counted tokens still stop the run when they go over, but the run may have used
    more; the result names those limits (`RunResult.unenforced_limits`) and the run logs
    a `run.limits_unenforced` warning.
    """

    requests: int | None = None
    """Deprecated: bound a run's model requests with `Agent(max_rounds=...)`, which ends
    the run with a history ready to continue (`stop_reason="max_rounds"`) rather than
    with an error. Still counted as before (compaction summaries and sub-agent requests
    included), with a `DeprecationWarning` when set."""
    input_tokens: int | None = None
    """Input tokens read by the model: uncached, cache writes and cache reads together."""
    output_tokens: int | None = None
    """Output tokens written by the model."""
    total_tokens: int | None = None
    """Input plus output tokens (as `Usage.total_tokens`)."""
    tool_calls: int | None = None
    """Tool calls run (0 allows none); a call answered without running is not counted."""
    cost_usd: float | None = None
    """US dollars, priced by `genai-prices` (cache reads and writes at their own rates);
    the run must use a model the price table knows, or it does not start."""
    count_tokens_before_request: bool = False
    """Count each request's input tokens with the API's `count_tokens` endpoint before
    sending it, so a request that would go over an input, total or cost limit is never
    sent. Costs one extra (free) request per round; needs a provider with
    `count_tokens` (the Anthropic one). Without it, the pre-check uses the running
    totals: a request is not sent when every request's least (one token read, one
    written) would already go over."""

    def __post_init__(self) -> None:
        """Check each bound: a whole number (>= 1; >= 0 for `tool_calls`), or dollars > 0."""
        for name in ("requests", "input_tokens", "output_tokens", "total_tokens"):
            value = getattr(self, name)
            if value is not None:
                check_count(f"UsageLimits.{name}", value)
        if self.requests is not None and not _BUILDING.get():
            warnings.warn(
                "UsageLimits(requests=...) is deprecated: bound a run's model requests with "
                "Agent(max_rounds=...), which ends it with stop_reason 'max_rounds' and a "
                "history ready to continue; UsageLimits bound what a run spends",
                DeprecationWarning,
                stacklevel=3,
            )
        if self.tool_calls is not None:
            check_count("UsageLimits.tool_calls", self.tool_calls, minimum=0)
        cost = self.cost_usd
        if cost is not None and (
            isinstance(cost, bool)
            or not isinstance(cost, (int, float))
            or not math.isfinite(cost)
            or cost <= 0
        ):
            raise ConfigurationError(
                f"UsageLimits.cost_usd must be a number of US dollars > 0, not {cost!r}"
            )
        if not isinstance(self.count_tokens_before_request, bool):
            raise ConfigurationError(
                "UsageLimits.count_tokens_before_request must be True or False, "
                f"not {self.count_tokens_before_request!r}"
            )

    def remaining(self, usage: Usage, tool_calls: int, cost: float | None) -> UsageLimits:
        """These limits less what has been used: the budget left for a sub-run.

        Counts are floored at 1, the least bound `UsageLimits` takes: check first that a
        request still fits (`Meter.before_request`), as `Agent.as_tool` does.
        """

        def left(bound: int | None, used: int) -> int | None:
            return None if bound is None else max(bound - used, 0)

        def at_least_one(value: int | None) -> int | None:
            return None if value is None else max(value, 1)

        cost_left = None
        if self.cost_usd is not None:
            cost_left = max(self.cost_usd - (cost or 0.0), 1e-12)
        with _building():
            return UsageLimits(
                requests=at_least_one(left(self.requests, usage.requests)),
                input_tokens=at_least_one(left(self.input_tokens, input_tokens(usage))),
                output_tokens=at_least_one(left(self.output_tokens, usage.output_tokens)),
                total_tokens=at_least_one(left(self.total_tokens, usage.total_tokens)),
                tool_calls=left(self.tool_calls, tool_calls),
                cost_usd=cost_left,
                count_tokens_before_request=self.count_tokens_before_request,
            )


@dataclass(frozen=True)
class Breach:
    """A limit that was (or would be) gone over: its name, its bound, and the value."""

    limit: str
    """The `UsageLimits` field (`"input_tokens"`, `"cost_usd"`, ...)."""
    bound: float
    value: float
    """The total that went over `bound` (for a request not sent: the least it would reach)."""
    sent: bool = True
    """False when the request that would go over was not sent."""

    def error(self, result: RunResult | None = None) -> UsageLimitExceeded:
        """The error that ends the run, carrying its partial `result`."""
        return UsageLimitExceeded(
            self.describe(),
            limit=self.limit,
            bound=self.bound,
            value=self.value,
            sent=self.sent,
            result=result,
        )

    def describe(self) -> str:
        """The breach in words, for the error's message."""
        if self.sent:
            return f"usage limit {self.limit}={self.bound:g} exceeded ({self.value:g})"
        return (
            f"usage limit {self.limit}={self.bound:g} would be exceeded by the next request "
            f"(at least {self.value:g}); it was not sent"
        )


def tighter(first: UsageLimits | None, second: UsageLimits | None) -> UsageLimits | None:
    """The limits that hold both `first` and `second`: the smaller bound of each field."""
    if first is None or second is None:
        return first or second

    def least(a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)

    with _building():
        return UsageLimits(
            requests=least(first.requests, second.requests),
            input_tokens=least(first.input_tokens, second.input_tokens),
            output_tokens=least(first.output_tokens, second.output_tokens),
            total_tokens=least(first.total_tokens, second.total_tokens),
            tool_calls=least(first.tool_calls, second.tool_calls),
            cost_usd=least(first.cost_usd, second.cost_usd),
            count_tokens_before_request=(
                first.count_tokens_before_request or second.count_tokens_before_request
            ),
        )


def input_tokens(usage: Usage) -> int:
    """All input tokens of `usage`: uncached, cache writes and cache reads."""
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def price(usage: Usage, model: str) -> float | None:
    """What one response's `usage` of `model` costs in US dollars; None if unknown.

    `agentloop.pricing.cost_of`, the one price function, with the provider found from the
    model id (the run's `RunResult.cost` passes its provider).
    """
    return cost_of(model, usage, provider=None)


@dataclass
class Meter:
    """One run's spending (tokens, dollars, tool calls) against its limits.

    It counts the run's own responses and whatever is spent on the run's behalf (a
    sub-run, a summary request: `RunContext.add_usage`). Its totals are the run's
    `RunResult.usage` and `RunResult.cost`: one total, so a limit counts exactly what
    the result reports. Dollars are priced per response, as sub-runs may use other
    models.
    """

    limits: UsageLimits | None
    model: str
    provider: str | None = None
    """The provider id in the price table (None: found from the model id)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens used so far, summed over every request (sub-runs' included)."""
    cost: float | None = field(init=False, default=None)
    """Dollars spent so far, or None when a price is unknown."""
    tool_calls: int = 0
    """Tool calls run so far (sub-runs' included)."""
    refused: Breach | None = None
    """The limit a response crossed, once `refused_calls` refused its calls for it."""

    def __post_init__(self) -> None:
        """Start counting dollars; refuse a cost limit the table cannot price."""
        self.cost = self.price(Usage())  # 0.0, or None for a model the table does not know
        if self.cost is None and self.limits is not None and self.limits.cost_usd is not None:
            raise ConfigurationError(
                f"UsageLimits.cost_usd needs a model genai-prices knows; it has no "
                f"price for {self.model!r}"
            )

    def price(self, usage: Usage) -> float | None:
        """What one response's `usage` of the run's model costs in US dollars, or None."""
        return cost_of(self.model, usage, provider=self.provider) if self.model else None

    def price_of(self, response: ModelResponse) -> float | None:
        """What one response costs: priced as the model its request named.

        The run's model, or the one a capability sent the request to instead
        (`ModelResponse.sent_to`, at that provider's prices).
        """
        if response.sent_to is None:
            return self.price(response.usage)
        model, provider = response.sent_to
        return cost_of(model, response.usage, provider=table_provider(provider))

    def add(self, response: ModelResponse) -> None:
        """Count one response of the run: its tokens and their price.

        With what the responses dropped for it spent (`ModelResponse.extra_usage`).
        """
        self.add_usage(
            response.usage + response.extra_usage,
            add_costs(self.price_of(response), response.extra_cost),
        )

    def add_usage(self, usage: Usage, cost: float | None, tool_calls: int = 0) -> None:
        """Count what was spent on the run's behalf (None cost: unknown from now on)."""
        self.usage += usage
        self.cost = add_costs(self.cost, cost)
        self.tool_calls += tool_calls

    def count_calls(self, n: int) -> None:
        """Count `n` tool calls run (or started)."""
        self.tool_calls += n

    @property
    def spent(self) -> Spent:
        """What the run has spent so far."""
        return Spent(self.usage, self.cost, self.tool_calls)

    def remaining(self, back: Spent | None = None) -> UsageLimits | None:
        """The budget left: the limits less what the run has spent (None: no limits).

        `back` is a part of that spending to leave out: what a resumed sub-run spent
        before it paused, which it counts again itself.
        """
        if self.limits is None:
            return None
        spent = self.spent if back is None else self.spent - back
        return self.limits.remaining(spent.usage, spent.tool_calls, spent.cost)

    def over(self) -> Breach | None:
        """The limit a response crossed, or the first one the totals went over."""
        return self.refused or _over(self.limits, self.usage, self.tool_calls, self.cost)

    def unenforced(self) -> tuple[str, ...]:
        """The limits the run cannot be held to, by name; () if none.

        Its token and cost limits, once a response came without token counts.
        """
        if self.limits is None or self.usage.tokens_known:
            return ()
        return tuple(name for name in _UNCOUNTABLE if getattr(self.limits, name) is not None)

    def calls_left(self) -> int | None:
        """How many more tool calls may run (None: no limit)."""
        bound = None if self.limits is None else self.limits.tool_calls
        return None if bound is None else max(bound - self.tool_calls, 0)

    def refused_calls(
        self,
        response: ModelResponse,
        errors: Mapping[str, str],
        external: Collection[str] = (),
        started: Collection[str] = (),
    ) -> dict[str, str]:
        """The calls of `response` that must not run for a limit, with the reason.

        Call it before counting `response`. Calls in `errors` (refused for another
        reason, unless already `started`) and of `external` tools do not count. When the
        response itself crossed a limit, or running its calls would go over
        `tool_calls`, every call is refused, except those already `started` (an eager
        tool under streaming), which finish; otherwise the calls are counted as run and
        none is refused.
        """
        # A call already started runs whatever `errors` says of it (an eager call whose
        # block the stop reason cuts off finishes): it counts.
        ids = [
            u.id
            for u in response.tool_uses
            if (u.id not in errors or u.id in started) and u.name not in external
        ]
        if self.limits is None:
            self.count_calls(len(ids))
            return {}
        cost = self.cost
        if cost is not None:
            cost = add_costs(cost, add_costs(self.price_of(response), response.extra_cost))
        usage = self.usage + response.usage + response.extra_usage
        breach = _over(self.limits, usage, self.tool_calls + len(ids), cost)
        if breach is None:
            self.count_calls(len(ids))
            return {}
        self.refused = breach
        self.count_calls(sum(1 for i in ids if i in started))
        why = LIMIT_REACHED.format(limit=breach.limit, bound=breach.bound)
        return {i: why for i in ids if i not in started}

    def before_request(self, counted: int | None = None) -> Breach | None:
        """The limit the next request would certainly go over, or None.

        `counted` is the request's input tokens as `count_tokens` gave them; without it,
        the request is taken to read one token and write one, the least any does.
        """
        limits = self.limits
        if limits is None:
            return None
        usage = self.usage
        reads = 1 if counted is None else counted
        cost = None
        if self.cost is not None and limits.cost_usd is not None:
            least = self.price(Usage(input_tokens=reads, output_tokens=1))
            cost = None if least is None else self.cost + least
        checks: list[tuple[str, float | None, float | None]] = [
            ("requests", limits.requests, usage.requests + 1),
            ("input_tokens", limits.input_tokens, input_tokens(usage) + reads),
            ("output_tokens", limits.output_tokens, usage.output_tokens + 1),
            ("total_tokens", limits.total_tokens, usage.total_tokens + reads + 1),
            ("cost_usd", limits.cost_usd, cost),
        ]
        for name, bound, value in checks:
            if bound is not None and value is not None and value > bound:
                return Breach(name, bound, value, sent=False)
        return None


_UNCOUNTABLE = ("input_tokens", "output_tokens", "total_tokens", "cost_usd")
"""The limits that need every response's token counts."""


def _over(
    limits: UsageLimits | None, usage: Usage, tool_calls: int, cost: float | None
) -> Breach | None:
    """The first limit of `limits` these totals went over."""
    if limits is None:
        return None
    totals: list[tuple[str, float | None, float | None]] = [
        ("requests", limits.requests, usage.requests),
        ("input_tokens", limits.input_tokens, input_tokens(usage)),
        ("output_tokens", limits.output_tokens, usage.output_tokens),
        ("total_tokens", limits.total_tokens, usage.total_tokens),
        ("tool_calls", limits.tool_calls, tool_calls),
        ("cost_usd", limits.cost_usd, cost),
    ]
    for name, bound, value in totals:
        if bound is not None and value is not None and value > bound:
            return Breach(name, bound, value)
    return None


async def check_before_request(
    meter: Meter, request: ModelRequest, provider: Provider
) -> Breach | None:
    """`Meter.before_request`, counting the request's tokens first when the limits ask."""
    counted = None
    limits = meter.limits
    if limits is not None and limits.count_tokens_before_request:
        count: Any = getattr(provider, "count_tokens", None)
        counted = await count(request)
    return meter.before_request(counted)


def check_provider(limits: UsageLimits | None, provider: Any) -> None:
    """Refuse limits that ask for exact counts from a provider that cannot count."""
    if limits is not None and limits.count_tokens_before_request:
        if not callable(getattr(provider, "count_tokens", None)):
            raise ConfigurationError(
                "UsageLimits(count_tokens_before_request=True) needs a provider with a "
                f"count_tokens() method; {type(provider).__name__} has none"
            )
