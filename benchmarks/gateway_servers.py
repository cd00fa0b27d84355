"""The two servers of the gateway benchmark that are not contenders: the upstream and the hop.

    python -m benchmarks.gateway_servers upstream --port N [--pace S] [--deltas N]
    python -m benchmarks.gateway_servers hop --port N --upstream URL

Both are bare ASGI apps on uvicorn (httptools and uvloop when installed, as the gateway
runs). The upstream answers `POST /v1/messages` as JSON, or as SSE that it paces: the
`message_start` event at once, then each text delta `pace` seconds after the previous
one, so a hop that buffers the stream shows it. The hop forwards any request with all
its headers and streams the answer back chunk by chunk with the gateway's HTTP client:
what any forwarding hop costs on this machine, measured in the same run as the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Awaitable, Callable, MutableMapping
from itertools import count
from typing import Any

import anthropic
import anyio
import httpx2
import uvicorn

BETA = "bench-2026-01-01"
"""The `anthropic-beta` value the benchmark sends; the upstream says when it is missing."""
LOST_BETA = " (anthropic-beta lost)"
"""Appended to the answer's text by the upstream when the beta did not reach it."""
MIXED = "bench-mixed"
"""The model whose first round calls the gateway's `lookup` and the client's tool."""

# Headers that belong to one connection, not to the request or answer forwarded.
HOP_BY_HOP = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade"}
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ids = count()


async def read_body(receive: Receive) -> bytes:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def lifespan(receive: Receive, send: Send) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def answer(send: Send, status: int, content_type: bytes, data: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]
    headers.append((b"request-id", f"req_bench{next(ids)}".encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


# --------------------------------------------------------------------------- upstream


def content(request: dict[str, Any], text: str) -> tuple[list[dict[str, Any]], str]:
    """The answer's blocks and stop reason: text, or for `MIXED`'s first round two calls."""
    assistants = sum(1 for m in request.get("messages", []) if m.get("role") == "assistant")
    if request.get("model") != MIXED or assistants:
        return [{"type": "text", "text": text}], "end_turn"
    n = next(ids)
    calls = [("lookup", {"key": "k"}), ("client_tool", {"x": 1})]
    blocks = [
        {"type": "tool_use", "id": f"toolu_bench{n}x{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(calls)
    ]
    return [{"type": "text", "text": "Both at once."}, *blocks], "tool_use"


def message(request: dict[str, Any], blocks: list[Any], stop: str | None) -> dict[str, Any]:
    return {
        "id": f"msg_bench{next(ids)}",
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "bench"),
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 8, "output_tokens": 2},
    }


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


async def paced_stream(send: Send, request: dict[str, Any], text: str, pace: float, n: int) -> None:
    """`message_start` at once, then `n` text deltas `pace` seconds apart, then the end."""
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    headers.append((b"request-id", f"req_bench{next(ids)}".encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    await write(
        event("message_start", {"type": "message_start", "message": message(request, [], None)})
    )
    pieces = [text] + ["."] * (n - 1)  # the whole text first: the checks read it
    block = {"type": "text", "text": ""}
    for i, piece in enumerate(pieces):
        await anyio.sleep(pace)
        start = event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        }
        await write((start if i == 0 else b"") + event("content_block_delta", delta))
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    end["usage"] = {"output_tokens": 2}
    tail = event("content_block_stop", {"type": "content_block_stop", "index": 0})
    tail += event("message_delta", end) + event("message_stop", {"type": "message_stop"})
    await send({"type": "http.response.body", "body": tail})


def upstream_app(pace: float, deltas: int) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The scripted Messages API: a function of each request, so any number of runs works."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        if scope["path"] != "/v1/messages":
            await answer(send, 200, b"text/plain", b"ok")
            return
        request = json.loads(body)
        betas = dict(scope["headers"]).get(b"anthropic-beta", b"").decode("latin-1")
        text = "hello" if BETA in betas else "hello" + LOST_BETA
        if request.get("stream") is True and request.get("model") != MIXED:
            await paced_stream(send, request, text, pace, deltas)
            return
        blocks, stop = content(request, text)
        await answer(
            send, 200, b"application/json", json.dumps(message(request, blocks, stop)).encode()
        )

    return app


# --------------------------------------------------------------------------- hop


def hop_client(upstream: str) -> httpx2.AsyncClient:
    """The gateway's HTTP client for upstream requests, as `--upstream-transport auto` picks it."""
    if importlib.util.find_spec("aiohttp"):
        return anthropic.DefaultAioHttpClient(base_url=upstream, timeout=60)
    return anthropic.DefaultAsyncHttpxClient(base_url=upstream, timeout=60)


def hop_app(upstream: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A bare forwarding hop: every header through, the answer streamed back as it comes.

    No SDK, no loop, no sessions, no parsing of the body.
    """
    client: httpx2.AsyncClient | None = None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal client
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            if client is not None:
                await client.aclose()
            return
        body = await read_body(receive)
        if scope["path"] == "/healthz":
            await answer(send, 200, b"text/plain", b"ok")
            return
        client = client or hop_client(upstream)
        kept = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP | {b"content-length"}]
        target = scope["raw_path"] + (
            b"?" + scope["query_string"] if scope["query_string"] else b""
        )
        request = client.build_request(
            scope["method"], target.decode("latin-1"), content=body, headers=kept
        )
        response = await client.send(request, stream=True)
        try:
            headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_servers")
    parser.add_argument("role", choices=("upstream", "hop"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", help="the hop's upstream base URL")
    parser.add_argument("--pace", type=float, default=0.02, help="seconds between streamed deltas")
    parser.add_argument("--deltas", type=int, default=3, help="text deltas per streamed answer")
    args = parser.parse_args(argv)
    app = (
        upstream_app(args.pace, args.deltas) if args.role == "upstream" else hop_app(args.upstream)
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
