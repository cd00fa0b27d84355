"""A run in a session: load the history before it, append what it added after it.

`Agent.run(..., session=...)` (and `run_stream`, `run_sync`) call `load_session` before the
run and drive it through `keeping`, which appends the run's new messages only if the
session is still at the version that was loaded (`SessionConflict` otherwise, carrying the
run's result). A run that fails or is cancelled after the model answered appends its
partial history (valid to send, every call answered), since its tool calls may have had
effects; one that ends before any answer appends nothing, so the same prompt can be
sent again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from agentloop.errors import (
    AgentloopError,
    ConfigurationError,
    HistoryError,
    SessionError,
)
from agentloop.logs import get_logger

from .base import Session, SessionSnapshot, added_messages

if TYPE_CHECKING:
    from agentloop.result import RunResult
    from agentloop.runstate import RunState

__all__ = ("SAVE_TIMEOUT", "append_result", "keeping", "load_session")

SAVE_TIMEOUT = 30.0
"""Seconds a cancelled run may spend appending its partial history before giving up."""

_log = get_logger()

_E = TypeVar("_E")


async def load_session(session: Session, history: Any) -> SessionSnapshot:
    """The session as it stands, for a run to continue.

    Raises:
        ConfigurationError: `history` was given too, or `session` is not a `Session`.
        SessionError: the store failed or holds what cannot be read.
    """
    if history is not None:
        raise ConfigurationError(
            "pass history= or session=, not both: a run in a session continues the "
            "session's history (load it with `await session.load()` to look at it)"
        )
    if not isinstance(session, Session):
        raise ConfigurationError(
            f"session must be a Session (SQLiteSession, RedisSession, ...), not "
            f"{type(session).__name__}"
        )
    try:
        return await session.load()
    except AgentloopError:
        raise
    except Exception as exc:
        raise SessionError(f"could not load session {session.session_id!r}: {exc}") from exc


def keeping(
    session: Session,
    snapshot: SessionSnapshot,
    run: RunState,
    drive: Callable[[_E], Awaitable[RunResult]],
) -> Callable[[_E], Awaitable[RunResult]]:
    """`drive`, then the run's new messages appended to `session` (see the module)."""

    async def drive_and_keep(emit: _E) -> RunResult:
        try:
            result = await drive(emit)
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(SAVE_TIMEOUT, shield=True):
                await _keep_partial(session, snapshot, run.outcome)
            raise
        except AgentloopError as exc:
            if not isinstance(exc, (HistoryError, SessionError)):
                await _keep_partial(session, snapshot, exc.result)
            raise
        await append_result(session, snapshot, result)
        return result

    return drive_and_keep


async def append_result(session: Session, snapshot: SessionSnapshot, result: RunResult) -> int:
    """Append what `result` added to `snapshot`, if the session is still at its version.

    Returns the session's new version.

    Raises:
        SessionConflict: another run appended or cleared first; `.result` is `result`.
        SessionError: the store failed; `.result` is `result`.
    """
    try:
        added = added_messages(snapshot.messages, result.messages)
        # A paused run's state is kept with its messages, for `resume(session=...)`;
        # any other ending clears a state stored before.
        return await session.append(added, version=snapshot.version, state=result.state)
    except SessionError as exc:
        exc.result = result
        raise
    except Exception as exc:
        raise SessionError(
            f"could not append to session {session.session_id!r}: {exc}", result=result
        ) from exc


async def _keep_partial(
    session: Session, snapshot: SessionSnapshot, partial: RunResult | None
) -> None:
    """Append a run's partial history if the model answered; a failure here is logged."""
    if partial is None:
        return
    try:
        added = added_messages(snapshot.messages, partial.messages)
        if not any(m.get("role") == "assistant" for m in added):
            return  # nothing but the prompt: the caller sends it again
        # A paused state stored before is answered (or superseded) by these messages.
        await session.append(added, version=snapshot.version, state=None)
    except Exception as exc:
        # The run's own error (or cancellation) is what the caller sees; its partial
        # result stays in that error's `.result`.
        _log.warning(
            "session.not_saved",
            session_id=session.session_id,
            error=str(exc),
            error_type=type(exc).__name__,
        )
