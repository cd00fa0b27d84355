"""Model fallback: when a round's request fails or is refused, the next model answers it.

`Fallback` wraps each model request (`Capability.wrap_request`): the run's own model
first, then each fallback in turn, on the same provider or on another (a Chat Completions
one included), until one answers. The request is the same each time (the history, the
tools, the options), with the fallback's model named in it. The run keeps the response
that answered, with the usage and cost of every response it did not keep
(`ModelResponse.extra_usage`, counted by the run and recorded with the response by a
durable run), and names the model of each round in `RunResult.models`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentloop.errors import ConfigurationError, ProviderError
from agentloop.logs import get_logger
from agentloop.pricing import add_costs
from agentloop.providers import provider_for
from agentloop.providers.base import ModelRequest, ModelResponse, Provider
from agentloop.result import Spent, Usage

from .base import Capability, NextRequest
from .conditions import ERRORS, Condition, check_conditions, failed, refused

if TYPE_CHECKING:
    from agentloop.context import RunContext

__all__ = ("Fallback",)

_log = get_logger()

_CONDITIONS = frozenset({*ERRORS, "refusal", "context_length"})


class Fallback(Capability):
    """Send a round's request to the next model when it fails with one of `on`.

    ```python
    agent = Agent(
        model="claude-sonnet-4-5",
        capabilities=[
            Fallback(
                ["claude-haiku-4-5", (AsyncOpenAI(base_url=...), "qwen3:8b")],
                on=("overloaded", "server_error", "refusal"),
            )
        ],
    )
    ```

    The conditions (`on`):

    - `"overloaded"`: 529 (`OverloadedError`); `"server_error"`: another 5xx
      (`ServerError`); `"rate_limit"`: 429 (`RateLimitError`); `"connection"`: no whole
      answer (`APIConnectionError`). Each after the client's own retries (or `Retries`).
    - `"refusal"`: the response stopped with `stop_reason="refusal"`.
    - `"context_length"`: the API refused the prompt as too long, or the response stopped
      at the model's context window (`model_context_window_exceeded`).

    The last model's failure or refusal is the round's, as it would be without a
    fallback. A request is never sent again once its response streamed a tool call (which
    may have started: see `ProviderError.tool_use_streamed`), and a refused response
    that holds tool calls is kept (its calls are not run: the stop reason refuses them).
    In a streamed run, the events say when a response that was shown in part is dropped
    (`agentloop.events.ResponseReplaced`).
    """

    name = "fallback"

    def __init__(
        self,
        models: Sequence[str | tuple[Any, str]],
        *,
        on: Collection[Condition] = ("overloaded", "server_error", "rate_limit", "connection"),
    ) -> None:
        """Fall back to `models`, in order, after the agent's own model.

        Args:
            models: Each a model name (sent through the run's provider) or a
                `(provider, model)` pair, the provider a `Provider` or an SDK client
                (`anthropic.AsyncAnthropic`, `openai.AsyncOpenAI`, ...; see
                `agentloop.providers.provider_for`).
            on: The conditions that send the request on to the next model.

        Raises:
            ConfigurationError: `models` is empty or holds something else, or `on`
                names an unknown condition.
        """
        if isinstance(models, (str, bytes)) or not isinstance(models, Sequence) or not models:
            raise ConfigurationError(
                f"Fallback(models=...) must be a non-empty list of models, not {models!r}"
            )
        self.models: tuple[tuple[Provider | None, str], ...] = tuple(_target(m) for m in models)
        """The fallbacks, in order: their provider (None: the run's) and model."""
        self.on = check_conditions(on, _CONDITIONS, "Fallback")
        """The conditions that send a request on to the next model."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        """The response of the first model that answers without a condition of `on`."""
        tries: list[tuple[Provider | None, str]] = [(None, request.model), *self.models]
        log = ctx.log or _log
        # The responses dropped so far: the run counts only the one it keeps, so their
        # spending goes with it (and into a durable run's record of it).
        dropped: Usage = Usage()
        dropped_cost: float | None = 0.0
        for number, (provider, model) in enumerate(tries, 1):
            last = number == len(tries)
            sent = request if model == request.model else replace(request, model=model)
            try:
                if provider is None:  # the provider the run (or an outer capability) chose
                    response = await call_next(sent)
                else:
                    response = await call_next(sent, provider=provider)
            except ProviderError as exc:
                why = failed(exc, self.on)
                if last or why is None or exc.tool_use_streamed:
                    if dropped != Usage():  # the run fails: count them now
                        ctx.add_usage(dropped, dropped_cost)
                    raise
                log.warning("model.fallback", model=model, fallback=tries[number][1], reason=why)
                continue
            why = refused(response, self.on)
            if last or why is None or response.tool_uses:
                return response.with_spent(Spent(dropped, dropped_cost))
            dropped += response.usage + response.extra_usage
            price = None if ctx.meter is None else ctx.meter.price_of(response)
            dropped_cost = add_costs(dropped_cost, add_costs(price, response.extra_cost))
            log.warning("model.fallback", model=model, fallback=tries[number][1], reason=why)
        raise AssertionError("unreachable: the last model's outcome is returned or raised")

    def __repr__(self) -> str:
        models = [m if p is None else (type(p).__name__, m) for p, m in self.models]
        return f"Fallback({models!r}, on={tuple(sorted(self.on))!r})"


def _target(entry: Any) -> tuple[Provider | None, str]:
    """A fallback entry as (provider or None, model), checked."""
    if isinstance(entry, str):
        return None, _model(entry)
    if isinstance(entry, tuple) and len(entry) == 2:
        where, model = entry
        return _provider(where), _model(model)
    raise ConfigurationError(
        "each Fallback model is a model name or a (provider, model) pair, "
        f"not {type(entry).__name__}: {entry!r}"[:300]
    )


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"a Fallback model must be a non-empty name, not {value!r}")
    return value


def _provider(value: Any) -> Provider:
    """A provider, or one for an SDK client (`provider_for`)."""
    if isinstance(value, Provider):
        return value
    if type(value).__module__.split(".")[0] in ("anthropic", "openai"):
        return provider_for(value)
    raise ConfigurationError(
        "a Fallback provider is a Provider or an SDK client (anthropic.AsyncAnthropic, "
        f"openai.AsyncOpenAI, ...), not {type(value).__name__}"
    )
