"""A local Messages-API server on 127.0.0.1 that answers from a `ScriptedModel`.

It speaks enough of `POST /v1/messages` for the official SDK: JSON responses, SSE streams
(`stream: true`), and API-shaped errors; `POST /v1/messages/count_tokens` answers with a
stand-in count (`count_tokens`) and `GET /v1/models` lists the server's `models`. The
paths of the Bedrock and Vertex AI clients are answered too, each in its own wire format
(`platforms`), so every client class of the SDK can be tested against it; message
batches are served too (`batches`). It runs
in a background thread, so tests under any event loop (or none) can use it, and it lints
every request's history, answering a broken one with the 400 `invalid_request_error` the
real API would send. Its Files API (`files`) keeps uploads in memory, for requests under
the Files beta to refer to.

Scripts can also hold `Fault`s (error statuses with `retry-after`, dropped connections,
slow, malformed or broken responses) and `Paced` messages (streamed with real pauses,
each event flushed as it is written); the server acts them out on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast
from urllib.parse import parse_qsl

from agentloop._wire import compact_json
from agentloop.errors import AgentloopError
from agentloop.files import FILES_BETA

from .batches import BatchQueue, answer_batch, batch_route
from .caching import PromptCache
from .files import FILES_PATH, FileStore, file_problem, files_answer
from .http import Events, RecordedRequest, ScriptedHandler, ScriptedServer
from .message_stream import message_events
from .platforms import (
    EVENT_STREAM_TYPE,
    event_stream_chunk,
    event_stream_exception,
    messages_request,
    platform_route,
)
from .scripted import Answer, Fault, Script, ScriptedModel
from .server_tools import request_problem

__all__ = ("DEFAULT_MODELS", "MessagesServer", "RecordedRequest", "count_tokens", "sse_events")

DEFAULT_MODELS = ("claude-scripted",)
"""The model ids a `MessagesServer` lists unless told others."""


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_local"}


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def sse_events(message: Mapping[str, Any], *, chunk: int = 16) -> str:
    """Render a whole response message as the SSE stream the API would send for it."""
    return "".join(_event(name, data) for name, data in message_events(message, chunk=chunk))


class _MessagesHandler(ScriptedHandler):
    """Answers `POST /v1/messages` from the script, and the model list and token counts.

    A Bedrock or Vertex AI request is read as the Messages API request it stands for;
    Bedrock's streams are answered in AWS event-stream frames. Error answers keep the
    Messages API's shape on every path.
    """

    routes = ("/v1/messages", "/v1/messages/count_tokens")
    event_stream = False
    """The request being answered streams in Bedrock's frames, not SSE."""
    malformed_json = b'{"id": "msg_01", "type": "message", "role": "assistant", "content": [{"ty'
    malformed_sse = (
        b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m\n\n'
    )

    def error_body(self, kind: str, message: str) -> Any:
        """The API's error shape."""
        return _error_body(kind, message)

    def fault_body(self, fault: Fault) -> Any:
        """The fault's error, in the API's shape."""
        return fault.error_body

    def message_body(self, message: dict[str, Any]) -> Any:
        """The message itself: it is already in this format."""
        return message

    def serves(self, path: str) -> bool:
        """The first-party paths and the Bedrock and Vertex AI ones."""
        return path in self.routes or platform_route(path) is not None or bool(batch_route(path))

    def do_DELETE(self) -> None:
        """Delete an uploaded file."""
        self._files("DELETE", b"")

    def _files(self, method: str, body: bytes) -> None:
        """Answer a Files API request from the server's `files`."""
        path = self.path.partition("?")[0]
        headers = self._headers()
        owner = cast("MessagesServer", self.server.owner)
        owner.record(RecordedRequest(path, {}, headers, None))
        betas = _betas(RecordedRequest(path, {}, headers, None))
        self._json(*files_answer(owner.files, method, path, headers, body, betas))

    def stream(self, events: Events, message: dict[str, Any]) -> list[tuple[float, bytes]]:
        """Each event as an SSE event (a Bedrock frame on Bedrock's path)."""
        if self.event_stream:
            return [(pause, event_stream_chunk(data)) for pause, _, data in events]
        return [(pause, _event(name, data).encode()) for pause, name, data in events]

    def stream_error(self, fault: Fault) -> bytes:
        """An `error` event (a Bedrock exception frame on Bedrock's path)."""
        error = fault.error_body["error"]
        if self.event_stream:
            return event_stream_exception(error["type"], error["message"])
        return _event("error", {"type": "error", "error": error}).encode()

    def billed(self, request: Mapping[str, Any], answer: Answer) -> Answer:
        """A message's usage as the server's prompt cache bills `request`, if it has one."""
        cache = cast("MessagesServer", self.server.owner).prompt_cache
        if cache is None or not isinstance(answer, dict):
            return answer
        return {**answer, "usage": {**(answer.get("usage") or {}), **cache.bill(request)}}

    def respond(self, seen: RecordedRequest, arrived: float) -> None:
        """Count tokens, or answer from the script."""
        owner = self.server.owner
        if batch_route(seen.path) is not None:
            owner.record(seen)
            answer_batch(self, cast("MessagesServer", owner).batches, seen)
            return
        route = platform_route(seen.path)
        request = seen.body if route is None else messages_request(route, seen.body)
        self.event_stream = route is not None and route.platform == "bedrock"
        self.stream_type = EVENT_STREAM_TYPE if self.event_stream else "text/event-stream"
        if seen.path == "/v1/messages/count_tokens" or (route and route.counts_tokens):
            owner.record(seen)
            try:
                owner.model.check(request)
            except AgentloopError as exc:
                self._json(400, _error_body("invalid_request_error", str(exc)))
                return
            self._json(200, {"input_tokens": count_tokens(request)})
            return
        owner.record(seen, arrived)
        betas = _betas(seen)
        problem = request_problem(request, betas)
        files = FILES_BETA in betas
        if problem is None and files:
            problem = file_problem(request, cast("MessagesServer", owner).files)
        if problem is not None:
            self._json(400, _error_body("invalid_request_error", problem))
            return
        self.answer_from_script(
            request, stream=bool(request.get("stream")), allow_file_sources=files
        )

    def do_POST(self) -> None:
        """A file upload, a batch's cancel (no body), or a request with a JSON body."""
        path, _, query = self.path.partition("?")
        if path.startswith(FILES_PATH):
            length = int(self.headers.get("content-length") or 0)
            self._files("POST", self.rfile.read(length))
            return
        if batch_route(path) is None or not path.endswith("/cancel"):
            super().do_POST()
            return
        self.rfile.read(int(self.headers.get("content-length") or 0))
        seen = RecordedRequest(path, dict(parse_qsl(query)), self._headers(), {})
        self.server.owner.record(seen)
        answer_batch(self, cast("MessagesServer", self.server.owner).batches, seen)

    def do_GET(self) -> None:
        """Answer `GET /v1/models` and `GET /v1/models/{id}` from the server's models."""
        path, _, query = self.path.partition("?")
        if path.startswith(FILES_PATH):
            self._files("GET", b"")
            return
        owner = self.server.owner
        seen = RecordedRequest(path, dict(parse_qsl(query)), self._headers(), None)
        owner.record(seen)
        if batch_route(path) is not None:
            answer_batch(self, cast("MessagesServer", owner).batches, seen)
            return
        models = [_model(name) for name in cast("MessagesServer", owner).models]
        if path == "/v1/models":
            self._json(200, _page(models, dict(parse_qsl(query))))
            return
        name = path.removeprefix("/v1/models/")
        found = [m for m in models if m["id"] == name] if path.startswith("/v1/models/") else []
        if found:
            self._json(200, found[0])
        else:
            self._json(404, _error_body("not_found_error", f"model: {name}"))


