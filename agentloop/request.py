"""A round's model request: built from the agent's configuration and the run's history, then sent.

`build_request` makes the provider-neutral `ModelRequest` of the next round (a typed
output shapes it); `send_request` sends it through the run's effects, streamed when a
handler of streamed events is given and the provider can stream, inside its `chat` span,
and logs what came back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .calls import AnnouncedTool, ToolDefinition, wire_tool_name
from .config import AgentConfig
from .context import RunContext, counted_apart
from .dynamic import announced, is_dynamic, uses_of
from .effects import OnEvent
from .errors import ConfigurationError, ProviderError
from .files import files_params
from .messages import Message, ToolUseBlock
from .providers import as_sent
from .providers.base import (
    BlockStop,
    CountingProvider,
    ModelRequest,
    ModelResponse,
    Provider,
    StreamEvent,
    StreamingProvider,
    provider_name,
)
from .runstate import RunState
from .tracing import record_response

__all__ = ("announced_tools", "build_request", "counting_provider", "send_request")


def build_request(
    config: AgentConfig,
    state: RunState,
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition | Mapping[str, Any]],
    params: dict[str, Any],
) -> ModelRequest:
    """The next request of the run `state`: `messages` (already compacted), `tools`.

    `params` are the config's `request_params`, computed once per run; a request whose
    messages refer to an uploaded file gets the Files beta too (`files_params`).
    """
    request = ModelRequest(
        model=config.model,
        messages=messages,
        max_tokens=config.max_tokens,
        system=config.system,
        tools=tools,
        tool_choice=config.tool_choice,
        thinking=config.thinking,
        metadata=config.metadata,
        stop_sequences=config.stop_sequences,
        container=state.container,
        params=files_params(messages, params),
        cache=config.cache_marker,
    )
    return request if state.output is None else state.output.shape(request)


async def announced_tools(state: RunState, context: RunContext[Any]) -> list[AnnouncedTool]:
    """The tools the next request of the run `state` announces.

    The run's, as each tool's `prepare` and `max_uses` allow this turn (see
    `agentloop.dynamic`), then through the run's capabilities' `prepare_tools`.
    """
    chain, dynamic = state.capabilities, is_dynamic(state.registry)
    if dynamic:
        definitions = await announced(state.registry, context, uses_of(state.calls))
    else:
        definitions = state.registry.definitions()
    tools: list[AnnouncedTool] = [*definitions, *state.external]
    if chain.has("prepare_tools"):
        tools = await chain.prepare_tools(context, tools)
    elif not dynamic:
        return tools
    state.offered = frozenset(n for t in tools if (n := wire_tool_name(t)) is not None)
    return tools


def counting_provider(provider: Provider) -> CountingProvider:
    """`provider`, which can count a request's tokens (`Run.count_tokens`).

    Raises:
        ConfigurationError: it has no `count_tokens()` (a Chat Completions provider).
    """
    if not isinstance(provider, CountingProvider):
        raise ConfigurationError(
            f"{type(provider).__name__} cannot count tokens: it has no count_tokens() "
            "(the Anthropic provider counts through the API's count endpoint)"
        )
    return provider


async def send_request(
    config: AgentConfig,
    state: RunState,
    request: ModelRequest,
    ctx: RunContext[Any],
    on_event: OnEvent | None,
) -> ModelResponse:
    """Send `request` through the run's effects; streamed to `on_event` when one is given.

    The run's capabilities wrap the send inside the effect (`ctx` is the turn's), so a
    durable run records what they did with the response.
    """
    started = time.perf_counter()

    async def send(stream: OnEvent | None) -> ModelResponse:
        attempts = _Attempts(stream)

        async def base(request: ModelRequest, *, provider: Provider | None = None) -> ModelResponse:
            target = provider or config.provider
            response = await attempts.send(as_sent(target, ctx.run_id), request)
            if provider is None and request.model == config.model:
                return response
            return replace(response, sent_to=(request.model, provider_name(target)))

        # What a capability spends of its own around the request rides on the response.
        response, spent = await counted_apart(
            ctx, lambda ctx: state.capabilities.request(ctx, base)(request)
        )
        return response.with_spent(spent)

    if state.tracing is None:
        response = await state.effects.model(request, state.rounds, send, on_event)
    else:
        tracing = state.tracing
        name = provider_name(config.provider)
        with tracing.chat(name, config.model, config.max_tokens, request.messages) as span:
            response = await state.effects.model(request, state.rounds, send, on_event)
            record_response(span, response, tracing.capture_content)
    state.log.info(
        "model.request",
        round=state.rounds,
        latency=round(time.perf_counter() - started, 4),
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        cache_read_input_tokens=response.usage.cache_read_input_tokens,
        stop_reason=response.stop_reason,
    )
    return response


class _Attempts:
    """The attempts at one round's request: each sent, streamed to the turn's handler.

    A capability may send the round's request again (a retry, a fallback), but never
    once a response streamed a whole `tool_use` block: the turn may have started that
    call as the block closed, and a call of a response that is then dropped must not
    run. Such an attempt's failure says so (`ProviderError.tool_use_streamed`), and a
    request sent after it is refused.
    """

    def __init__(self, on_event: OnEvent | None) -> None:
        self.on_event = on_event
        self.tool_use_streamed = False
        self.failure: ProviderError | None = None

    async def send(self, provider: Provider, request: ModelRequest) -> ModelResponse:
        """The response to `request` from `provider`, streamed when the run streams."""
        if self.tool_use_streamed:
            if self.failure is not None:
                raise self.failure
            raise ConfigurationError(
                "a capability sent a round's request again after a response that "
                "streamed a tool call (which may have started): it must keep that response"
            )
        try:
            if self.on_event is not None and isinstance(provider, StreamingProvider):
                return await provider.stream(request, self._watched)
            return await provider.complete(request)
        except ProviderError as exc:
            exc.tool_use_streamed = self.tool_use_streamed
            self.failure = exc
            raise

    async def _watched(self, event: StreamEvent) -> None:
        assert self.on_event is not None
        await self.on_event(event)
        if (
            isinstance(event, BlockStop)
            and isinstance(event.block, ToolUseBlock)
            and event.complete
        ):
            self.tool_use_streamed = True
