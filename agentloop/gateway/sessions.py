"""Sessions: the hidden turns of a conversation, found again from what the client sends.

The client only ever sees (and sends back) the visible conversation. After a run that had
hidden turns, the gateway stores the upstream history under a key derived from the
visible conversation up to the reply it returned and the client's credential, through an
HMAC with the server secret. The next request's prefix (up to its last assistant
message) derives the same key, so the gateway can rebuild the upstream history: the
stored one plus the client's new messages. Snapshots are immutable and stored as deltas
(the keys of their ancestors and the messages they add), so a retried request, a
regenerated answer or a branch from any earlier reply all find their hidden turns.

Two conversations can show the client the same text while their hidden turns differ
(same question, same visible answer, different tool results). The first write of a key
wins; a later write of different hidden turns under the same key marks the key
ambiguous, and an ambiguous key restores nothing: the gateway never guesses which
conversation a client continues.

A run that fails after the gateway's tools ran (the upstream failed in a later round)
keeps its partial history under a key derived from the whole request, so the client's
retry of that request goes on from there instead of running the tools again.

Message threads use the same snapshots: a thread record holds the visible messages a
reply added, keyed by the reply's id, so a `continue` request can be expanded to the
whole visible conversation.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentloop._wire import compact_json
from agentloop.logs import get_logger
from agentloop.messages import ROLES

from .stores import SECRET_KEY, Store

__all__ = (
    "Found",
    "Session",
    "Sessions",
    "Thread",
    "canonical_json",
    "canonical_messages",
    "canonical_numbers",
    "continue_history",
    "last_marker",
    "moved_markers",
)

_FORMAT = 1

_log = get_logger()


def canonical_json(messages: Sequence[Any]) -> bytes:
    """The visible conversation as bytes that do not depend on how a client wrote it.

    Keys are sorted and whitespace dropped; a string content is one text block; null
    fields and `cache_control` markers (clients move them from request to request) are
    left out of blocks, at every depth that holds blocks. A whole number is written the
    same whether it came as `1` or `1.0` (JavaScript's `JSON.stringify` writes `1.0` as
    `1`), at every depth; tool inputs are otherwise kept as they are.
    """
    return compact_json(canonical_messages(messages), sort_keys=True)


def canonical_messages(messages: Sequence[Any]) -> list[Any]:
    """The values `canonical_json` writes: `messages` in their one normal form."""
    return [canonical_numbers(_message(m)) for m in messages]


def canonical_numbers(value: Any) -> Any:
    """`value` with every float that is a whole number (`1.0`, `1e21`) made an int."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {k: canonical_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical_numbers(v) for v in value]
    return value


def _message(message: Any) -> Any:
    if not isinstance(message, Mapping):
        return message
    return {"role": message.get("role"), "content": _content(message.get("content"))}


def _content(content: Any) -> Any:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [_block(b) for b in content]
    return content


def _block(block: Any) -> Any:
    if not isinstance(block, Mapping):
        return block
    return {
        k: _content(v) if k == "content" else v
        for k, v in block.items()
        if v is not None and k != "cache_control"
    }


@dataclass(frozen=True)
class Session:
    """A stored upstream history, found by the key of its visible conversation."""

    key: str
    ancestors: tuple[str, ...]
    """Keys of the snapshots this one extends, oldest first."""
    messages: list[dict[str, Any]]
    """The whole upstream history, hidden turns included, up to the stored reply."""
    held: list[dict[str, Any]] = field(default_factory=list)
    """`tool_result` blocks of the gateway's own calls in the last assistant message,
    waiting for the client's results (a mixed turn)."""


@dataclass(frozen=True)
class Thread:
    """A stored message thread up to one reply."""

    key: str
    ancestors: tuple[str, ...]
    messages: list[dict[str, Any]]
    """The visible conversation, the reply included."""
    fields: dict[str, Any]
    """The fields a thread keeps from its `create` request (`system`, `tools`)."""


@dataclass(frozen=True)
class Found:
    """What a session key leads to: a session, nothing, or an ambiguous conversation."""

    session: Session | None
    ambiguous: bool = False
    """Two conversations stored different hidden turns under this key: none is restored."""


def _ambiguous(key: str) -> str:
    """The key of the marker saying `key` is held by two different conversations."""
    return key + ":ambiguous"


