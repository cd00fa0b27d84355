"""Defaults shared by the library and the `agentloop` command, in a module importing nothing.

The command's `--help` shows them; keeping them here lets it do so without importing the
agent, the sessions or the SDKs they belong to (`agentloop.config`, `agentloop.sessions`).
"""

from __future__ import annotations

__all__ = ("DEFAULT_MODEL", "DEFAULT_SESSIONS_ENV")

DEFAULT_MODEL = "claude-sonnet-5-5"
"""The model an `Agent` uses when none is given."""

DEFAULT_SESSIONS_ENV = "AGENTLOOP_SESSIONS"
"""The environment variable naming the default session store (a file path or a URL)."""
