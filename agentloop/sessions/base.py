"""What a session store is: the `Session` protocol, and what a run adds to one.

A session is one conversation that outlives a run: an append-only list of wire messages
with a version that every append and clear moves on, plus the stored state of a paused
run. `added_messages` works out what a run added to the history it loaded, which is
what a run appends.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

from agentloop.checks import check_seconds
from agentloop.errors import SessionConflict, SessionError

__all__ = (
    "UNCHANGED",
    "Session",
    "SessionSnapshot",
    "Unchanged",
    "added_messages",
    "check_ttl",
    "conflict",
    "decode",
    "encode",
)


class Unchanged(enum.Enum):
    """The type of `UNCHANGED`."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED
"""`Session.append(..., state=UNCHANGED)`: leave the stored state as it is."""


@dataclass(frozen=True)
class SessionSnapshot:
    """A session as one read saw it."""

    messages: list[dict[str, Any]]
    """The conversation in wire form, oldest first, valid to send as a history. Two
    consecutive messages of one role can occur (a run that added to the last stored
    turn); the Messages API reads them as one turn."""
    version: int
    """How many times the session was appended to or cleared; 0 for a new session."""
    state: dict[str, Any] | None = field(default=None)
    """The stored state of a paused run (see `Session.save_state`), or None."""


@runtime_checkable
class Session(Protocol):
    """A conversation kept between runs, in a store several processes can share.

    `Agent.run(prompt, session=...)` loads it, runs, and appends what the run added,
    only if nobody appended in between (`SessionConflict` otherwise).
    """

    session_id: str
    """Which conversation of the store this is."""

    async def load(self) -> SessionSnapshot:
        """The messages, version and stored state, read together in one consistent read."""
        ...

    async def append(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        state: Mapping[str, Any] | Unchanged | None = UNCHANGED,
    ) -> int:
        """Add `messages` at the end, all or none; returns the new version.

        Args:
            messages: Wire messages (JSON-serialisable dicts).
            version: When given, append only if the session is still at this version
                (the one `load` returned): optimistic concurrency.
            state: The stored state after the append, written with the messages in the
                same transaction: a paused run's state to keep, None to forget it, or
                `UNCHANGED` (the default) to leave it.

        Raises:
            SessionConflict: the session is no longer at `version`; nothing was written.
        """
        ...

    async def clear(self) -> None:
        """Forget the messages and the stored state (the version moves on)."""
        ...

    async def save_state(self, state: Mapping[str, Any]) -> None:
        """Keep the JSON-serialisable state of a paused run, replacing any earlier one."""
        ...

    async def load_state(self) -> dict[str, Any] | None:
        """The stored state of a paused run, or None."""
        ...

    async def clear_state(self) -> None:
        """Forget the stored state (the messages stay)."""
        ...


def check_ttl(ttl: Any) -> float | None:
    """A store's `ttl` option as seconds, or None for a session kept until cleared.

    `math.inf` is None too.

    Raises:
        ConfigurationError: `ttl` is not None nor a number of seconds > 0.
    """
    if ttl is None:
        return None
    seconds = check_seconds("a session's ttl", ttl)
    return None if seconds == math.inf else seconds


def encode(value: Any) -> str:
    """A message or state as the JSON text a store keeps.

    Raises:
        SessionError: `value` is not JSON-serialisable.
    """
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SessionError(f"a session holds JSON values only: {exc}") from exc


def decode(text: str | bytes, what: str) -> Any:
    """A value a store kept, read back.

    Raises:
        SessionError: the text is not JSON (the store was written by something else).
    """
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SessionError(f"the session's {what} is not readable JSON: {exc}") from exc


def conflict(session_id: str, expected: int, actual: int) -> SessionConflict:
    """The error of an append that found the session at another version than loaded."""
    return SessionConflict(
        f"session {session_id!r} changed since it was loaded (version {expected}, now "
        f"{actual}): another run appended to it or cleared it; nothing was stored",
        session_id=session_id,
        expected=expected,
        actual=actual,
    )


def added_messages(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The messages that, appended to `before`, give a history the API reads as `after`.

    A run starting from `before` adds messages, and may add blocks to the last message
    it was given (a prompt after a user turn, a paused turn's continuation): those
    blocks become a message of the same role, which the API merges back into one turn.

    Raises:
        SessionError: `after` does not continue `before` (the run rewrote its history).
    """
    count = len(before)
    if list(after[:count]) == list(before):
        return [dict(m) for m in after[count:]]
    last, changed = before[-1], after[count - 1] if len(after) >= count else None
    if (
        changed is not None
        and list(after[: count - 1]) == list(before[: count - 1])
        and changed.get("role") == last.get("role")
    ):
        old, new = _blocks(last.get("content")), _blocks(changed.get("content"))
        if new[: len(old)] == old:
            rest = [dict(m) for m in after[count:]]
            extra = new[len(old) :]
            return [{"role": changed.get("role"), "content": extra}, *rest] if extra else rest
    raise SessionError("the run's history does not continue the session's; nothing was stored")


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []
