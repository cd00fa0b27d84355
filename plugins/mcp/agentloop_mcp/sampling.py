"""Sampling: a server's `sampling/createMessage` answered by a model, on the calling run's account.

The SDK calls the sampling callback in the connection's own task, not in the tool call's,
so the run that made the call is not visible there. The link is made by hand: each tool
call carries its `Caller` (the call's `RunContext`, and the event loop it runs on when
that is not the connection's), and the callback finds the call a request belongs to:

1. exactly, when the SDK answers the request inside the call: a server on the 2026
   protocol asks for input as part of the call's result (`input_required`), and the
   connection marks the call's task with `in_call`;
2. otherwise (a server-to-client request on an older protocol: neither stdio nor the SDK
   says which call it came with), the run whose calls are in flight on the connection,
   when they all belong to one run;
3. otherwise (no call in flight, or calls of several runs) no run: the request is answered
   with `MCPSampling`'s own provider and model when it names them, counted in no run, and
   refused with the protocol's error when it does not.

The model request is sent, and its usage and cost counted in the run, on the run's own
event loop, so a provider (an HTTP client bound to a loop) and a run are never touched
from another thread.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp.types as mcp_types
from agentloop import RunContext
from agentloop.events import Event
from agentloop.logs import get_logger
from agentloop.messages import ImageBlock, Message, TextBlock
from agentloop.pricing import cost_of
from agentloop.providers.base import ModelRequest, ModelResponse, Provider, provider_name
from agentloop.result import Usage

from .config import MCPConfigError, MCPServer

__all__ = ("Caller", "MCPSampling", "calling", "in_call", "sampling_callback")

_log = get_logger()
_T = TypeVar("_T")

_STOP_REASONS = {"end_turn": "endTurn", "max_tokens": "maxTokens", "stop_sequence": "stopSequence"}


@dataclass(frozen=True, kw_only=True)
class MCPSampling:
    """How servers' sampling requests (`sampling/createMessage`) are answered.

    With neither `provider` nor `model` (the default), a request is answered by the model
    of the run whose tool call it came with, and counted in that run's usage and cost. A
    server's `sampling_model` names another model of that provider; its
    `sampling_max_requests` and `sampling_max_tokens` replace the limits below.
    """

    provider: Provider | None = None
    """The provider that answers; None: the calling run's."""
    model: str | None = None
    """The model asked; None: the calling run's (or the server's `sampling_model`)."""
    max_requests: int = 10
    """Requests one server may make while the source is open; further ones are refused."""
    max_tokens: int = 20_000
    """Tokens (input and output) one server may spend while the source is open."""

    def __post_init__(self) -> None:
        if not (self.max_requests > 0 and self.max_tokens > 0):
            raise MCPConfigError("MCPSampling: max_requests and max_tokens must be > 0")
        if self.model is not None and not self.model.strip():
            raise MCPConfigError("MCPSampling: model must name a model")


@dataclass(frozen=True, eq=False)
class Caller:
    """Who made a tool call: the call's run (if any) and the event loop it runs on."""

    ctx: RunContext[Any] | None
    """The call's context: its run's id, provider, model and meter; None outside a run."""
    token: anyio.lowlevel.EventLoopToken | None = None
    """The caller's event loop when it is not the connection's (a background source)."""

    @property
    def run_id(self) -> str | None:
        """The calling run's id (None outside a run)."""
        return self.ctx.run_id if self.ctx is not None and self.ctx.meter is not None else None

    @classmethod
    def here(cls, ctx: RunContext[Any] | None) -> Caller:
        """The caller of a tool call made in this task with `ctx` (see `calling`)."""
        return calling.get() or cls(ctx)

    async def run(self, func: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        """Await `func()` on the caller's event loop (here, when it is this one)."""
        if self.token is None:
            return await func()
        return await anyio.to_thread.run_sync(
            partial(anyio.from_thread.run, func, token=self.token), abandon_on_cancel=True
        )

    async def emit(self, event: Event) -> None:
        """Report `event` to the caller's run (`RunContext.emit`), on the run's event loop.

        Nowhere outside a run; an event that comes after its run ended is dropped.
        """
        ctx = self.ctx
        if ctx is None:
            return
        try:
            await self.run(partial(ctx.emit, event))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError) as exc:
            _log.debug("mcp.event_dropped", kind=type(event).__name__, error=str(exc))


calling: ContextVar[Caller | None] = ContextVar("agentloop_mcp_calling", default=None)
"""Set by a tool that forwards a call to a connection on another event loop: the caller."""

in_call: ContextVar[Caller | None] = ContextVar("agentloop_mcp_in_call", default=None)
"""Set in the task that sends a tool call to its server: the call's caller."""


def sampling_callback(
    server: MCPServer,
    sampling: MCPSampling | None,
    callers: Callable[[], Sequence[Caller]],
) -> Any:
    """The sampling callback for `server`, with its own request and token budget.

    `callers()` gives the callers of the tool calls in flight on the server's connection.
    None (sampling not offered) when `sampling` is None or the server's switch is off.
    """
    if sampling is None or not server.sampling:
        return None
    return _Sampler(server, sampling, callers).sample


