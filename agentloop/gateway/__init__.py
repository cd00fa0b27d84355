"""The gateway: the agent loop behind an Anthropic-compatible `POST /v1/messages`.

Clients that speak the Messages API point their base URL here. The gateway runs the
tools it owns inside the loop and hands the client's own tools back, keeping the hidden
turns in a session store (`agentloop.gateway.stores`). `agentloop serve` runs it; the
server itself (`Gateway`, on Starlette and uvicorn) needs the `gateway` extra:
`pip install 'agentloop-runner[gateway]'`. Importing this package does not.
"""

from .cli import add_serve_command as add_serve_command
from .cli import serve_command as serve_command
from .sessions import Sessions as Sessions
from .sessions import canonical_json as canonical_json
from .stores import MemoryStore as MemoryStore
from .stores import RedisStore as RedisStore
from .stores import SQLiteStore as SQLiteStore
from .stores import Store as Store
from .stores import open_store as open_store

__all__ = (
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "Sessions",
    "Store",
    "add_serve_command",
    "canonical_json",
    "open_store",
    "serve_command",
)
