"""The gateway: an Anthropic-compatible `POST /v1/messages` in front of the agent loop.

A request is checked and authenticated, its hidden turns are found in the session store,
and the same `Agent` machinery as any agentloop run takes it from there: the gateway's
tools run inside the loop, the client's tools (the request's `tools`) are handed back.
The client gets one assistant message (JSON or SSE) with its own calls only; whatever
the client cannot see is stored for the request that continues the conversation.
Token counts are taken of what the upstream would receive; model listings pass through.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import string
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.context import Context
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentloop.agent import Agent
from agentloop.errors import (
    ConfigurationError,
    HistoryError,
    MissingAPIKeyError,
    ProviderError,
)
from agentloop.logs import get_logger
from agentloop.registry import ToolRegistry
from agentloop.result import RunResult
from agentloop.tools import Tool

from .sessions import (
    Found,
    Session,
    Sessions,
    Thread,
    continue_history,
    last_marker,
    moved_markers,
)
from .stores import DEFAULT_STORE, Store, open_store
from .upstream import (
    RETRY_WAIT_LIMIT,
    Transport,
    Upstream,
    UpstreamProvider,
    forwarded_headers,
)
from .visible import PING, VisibleStream, sse, visible_message

__all__ = ("GATEWAY_KEYS_ENV", "SECRET_ENV", "SESSION_HEADER", "Gateway", "GatewayConfig")

GATEWAY_KEYS_ENV = "AGENTLOOP_GATEWAY_KEYS"
"""Comma-separated client keys the gateway admits when it has its own upstream key."""
SECRET_ENV = "AGENTLOOP_GATEWAY_SECRET"
"""The server secret session keys are derived with (else one is made and kept in the store)."""

SESSION_HEADER = "agentloop-session"
"""Response header saying what happened to the conversation's session, when it matters:
`ambiguous` (its hidden turns were not restored), `unsaved` (the store failed)."""

_log = get_logger()

# Request fields the Agent takes as its own options; every other field goes upstream as
# it is (through `params`).
_AGENT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "stop_sequences",
        "stream",
        "thread",
    }
)
# Names the provider reads as request options rather than body fields: a client field of
# that name is sent in the body through `extra_body`.
_OPTION_NAMES = frozenset(
    {
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
        "betas",
        "user_profile_id",
        "workspace_id",
    }
)
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """How a gateway runs (what `agentloop serve` builds from its options)."""

    upstream: str
    """Base URL of the Messages API to forward to (e.g. `https://api.anthropic.com`)."""
    store: str = DEFAULT_STORE
    """Session store URL: `sqlite:///PATH`, `redis://HOST:PORT/DB` or `memory://`."""
    session_ttl: float = 3600.0
    """Seconds a stored session is kept after it was last written."""
    tools: Sequence[Tool] = ()
    """The gateway's own tools (run inside the loop, never shown to the client)."""
    max_rounds: int = 10
    """Most upstream requests for one client request."""
    tool_concurrency: int = 8
    """Most calls of the gateway's tools in flight at once, per request."""
    tool_timeout: float = 30.0
    """Seconds a tool call may take, unless the tool sets its own."""
    upstream_key: str | None = None
    """The gateway's own upstream API key; when set, clients must present a gateway key."""
    gateway_keys: frozenset[str] = frozenset()
    """The client keys admitted when `upstream_key` is set."""
    secret: bytes | None = None
    """Secret for session keys (every replica sharing a store needs the same one); by
    default one is made and kept in the store, and checked on every lookup."""
    ping_interval: float = 5.0
    """Seconds of silence after which a stream gets a `ping` event."""
    upstream_timeout: float | None = None
    """Seconds the SDK waits for an upstream response, and the longest silence within an
    upstream stream (the SDK's 600 when None; `math.inf` for no limit)."""
    retry_wait_limit: float = RETRY_WAIT_LIMIT
    """The longest `retry-after` a hidden round waits for; a longer one goes to the
    client (with its `retry-after` header), as the API's answer would."""
    upstream_transport: Transport = "auto"
    """The HTTP client upstream: "aiohttp", "httpx", or "auto" (aiohttp when installed
    and on asyncio, as under `agentloop serve`; else httpx)."""
    deps: Any = None
    """Passed to every run as `deps` (what the gateway's tools receive)."""
    tracer_provider: Any = None
    """Where the runs' OpenTelemetry spans go (the global tracer provider when None)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> GatewayConfig:
        """A config from `options` and the environment.

        Reads `ANTHROPIC_API_KEY` (the gateway's own upstream key), `AGENTLOOP_GATEWAY_KEYS`
        and `AGENTLOOP_GATEWAY_SECRET` (unless `options` hold a `secret`).

        Raises:
            ConfigurationError: an upstream key is set but no gateway key is.
        """
        env = os.environ if environ is None else environ
        upstream_key = env.get("ANTHROPIC_API_KEY") or None
        keys = frozenset(k.strip() for k in env.get(GATEWAY_KEYS_ENV, "").split(",") if k.strip())
        if upstream_key and not keys:
            raise ConfigurationError(
                f"ANTHROPIC_API_KEY is set, so clients must present a gateway key: set "
                f"{GATEWAY_KEYS_ENV} to a comma-separated list of keys"
            )
        if options.get("secret") is None:
            secret = env.get(SECRET_ENV)
            options["secret"] = secret.encode() if secret else None
        return cls(upstream_key=upstream_key, gateway_keys=keys, **options)


class _Refusal(Exception):
    """A request answered with an API error before any upstream request."""

    def __init__(
        self, status: int, kind: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.details = details


@dataclass
class _ThreadCall:
    parent: Thread | None
    fields: dict[str, Any]
    added: list[Any]
    """The visible messages this request adds to the thread (before the reply)."""


@dataclass
class _Call:
    """One client request, ready to run."""

    scope: str
    """The client's credential: what its sessions are scoped by."""
    agent: Agent
    provider: UpstreamProvider
    history: list[dict[str, Any]]
    """The upstream history the run starts from."""
    visible: list[Any]
    """The conversation as the client sees it."""
    session: Session | None
    notes: dict[str, str]
    """Headers telling the client what happened to its session (`agentloop-session`)."""
    client_tools: list[Any]
    client_names: frozenset[str]
    stream: bool
    request_id: str
    model: str = ""
    """The model the client asked for."""
    thread: _ThreadCall | None = None
    reply_id: str | None = None
    trace: Context | None = None
    """The W3C trace context the client sent (`traceparent`), which the run continues."""


@contextmanager
def continued_trace(call: _Call) -> Iterator[None]:
    """Make the client's trace context current while its run lasts.

    The run's spans and its upstream requests then continue the client's trace.
    """
    if call.trace is None:
        yield
        return
    token = otel_context.attach(call.trace)
    try:
        yield
    finally:
        otel_context.detach(token)


def _error_body(kind: str, message: str, request_id: str, details: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error, "request_id": request_id}


def _json(
    status: int, data: Any, request_id: str, headers: Mapping[str, str] | None = None
) -> Response:
    try:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        body = json.dumps(data, separators=(",", ":")).encode()
    return Response(
        body,
        status,
        headers={"request-id": request_id, **(headers or {})},
        media_type="application/json",
    )


_STATUS_OF = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}


