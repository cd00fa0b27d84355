"""A local Messages-API server on 127.0.0.1 that answers from a `ScriptedModel`.

It speaks enough of `POST /v1/messages` for the official SDK: JSON responses, SSE streams
(`stream: true`), and API-shaped errors. It runs in a background thread, so tests under
any event loop (or none) can use it, and it lints every request's history, answering a
broken one with the 400 `invalid_request_error` the real API would send.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from agentloop.errors import AgentloopError
from agentloop.providers.scripted import RawResponse, Script, ScriptedModel

__all__ = ("MessagesServer", "sse_events")


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_local"}


def _chunks(value: str, size: int) -> Iterator[str]:
    for start in range(0, len(value), size):
        yield value[start : start + size]


def sse_events(message: Mapping[str, Any], *, chunk: int = 16) -> str:
    """Render a whole response message as the SSE stream the API would send for it."""
    usage = dict(message.get("usage") or {})
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            head = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in _chunks(block["text"], chunk)]
        elif kind in ("tool_use", "server_tool_use"):
            head = {**block, "input": {}}
            raw = json.dumps(block.get("input") or {}) if block.get("input") else ""
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [{"type": "input_json_delta", "partial_json": p} for p in _chunks(raw, chunk)]
        elif kind == "thinking":
            head = {**block, "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": t} for t in _chunks(block["thinking"], chunk)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            head = dict(block)
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": head},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message.get("stop_reason"),
                    "stop_sequence": message.get("stop_sequence"),
                },
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] = {}
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.send_header("request-id", "req_local")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any, headers: Mapping[str, str] = {}) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def do_POST(self) -> None:
        """Answer `POST /v1/messages` from the script."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] != "/v1/messages":
            self._json(404, _error_body("not_found_error", f"no route {self.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, _error_body("invalid_request_error", "request body is not valid JSON"))
            return
        self.server.received.append(body)
        try:
            answer = self.server.model.respond(body)
        except AgentloopError as exc:
            self._json(400, _error_body("invalid_request_error", str(exc)))
            return
        if isinstance(answer, RawResponse):
            if answer.sse is not None:
                self._send(answer.status, answer.sse.encode(), "text/event-stream", answer.headers)
            else:
                self._json(answer.status, answer.json, answer.headers)
            return
        if body.get("stream"):
            self._send(200, sse_events(answer).encode(), "text/event-stream")
        else:
            self._json(200, answer)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    model: ScriptedModel
    received: list[dict[str, Any]]


class MessagesServer:
    """A scripted Messages API on 127.0.0.1, for the real `AsyncAnthropic` to talk to.

    ```python
    async with MessagesServer([reply(tool_call("add", {"a": 1, "b": 2})), reply("3")]) as server:
        agent = Agent(client=server.client(), tools=[add])
        result = await agent.run("1 + 2?")
    ```
    """

    def __init__(
        self, script: Script | ScriptedModel, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        """Create (but do not start) a server answering from `script`."""
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.model = self.model
        self._httpd.received = []
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []

    @property
    def base_url(self) -> str:
        """The URL to pass as `AsyncAnthropic(base_url=...)`."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received (including ones answered with an error)."""
        return self._httpd.received

    def client(self, **options: Any) -> Any:
        """An `anthropic.AsyncAnthropic` pointed at this server (no retries by default)."""
        import anthropic

        options.setdefault("api_key", "sk-ant-local-test")
        options.setdefault("max_retries", 0)
        client = anthropic.AsyncAnthropic(base_url=self.base_url, **options)
        self._clients.append(client)
        return client

    def start(self) -> MessagesServer:
        """Start serving in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=partial(self._httpd.serve_forever, poll_interval=0.02),
                name="agentloop-messages-server",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    async def aclose(self) -> None:
        """Close the clients made by `client()`, then stop serving."""
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()
        self.stop()

    async def __aenter__(self) -> MessagesServer:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> MessagesServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
