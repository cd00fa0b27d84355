"""The `agentloop serve` command's options: its parser, built without importing the gateway.

`agentloop --help` builds every command's parser; this module imports only argparse and
the option types, so that costs nothing. `agentloop.gateway.cli` runs the command.
"""

from __future__ import annotations

import argparse
from typing import Any

from agentloop.cli.values import finite_seconds, port, seconds, whole_number

from .defaults import (
    BODY_TIMEOUT,
    CONNECTIONS_PER_ADDRESS,
    DBOS_FILE,
    DEFAULT_STORE,
    DURABLE_LEASE,
    EXECUTOR_ID_ENV,
    HEAD_TIMEOUT,
)

__all__ = ("add_serve_command",)


def add_serve_command(subparsers: Any, **parser_options: Any) -> argparse.ArgumentParser:
    """Add `serve` to an argparse subparsers object (`parser.add_subparsers()`).

    `parser_options` go to `add_parser` (e.g. `parents=[...]` for shared options).
    Returns the command's parser, for plugins' options.
    """
    serve: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve an Anthropic-compatible /v1/messages that runs the plugins' tools",
        description=(
            "Serve POST /v1/messages in front of an Anthropic-compatible upstream. The "
            "selected plugin tools run inside the gateway; the request's own tools go back "
            "to the client. Without ANTHROPIC_API_KEY, each client's key is forwarded "
            "upstream; with it, clients must present a key from AGENTLOOP_GATEWAY_KEYS."
        ),
        **parser_options,
    )
    serve.add_argument("--upstream", required=True, metavar="URL", help="upstream base URL")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port, default=8787, help="port to listen on")
    serve.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="NAME",
        help="run this plugin's tools inside the gateway (repeatable)",
    )
    serve.add_argument(
        "--tool",
        action="append",
        dest="tools",
        metavar="NAME",
        help="run only these tools (repeatable; within --plugin when both are given)",
    )
    serve.add_argument(
        "--capability",
        action="append",
        dest="capabilities",
        metavar="NAME",
        help="wrap every run in this plugin capability (repeatable; the first is the outermost)",
    )
    serve.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="URL",
        help=f"session store: sqlite:///PATH, redis://HOST:PORT/DB or memory:// "
        f"(default: {DEFAULT_STORE})",
    )
    serve.add_argument(
        "--secret-file",
        metavar="PATH",
        help="file holding the secret session keys are derived with (default: "
        "AGENTLOOP_GATEWAY_SECRET, else one kept in the store)",
    )
    serve.add_argument(
        "--session-ttl",
        type=finite_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="seconds a stored session is kept (default: 3600)",
    )
    serve.add_argument(
        "--store-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds to wait for the session store or the durable runs' database before "
        "answering 500 api_error (default: 10)",
    )
    serve.add_argument(
        "--head-timeout",
        type=seconds,
        default=HEAD_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds a request's head may take to arrive (default: {HEAD_TIMEOUT:g})",
    )
    serve.add_argument(
        "--body-timeout",
        type=seconds,
        default=BODY_TIMEOUT,
        metavar="SECONDS",
        help="seconds a request's body may take to arrive after its head "
        f"(default: {BODY_TIMEOUT:g})",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=_connections,
        default=CONNECTIONS_PER_ADDRESS,
        metavar="N",
        help="connections one client address may hold open at once (0: no limit; "
        f"default: {CONNECTIONS_PER_ADDRESS})",
    )
    serve.add_argument(
        "--stream-buffer",
        type=whole_number,
        default=256,
        metavar="N",
        help="SSE events a streamed answer holds for a slow client (default: 256)",
    )
    serve.add_argument(
        "--slow-client-timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds a streamed answer's buffer may stay full before its client is "
        "dropped and its run cancelled (default: 30)",
    )
    serve.add_argument(
        "--max-rounds", type=whole_number, default=10, help="upstream requests per request"
    )
    serve.add_argument(
        "--tool-concurrency", type=whole_number, default=8, help="tool calls at once"
    )
    serve.add_argument("--tool-timeout", type=seconds, default=30.0, help="seconds per tool call")
    serve.add_argument(
        "--upstream-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="seconds an upstream request may take, and the longest silence within an "
        "upstream stream ('inf' for no limit; default: 600)",
    )
    serve.add_argument(
        "--max-retry-wait",
        type=seconds,
        metavar="SECONDS",
        help="longest retry-after a hidden round waits for; a longer one goes to the "
        "client (default: 10)",
    )
    serve.add_argument(
        "--upstream-transport",
        choices=("auto", "aiohttp", "httpx"),
        default="auto",
        help="HTTP client for upstream requests (default: auto, aiohttp when installed)",
    )
    serve.add_argument(
        "--durable",
        metavar="dbos[:URL]",
        help="run each request that runs the gateway's tools as a durable run on DBOS, so "
        "a client's retry after a crash attaches to it (URL: the DBOS system database; "
        f"default: {DBOS_FILE} next to a sqlite store)",
    )
    serve.add_argument(
        "--durable-executor-id",
        metavar="ID",
        help="this gateway's executor id in the DBOS database (default: "
        f"${EXECUTOR_ID_ENV}, else 'local'); each of several gateways sharing one "
        "database needs its own, kept across restarts: a gateway recovers the runs left "
        "under way by a process of its id",
    )
    serve.add_argument(
        "--durable-lease",
        type=finite_seconds,
        metavar="SECONDS",
        help="seconds this gateway's lease in the DBOS database lasts unrenewed (renewed "
        "every third of that); a gateway silent that long is taken for dead and a live "
        f"one takes over its runs under way (default: {DURABLE_LEASE:g})",
    )
    serve.set_defaults(handler=_serve)
    return serve


def _serve(args: argparse.Namespace) -> int:
    """Run `agentloop serve`, importing the gateway only now."""
    from .cli import serve_command

    return serve_command(args)


def _connections(value: str) -> int:
    """A number of connections: a whole number >= 0 (0: no limit)."""
    if value.strip() == "0":
        return 0
    try:
        return whole_number(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number >= 0 (0: no limit), got {value!r}"
        ) from None
