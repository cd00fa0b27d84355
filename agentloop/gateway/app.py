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
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
from opentelemetry import propagate
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentloop._wire import random_id
from agentloop.agent import Agent
from agentloop.capabilities.base import check_capabilities
from agentloop.checks import check_count, check_seconds
from agentloop.errors import ConfigurationError, ProviderError, SessionError
from agentloop.events import ModelResponded
from agentloop.logs import get_logger
from agentloop.providers.base import ModelResponse
from agentloop.registry import ToolRegistry
from agentloop.result import RunResult

from .calls import Call, continued_trace, expand_thread
from .config import GATEWAY_KEYS_ENV, RUN_HEADER, SECRET_ENV, SESSION_HEADER, GatewayConfig
from .durable import DurableRequests, given_up_when, open_durable
from .errors import Refusal, error_body, json_answer, store_failure
from .failures import client_failure
from .parsing import (
    AGENT_FIELDS,
    OPTION_NAMES,
    CountFields,
    MessagesFields,
    api_headers,
    check_fields,
    client_tool_names,
    credential,
    json_object,
    last_assistant,
)
from .runs import canonical_request, reply_id, request_run_id
from .sessions import Found, Sessions, continue_history, last_marker
from .stores import Store, open_store
from .streaming import StreamResponse, cancel_on_disconnect
from .upstream import Upstream, client_headers
from .visible import message_sse, visible_message

__all__ = (
    "GATEWAY_KEYS_ENV",
    "RUN_HEADER",
    "SECRET_ENV",
    "SESSION_HEADER",
    "Gateway",
    "GatewayConfig",
)


_log = get_logger()


