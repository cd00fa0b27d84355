"""A session by name, in a store named by a path or a URL: what `agentloop run --session` uses.

`open_session("chat")` is the session `chat` in the default SQLite file;
`open_session("chat", "redis://localhost:6379/0")` the same name on a Redis server.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentloop.defaults import DEFAULT_SESSIONS_ENV

from .base import Session
from .redis import RedisSession
from .sqlite import SQLiteSession

__all__ = ("DEFAULT_SESSIONS_ENV", "default_sessions_path", "open_session", "sqlite_path")

_REDIS = ("redis://", "rediss://", "unix://")


def default_sessions_path() -> Path:
    """The SQLite file sessions are kept in when nothing else is named.

    `agentloop/sessions.db` under `$XDG_DATA_HOME` (by default `~/.local/share`).
    """
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "agentloop" / "sessions.db"


def open_session(
    session_id: str, where: str | os.PathLike[str] | None = None, *, ttl: float | None = None
) -> Session:
    """The session `session_id` in the store `where` names.

    Args:
        session_id: The conversation's name.
        where: A SQLite file path (`sqlite:///PATH` also works) or a Redis URL
            (`redis://HOST:PORT/DB`, `rediss://`, `unix://`). By default
            `$AGENTLOOP_SESSIONS`, else `default_sessions_path()`.
        ttl: Seconds the session is kept after its last write; None (the default)
            keeps it until cleared (see docs/sessions.md, "Sessions that expire").

    Raises:
        ConfigurationError: `session_id` is empty, or `ttl` is not a number of
            seconds > 0.
    """
    if where is None or str(where) == "":
        where = os.environ.get(DEFAULT_SESSIONS_ENV) or default_sessions_path()
    path = sqlite_path(where)
    if path is None:
        return RedisSession(os.fspath(where), session_id, ttl=ttl)
    return SQLiteSession(path, session_id, ttl=ttl)


def sqlite_path(where: str | os.PathLike[str]) -> Path | None:
    """The SQLite file a session store's name means, or None when it names a Redis server.

    Args:
        where: A file path, `sqlite:///PATH`, or a Redis URL (as `open_session` takes).
    """
    text = os.fspath(where)
    if text.startswith(_REDIS):
        return None
    return Path(text.removeprefix("sqlite:///")).expanduser()