@dataclass(frozen=True)
class _Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def _failure(exc: Exception, request_id: str, provider: UpstreamProvider) -> _Failure:
    """How a failed run is answered: with the upstream's own error where there is one."""
    if isinstance(exc, MissingAPIKeyError):
        body = _error_body("authentication_error", "x-api-key header is required", request_id)
        return _Failure(401, body, {})
    if isinstance(exc, ProviderError):
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            # The upstream's answer, unchanged (an error event inside a stream has no
            # status of its own: it gets the one its type has).
            status = exc.status_code or _STATUS_OF.get(body["error"].get("type"), 500)
            headers = dict(provider.error_headers)
            if isinstance(body.get("request_id"), str):  # the id the body names, in both
                headers["request-id"] = body["request_id"]
            return _Failure(status, body, headers)
        body = _error_body("api_error", f"upstream request failed: {exc}", request_id)
        return _Failure(502, body, {})
    if isinstance(exc, (HistoryError, ConfigurationError)):
        return _Failure(400, _error_body("invalid_request_error", str(exc), request_id), {})
    _log.error("gateway.internal_error", error=repr(exc), exc_info=exc)
    return _Failure(500, _error_body("api_error", "internal gateway error", request_id), {})


def _api_headers(request: Request) -> dict[str, str]:
    """The client's API headers to send upstream, which must be ASCII as the API's are."""
    headers = forwarded_headers(request.headers)
    for name, value in headers.items():
        if not value.isascii():
            raise _Refusal(400, "invalid_request_error", f"{name}: header value must be ASCII")
    return headers


def _credential(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def _new_id(prefix: str) -> str:
    """`prefix` and 24 random base62 characters (from one read of the system's randomness)."""
    number = int.from_bytes(secrets.token_bytes(18), "big")
    chars = []
    for _ in range(24):
        number, digit = divmod(number, 62)
        chars.append(_ID_ALPHABET[digit])
    return prefix + "".join(chars)


class Gateway:
    """The gateway's state (tools, store, upstream clients) and its ASGI app."""

    def __init__(self, config: GatewayConfig, *, store: Store | None = None) -> None:
        """A gateway for `config`; `store` replaces the one `config.store` names.

        Raises:
            ConfigurationError: the store URL or a limit cannot work.
        """
        where = urlsplit(config.upstream)
        if where.scheme not in ("http", "https") or not where.hostname:
            raise ConfigurationError(
                f"the upstream must be an http:// or https:// URL, not {config.upstream!r}"
            )
        self.config = config
        self.registry = ToolRegistry(config.tools)
        self.internal = frozenset(self.registry.names)
        self.store = store or open_store(config.store, ttl=config.session_ttl)
        self.sessions: Sessions | None = None
        self.upstream: Upstream | None = None
        if config.upstream_transport == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
            raise ConfigurationError(
                "the aiohttp upstream transport needs aiohttp: "
                "pip install 'agentloop-runner[gateway]'"
            )
        # Checked once here, so a bad limit fails at startup, not on each request.
        Agent(
            provider=_Unused(),
            tools=self.registry,
            max_rounds=config.max_rounds,
            tool_concurrency=config.tool_concurrency,
            tool_timeout=config.tool_timeout,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the store, read (or make) the secret, make the upstream clients."""
        await self.store.open()
        if self.config.secret is not None:
            self.sessions = Sessions(self.store, self.config.secret)
        else:
            self.sessions = Sessions(self.store, await self.store.secret(), kept=True)
        self.upstream = Upstream(
            self.config.upstream,
            timeout=self.config.upstream_timeout,
            retry_wait_limit=self.config.retry_wait_limit,
            transport=self.config.upstream_transport,
        )
        _log.info("gateway.start", upstream=self.config.upstream, tools=sorted(self.internal))

    async def aclose(self) -> None:
        """Close the upstream clients and the store."""
        if self.upstream is not None:
            await self.upstream.aclose()
            self.upstream = None
        await self.store.aclose()

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._purge_forever)
                yield
                group.cancel_scope.cancel()
        finally:
            await self.aclose()

    async def _purge_forever(self) -> None:
        interval = min(max(self.config.session_ttl / 2, 0.05), 60.0)
        while True:
            await anyio.sleep(interval)
            try:
                await self.store.purge()
            except Exception as exc:  # a store hiccup must not stop the gateway
                _log.warning("gateway.purge_failed", error=repr(exc))

    def app(self) -> Starlette:
        """The ASGI application (its lifespan opens and closes the gateway)."""

        async def not_found(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 404
            kind = "not_found_error" if status == 404 else "invalid_request_error"
            message = f"{request.method} {request.url.path} is not served here"
            request_id = _new_id("req_")
            return _json(status, _error_body(kind, message, request_id), request_id)

        return Starlette(
            routes=[
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model_id}", self.models, methods=["GET"]),
                Route("/healthz", self.healthz, methods=["GET"]),
            ],
            exception_handlers={404: not_found, 405: not_found},
            lifespan=self._lifespan,
        )

    async def healthz(self, request: Request) -> Response:
        """200 once the store is open."""
        ready = self.sessions is not None
        body = {"status": "ok" if ready else "starting"}
        return _json(200 if ready else 503, body, _new_id("req_"))

    # ------------------------------------------------------------------ /v1/messages

    async def messages(self, request: Request) -> Response:
        """`POST /v1/messages`: one client request, answered as the API would."""
        request_id = _new_id("req_")
        try:
            call = await self._prepare(request, request_id)
        except _Refusal as refusal:
            body = _error_body(refusal.kind, str(refusal), request_id, refusal.details)
            return _json(refusal.status, body, request_id)
        if call.stream:
            return _StreamResponse(self, call)
        result: RunResult | None = None
        error: Exception | None = None
        async with anyio.create_task_group() as group:
            # A client that goes away cancels its run, as for a stream.
            group.start_soon(_cancel_on_disconnect, request.receive, group.cancel_scope)
            try:
                with continued_trace(call):
                    result = await call.agent.run(
                        None,
                        history=call.history,
                        deps=self.config.deps,
                        external_tools=call.client_tools,
                    )
            except Exception as exc:
                error = exc
            group.cancel_scope.cancel()
        if error is not None:
            await self._keep_partial(call, error)
            failure = _failure(error, request_id, call.provider)
            _log.info("gateway.failed", status=failure.status, error=str(error))
            return _json(failure.status, failure.body, request_id, failure.headers)
        if result is None:  # the client went away: nobody to answer
            _log.info("gateway.client_gone", request_id=request_id)
            return Response(status_code=499)
        message = await self._finish(call, result)
        return _json(200, message, request_id, {**call.provider.answer_headers, **call.notes})

    async def count_tokens(self, request: Request) -> Response:
        """`POST /v1/messages/count_tokens`: the count for what the upstream would receive.

        The request's conversation is counted as the gateway would send it: with its
        hidden turns restored and the gateway's tools announced beside the client's.
        """
        request_id = _new_id("req_")
        try:
            scope, upstream_credential = self._authenticate(request)
            body = await _json_object(request)
            _require(body, (("model", str), ("messages", list)))
            client_tools = body.get("tools") or []
            self._client_tool_names(client_tools)
            _, body["messages"] = await self._restore(scope, body["messages"])
        except _Refusal as refusal:
            body = _error_body(refusal.kind, str(refusal), request_id, refusal.details)
            return _json(refusal.status, body, request_id)
        if self.internal:
            body["tools"] = [*(d.to_wire() for d in self.registry.definitions()), *client_tools]
        path = "/v1/messages/count_tokens"
        return await self._forward(request, request_id, upstream_credential, path, body)

    async def models(self, request: Request) -> Response:
        """`GET /v1/models` and `GET /v1/models/{id}`: the upstream's answer, as it is."""
        request_id = _new_id("req_")
        model_id = request.path_params.get("model_id")
        try:
            _, upstream_credential = self._authenticate(request)
            if model_id in (".", ".."):  # never a model, and would leave /v1/models upstream
                raise _Refusal(404, "not_found_error", f"model: {model_id}")
        except _Refusal as refusal:
            body = _error_body(refusal.kind, str(refusal), request_id)
            return _json(refusal.status, body, request_id)
        path = "/v1/models" if model_id is None else f"/v1/models/{quote(model_id, safe='')}"
        return await self._forward(request, request_id, upstream_credential, path)

    async def _forward(
        self,
        request: Request,
        request_id: str,
        credential: str,
        path: str,
        body: Mapping[str, Any] | None = None,
    ) -> Response:
        assert self.upstream is not None
        try:
            headers = _api_headers(request)
        except _Refusal as refusal:
            error = _error_body(refusal.kind, str(refusal), request_id)
            return _json(refusal.status, error, request_id)
        try:
            answer = await self.upstream.forward(
                credential,
                request.method,
                path,
                body=body,
                headers=headers,
                query=dict(request.query_params),
            )
        except ProviderError as exc:
            message = f"upstream request failed: {exc}"
            return _json(502, _error_body("api_error", message, request_id), request_id)
        headers = {"request-id": request_id, **answer.headers}
        return Response(answer.content, answer.status, headers=headers)

    async def _prepare(self, request: Request, request_id: str) -> _Call:
        assert self.sessions is not None and self.upstream is not None
        scope, upstream_credential = self._authenticate(request)
        body = await _json_object(request)
        thread = await self._thread(body, scope)
        _require(body, (("model", str), ("max_tokens", int), ("messages", list)))
        _check_types(body)
        visible: list[Any] = body["messages"]
        client_tools = body.get("tools") or []
        names = self._client_tool_names(client_tools)
        found, history = await self._restore(scope, visible)
        provider = self.upstream.provider(upstream_credential)
        params = {k: v for k, v in body.items() if k not in _AGENT_FIELDS}
        extra_body = {k: params.pop(k) for k in list(params) if k in _OPTION_NAMES}
        if extra_body:
            params["extra_body"] = extra_body
        headers = _api_headers(request)
        if headers:
            params["extra_headers"] = headers
        if request.query_params:
            params["extra_query"] = dict(request.query_params)
        try:
            agent = Agent(
                body["model"],
                provider=provider,
                system=body.get("system"),
                tools=self.registry,
                max_rounds=self.config.max_rounds,
                max_tokens=body["max_tokens"],
                tool_concurrency=self.config.tool_concurrency,
                tool_timeout=self.config.tool_timeout,
                tool_choice=body.get("tool_choice"),
                thinking=body.get("thinking"),
                metadata=body.get("metadata"),
                stop_sequences=body.get("stop_sequences"),
                params=params,
                name="agentloop-gateway",
                tracer_provider=self.config.tracer_provider,
            )
        except ConfigurationError as exc:
            raise _Refusal(400, "invalid_request_error", str(exc)) from None
        return _Call(
            scope=scope,
            agent=agent,
            provider=provider,
            history=history,
            visible=visible,
            session=found.session,
            notes={SESSION_HEADER: "ambiguous"} if found.ambiguous else {},
            client_tools=list(client_tools),
            client_names=names,
            stream=body.get("stream") is True,
            request_id=request_id,
            model=body["model"],
            thread=thread,
            reply_id=_new_id("msg_") if thread is not None else None,
            trace=propagate.extract(request.headers) if "traceparent" in request.headers else None,
        )

    def _authenticate(self, request: Request) -> tuple[str, str]:
        """The client's credential (its session scope) and the credential sent upstream."""
        presented = _credential(request)
        config = self.config
        if config.upstream_key:
            if presented is None or presented not in config.gateway_keys:
                raise _Refusal(401, "authentication_error", "invalid x-api-key")
            return presented, config.upstream_key
        if presented is None:
            raise _Refusal(401, "authentication_error", "x-api-key header is required")
        return presented, presented

    def _client_tool_names(self, tools: Any) -> frozenset[str]:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _Refusal(400, "invalid_request_error", "tools: must be a list of tool objects")
        names = [t.get("name") for t in tools]
        if not all(isinstance(n, str) and n for n in names):
            raise _Refusal(400, "invalid_request_error", "tools: every tool needs a name")
        clash = sorted(set(names) & self.internal)
        if clash:
            raise _Refusal(
                400,
                "invalid_request_error",
                f"tools: {', '.join(clash)} is the name of a tool this gateway runs itself; "
                "rename the client tool",
            )
        return frozenset(n for n in names if isinstance(n, str))

    async def _restore(self, scope: str, visible: list[Any]) -> tuple[Found, list[Any]]:
        """The session a visible conversation continues, and the upstream history.

        The history is the stored one plus the client's new messages (those after its
        last assistant message), or the visible conversation when no session matches
        or the match is ambiguous (two conversations showed the same text).
        """
        assert self.sessions is not None
        if self.internal:  # a failed attempt of this very request may have run tools
            with _store_failure("finding the conversation's session"):
                kept = await self.sessions.restore(scope, visible, retry=True)
            if kept.session is not None:
                _log.info("gateway.retry_resumed", rounds_kept=len(kept.session.messages))
                return kept, list(kept.session.messages)
        end = _last_assistant(visible) + 1
        if end == 0:
            return Found(None), list(visible)
        prefix = visible[:end]
        with _store_failure("finding the conversation's session"):
            found = await self.sessions.restore(scope, prefix)
        if found.session is None:
            if found.ambiguous:
                _log.warning(
                    "gateway.session_ambiguous",
                    detail="two conversations showed this text with different hidden turns; "
                    "forwarded without hidden turns",
                )
            return found, list(visible)
        history = continue_history(found.session, visible[end:], marker=last_marker(prefix))
        return found, history

    async def _thread(self, body: dict[str, Any], scope: str) -> _ThreadCall | None:
        """Expand a message-thread request into a whole conversation (in place)."""
        assert self.sessions is not None
        thread = body.pop("thread", None)
        if thread is None:
            return None
        kind = thread.get("type") if isinstance(thread, dict) else None
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise _Refusal(400, "invalid_request_error", "messages: Field required")
        if kind == "create":
            fields: dict[str, Any] = {k: body[k] for k in ("system", "tools") if k in body}
            return _ThreadCall(None, fields, list(messages))
        if kind != "continue":
            raise _Refusal(400, "invalid_request_error", "thread.type: must be create or continue")
        previous = thread.get("previous_message_id")
        if not isinstance(previous, str) or not previous:
            raise _Refusal(400, "invalid_request_error", "thread.previous_message_id: required")
        repeated = [k for k in ("system", "tools") if k in body]
        if repeated:
            raise _Refusal(
                400,
                "invalid_request_error",
                f"{' and '.join(repeated)}: a thread keeps the values it was created with; "
                "a continue request cannot send them",
                {"error_code": "thread_fingerprint_mismatch"},
            )
        with _store_failure("finding the thread"):
            parent = await self.sessions.load_thread(self.sessions.thread_key(scope, previous))
        if parent is None:
            raise _Refusal(
                404,
                "not_found_error",
                f"no thread holds a response with id {previous!r}",
                {"error_code": "thread_not_found"},
            )
        body.update(parent.fields)
        earlier = moved_markers(parent.messages, last_marker(parent.messages))
        body["messages"] = [*earlier, *messages]
        return _ThreadCall(parent, parent.fields, list(messages))

    async def _finish(self, call: _Call, result: RunResult) -> dict[str, Any]:
        """The client's message for a finished run; stores what the client cannot see."""
        assert self.sessions is not None
        responses = call.provider.responses
        message = visible_message(responses, result, reply_id=call.reply_id)
        reply = {"role": "assistant", "content": message["content"]}
        hidden = call.session is not None or result.rounds > 1 or bool(result.tool_calls)
        try:
            await self._save(call, result, reply, hidden=hidden)
        except Exception as exc:  # the answer is made: it reaches the client all the same
            _log.warning(
                "gateway.session_not_saved",
                request_id=call.request_id,
                error=repr(exc),
                detail="the answer was sent, but continuing it will not restore its hidden turns",
            )
            notes = [call.notes[SESSION_HEADER]] if SESSION_HEADER in call.notes else []
            call.notes[SESSION_HEADER] = ", ".join([*notes, "unsaved"])
        _log.info(
            "gateway.reply",
            request_id=call.request_id,
            rounds=result.rounds,
            stop_reason=message["stop_reason"],
            hidden=hidden,
        )
        return message

    async def _keep_partial(self, call: _Call, exc: Exception) -> None:
        """After a failed run whose gateway tools ran, keep what they did for a retry."""
        assert self.sessions is not None
        partial: RunResult | None = getattr(exc, "result", None)
        if partial is None or not partial.tool_calls:
            return
        try:
            await self.sessions.check_secret()
            key = self.sessions.retry_key(call.scope, call.visible)
            await self.sessions.save(key, partial.messages, parent=call.session)
        except Exception as failure:
            _log.warning("gateway.partial_not_saved", error=repr(failure))
        else:
            _log.info(
                "gateway.partial_kept", request_id=call.request_id, calls=len(partial.tool_calls)
            )

    async def _save(
        self, call: _Call, result: RunResult, reply: dict[str, Any], *, hidden: bool
    ) -> None:
        """Store the run's hidden turns (when it had any) and the thread's reply."""
        assert self.sessions is not None
        if hidden or call.thread is not None:
            await self.sessions.check_secret()
        if hidden:
            key = self.sessions.key(call.scope, [*call.visible, reply])
            await self.sessions.save(key, result.messages, parent=call.session, held=result.held)
        if call.thread is not None and call.reply_id is not None:
            await self.sessions.save_thread(
                self.sessions.thread_key(call.scope, call.reply_id),
                [*call.thread.added, reply],
                parent=call.thread.parent,
                fields=call.thread.fields,
            )


@contextmanager
def _store_failure(doing: str) -> Iterator[None]:
    """Answer a store failure as the API answers its own failures: a 500 `api_error`."""
    try:
        yield
    except Exception as exc:
        _log.error("gateway.store_failed", doing=doing, error=repr(exc))
        raise _Refusal(500, "api_error", f"the session store failed while {doing}") from exc


# The fields the gateway reads itself, and the JSON types they must have (absent or null
# is fine); every other field goes upstream unread.
_TYPES: dict[str, tuple[type, ...]] = {
    "system": (str, list),
    "tools": (list,),
    "tool_choice": (dict,),
    "thinking": (dict,),
    "metadata": (dict,),
    "stop_sequences": (list,),
    "stream": (bool,),
}
_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", bool: "a boolean"}


def _check_types(body: Mapping[str, Any]) -> None:
    """Refuse a field the gateway reads whose value has the wrong JSON type."""
    for name, kinds in _TYPES.items():
        value = body.get(name)
        if value is not None and not isinstance(value, kinds):
            wanted = " or ".join(_TYPE_NAMES[k] for k in kinds)
            raise _Refusal(400, "invalid_request_error", f"{name}: Input should be {wanted}")


def _require(body: Mapping[str, Any], fields: Sequence[tuple[str, type]]) -> None:
    """Refuse a body missing one of `fields` or holding a value of another type."""
    for name, kind in fields:
        if name not in body:
            raise _Refusal(400, "invalid_request_error", f"{name}: Field required")
        if not isinstance(body[name], kind) or isinstance(body[name], bool):
            raise _Refusal(400, "invalid_request_error", f"{name}: invalid value")


MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body served, as the API's limit (32 MB): larger ones get 413."""
MAX_DEPTH = 256
"""The deepest nesting of arrays and objects a request body may hold."""


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's body, which must be one JSON object of at most `MAX_BODY_BYTES`.

    The body is read in chunks and refused as soon as it is too large, so a huge body
    never sits in memory whole.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except RecursionError:
        body = None  # nested too deep for the parser: refused below
    except ValueError as exc:
        raise _Refusal(400, "invalid_request_error", f"the body is not valid JSON: {exc}") from None
    if body is None or not _shallow(body, MAX_DEPTH):
        raise _Refusal(
            400, "invalid_request_error", f"the body nests arrays and objects over {MAX_DEPTH} deep"
        )
    if not isinstance(body, dict):
        raise _Refusal(400, "invalid_request_error", "the body must be a JSON object")
    return body


def _too_large() -> _Refusal:
    message = f"the request exceeds the maximum size of {MAX_BODY_BYTES // 2**20} MB"
    return _Refusal(413, "request_too_large", message)


def _shallow(value: Any, limit: int) -> bool:
    """Whether `value` nests lists and dicts at most `limit` deep (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children if isinstance(item, (dict, list)) else ():
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return False
                stack.append((child, depth + 1))
    return True


def _last_assistant(messages: Sequence[Any]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return i
    return -1


class _Unused:
    """A provider that is never called (for checking options at startup)."""

    async def complete(self, request: Any) -> Any:
        raise RuntimeError("not a real provider")


_Item = tuple[str, Any]


class _StreamResponse(Response):
    """One SSE message for the whole run, its status decided by the first upstream answer.

    The HTTP status is sent once the upstream's stream opened: an upstream error before
    that is answered as the API would (its status and error body); after it, as the
    API's `error` event.
    """

    def __init__(self, gateway: Gateway, call: _Call) -> None:
        self.gateway = gateway
        self.call = call
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send_items, items = anyio.create_memory_object_stream[_Item](math.inf)
        view = VisibleStream(
            self.call.client_names, reply_id=self.call.reply_id, model=self.call.model
        )

        async def on_event(round_: int, event: Any) -> None:
            data = view.feed(round_, event)
            if data:
                send_items.send_nowait(("data", data))

        self.call.provider.on_event = on_event
        async with anyio.create_task_group() as group:
            group.start_soon(self._run, send_items, view)
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            try:
                await self._write(items, scope, send)
            finally:
                group.cancel_scope.cancel()

    async def _run(self, send_items: Any, view: VisibleStream) -> None:
        call = self.call
        with send_items:
            try:
                with continued_trace(call):
                    async with call.agent.run_stream(
                        None,
                        history=call.history,
                        deps=self.gateway.config.deps,
                        external_tools=call.client_tools,
                    ) as stream:
                        async for _ in stream:
                            pass
                result = stream.result
                assert result is not None
                await self.gateway._finish(call, result)
                send_items.send_nowait(("end", view.finish(call.provider.responses, result)))
            except Exception as exc:
                await self.gateway._keep_partial(call, exc)
                send_items.send_nowait(("error", exc))

    async def _write(self, items: Any, scope: Scope, send: Send) -> None:
        started = False
        interval = self.gateway.config.ping_interval
        request_id = self.call.request_id

        async def start() -> None:
            nonlocal started
            started = True
            answered = self.call.provider.answer_headers
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"request-id", request_id.encode()),
                *((k.encode(), v.encode("latin-1", "replace")) for k, v in answered.items()),
                *((k.encode(), v.encode()) for k, v in self.call.notes.items()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        async with items:
            while True:
                item: _Item | None = None
                with anyio.move_on_after(interval if started else math.inf):
                    try:
                        item = await items.receive()
                    except anyio.EndOfStream:
                        item = ("closed", None)
                if item is None:
                    await body(PING)
                    continue
                kind, value = item
                if kind == "data":
                    if not started:
                        await start()
                    await body(value)
                elif kind == "end":
                    if not started:
                        await start()
                    await body(value, more=False)
                    return
                elif kind == "error":
                    failure = _failure(value, request_id, self.call.provider)
                    _log.info(
                        "gateway.failed", status=failure.status, error=str(value), streamed=started
                    )
                    if not started:
                        response = _json(failure.status, failure.body, request_id, failure.headers)
                        await response(scope, _no_receive, send)
                        return
                    error = {"type": "error", "error": failure.body["error"]}
                    await body(sse("error", error), more=False)
                    return
                else:  # the run task ended without a word (cancelled)
                    if started:
                        await body(b"", more=False)
                    return


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (its body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _no_receive() -> Any:
    return {"type": "http.disconnect"}
