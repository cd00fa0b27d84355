"""The gateway's defaults, in a module importing nothing.

`agentloop serve --help` shows them (`agentloop.gateway.options`); keeping them here lets
it do so without importing the stores, the SDK or DBOS they configure.
"""

from __future__ import annotations

__all__ = ("DBOS_FILE", "DEFAULT_STORE", "EXECUTOR_ID_ENV")

DEFAULT_STORE = "sqlite:///agentloop-gateway.db"
"""The store used when none is given: a SQLite file in the working directory."""

DBOS_FILE = "agentloop-gateway-dbos.sqlite"
"""The name of the DBOS system database file when `--durable dbos` names no URL."""

EXECUTOR_ID_ENV = "AGENTLOOP_GATEWAY_EXECUTOR_ID"
"""The environment variable of `GatewayConfig.durable_executor_id`, when not given."""
