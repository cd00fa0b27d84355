"""The `agentloop serve` command: the gateway on uvicorn.

`add_serve_command` adds the subcommand to the `agentloop` parser; `serve_command` runs
it: it selects the gateway's tools and capabilities from the installed plugins (as
`agentloop run` does), builds a `Gateway` and serves it until SIGTERM or Ctrl-C, letting
the requests in flight finish first (for at most `SHUTDOWN_GRACE` seconds). Logging is
configured by the command that calls it (`agentloop`, `python -m agentloop.gateway`).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

from agentloop.capabilities.base import Capability
from agentloop.cli.values import finite_seconds, port, seconds, whole_number
from agentloop.errors import ConfigurationError
from agentloop.plugins import default_manager
from agentloop.tools import Tool

from .config import EXECUTOR_ID_ENV
from .durable import DBOS_FILE
from .guard import ConnectionLimits
from .stores import DEFAULT_STORE

__all__ = ("SHUTDOWN_GRACE", "add_serve_command", "serve_command")

SHUTDOWN_GRACE = 30.0
"""Seconds requests in flight may take to finish after SIGTERM before they are closed."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


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
        default=ConnectionLimits.head_timeout,
        metavar="SECONDS",
        help="seconds a request's head may take to arrive (default: 10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=seconds,
        default=ConnectionLimits.body_timeout,
        metavar="SECONDS",
        help="seconds a request's body may take to arrive after its head (default: 60)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=_connections,
        default=ConnectionLimits.per_address,
        metavar="N",
        help="connections one client address may hold open at once (0: no limit; default: 64)",
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
    serve.set_defaults(handler=serve_command)
    return serve


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


def _read_secret(path: str | None) -> bytes | None:
    """The secret in the file at `path` (surrounding whitespace dropped), or None."""
    if path is None:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(f"--secret-file: {exc.strerror}: {path}") from None
    if not secret:
        raise ConfigurationError(f"--secret-file: {path} is empty")
    return secret


def _server_class(uvicorn: Any) -> Any:
    class Server(uvicorn.Server):  # type: ignore[misc]
        """uvicorn's server around a started gateway, exiting 0 after a graceful stop.

        The gateway is started (its store opened) before uvicorn serves, in the server's
        event loop: a gateway that cannot start is kept in `startup_error` for the
        command to say in one line, instead of uvicorn's lifespan traceback.

        uvicorn raises the signal again once it has shut down, so the process dies of it
        (status -15); a gateway stopped by SIGTERM has finished its requests and exits 0.
        """

        def __init__(self, config: Any, gateway: Any, banner: str) -> None:
            super().__init__(config)
            self.gateway = gateway
            self.banner = banner
            """Printed once the gateway has started."""
            self.startup_error: Exception | None = None

        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            async with AsyncExitStack() as stack:
                try:
                    await stack.enter_async_context(self.gateway.running())
                except Exception as exc:
                    self.startup_error = exc
                    return
                print(self.banner, file=sys.stderr, flush=True)
                await super().serve(sockets)

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def serve_command(
    args: argparse.Namespace,
    *,
    tools: list[Tool] | None = None,
    deps: Any = None,
    capabilities: list[Capability] | None = None,
) -> int:
    """Run the gateway until it is stopped; returns the exit code.

    `tools` are the gateway's own tools (by default those `--plugin` / `--tool` select
    from the installed plugins); `deps` is what every run's tools receive (the
    `agentloop` command builds it from the plugins' options, as for `agentloop run`);
    `capabilities` wrap every run (by default those `--capability` names).
    """
    try:
        import uvicorn
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from .app import Gateway, GatewayConfig
        from .guard import Guard
    except ImportError as exc:
        print(
            f"agentloop: error: {exc.name or exc} is missing; "
            "install it with: pip install 'agentloop-runner[gateway]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.durable_executor_id is not None and not args.durable:
            raise ConfigurationError("--durable-executor-id needs --durable")
        if tools is None or capabilities is None:
            manager = default_manager()
            if tools is None:
                tools = manager.select(plugins=args.plugins, tools=args.tools)
            if capabilities is None:
                capabilities = manager.select_capabilities(args.capabilities)
        config = GatewayConfig.from_env(
            secret=_read_secret(args.secret_file),
            deps=deps,
            upstream=args.upstream,
            store=args.store,
            session_ttl=args.session_ttl,
            store_timeout=args.store_timeout,
            stream_buffer=args.stream_buffer,
            slow_client_timeout=args.slow_client_timeout,
            tools=tools,
            capabilities=capabilities,
            max_rounds=args.max_rounds,
            tool_concurrency=args.tool_concurrency,
            tool_timeout=args.tool_timeout,
            upstream_transport=args.upstream_transport,
            upstream_timeout=args.upstream_timeout,
            durable=args.durable,
            durable_executor_id=args.durable_executor_id,
            **({"retry_wait_limit": args.max_retry_wait} if args.max_retry_wait else {}),
        )
        gateway = Gateway(config)
        listening = _listen(args.host, args.port)
    except ConfigurationError as exc:
        print(f"agentloop: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verbose = bool(getattr(args, "verbose", False))  # logging itself is the command's
    names = ", ".join(t.name for t in tools) or "none"
    wrapped = f"; capabilities: {', '.join(args.capabilities)}" if args.capabilities else ""
    port_in_use = listening.getsockname()[1]  # the one the system chose for --port 0
    banner = (
        f"agentloop gateway on http://{args.host}:{port_in_use} -> {args.upstream} "
        f"(tools: {names}{wrapped}; store: {args.store}"
        f"{'; durable: ' + args.durable if args.durable else ''})"
    )
    guard = Guard(
        ConnectionLimits(
            head_timeout=args.head_timeout,
            body_timeout=args.body_timeout,
            per_address=args.max_connections_per_address,
        )
    )
    # The guard sees each connection's own address, so it runs outside of uvicorn's
    # proxy headers, which the command applies inside it as uvicorn would.
    trusted = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
    app: Any = gateway.app()  # an ASGI app (uvicorn's types are narrower than Starlette's)
    server = _server_class(uvicorn)(
        uvicorn.Config(
            guard.app(ProxyHeadersMiddleware(app, trusted_hosts=trusted)),
            host=args.host,
            port=port_in_use,
            http=guard.protocol(AutoHTTPProtocol),
            proxy_headers=False,
            lifespan="off",  # the server starts the gateway itself (see `_server_class`)
            log_level="info" if verbose else "warning",
            access_log=verbose,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        ),
        gateway,
        banner,
    )
    with listening:
        server.run(sockets=[listening])
    if server.startup_error is not None:
        print(f"agentloop: error: {server.startup_error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if server.started else EXIT_FAILED


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for the server, so a taken port fails up front.

    Raises:
        ConfigurationError: the address cannot be listened on (in use, not local, ...).
    """
    try:
        (family, kind, proto, _, address), *_ = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock
