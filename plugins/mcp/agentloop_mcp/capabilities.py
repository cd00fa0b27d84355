"""What the client offers servers: roots, sampling and elicitation, each only when set up.

A capability is announced to a server only when it can be answered: roots when the
server's declaration lists directories, sampling when the tool source was given an
`MCPSampling` (a provider and model) and the server's `sampling` switch is on, elicitation
when the source was given a handler and the server's `elicitation` switch is on. A server
that asks for one anyway is refused with the protocol's error by the SDK. Progress is
per call (see `connection.py`). Each function here builds the SDK callback for one server.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as mcp_types
from agentloop.logs import get_logger
from agentloop.messages import ImageBlock, Message, TextBlock
from agentloop.providers.base import ModelRequest, Provider
from agentloop.result import Usage

from .config import MCPServer

__all__ = (
    "ElicitationHandler",
    "MCPSampling",
    "elicitation_callback",
    "roots_callback",
    "sampling_callback",
    "terminal_elicitation",
)

_log = get_logger()

ElicitationHandler = Callable[
    [str, mcp_types.ElicitRequestParams], Awaitable[mcp_types.ElicitResult]
]
"""`await handler(server_name, params)`: ask the user what a server wants to know."""

_STOP_REASONS = {"end_turn": "endTurn", "max_tokens": "maxTokens", "stop_sequence": "stopSequence"}


@dataclass(frozen=True, kw_only=True)
class MCPSampling:
    """How servers' sampling requests (`sampling/createMessage`) are answered."""

    provider: Provider
    """The model provider that answers, e.g. the agent's own `agent.provider`."""
    model: str
    """The model asked."""
    max_requests: int = 10
    """Requests one server may make while the source is open; further ones are refused."""
    max_tokens: int = 20_000
    """Tokens (input and output) one server may spend while the source is open."""


def roots_callback(server: MCPServer) -> Any:
    """The `roots/list` answer for `server`'s `roots` (directories), or None for none."""
    if not server.roots:
        return None
    roots = [
        mcp_types.Root(uri=Path(root).expanduser().resolve().as_uri(), name=Path(root).name)  # type: ignore[arg-type]
        for root in server.roots
    ]

    async def list_roots(context: Any) -> mcp_types.ListRootsResult:
        return mcp_types.ListRootsResult(roots=roots)

    return list_roots


def elicitation_callback(server: MCPServer, handler: ElicitationHandler | None) -> Any:
    """The elicitation callback for `server`, or None when it is not offered."""
    if handler is None or not server.elicitation:
        return None

    async def elicit(
        context: Any, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        try:
            return await handler(server.name, params)
        except Exception as exc:
            _log.warning("mcp.elicitation_failed", mcp_server=server.name, error=str(exc))
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the client could not ask: {exc}"
            )

    return elicit


def sampling_callback(server: MCPServer, sampling: MCPSampling | None) -> Any:
    """The sampling callback for `server`, with its own request and token budget."""
    if sampling is None or not server.sampling:
        return None
    spent = Usage()

    async def sample(
        context: Any, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        nonlocal spent
        tokens = spent.input_tokens + spent.output_tokens
        if spent.requests >= sampling.max_requests or tokens >= sampling.max_tokens:
            _log.warning("mcp.sampling_refused", mcp_server=server.name, requests=spent.requests)
            return mcp_types.ErrorData(
                code=mcp_types.INVALID_REQUEST,
                message=f"sampling limit reached for this server ({sampling.max_requests} "
                f"requests, {sampling.max_tokens} tokens)",
            )
        request = ModelRequest(
            model=sampling.model,
            messages=[_message(m) for m in params.messages],
            max_tokens=max(1, min(params.max_tokens, sampling.max_tokens - tokens)),
            system=params.system_prompt,
            stop_sequences=params.stop_sequences,
            params={} if params.temperature is None else {"temperature": params.temperature},
        )
        try:
            response = await sampling.provider.complete(request)
        except Exception as exc:
            _log.warning("mcp.sampling_failed", mcp_server=server.name, error=str(exc))
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the model request failed: {exc}"
            )
        used = response.usage
        spent = spent + Usage(
            input_tokens=used.input_tokens, output_tokens=used.output_tokens, requests=1
        )
        text = "".join(b.text for b in response.content if isinstance(b, TextBlock))
        _log.info("mcp.sampled", mcp_server=server.name, model=sampling.model, usage=str(spent))
        return mcp_types.CreateMessageResult(
            role="assistant",
            content=mcp_types.TextContent(type="text", text=text),
            model=response.model or sampling.model,
            stop_reason=_STOP_REASONS.get(response.stop_reason or "", response.stop_reason),
        )

    return sample


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


async def terminal_elicitation(
    server: str, params: mcp_types.ElicitRequestParams
) -> mcp_types.ElicitResult:
    """Ask on the terminal: the server's message, then each field of its form.

    An empty answer to the first question declines; end of input (Ctrl-D) cancels.
    """
    return await anyio.to_thread.run_sync(_ask, server, params)


def _ask(server: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
    out = sys.stderr
    print(f"\nMCP server '{server}' asks: {params.message}", file=out)
    if isinstance(params, mcp_types.ElicitRequestURLParams):
        print(f"  open {params.url} (press Enter when done, Ctrl-D to cancel)", file=out)
        try:
            input()
        except EOFError:
            return mcp_types.ElicitResult(action="cancel")
        return mcp_types.ElicitResult(action="accept")
    schema = params.requested_schema or {}
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    content: dict[str, Any] = {}
    for index, (name, spec) in enumerate(properties.items()):
        kind = spec.get("type", "string")
        hint = f" ({spec['description']})" if spec.get("description") else ""
        print(f"  {name}{hint} [{kind}]: ", end="", file=out, flush=True)
        try:
            answer = input().strip()
        except EOFError:
            return mcp_types.ElicitResult(action="cancel")
        if index == 0 and not answer:
            return mcp_types.ElicitResult(action="decline")
        content[name] = _typed(answer, kind)
    return mcp_types.ElicitResult(action="accept", content=content)


def _typed(answer: str, kind: str) -> Any:
    if kind == "boolean":
        return answer.lower() in ("y", "yes", "true", "1")
    if kind == "integer":
        try:
            return int(answer)
        except ValueError:
            return answer
    if kind == "number":
        try:
            return float(answer)
        except ValueError:
            return answer
    return answer
