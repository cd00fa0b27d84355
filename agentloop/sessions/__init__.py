"""Sessions: conversations that outlive a run, in a SQLite file or on a Redis server.

`Agent.run(prompt, session=...)` loads the session's history, runs, and appends what the
run added; `Session` is the protocol a store meets, `SQLiteSession` the embedded default
and `RedisSession` the store for services with several replicas. See docs/sessions.md.
"""

from agentloop.errors import SessionConflict as SessionConflict
from agentloop.errors import SessionError as SessionError

from .base import UNCHANGED as UNCHANGED
from .base import Session as Session
from .base import SessionSnapshot as SessionSnapshot
from .named import DEFAULT_SESSIONS_ENV as DEFAULT_SESSIONS_ENV
from .named import default_sessions_path as default_sessions_path
from .named import open_session as open_session
from .redis import RedisSession as RedisSession
from .sqlite import SQLiteSession as SQLiteSession

__all__ = (
    "DEFAULT_SESSIONS_ENV",
    "UNCHANGED",
    "RedisSession",
    "SQLiteSession",
    "Session",
    "SessionConflict",
    "SessionError",
    "SessionSnapshot",
    "default_sessions_path",
    "open_session",
)
