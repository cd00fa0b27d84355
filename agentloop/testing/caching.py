"""The test server's prompt cache: what a request would be billed under Anthropic's rules.

`MessagesServer(prompt_cache=True)` hands each request to a `PromptCache`, which reports
the request's input tokens the way the API splits them (`input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `cache_creation`), so tests
and benchmarks can measure what a run would be billed. The rules modelled, and where
they come from, are listed in docs/testing.md ("Prompt caching").

Tokens are a deterministic estimate: one token per 4 characters (rounded up) of each
block's compact, key-sorted JSON without its `cache_control` marker.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentloop._wire import compact_json
from agentloop.errors import HistoryError

__all__ = (
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "MIN_CACHEABLE_TOKENS",
    "TTL_SECONDS",
    "Breakpoint",
    "PromptCache",
    "breakpoints",
    "min_cacheable_tokens",
)

MAX_BREAKPOINTS = 4
"""The most cache breakpoints one request may hold (the automatic one included)."""

LOOKBACK_BLOCKS = 20
"""How many blocks before a breakpoint the API looks back for an earlier cache entry."""

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""The cache lifetimes the API offers; `5m` is the default."""

MIN_CACHEABLE_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-haiku-3-5", 2048),
    ("claude-3-haiku", 2048),
    ("claude-haiku-3", 2048),
)
"""The shortest prefix (tokens) each model family caches, by model-id prefix; any other
model caches from 1024 tokens (Sonnet 4.x, Opus 4 and 4.1, Sonnet 3.7)."""

_DEFAULT_MIN_TOKENS = 1024

# Blocks that cannot carry a marker (an empty text block cannot either).
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix, in tokens, that `model` caches (see `MIN_CACHEABLE_TOKENS`)."""
    for prefix, tokens in MIN_CACHEABLE_TOKENS:
        if model.startswith(prefix):
            return tokens
    return _DEFAULT_MIN_TOKENS


@dataclass(frozen=True)
class Breakpoint:
    """A cache breakpoint of a request: after block `index` (in tools, system, messages order)."""

    index: int
    ttl: str
    """`"5m"` or `"1h"`."""
    automatic: bool = False
    """Placed by the request's top-level `cache_control` rather than on a block."""


@dataclass(frozen=True)
class _Block:
    """One block of a request, in the order the API reads them: tools, system, messages."""

    key: str
    """A hash of the whole prefix up to and including this block."""
    tokens: int
    marker: Mapping[str, Any] | None
    markable: bool


def _tokens(value: Any) -> int:
    return max(1, -(-len(compact_json(value, sort_keys=True)) // 4))


def _unmarked(block: Any) -> Any:
    if not isinstance(block, Mapping):
        return block
    return {
        k: [_unmarked(b) for b in v] if k == "content" and isinstance(v, list) else v
        for k, v in block.items()
        if k != "cache_control"
    }


def _marker(block: Any) -> Mapping[str, Any] | None:
    """The block's `cache_control`, or a nested one (inside a tool_result's content)."""
    if not isinstance(block, Mapping):
        return None
    own = block.get("cache_control")
    if isinstance(own, Mapping):
        return own
    content = block.get("content")
    for inner in content if isinstance(content, list) else ():
        found = _marker(inner)
        if found is not None:
            return found
    return None


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _blocks(body: Mapping[str, Any]) -> list[_Block]:
    """The request's blocks with their prefix hashes, in the API's order."""
    chain = hashlib.sha256(str(body.get("model", "")).encode())
    out: list[_Block] = []

    def add(section: str, block: Any, *, markable: bool = True) -> None:
        plain = _unmarked(block)
        chain.update(section.encode() + compact_json(plain, sort_keys=True))
        kind = plain.get("type") if isinstance(plain, Mapping) else None
        markable = (
            markable and kind not in _UNMARKABLE and not (kind == "text" and not plain.get("text"))
        )
        out.append(_Block(chain.hexdigest(), _tokens(plain), _marker(block), markable))

    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        add("tool", tool)
    for block in _as_blocks(body.get("system")):
        add("system", block, markable=not isinstance(body.get("system"), str))
    # A change of tool_choice or of the thinking settings invalidates the messages' cache.
    settings = {k: body.get(k) for k in ("tool_choice", "thinking")}
    chain.update(compact_json(settings, sort_keys=True))
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, Mapping):
            content = message.get("content")
            for block in _as_blocks(content):
                add(f"{i}:{message.get('role')}", block, markable=not isinstance(content, str))
    return out


def _ttl(marker: Mapping[str, Any]) -> str:
    ttl = marker.get("ttl", "5m")
    if marker.get("type") != "ephemeral" or ttl not in TTL_SECONDS:
        raise HistoryError(
            f"cache_control must be {{'type': 'ephemeral'}} with a ttl of '5m' or '1h', "
            f"not {dict(marker)!r}"
        )
    return str(ttl)


def breakpoints(body: Mapping[str, Any]) -> list[Breakpoint]:
    """The request's cache breakpoints, checked as the API checks them.

    Raises:
        HistoryError: more than `MAX_BREAKPOINTS` (the automatic one counts), a marker
            that is not `ephemeral` with a known TTL, a 1-hour breakpoint after a
            5-minute one, or a top-level `cache_control` whose TTL differs from an
            explicit marker on the block it would mark.
    """
    return _breakpoints(_blocks(body), body)


def _breakpoints(blocks: list[_Block], body: Mapping[str, Any]) -> list[Breakpoint]:
    found = [Breakpoint(i, _ttl(b.marker)) for i, b in enumerate(blocks) if b.marker is not None]
    auto = body.get("cache_control")
    if isinstance(auto, Mapping):
        ttl = _ttl(auto)
        last = next((i for i in range(len(blocks) - 1, -1, -1) if blocks[i].markable), None)
        same = next((b for b in found if b.index == last), None)
        if same is not None and same.ttl != ttl:
            raise HistoryError(
                f"the top-level cache_control (ttl {ttl!r}) conflicts with the "
                f"cache_control of the last cacheable block (ttl {same.ttl!r})"
            )
        if last is not None and same is None:
            found = sorted([*found, Breakpoint(last, ttl, automatic=True)], key=lambda b: b.index)
    if len(found) > MAX_BREAKPOINTS:
        raise HistoryError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(found)}."
        )
    for earlier, later in itertools.pairwise(found):
        if earlier.ttl == "5m" and later.ttl == "1h":
            raise HistoryError(
                "a cache_control with ttl='1h' must not come after one with ttl='5m'"
            )
    return found


@dataclass
class _Entry:
    expires: float
    ttl: str


class PromptCache:
    """A prompt cache with the API's rules; thread-safe (the server answers from threads).

    ```python
    cache = PromptCache()
    async with MessagesServer(script, prompt_cache=cache) as server:
        ...
    ```

    Entries are kept per prefix hash (the model's id included), each with the TTL of the
    breakpoint that wrote it, and refreshed by every read.
    """

    def __init__(
        self,
        *,
        min_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create an empty cache.

        Args:
            min_tokens: The shortest cacheable prefix for every model; by default each
                model family's (`min_cacheable_tokens`).
            clock: Seconds, for expiry (a test can pass its own to move time on).
        """
        self.min_tokens = min_tokens
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def bill(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The input side of the request's `usage`; reads refresh and writes add entries.

        Raises:
            HistoryError: the request's breakpoints break an API rule (see `breakpoints`).
        """
        blocks = _blocks(body)
        points = _breakpoints(blocks, body)
        ends = list(_running_sum(b.tokens for b in blocks))
        total = ends[-1] if ends else 0
        floor = self.min_tokens
        if floor is None:
            floor = min_cacheable_tokens(str(body.get("model", "")))
        eligible = [p for p in points if ends[p.index] >= floor]
        with self._lock:
            now = self.clock()
            read = -1
            for point in eligible:
                for i in range(point.index, max(-1, point.index - LOOKBACK_BLOCKS - 1), -1):
                    entry = self._entries.get(blocks[i].key)
                    if entry is not None and entry.expires > now:
                        entry.expires = now + TTL_SECONDS[entry.ttl]
                        read = max(read, i)
                        break
            read_tokens = ends[read] if read >= 0 else 0
            written = {"5m": 0, "1h": 0}
            end = read_tokens
            for point in eligible:
                key = blocks[point.index].key
                self._entries[key] = _Entry(now + TTL_SECONDS[point.ttl], point.ttl)
                if ends[point.index] > end:
                    written[point.ttl] += ends[point.index] - end
                    end = ends[point.index]
        return {
            "input_tokens": total - end,
            "cache_creation_input_tokens": written["5m"] + written["1h"],
            "cache_read_input_tokens": read_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written["5m"],
                "ephemeral_1h_input_tokens": written["1h"],
            },
        }


def _running_sum(values: Iterable[int]) -> Iterator[int]:
    total = 0
    for value in values:
        total += value
        yield total
