"""How a gateway runs: its configuration, read from options and the environment.

`agentloop serve` builds a `GatewayConfig` from its options; `Gateway` (in `app`) runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.capabilities.base import Capability
from agentloop.errors import ConfigurationError
from agentloop.tools import Tool

from .defaults import DEFAULT_STORE, DURABLE_LEASE, EXECUTOR_ID_ENV
from .upstream import RETRY_WAIT_LIMIT, Transport

__all__ = (
    "EXECUTOR_ID_ENV",
    "GATEWAY_KEYS_ENV",
    "RUN_HEADER",
    "SECRET_ENV",
    "SESSION_HEADER",
    "GatewayConfig",
)

GATEWAY_KEYS_ENV = "AGENTLOOP_GATEWAY_KEYS"
"""Comma-separated client keys the gateway admits when it has its own upstream key."""
SECRET_ENV = "AGENTLOOP_GATEWAY_SECRET"
"""The server secret session keys are derived with (else one is made and kept in the store)."""

SESSION_HEADER = "agentloop-session"
"""Response header saying what happened to the conversation's session, when it matters:
`ambiguous` (its hidden turns were not restored), `unsaved` (the store failed)."""

RUN_HEADER = "agentloop-run-id"
"""Response header of a durable request's answer: the id of the run that answered it
(`agentloop serve --durable`)."""


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """How a gateway runs (what `agentloop serve` builds from its options)."""

    upstream: str
    """Base URL of the Messages API to forward to (e.g. `https://api.anthropic.com`)."""
    store: str = DEFAULT_STORE
    """Session store URL: `sqlite:///PATH`, `redis://HOST:PORT/DB` or `memory://`."""
    session_ttl: float = 3600.0
    """Seconds a stored session is kept after it was last written."""
    store_timeout: float = 10.0
    """Seconds the gateway waits for its session store, or for an answer from the durable
    runs' database, before it answers a 500 `api_error` (a run under way when the
    database stops answering is answered within 1.5 times this)."""
    tools: Sequence[Tool] = ()
    """The gateway's own tools (run inside the loop, never shown to the client)."""
    capabilities: Sequence[Capability] = ()
    """Capabilities wrapping every run the gateway makes (`agentloop.Capability`), the
    first outermost: what a capability does to a request, a response or one of the
    gateway's tool calls is what the upstream and the client get."""
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
    stream_buffer: int = 256
    """SSE events a streamed answer holds for a client that reads slower than the
    upstream writes; while they wait, the upstream is read no faster."""
    slow_client_timeout: float = 30.0
    """Seconds a streamed answer's buffer may stay full before its client is dropped:
    its connection closed, its run (and upstream request) cancelled, its usage logged."""
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
    durable: str | None = None
    """`dbos` or `dbos:URL`: run each request that runs the gateway's tools as a durable
    run on DBOS (`agentloop.gateway.durable`), recorded in the DBOS system database at
    URL (by default a SQLite file next to a SQLite session store)."""
    durable_executor_id: str | None = None
    """This process's executor id in the DBOS database (DBOS's `executor_id`; `local`
    when None). At start a gateway recovers the runs that a process of its id left under
    way, so each of several gateways sharing one DBOS database needs an id of its own,
    kept across its restarts (see docs/gateway.md, Durable requests)."""
    durable_lease: float = DURABLE_LEASE
    """Seconds a durable gateway's lease in the DBOS database lasts unrenewed (renewed
    every third of that): a gateway silent that long is taken for dead, and a live one
    takes over its runs under way. Shorter takes over sooner; longer rides out longer
    pauses (a stalled host, a slow database) without a takeover."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> GatewayConfig:
        """A config from `options` and the environment.

        Reads `ANTHROPIC_API_KEY` (the gateway's own upstream key), `AGENTLOOP_GATEWAY_KEYS`,
        `AGENTLOOP_GATEWAY_SECRET` (unless `options` hold a `secret`) and
        `AGENTLOOP_GATEWAY_EXECUTOR_ID` (unless they hold a `durable_executor_id`).

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
        if options.get("durable_executor_id") is None:
            options["durable_executor_id"] = env.get(EXECUTOR_ID_ENV) or None
        return cls(upstream_key=upstream_key, gateway_keys=keys, **options)
