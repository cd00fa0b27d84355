"""The HTTP server both scripted APIs share: 127.0.0.1, a background thread, recording.

`ScriptedServer` starts and stops the server and keeps what arrived; `ScriptedHandler`
reads a request, hands it to the script and acts the answer out on the wire (JSON,
streams flushed event by event, `Fault`s and `Paced` pauses). A wire format
(`server.MessagesServer`, `chat_server.ChatCompletionsServer`) says only how its bodies,
events and errors look, through the handler's format hooks.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from agentloop.errors import AgentloopError

from .message_stream import message_events
from .scripted import Answer, Fault, Paced, RawResponse, Script, ScriptedModel

__all__ = ("RecordedRequest", "ScriptedHandler", "ScriptedServer")

Events = Sequence[tuple[float, str, Any]]
"""Messages API stream events, each with the seconds to wait before it."""

_S = TypeVar("_S", bound="ScriptedServer")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it: path, query, headers and decoded JSON body."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any


class ScriptedHandler(BaseHTTPRequestHandler):
    """Answers requests from the server's script; a wire format fills in the hooks."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each streamed event leaves at once
    server: _HTTPServer

    routes: tuple[str, ...] = ()
    """The paths `POST` answers (unless `serves` says more); others get a 404."""
    stream_type = "text/event-stream"
    """The content type of a streamed answer."""
    not_found_type = "not_found_error"
    """The error type of a 404."""
    malformed_json = b""
    """A cut-off JSON body, as this format's `Fault.malformed_json()` sends it."""
    malformed_sse = b""
    """A cut-off stream event, as this format's `Fault.malformed_json()` streams it."""

    # -- the format's hooks

    def serves(self, path: str) -> bool:
        """Whether `POST` answers `path`."""
        return path in self.routes

    def error_body(self, kind: str, message: str) -> Any:
        """An error answer's JSON body."""
        raise NotImplementedError

    def fault_body(self, fault: Fault) -> Any:
        """The JSON body of an error fault."""
        raise NotImplementedError

    def message_body(self, message: dict[str, Any]) -> Any:
        """The JSON body that answers with `message` (a Messages API message)."""
        raise NotImplementedError

    def stream(self, events: Events, message: dict[str, Any]) -> list[tuple[float, bytes]]:
        """The stream payloads for `message`'s events, each with its pause."""
        raise NotImplementedError

    def stream_error(self, fault: Fault) -> bytes:
        """The payload a stream reports an error with, in its middle."""
        raise NotImplementedError

    def respond(self, seen: RecordedRequest, arrived: float) -> None:
        """Answer a `POST` to one of `routes` whose body is JSON."""
        raise NotImplementedError

    def billed(self, request: Mapping[str, Any], answer: Answer) -> Answer:
        """The script's answer with the usage the server bills for `request` (as it is)."""
        return answer

    # -- reading a request

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_POST(self) -> None:
        """Read the request; refuse an unknown route or a body that is not JSON."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        arrived = time.monotonic()
        path, _, query = self.path.partition("?")
        if not self.serves(path):
            self._json(404, self._not_found())
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(
                400, self.error_body("invalid_request_error", "request body is not valid JSON")
            )
            return
        self.respond(RecordedRequest(path, dict(parse_qsl(query)), self._headers(), body), arrived)

    def _not_found(self) -> Any:
        return self.error_body(self.not_found_type, f"no route {self.path}")

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def answer_from_script(
        self, request: Mapping[str, Any], *, stream: bool, allow_file_sources: bool = False
    ) -> None:
        """Hand `request` (in the Messages API shape) to the script; act its answer out.

        `allow_file_sources`: the request came under the Files beta.
        """
        model = self.server.owner.model
        try:
            answer = self.billed(
                request, model.respond(request, allow_file_sources=allow_file_sources)
            )
        except AgentloopError as exc:
            self._json(400, self.error_body("invalid_request_error", str(exc)))
            return
        try:
            self._answer(answer, stream=stream)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (e.g. its timeout)

    # -- answering

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
            events = [(0.0, name, data) for name, data in message_events(answer)]
            body = b"".join(payload for _, payload in self.stream(events, answer))
            self._send(200, body, self.stream_type)
        else:
            self._json(200, self.message_body(answer))

    def _fault(self, fault: Fault, *, stream: bool) -> None:
        answer = dict(fault.answer or {})
        if fault.kind == "http_error":
            headers = {} if fault.retry_after is None else {"retry-after": f"{fault.retry_after:g}"}
            self._json(fault.status, self.fault_body(fault), headers)
        elif fault.kind == "dropped" or (fault.kind == "stream_ends_early" and not stream):
            self._drop()
        elif fault.kind == "slow":
            if self._wait(fault.delay):
                self._answer(answer, stream=stream)
            else:
                self._drop()
        elif fault.kind == "malformed_json":
            if stream:
                self._send(200, self.malformed_sse, self.stream_type)
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
            self._json(status, self.fault_body(fault))
        else:
            self._open_stream()
            self._write_start(answer, fault.after_blocks)
            self._write(self.stream_error(fault))
            self._close_stream()

    def _write_start(self, answer: dict[str, Any], blocks: int) -> None:
        """Stream the start of `answer`: up to the end of its first `blocks` blocks."""
        for _, payload in self.stream(_cut(message_events(answer), blocks), answer):
            self._write(payload)

    def _paced(self, paced: Paced, *, stream: bool) -> None:
        if not stream:
            if self._wait(paced.total_delay):
                self._json(200, self.message_body(paced.message))
            else:
                self._drop()
            return
        self._open_stream()
        for pause, payload in self.stream(paced.schedule(), paced.message):
            if pause and not self._wait(pause):
                self._drop()
                return
            self._write(payload)
        self._close_stream()

    def _wait(self, seconds: float) -> bool:
        """Sleep; False (at once) if the server is stopping."""
        return not self.server.owner.stopping.wait(seconds)

    def _drop(self) -> None:
        """Close the connection without another byte."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", self.stream_type)
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", "req_local")
        self.end_headers()

    def _write(self, payload: bytes) -> None:
        """Write one HTTP chunk, so it is flushed as it is written."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def _close_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


def _cut(events: list[tuple[str, Any]], blocks: int) -> list[tuple[float, str, Any]]:
    """The events up to the end of the first `blocks` content blocks (no message end)."""
    kept: list[tuple[float, str, Any]] = []
    for name, data in events:
        if name in ("message_delta", "message_stop"):
            break
        if name == "content_block_start" and data["index"] >= blocks:
            break
        kept.append((0.0, name, data))
    return kept


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self, owner: ScriptedServer, address: tuple[str, int], handler: type[ScriptedHandler]
    ) -> None:
        super().__init__(address, handler)
        self.owner = owner


class ScriptedServer:
    """A scripted API on 127.0.0.1, serving in a background thread; see `MessagesServer`."""

    handler: type[ScriptedHandler] = ScriptedHandler
    """The request handler: the wire format this server speaks."""

    def __init__(
        self, script: Script | ScriptedModel, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        """Create (but do not start) a server answering from `script`."""
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
        self.stopping = threading.Event()
        """Set when the server stops: answers still waiting are cut short."""
        self._lock = threading.Lock()
        self._received: list[dict[str, Any]] = []
        self._recorded: list[RecordedRequest] = []
        self._arrivals: list[float] = []
        self._httpd = _HTTPServer(self, (host, port), self.handler)
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []

    def record(self, seen: RecordedRequest, arrived: float | None = None) -> None:
        """Keep a request; one for the script also has the time it `arrived`."""
        with self._lock:
            self._recorded.append(seen)
            if arrived is not None:
                self._received.append(seen.body)
                self._arrivals.append(arrived)

    @property
    def base_url(self) -> str:
        """The URL the server answers on."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body for the script (including ones answered with an error)."""
        return self._received

    @property
    def recorded(self) -> list[RecordedRequest]:
        """Every JSON request received, with its path, query and headers."""
        return self._recorded

    @property
    def request_times(self) -> list[float]:
        """When each request of `requests` arrived, as `time.monotonic()` values.

        Measure gaps between them, e.g. to check that a client waited `retry-after`.
        """
        return self._arrivals

    def start(self: _S) -> _S:
        """Start serving in a background thread."""
        if self._thread is None:
            # `stop` waits up to one poll for the loop to notice: a test suite starts and
            # stops a server per test, so the poll is short.
            self._thread = threading.Thread(
                target=partial(self._httpd.serve_forever, poll_interval=0.005),
                name=f"agentloop-{type(self).__name__}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; responses still waiting are cut short."""
        self.stopping.set()
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

    async def __aenter__(self: _S) -> _S:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
