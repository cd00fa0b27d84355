"""A local Messages-API server on 127.0.0.1 that answers from a `ScriptedModel`.

It speaks enough of `POST /v1/messages` for the official SDK: JSON responses, SSE streams
(`stream: true`), and API-shaped errors; `POST /v1/messages/count_tokens` answers with a
stand-in count (`count_tokens`) and `GET /v1/models` lists the server's `models`. It runs
in a background thread, so tests under any event loop (or none) can use it, and it lints
every request's history, answering a broken one with the 400 `invalid_request_error` the
real API would send.

Scripts can also hold `Fault`s (error statuses with `retry-after`, dropped connections,
slow, malformed or broken responses) and `Paced` messages (streamed with real pauses,
each event flushed as it is written); the server acts them out on the wire.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

from agentloop._wire import compact_json
from agentloop.errors import AgentloopError

from .scripted import (
    Answer,
    Fault,
    Paced,
    RawResponse,
    Script,
    ScriptedModel,
    message_events,
)

__all__ = ("DEFAULT_MODELS", "MessagesServer", "RecordedRequest", "count_tokens", "sse_events")

DEFAULT_MODELS = ("claude-scripted",)
"""The model ids a `MessagesServer` lists unless told others."""

_MALFORMED_JSON = b'{"id": "msg_01", "type": "message", "role": "assistant", "content": [{"ty'
_MALFORMED_SSE = b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m\n\n'


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_local"}


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def sse_events(message: Mapping[str, Any], *, chunk: int = 16) -> str:
    """Render a whole response message as the SSE stream the API would send for it."""
    return "".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n"
        for name, data in message_events(message, chunk=chunk)
    )


def _cut(events: list[tuple[str, Any]], blocks: int) -> list[tuple[str, Any]]:
    """The events up to the end of the first `blocks` content blocks (no message end)."""
    kept: list[tuple[str, Any]] = []
    for name, data in events:
        if name in ("message_delta", "message_stop"):
            break
        if name == "content_block_start" and data["index"] >= blocks:
            break
        kept.append((name, data))
    return kept


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it: path, query, headers and decoded JSON body."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each streamed event leaves at once
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

    def do_GET(self) -> None:
        """Answer `GET /v1/models` and `GET /v1/models/{id}` from the server's models."""
        path, _, query = self.path.partition("?")
        self._record(RecordedRequest(path, dict(parse_qsl(query)), self._headers(), None))
        models = [_model(name) for name in self.server.models]
        if path == "/v1/models":
            self._json(200, _page(models, dict(parse_qsl(query))))
            return
        name = path.removeprefix("/v1/models/")
        found = [m for m in models if m["id"] == name] if path.startswith("/v1/models/") else []
        if found:
            self._json(200, found[0])
        else:
            self._json(404, _error_body("not_found_error", f"model: {name}"))

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _record(self, seen: RecordedRequest) -> None:
        with self.server.lock:
            self.server.recorded.append(seen)

    def _count_tokens(self, seen: RecordedRequest) -> None:
        """Answer `POST /v1/messages/count_tokens`: lint the history, count the request."""
        self._record(seen)
        try:
            self.server.model.check(seen.body)
        except AgentloopError as exc:
            self._json(400, _error_body("invalid_request_error", str(exc)))
            return
        self._json(200, {"input_tokens": count_tokens(seen.body)})

    def do_POST(self) -> None:
        """Answer `POST /v1/messages` from the script (and `count_tokens`)."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        arrived = time.monotonic()
        path, _, query = self.path.partition("?")
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._json(404, _error_body("not_found_error", f"no route {self.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, _error_body("invalid_request_error", "request body is not valid JSON"))
            return
        seen = RecordedRequest(path, dict(parse_qsl(query)), self._headers(), body)
        if path == "/v1/messages/count_tokens":
            self._count_tokens(seen)
            return
        with self.server.lock:
            self.server.received.append(body)
            self.server.recorded.append(seen)
            self.server.arrivals.append(arrived)
        try:
            answer = self.server.model.respond(body)
        except AgentloopError as exc:
            self._json(400, _error_body("invalid_request_error", str(exc)))
            return
        try:
            self._answer(answer, stream=bool(body.get("stream")))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (e.g. its timeout)

    def _answer(self, answer: Answer, *, stream: bool) -> None:
        if isinstance(answer, Fault):
            self._fault(answer, stream=stream)
        elif isinstance(answer, Paced):
            self._paced(answer, stream=stream)
        elif isinstance(answer, RawResponse):
            if answer.sse is not None:
                self._send(answer.status, answer.sse.encode(), "text/event-stream", answer.headers)
            else:
                self._json(answer.status, answer.json, answer.headers)
        elif stream:
            self._send(200, sse_events(answer).encode(), "text/event-stream")
        else:
            self._json(200, answer)

    # -- faults, acted out the same way in every wire format (the hooks below say how)

    malformed_json = _MALFORMED_JSON
    """A cut-off JSON body, as this format's `Fault.malformed_json()` sends it."""
    malformed_sse = _MALFORMED_SSE
    """A cut-off stream event, as this format's `Fault.malformed_json()` streams it."""

    def _fault(self, fault: Fault, *, stream: bool) -> None:
        answer = dict(fault.answer or {})
        if fault.kind == "http_error":
            headers = {} if fault.retry_after is None else {"retry-after": f"{fault.retry_after:g}"}
            self._json(fault.status, self._error_of(fault), headers)
        elif fault.kind == "dropped" or (fault.kind == "stream_ends_early" and not stream):
            self._drop()
        elif fault.kind == "slow":
            if self._wait(fault.delay):
                self._answer(answer, stream=stream)
            else:
                self._drop()
        elif fault.kind == "malformed_json":
            if stream:
                self._send(200, self.malformed_sse, "text/event-stream")
            else:
                self._send(200, self.malformed_json, "application/json")
        elif fault.kind == "stream_ends_early":
            self._open_stream()
            self._write_start(answer, fault.after_blocks)
            if fault.clean_end:
                self._close_stream()
            else:
                self._drop()
        elif not stream:  # stream_error, asked for without streaming
            status = 529 if fault.error_type == "overloaded_error" else 500
            self._json(status, self._error_of(fault))
        else:
            self._open_stream()
            self._write_start(answer, fault.after_blocks)
            self._write_stream_error(fault)
            self._close_stream()

    def _error_of(self, fault: Fault) -> Any:
        """The error body of an error fault, in this format."""
        return fault.error_body

    def _write_start(self, answer: dict[str, Any], blocks: int) -> None:
        """Stream the start of `answer`: up to the end of its first `blocks` blocks."""
        self._write_events(_cut(message_events(answer), blocks))

    def _write_stream_error(self, fault: Fault) -> None:
        """The error a stream reports in its middle, in this format."""
        self._write_events([("error", {"type": "error", "error": fault.error_body["error"]})])

    def _paced(self, paced: Paced, *, stream: bool) -> None:
        if not stream:
            if self._wait(paced.total_delay):
                self._json(200, paced.message)
            else:
                self._drop()
            return
        self._open_stream()
        for pause, name, data in paced.schedule():
            if pause and not self._wait(pause):
                self._drop()
                return
            self._write_events([(name, data)])
        self._close_stream()

    def _wait(self, seconds: float) -> bool:
        """Sleep; False (at once) if the server is stopping."""
        return not self.server.stopping.wait(seconds)

    def _drop(self) -> None:
        """Close the connection without another byte."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", "req_local")
        self.end_headers()

    def _write_events(self, events: Iterable[tuple[str, Any]]) -> None:
        """Write events as HTTP chunks, one each, so each is flushed as it is written."""
        for name, data in events:
            payload = _event(name, data)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def _close_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


def count_tokens(body: Mapping[str, Any]) -> int:
    """The server's stand-in token count of a request.

    One token per 4 characters (rounded up) of the compact, key-sorted JSON of the
    request's `system`, `tools` and `messages`.
    """
    counted = {k: body[k] for k in ("system", "tools", "messages") if k in body}
    text = compact_json(counted, sort_keys=True).decode()
    return max(1, -(-len(text) // 4))


def _model(name: str) -> dict[str, Any]:
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": "2025-01-01T00:00:00Z",
    }


def _page(models: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of the model list, as `GET /v1/models` pages it (`limit`, `after_id`)."""
    after = query.get("after_id")
    if after is not None:
        ids = [m["id"] for m in models]
        models = models[ids.index(after) + 1 :] if after in ids else []
    try:
        limit = max(1, int(query.get("limit", "20")))
    except ValueError:
        limit = 20
    page = models[:limit]
    return {
        "data": page,
        "has_more": len(models) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    model: ScriptedModel
    received: list[dict[str, Any]]
    recorded: list[RecordedRequest]
    arrivals: list[float]
    models: tuple[str, ...]
    lock: threading.Lock
    stopping: threading.Event


class MessagesServer:
    """A scripted Messages API on 127.0.0.1, for the real `AsyncAnthropic` to talk to.

    ```python
    async with MessagesServer([reply(tool_call("add", {"a": 1, "b": 2})), reply("3")]) as server:
        agent = Agent(client=server.client(), tools=[add])
        result = await agent.run("1 + 2?")
    ```

    Script items may also be `Fault`s, acted out on the wire, and `Paced` messages,
    streamed with real pauses. With `server.client(max_retries=2)` the SDK's own retries
    meet the faults; `request_times` tells when each attempt arrived:

    ```python
    script = [Fault.rate_limited(retry_after=0.2), Fault.dropped(), reply("ok")]
    async with MessagesServer(script) as server:
        result = await Agent(client=server.client(max_retries=2)).run("hi")
        assert len(server.requests) == 3
    ```
    """

    _handler: type[_Handler] = _Handler
    """The request handler: the wire format this server speaks."""

    def __init__(
        self,
        script: Script | ScriptedModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Iterable[str] = DEFAULT_MODELS,
    ) -> None:
        """Create (but do not start) a server answering from `script`.

        `models` are the ids `GET /v1/models` lists.
        """
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
        self._httpd = _HTTPServer((host, port), self._handler)
        self._httpd.model = self.model
        self._httpd.models = tuple(models)
        self._httpd.received = []
        self._httpd.recorded = []
        self._httpd.arrivals = []
        self._httpd.lock = threading.Lock()
        self._httpd.stopping = threading.Event()
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

    @property
    def recorded(self) -> list[RecordedRequest]:
        """Every JSON request received, with its path, query and headers."""
        return self._httpd.recorded

    @property
    def request_times(self) -> list[float]:
        """When each request of `requests` arrived, as `time.monotonic()` values.

        Measure gaps between them, e.g. to check that a client waited `retry-after`.
        """
        return self._httpd.arrivals

    def client(self, **options: Any) -> Any:
        """An `anthropic.AsyncAnthropic` pointed at this server (no retries by default).

        `options` go to `AsyncAnthropic`: e.g. `max_retries=2` to let the SDK retry faults
        (it waits `retry-after` when sent, else 0.5 s * 2**attempt, less up to 25 %
        jitter, at most 8 s), or `timeout=0.2` to make a `Fault.slow` time out.
        """
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
        """Stop serving and close the socket; responses still waiting are cut short."""
        self._httpd.stopping.set()
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
