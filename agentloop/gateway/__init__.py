"""The gateway: the agent loop behind an Anthropic-compatible `POST /v1/messages`.

Clients that speak the Messages API point their base URL here. The gateway runs the
tools it owns inside the loop and hands the client's own tools back, keeping the hidden
turns in a session store (`agentloop.gateway.stores`). `agentloop serve` runs it; the
server itself (`Gateway`, on Starlette and uvicorn) needs the `gateway` extra:
`pip install 'agentloop-runner[gateway]'`. Importing this package does not, and its
names are imported on first use, so `agentloop --help` does not import the SDK.
"""

import typing

from agentloop.lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from .cli import serve_command as serve_command
    from .options import add_serve_command as add_serve_command
    from .sessions import Sessions as Sessions
    from .sessions import canonical_json as canonical_json
    from .stores import MemoryStore as MemoryStore
    from .stores import RedisStore as RedisStore
    from .stores import SQLiteStore as SQLiteStore
    from .stores import Store as Store
    from .stores import open_store as open_store

# Where each exported name is defined: the module (below this package) it is imported from.
_MODULES = {
    "MemoryStore": "stores",
    "RedisStore": "stores",
    "SQLiteStore": "stores",
    "Sessions": "sessions",
    "Store": "stores",
    "add_serve_command": "options",
    "canonical_json": "sessions",
    "open_store": "stores",
    "serve_command": "cli",
}

__all__ = tuple(sorted(_MODULES))

__getattr__, __dir__ = _lazy_exports(globals(), _MODULES)