class Sessions:
    """Derives session keys and reads and writes snapshots in a `Store`."""

    def __init__(self, store: Store, secret: bytes, *, kept: bool = False) -> None:
        """Use `store`, deriving keys with `secret`.

        With `kept`, `secret` is the one kept in the store, and every lookup checks it is
        still there: a store wiped (a Redis restart, a flush) gets its secret back from
        the first process that notices, and a process that finds another one adopts it,
        so processes sharing a store never derive different keys for long.
        """
        self.store = store
        self._secret = secret
        self._kept = kept

    async def check_secret(self, stored: bytes | None = None, *, read: bool = True) -> bool:
        """Whether the kept secret was still in the store (adopting the store's if not).

        `stored` is the store's secret when the caller already read it (`read=False`).
        Always True when the secret comes from the configuration.
        """
        if not self._kept:
            return True
        if read:
            (stored,) = await self.store.get_many([SECRET_KEY])
        if stored == self._secret:
            return True
        self._secret = await self.store.secret(self._secret)
        _log.warning(
            "gateway.secret_changed",
            detail="the store lost the session secret (wiped or restarted); the secret "
            "in the store now is used, and sessions stored before are gone",
            adopted=stored is not None,
        )
        return False

    async def restore(
        self, credential: str, visible: Sequence[Any], *, retry: bool = False
    ) -> Found:
        """The session of a visible conversation (ending with an assistant reply).

        With `retry`, the partial run kept for a request that failed after the gateway's
        tools ran, found from the whole request's conversation (`retry_key`).
        """
        for _ in range(2):
            key = (self.retry_key if retry else self.key)(credential, visible)
            extra = [SECRET_KEY] if self._kept else []
            values = await self.store.get_many([key, _ambiguous(key), *extra])
            if extra and not await self.check_secret(values[2], read=False):
                continue  # the key was derived with a secret the store no longer has
            break
        return await self._found(key, values[0], values[1])

    def _key(self, kind: bytes, credential: str, payload: bytes) -> str:
        scope = credential.encode("utf-8", "surrogatepass")
        message = b"%s\0%d:%s\0%s" % (kind, len(scope), scope, payload)
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def key(self, credential: str, visible: Sequence[Any]) -> str:
        """The key of a visible conversation (ending with an assistant reply) for a client."""
        return self._key(b"session", credential, canonical_json(visible))

    def retry_key(self, credential: str, visible: Sequence[Any]) -> str:
        """The key of the partial run kept for a failed request's whole conversation."""
        return self._key(b"retry", credential, canonical_json(visible))

    def run_key(self, credential: str, request: bytes) -> str:
        """The key of a client request (its canonical form, `runs.canonical_request`)."""
        return self._key(b"run", credential, request)

    def thread_key(self, credential: str, reply_id: str) -> str:
        """The key of a thread's record for the reply `reply_id`, for a client."""
        return self._key(b"thread", credential, reply_id.encode("utf-8", "surrogatepass"))

    async def _chain(self, key: str, raw: bytes | None = None) -> list[dict[str, Any]] | None:
        """The records from the root to `key` (whose value is `raw` when read), or None."""
        if raw is None:
            (raw,) = await self.store.get_many([key])
        if raw is None:
            return None
        record = json.loads(raw)
        if record.get("v") != _FORMAT:
            return None
        up = list(record.get("up") or [])
        earlier = await self.store.get_many(up) if up else []
        if any(value is None for value in earlier):
            return None  # an ancestor expired: the snapshot cannot be rebuilt
        return [*(json.loads(v) for v in earlier if v is not None), record]

    async def load(self, key: str) -> Session | None:
        """The session stored under `key`, or None (none there, or ambiguous)."""
        return (await self.find(key)).session

    async def find(self, key: str) -> Found:
        """The session stored under `key`, unless there is none or it is ambiguous."""
        raw, marker = await self.store.get_many([key, _ambiguous(key)])
        return await self._found(key, raw, marker)

    async def _found(self, key: str, raw: bytes | None, marker: bytes | None) -> Found:
        if marker is not None:
            return Found(None, ambiguous=True)
        chain = await self._chain(key, raw) if raw is not None else None
        if chain is None:
            return Found(None)
        messages = [m for record in chain for m in record.get("add") or []]
        session = Session(
            key, tuple(chain[-1].get("up") or []), messages, list(chain[-1].get("held") or [])
        )
        return Found(session)

    async def save(
        self,
        key: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent: Session | None,
        held: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Store the upstream history `messages` under `key`, as a delta on `parent`.

        `messages` must extend `parent.messages`; if it does not (a prefill merged into
        the parent's last message), the whole history is stored on its own.
        """
        up: list[str] = []
        added: Sequence[Mapping[str, Any]] = messages
        if parent is not None and _extends(messages, parent.messages):
            up = [*parent.ancestors, parent.key]
            added = messages[len(parent.messages) :]
        record = {"v": _FORMAT, "up": up, "add": list(added), "held": list(held)}
        value = compact_json(record)
        # The markers of the ancestors live as long as they do, so an ambiguous key
        # never becomes unambiguous while it is still there to be found.
        refresh = [*up, *(_ambiguous(k) for k in (*up, key))]
        if await self.store.put(key, value, refresh=refresh):
            return
        (kept,) = await self.store.get_many([key])
        if kept is not None and json.loads(kept) != json.loads(value):
            await self.store.put(_ambiguous(key), b"1")

    async def load_thread(self, key: str) -> Thread | None:
        """The thread record stored under `key`, or None."""
        chain = await self._chain(key)
        if chain is None:
            return None
        messages = [m for record in chain for m in record.get("add") or []]
        fields = dict(chain[0].get("fields") or {})
        return Thread(key, tuple(chain[-1].get("up") or []), messages, fields)

    async def save_thread(
        self,
        key: str,
        added: Sequence[Mapping[str, Any]],
        *,
        parent: Thread | None,
        fields: Mapping[str, Any],
    ) -> None:
        """Store a thread's reply.

        `added` is what the reply adds to `parent`: the request's messages and the reply;
        a new thread (no parent) stores its whole conversation and its `fields`.
        """
        up = [*parent.ancestors, parent.key] if parent is not None else []
        record: dict[str, Any] = {"v": _FORMAT, "up": up, "add": list(added)}
        if parent is None:
            record["fields"] = dict(fields)
        await self.store.put(key, compact_json(record), refresh=up)


def _extends(messages: Sequence[Mapping[str, Any]], prefix: Sequence[Mapping[str, Any]]) -> bool:
    if len(messages) < len(prefix):
        return False
    return not prefix or messages[len(prefix) - 1] == prefix[-1]


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def continue_history(
    session: Session,
    new: Sequence[Mapping[str, Any]],
    *,
    marker: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The upstream history for a request that continues `session` with `new` messages.

    After a mixed turn, the first new user message becomes the one message answering
    every call of the stored assistant message in the model's order: the held results of
    the gateway's own calls and the client's results, then whatever else the client
    wrote. Messages of other roles before it (a mid-conversation `system` message) stay
    where the client put them. A new user message right after a stored user message is
    merged into it.

    The stored messages keep none of the `cache_control` markers earlier requests put
    on them (clients move their markers from request to request, and the API takes at
    most four); `marker`, the client's latest marker before its new messages, is put on
    the last stored block that can carry one.
    """
    history = moved_markers(session.messages, marker)
    rest = [dict(m) for m in new]
    turn = next((i for i, m in enumerate(rest) if m.get("role") in ROLES), None)
    if session.held and turn is not None and rest[turn].get("role") == "user" and history:
        answer = _answer_all(history[-1], session.held, rest[turn])
        rest[turn] = {**rest[turn], "content": answer}
    if rest and history and history[-1].get("role") == "user" and rest[0].get("role") == "user":
        merged = _blocks(history[-1].get("content")) + _blocks(rest[0].get("content"))
        history[-1] = {**history[-1], "content": merged}
        rest = rest[1:]
    return history + rest


def _answer_all(
    assistant: Mapping[str, Any], held: Sequence[Mapping[str, Any]], user: Mapping[str, Any]
) -> list[Any]:
    blocks = _blocks(user.get("content"))
    theirs = {
        b.get("tool_use_id"): b
        for b in blocks
        if isinstance(b, Mapping) and b.get("type") == "tool_result"
    }
    ours = {b.get("tool_use_id"): b for b in held}
    ordered: list[Any] = []
    used: set[Any] = set()
    for block in _blocks(assistant.get("content")):
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            continue
        call = block.get("id")
        result = ours.get(call) or theirs.get(call)
        if result is not None:
            ordered.append(result)
            used.add(call)
    others = [
        b
        for b in blocks
        if not (
            isinstance(b, Mapping)
            and b.get("type") == "tool_result"
            and b.get("tool_use_id") in used
        )
    ]
    return ordered + others


# Blocks the API lets carry a `cache_control` marker (thinking blocks cannot).
_MARKABLE = frozenset({"text", "image", "document", "search_result", "tool_use", "tool_result"})


def last_marker(messages: Sequence[Any]) -> dict[str, Any] | None:
    """The last `cache_control` marker in `messages` (at any depth), or None."""
    found: list[dict[str, Any]] = []

    def visit(content: Any) -> None:
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping):
                visit(block.get("content"))
                if isinstance(block.get("cache_control"), Mapping):
                    found.append(dict(block["cache_control"]))

    for message in messages:
        if isinstance(message, Mapping):
            visit(message.get("content"))
    return found[-1] if found else None


def moved_markers(
    messages: Sequence[Mapping[str, Any]], marker: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """`messages` without their `cache_control` markers, and `marker` put back once.

    `marker` (when given) goes on the last block that can carry one: not a thinking
    block, not an empty text.
    """
    out = [{**m, "content": _unmarked(m.get("content"))} for m in messages]
    if marker is None:
        return out
    for message in reversed(out):
        blocks = _blocks(message.get("content"))
        for i in range(len(blocks) - 1, -1, -1):
            block = blocks[i]
            if (
                isinstance(block, Mapping)
                and block.get("type") in _MARKABLE
                and (block.get("type") != "text" or block.get("text"))
            ):
                blocks[i] = {**block, "cache_control": dict(marker)}
                message["content"] = blocks
                return out
    return out


def _unmarked(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {k: _unmarked(v) if k == "content" else v for k, v in b.items() if k != "cache_control"}
        if isinstance(b, Mapping)
        else b
        for b in content
    ]
