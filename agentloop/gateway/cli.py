"""The `agentloop serve` command: the gateway on uvicorn.

`add_serve_command` (from `agentloop.gateway.options`) adds the subcommand to the
`agentloop` parser; `serve_command` runs it: it selects the gateway's tools and
capabilities from the installed plugins (as `agentloop run` does), builds a `Gateway` and
serves it until SIGTERM or Ctrl-C, letting the requests in flight finish first (for at
most `SHUTDOWN_GRACE` seconds). Logging is configured by the command that calls it
(`agentloop`, `python -m agentloop.gateway`).
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
from agentloop.errors import ConfigurationError
from agentloop.plugins import default_manager
from agentloop.tools import Tool

__all__ = ("SHUTDOWN_GRACE", "serve_command")

SHUTDOWN_GRACE = 30.0
"""Seconds requests in flight may take to finish after SIGTERM before they are closed."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


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
        from .guard import ConnectionLimits, Guard
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
        if args.durable_lease is not None and not args.durable:
            raise ConfigurationError("--durable-lease needs --durable")
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
            **({"durable_lease": args.durable_lease} if args.durable_lease else {}),
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