class Gateway:
    """The gateway's state (tools, store, upstream clients) and its ASGI app."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        store: Store | None = None,
        durable: DurableRequests | None = None,
    ) -> None:
        """A gateway for `config`; `store` and `durable` replace what `config` names.

        Raises:
            ConfigurationError: the store URL or a limit cannot work, a tool requires
                approval (the gateway has nobody to ask), `config.capabilities` is not a
                list of capabilities, or `config.durable` names an engine that is not
                installed.
        """
        where = urlsplit(config.upstream)
        if where.scheme not in ("http", "https") or not where.hostname:
            raise ConfigurationError(
                f"the upstream must be an http:// or https:// URL, not {config.upstream!r}"
            )
        self.config = config
        self.capabilities = check_capabilities(config.capabilities, "capabilities")
        self.registry = ToolRegistry(config.tools)
        asking = [t.name for t in self.registry if t.requires_approval is not False]
        if asking:
            raise ConfigurationError(
                f"tool(s) {', '.join(asking)} require approval, and the gateway has nobody "
                "to ask: run them in a service that resumes paused runs (docs/approval.md)"
            )
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
        check_count("max_rounds", config.max_rounds)
        check_count("tool_concurrency", config.tool_concurrency)
        check_seconds("tool_timeout", config.tool_timeout)
        check_seconds("store_timeout", config.store_timeout)
        check_count("stream_buffer", config.stream_buffer)
        check_seconds("slow_client_timeout", config.slow_client_timeout)
        self.durable = durable
        if durable is None and config.durable is not None:
            self.durable = open_durable(
                config.durable,
                store=config.store,
                registry=self.registry,
                capabilities=self.capabilities,
                max_rounds=config.max_rounds,
                tool_concurrency=config.tool_concurrency,
                tool_timeout=config.tool_timeout,
                deps=config.deps,
                attach_wait=config.session_ttl,
                executor_id=config.durable_executor_id,
                lease_seconds=config.durable_lease,
            )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the store, read (or make) the secret, make the upstream clients.

        Raises:
            SessionError: the session store (or the durable runs' database) cannot be
                opened: its server is down, its file cannot be made, ...
        """
        try:
            await self.store.open()
        except Exception as exc:
            raise SessionError(
                f"the session store {self.config.store} cannot be opened: {exc}"
            ) from exc
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
        if self.durable is not None:
            try:
                await self.durable.open()
            except Exception as exc:
                raise SessionError(
                    f"the durable runs' database cannot be opened ({self.config.durable}): {exc}"
                ) from exc
        _log.info("gateway.start", upstream=self.config.upstream, tools=sorted(self.internal))

    async def aclose(self) -> None:
        """Stop the durable engine, close the upstream clients and the store.

        Each is closed even when one before it fails to; that failure is raised after.
        """
        async with AsyncExitStack() as closing:
            closing.push_async_callback(self.store.aclose)
            if self.upstream is not None:
                closing.push_async_callback(self.upstream.aclose)
                self.upstream = None
            if self.durable is not None:
                await self.durable.aclose()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The gateway started (`start`), with its store purged now and then, then closed.

        The app's lifespan; `agentloop serve` enters it before uvicorn serves, so a
        store that cannot be opened is one line of error, not a server's traceback.
        """
        try:
            await self.start()
        except BaseException:
            await self.aclose()  # what did open
            raise
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._purge_forever)
                yield
                group.cancel_scope.cancel()
        finally:
            await self.aclose()

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with self.running():
            yield

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
            request_id = random_id("req_")
            return json_answer(status, error_body(kind, message, request_id), request_id)

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
        return json_answer(200 if ready else 503, body, random_id("req_"))

    # ------------------------------------------------------------------ /v1/messages

    async def messages(self, request: Request) -> Response:
        """`POST /v1/messages`: one client request, answered as the API would."""
        request_id = random_id("req_")
        try:
            call = await self._prepare(request, request_id)
        except Refusal as refusal:
            body = error_body(refusal.kind, str(refusal), request_id, refusal.details)
            return json_answer(refusal.status, body, request_id)
        if call.run_id is not None:
            return await self._durable_answer(call)
        if call.stream:
            return self._streamed(call)
        result: RunResult | None = None
        responses: list[ModelResponse] = []
        error: Exception | None = None
        async with anyio.create_task_group() as group:
            # A client that goes away cancels its run, as for a stream.
            group.start_soon(cancel_on_disconnect, request.receive, group.cancel_scope)
            try:
                with continued_trace(call):
                    async with call.agent.run_stream(
                        None,
                        history=call.history,
                        deps=self.config.deps,
                        external_tools=call.client_tools,
                    ) as stream:
                        async for event in stream:
                            if isinstance(event, ModelResponded):
                                responses.append(event.response)
                    result = stream.result
            except Exception as exc:
                error = exc
            group.cancel_scope.cancel()
        if error is not None:
            await self._keep_partial(call, error)
            failure = client_failure(call, error)
            _log.info("gateway.failed", status=failure.status, error=str(error))
            return json_answer(failure.status, failure.body, request_id, failure.headers)
        if result is None:  # the client went away: nobody to answer
            _log.info("gateway.client_gone", request_id=request_id)
            return Response(status_code=499)
        message = await self._finish(call, result, responses)
        # The rate limits of the last upstream answer, as the upstream sent them.
        answered = client_headers(responses[-1].headers) if responses else {}
        return json_answer(200, message, request_id, {**answered, **call.notes})

    def _streamed(self, call: Call, **options: Any) -> StreamResponse:
        """The SSE answer to `call` (`options`: a durable run's, see `StreamResponse`)."""
        return StreamResponse(
            call,
            finish=self._finish,
            keep_partial=self._keep_partial,
            deps=self.config.deps,
            ping_interval=self.config.ping_interval,
            buffer=self.config.stream_buffer,
            patience=self.config.slow_client_timeout,
            **options,
        )

    async def _durable_answer(self, call: Call) -> Response:
        """Run `call` as the durable run `call.run_id` (or attach to it), then answer.

        A streaming client whose request starts the run gets its events as they come,
        as from a run that is not durable. One whose request attaches to an existing run
        (a retry) gets the whole answer as SSE once the run has ended: the run's stream
        may begin with a step's attempt that a crash cut short, which the client could
        not take back. A client that goes away does not cancel the run: its retry gets
        the answer. Nor does a database that stops answering (`store_timeout`): the
        client gets a 500 `api_error`, and its retry finds the run where it stopped.
        """
        assert self.durable is not None and call.run_id is not None
        request_id = call.request_id
        watch = partial(self.durable.watch, call.run_id, self.config.store_timeout)
        try:
            async with given_up_when(watch):
                attempt = await self.durable.starts(call.run_id) if call.stream else None
                if attempt is not None:
                    return self._streamed(
                        call,
                        durable=partial(self.durable.stream, call, attempt),
                        watch=partial(self.durable.watch, attempt, self.config.store_timeout),
                        headers={RUN_HEADER: attempt},
                    )
                finished = await self.durable.run(call, call.run_id)
        except Exception as error:
            await self._keep_partial(call, error)
            failure = client_failure(call, error)
            _log.info("gateway.failed", status=failure.status, error=str(error), durable=True)
            return json_answer(failure.status, failure.body, request_id, failure.headers)
        responses = finished.responses
        message = await self._finish(call, finished.result, responses)
        answered = client_headers(responses[-1].headers) if responses else {}
        headers = {**answered, **call.notes, RUN_HEADER: finished.run_id}
        if not call.stream:
            return json_answer(200, message, request_id, headers)
        headers = {"request-id": request_id, "cache-control": "no-cache", **headers}
        return Response(
            message_sse(message),
            200,
            headers=headers,
            media_type="text/event-stream; charset=utf-8",
        )

    async def count_tokens(self, request: Request) -> Response:
        """`POST /v1/messages/count_tokens`: the count for what the upstream would receive.

        The request's conversation is counted as the gateway would send it: with its
        hidden turns restored and the gateway's tools announced beside the client's.
        """
        request_id = random_id("req_")
        try:
            scope, upstream_credential = self._authenticate(request)
            body = await json_object(request)
            check_fields(body, CountFields)
            client_tools = body.get("tools") or []
            client_tool_names(client_tools, self.internal)
            _, body["messages"] = await self._restore(scope, body["messages"])
        except Refusal as refusal:
            body = error_body(refusal.kind, str(refusal), request_id, refusal.details)
            return json_answer(refusal.status, body, request_id)
        if self.internal:
            body["tools"] = [*(d.to_wire() for d in self.registry.definitions()), *client_tools]
        path = "/v1/messages/count_tokens"
        return await self._forward(request, request_id, upstream_credential, path, body)

    async def models(self, request: Request) -> Response:
        """`GET /v1/models` and `GET /v1/models/{id}`: the upstream's answer, as it is."""
        request_id = random_id("req_")
        model_id = request.path_params.get("model_id")
        try:
            _, upstream_credential = self._authenticate(request)
            if model_id in (".", ".."):  # never a model, and would leave /v1/models upstream
                raise Refusal(404, "not_found_error", f"model: {model_id}")
        except Refusal as refusal:
            body = error_body(refusal.kind, str(refusal), request_id)
            return json_answer(refusal.status, body, request_id)
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
            headers = api_headers(request)
        except Refusal as refusal:
            error = error_body(refusal.kind, str(refusal), request_id)
            return json_answer(refusal.status, error, request_id)
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
            return json_answer(502, error_body("api_error", message, request_id), request_id)
        headers = {"request-id": request_id, **answer.headers}
        return Response(answer.content, answer.status, headers=headers)

    async def _prepare(self, request: Request, request_id: str) -> Call:
        assert self.sessions is not None and self.upstream is not None
        scope, upstream_credential = self._authenticate(request)
        body = await json_object(request)
        headers = api_headers(request)
        run_id: str | None = None
        if self.durable is not None and self.internal:
            # Of the request as the client sent it (a thread request not yet expanded).
            canonical = canonical_request(body, headers, request.query_params)
            run_id = request_run_id(self.sessions, scope, canonical)
        assert self.sessions is not None
        thread = await expand_thread(self.sessions, body, scope, within=self.config.store_timeout)
        check_fields(body, MessagesFields)
        visible: list[Any] = body["messages"]
        client_tools = body.get("tools") or []
        names = client_tool_names(client_tools, self.internal)
        found, history = await self._restore(scope, visible)
        stream = body.get("stream") is True
        provider = self.upstream.provider(upstream_credential, stream=stream)
        params = {k: v for k, v in body.items() if k not in AGENT_FIELDS}
        extra_body = {k: params.pop(k) for k in list(params) if k in OPTION_NAMES}
        if extra_body:
            params["extra_body"] = extra_body
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
                capabilities=self.capabilities,
                # The client's own markers decide what is cached (sessions.py moves them).
                cache="off",
            )
        except ConfigurationError as exc:
            raise Refusal(400, "invalid_request_error", str(exc)) from None
        return Call(
            scope=scope,
            agent=agent,
            history=history,
            visible=visible,
            session=found.session,
            notes={SESSION_HEADER: "ambiguous"} if found.ambiguous else {},
            client_tools=list(client_tools),
            client_names=names,
            stream=stream,
            request_id=request_id,
            model=body["model"],
            thread=thread,
            reply_id=reply_id(run_id) if thread is not None else None,
            trace=propagate.extract(request.headers) if "traceparent" in request.headers else None,
            run_id=run_id,
        )

    def _authenticate(self, request: Request) -> tuple[str, str]:
        """The client's credential (its session scope) and the credential sent upstream."""
        presented = credential(request)
        config = self.config
        if config.upstream_key:
            if presented is None or presented not in config.gateway_keys:
                raise Refusal(401, "authentication_error", "invalid x-api-key")
            return presented, config.upstream_key
        if presented is None:
            raise Refusal(401, "authentication_error", "x-api-key header is required")
        return presented, presented

    async def _restore(self, scope: str, visible: list[Any]) -> tuple[Found, list[Any]]:
        """The session a visible conversation continues, and the upstream history.

        The history is the stored one plus the client's new messages (those after its
        last assistant message), or the visible conversation when no session matches
        or the match is ambiguous (two conversations showed the same text).
        """
        assert self.sessions is not None
        if self.internal:  # a failed attempt of this very request may have run tools
            with store_failure(
                "finding the conversation's session", within=self.config.store_timeout
            ):
                kept = await self.sessions.restore(scope, visible, retry=True)
            if kept.session is not None:
                _log.info("gateway.retry_resumed", rounds_kept=len(kept.session.messages))
                return kept, list(kept.session.messages)
        end = last_assistant(visible) + 1
        if end == 0:
            return Found(None), list(visible)
        prefix = visible[:end]
        with store_failure("finding the conversation's session", within=self.config.store_timeout):
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

    async def _finish(
        self, call: Call, result: RunResult, responses: list[ModelResponse]
    ) -> dict[str, Any]:
        """The client's message for a finished run (whose model `responses` are given).

        Stores what the client cannot see.
        """
        assert self.sessions is not None
        message = visible_message(responses, result, reply_id=call.reply_id)
        reply = {"role": "assistant", "content": message["content"]}
        hidden = call.session is not None or result.rounds > 1 or bool(result.tool_calls)
        try:
            with anyio.fail_after(self.config.store_timeout):
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

    async def _keep_partial(self, call: Call, exc: Exception) -> None:
        """After a failed run whose gateway tools ran, keep what they did for a retry."""
        assert self.sessions is not None
        partial: RunResult | None = getattr(exc, "result", None)
        if partial is None or not partial.tool_calls:
            return
        try:
            with anyio.fail_after(self.config.store_timeout):
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
        self, call: Call, result: RunResult, reply: dict[str, Any], *, hidden: bool
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