class _Sampler:
    """Answers one server's sampling requests, within its budget."""

    def __init__(
        self,
        server: MCPServer,
        sampling: MCPSampling,
        callers: Callable[[], Sequence[Caller]],
    ) -> None:
        self.server = server
        self.sampling = sampling
        self.max_requests = server.sampling_max_requests or sampling.max_requests
        self.max_tokens = server.sampling_max_tokens or sampling.max_tokens
        self.spent = Usage()
        """The tokens of the requests answered so far."""
        self.started = 0
        """Requests sent or being sent: counted before the answer, so that requests made
        at once cannot together go over `max_requests`."""
        self._callers = callers
        self._log = _log.bind(mcp_server=server.name)

    async def sample(
        self, context: Any, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """Answer one `sampling/createMessage`, or refuse it with the protocol's error."""
        caller, unknown = self.caller()
        ctx = caller.ctx if caller is not None else None
        provider = self.sampling.provider or (ctx.provider if ctx is not None else None)
        model = self.server.sampling_model or self.sampling.model or (ctx.model if ctx else None)
        if provider is None or model is None:
            why = unknown or "no run made the call"
            return self._refuse(f"sampling is answered by the calling run's model, and {why}")
        tokens = self.spent.input_tokens + self.spent.output_tokens
        if self.started >= self.max_requests or tokens >= self.max_tokens:
            return self._refuse(
                f"sampling limit reached for this server ({self.max_requests} requests, "
                f"{self.max_tokens} tokens)"
            )
        request = ModelRequest(
            model=model,
            messages=[_message(m) for m in params.messages],
            max_tokens=max(1, min(params.max_tokens, self.max_tokens - tokens)),
            system=params.system_prompt,
            stop_sequences=params.stop_sequences,
            params={} if params.temperature is None else {"temperature": params.temperature},
        )
        ask = partial(_complete, provider, request, ctx)
        self.started += 1
        try:
            response = await (caller.run(ask) if caller is not None else ask())
        except _OverBudget as exc:
            self.started -= 1
            return self._refuse(str(exc))
        except Exception as exc:
            self.started -= 1
            self._log.warning("mcp.sampling_failed", error=str(exc))
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the model request failed: {exc}"
            )
        used = response.usage
        self.spent += Usage(
            input_tokens=used.input_tokens, output_tokens=used.output_tokens, requests=1
        )
        text = "".join(b.text for b in response.content if isinstance(b, TextBlock))
        self._log.info(
            "mcp.sampled",
            model=model,
            counted_in_run=caller.run_id if caller is not None else None,
            usage=str(self.spent),
        )
        return mcp_types.CreateMessageResult(
            role="assistant",
            content=mcp_types.TextContent(type="text", text=text),
            model=response.model or model,
            stop_reason=_STOP_REASONS.get(response.stop_reason or "", response.stop_reason),
        )

    def caller(self) -> tuple[Caller | None, str]:
        """The caller of the tool call this request came with; or None and why not."""
        exact = in_call.get()
        if exact is not None:
            return exact, ""
        found: dict[tuple[str | None, anyio.lowlevel.EventLoopToken | None], Caller] = {}
        for caller in self._callers():
            found.setdefault((caller.run_id, caller.token), caller)  # tokens of one loop are equal
        if len(found) == 1:
            return next(iter(found.values())), ""
        if not found:
            return None, "no tool call is in flight on this server"
        return None, "calls of several runs are in flight, so it cannot tell which one asked"

    def _refuse(self, message: str) -> mcp_types.ErrorData:
        self._log.warning("mcp.sampling_refused", reason=message, requests=self.spent.requests)
        return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=message)


class _OverBudget(Exception):
    """The calling run cannot afford the request; the message says which limit."""


async def _complete(
    provider: Provider, request: ModelRequest, ctx: RunContext[Any] | None
) -> ModelResponse:
    """Send `request`; count its usage and cost in the run of the call's `ctx`.

    Runs on the run's own event loop, so the run is read and written only there.

    Raises:
        _OverBudget: the run's usage limits leave no room for a request.
    """
    breach = ctx.limit_reached() if ctx is not None else None
    if breach is not None:
        raise _OverBudget(
            f"the calling run's usage limit ({breach.limit} = {breach.bound:g}) was reached"
        )
    response = await provider.complete(request)
    if ctx is not None:
        cost = cost_of(request.model, response.usage, provider=provider_name(provider))
        ctx.add_usage(response.usage, cost)
    return response


def _message(message: mcp_types.SamplingMessage) -> Message:
    items = message.content if isinstance(message.content, list) else [message.content]
    blocks: list[Any] = []
    for item in items:
        if isinstance(item, mcp_types.TextContent):
            blocks.append(TextBlock(text=item.text))
        elif isinstance(item, mcp_types.ImageContent):
            source = {"type": "base64", "media_type": item.mime_type, "data": item.data}
            blocks.append(ImageBlock(source=source))
        else:
            blocks.append(TextBlock(text=f"[{getattr(item, 'type', 'content')} omitted]"))
    return Message(role=message.role, content=tuple(blocks))