def _betas(seen: RecordedRequest) -> list[str]:
    """The betas a request asks for: its `anthropic-beta` header (Bedrock: in the body)."""
    header = seen.headers.get("anthropic-beta", "")
    body = seen.body if isinstance(seen.body, Mapping) else {}
    return [b.strip() for b in header.split(",") if b.strip()] + list(
        body.get("anthropic_beta") or ()
    )


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


class MessagesServer(ScriptedServer):
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

    handler = _MessagesHandler

    def __init__(
        self,
        script: Script | ScriptedModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Iterable[str] = DEFAULT_MODELS,
        prompt_cache: PromptCache | bool = False,
        batch_delay: float = 0.0,
    ) -> None:
        """Create (but do not start) a server answering from `script`.

        `models` are the ids `GET /v1/models` lists. With `prompt_cache` (`True` or a
        `PromptCache`), each message's usage is billed as the API's prompt caching would
        bill the request (see `agentloop.testing.caching`); the script's `output_tokens`
        are kept. A message batch (`/v1/messages/batches`, see `agentloop.testing.batches`)
        stays in progress for `batch_delay` seconds.
        """
        super().__init__(script, host=host, port=port)
        self.models = tuple(models)
        """The model ids `GET /v1/models` lists."""
        self.prompt_cache: PromptCache | None = (
            prompt_cache
            if isinstance(prompt_cache, PromptCache)
            else (PromptCache() if prompt_cache else None)
        )
        """The cache that bills each request, or None (usage then comes from the script)."""
        self.files = FileStore()
        """The files uploaded to its Files API (`client.beta.files`)."""
        self.batches = BatchQueue(batch_delay)
        """The message batches posted, answered from the script when posted."""

    def client(self, **options: Any) -> Any:
        """An `anthropic.AsyncAnthropic` pointed at this server (no retries by default).

        `options` go to `AsyncAnthropic`: e.g. `max_retries=2` to let the SDK retry faults
        (it waits `retry-after` when sent, else 0.5 s * 2**attempt, less up to 25 %
        jitter, at most 8 s), or `timeout=0.2` to make a `Fault.slow` time out.
        """
        import anthropic

        options.setdefault("api_key", "sk-ant-local-test")
        options.setdefault("max_retries", 0)
        if "http_client" not in options:
            # This server speaks plain HTTP: no CA bundle to load (the SDK's default
            # client loads one, about 0.1 s of CPU per client).
            options["http_client"] = anthropic.DefaultAsyncHttpxClient(verify=False)
        client = anthropic.AsyncAnthropic(base_url=self.base_url, **options)
        self._clients.append(client)
        return client
