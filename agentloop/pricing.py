"""What a model request cost, in US dollars, from a kept price table (`genai-prices`).

The run prices each response as it arrives (`RunResult.cost` is their sum): a price table
can depend on the size of one request (a higher rate past 200k input tokens), so usage
summed over a run cannot be priced as one request. Cache reads and writes are priced as
such, 1-hour writes apart from 5-minute ones; a response of the Message Batches API
(`Usage.batch_requests`) at the table's batch rate. A model the table does not know has no
price: `None`, never a guess. A provider the table does not know (a scripted one, a proxy)
is priced by the model id alone (`table_provider`). The table is imported on first use
(it takes a while), so `import agentloop` does not pay for it.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from .result import Usage

if TYPE_CHECKING:
    from genai_prices import Usage as PricedUsage
    from genai_prices.types import PriceCalculation

__all__ = ("add_costs", "cost_of", "table_provider")


def cost_of(model: str, usage: Usage, *, provider: str | None = "anthropic") -> float | None:
    """The price in US dollars of one request's `usage` on `model`, or None if unknown.

    Args:
        model: The model id the request named (e.g. `"claude-sonnet-4-5"`).
        usage: The usage of one response (`ModelResponse.usage`). Summed usage is priced
            as if it were one request, which is wrong for models whose price depends on
            the request's size; sum the costs instead (`add_costs`). A usage whose
            tokens are not all counted (`Usage.tokens_known`) has no price. A usage of
            batched requests (`Usage.batch_requests`) is priced at the batch rate; one
            summing batched and other requests has no price.
        provider: The provider id in the price table (`"anthropic"`, `"openai"`, ...);
            None lets the table find a provider by the model id alone.
    """
    if not usage.tokens_known or not _known(model, provider):
        return None  # tokens not counted cannot be priced
    if 0 < usage.batch_requests < usage.requests:
        return None  # batched and standard requests summed: no one rate fits
    from genai_prices import Usage as PricedUsage

    cached = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    priced = PricedUsage(
        input_tokens=usage.input_tokens + cached,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_input_tokens,
        cache_write_tokens=usage.cache_creation_input_tokens,
        cache_write_1h_tokens=usage.cache_creation_1h_input_tokens,
    )
    batch = usage.batch_requests > 0
    return float(_price(priced, model, provider, batch=batch).total_price)


@cache
def table_provider(name: str) -> str | None:
    """`name` when the price table has a provider of that id, else None.

    A run is priced with its provider's name (`AnthropicProvider.name` is "anthropic")
    when the table knows it, and by its model id alone otherwise: a scripted provider or
    a proxy of your own is priced as the model it names.
    """
    from genai_prices.data import providers

    return name if any(p.id == name for p in providers) else None


def add_costs(total: float | None, cost: float | None) -> float | None:
    """`total + cost`, where an unknown part (None) makes the whole unknown."""
    return None if total is None or cost is None else total + cost


@cache
def _known(model: str, provider: str | None) -> bool:
    """Whether the price table has `model` (with `provider`); looked up once per pair."""
    from genai_prices import Usage as PricedUsage

    try:
        _price(PricedUsage(input_tokens=0, output_tokens=0), model, provider)
    except LookupError:
        return False
    return True


def _price(
    usage: PricedUsage, model: str, provider: str | None, *, batch: bool = False
) -> PriceCalculation:
    from genai_prices import calc_price  # imported on first use: the table is large

    # The table's batch variant (half the standard rates); a model without one keeps
    # its standard prices.
    context = {"processing": "batch"} if batch else None
    return calc_price(usage, model, provider_id=provider, price_context=context)
