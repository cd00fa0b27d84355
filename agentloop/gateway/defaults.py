"""The gateway's defaults, in a module importing nothing.

`agentloop serve --help` shows them (`agentloop.gateway.options`); keeping them here lets
it do so without importing the stores, the SDK or DBOS they configure.
"""

from __future__ import annotations

__all__ = (
    "BODY_TIMEOUT",
    "CONNECTIONS_PER_ADDRESS",
    "DBOS_FILE",
    "DEFAULT_STORE",
    "DURABLE_LEASE",
    "EXECUTOR_ID_ENV",
    "HEAD_TIMEOUT",
)

DEFAULT_STORE = "sqlite:///agentloop-gateway.db"
"""The store used when none is given: a SQLite file in the working directory."""

DBOS_FILE = "agentloop-gateway-dbos.sqlite"
"""The name of the DBOS system database file when `--durable dbos` names no URL."""

DURABLE_LEASE = 15.0
"""Seconds a durable gateway's lease lasts unrenewed (`GatewayConfig.durable_lease`)."""

EXECUTOR_ID_ENV = "AGENTLOOP_GATEWAY_EXECUTOR_ID"
"""The environment variable of `GatewayConfig.durable_executor_id`, when not given."""

HEAD_TIMEOUT = 10.0
"""Seconds a request's head may take to arrive (`ConnectionLimits.head_timeout`)."""

BODY_TIMEOUT = 60.0
"""Seconds a request's body may take after its head (`ConnectionLimits.body_timeout`)."""

CONNECTIONS_PER_ADDRESS = 64
"""Connections one client address may hold open (`ConnectionLimits.per_address`)."""
