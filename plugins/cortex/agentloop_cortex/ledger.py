"""The record of keyed changes that makes a retried change happen once.

A run that is retried or resumed (a durable run after a crash) may call a cortex tool
again with the same `RunContext.idempotency_key`. Each file keeps, beside it, a ledger
(`<persona>/.memory.md.applied`, JSON lines) of the last `LIMIT` keyed changes: the key,
the SHA-256 of the content the change produced, and what the change reported. The store
uses it under the file's lock:

1. `settle(current)`: the newest entry may be *pending*: written just before its change
   was committed, by a writer that may have died. If the file now holds the content that
   entry produced, the change happened and the entry is confirmed; otherwise it never
   happened and the entry is dropped. Only the newest entry can be pending, because
   changes of one file are serialised and every change settles first.
2. `find(key)`: a confirmed entry for the key means the change happened: the store
   returns what it reported then and changes nothing.
3. `add(...)`: before committing a keyed change, its pending entry is written (to a
   temporary file, fsynced, renamed over the ledger), so a crash at any point after it
   is settled correctly by the next change.

Keys older than the last `LIMIT` keyed changes of the file are forgotten.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

__all__ = ("LIMIT", "Entry", "Ledger", "digest")

LIMIT: Final = 1000
"""How many keyed changes of one file the ledger remembers."""


def digest(data: bytes | None) -> str:
    """The SHA-256 of a file's content (`None`, a missing file, counts as empty)."""
    return hashlib.sha256(data or b"").hexdigest()


@dataclass(frozen=True)
class Entry:
    """One keyed change: its key, the content it produced, and what it reported."""

    key: str
    sha256: str
    size: int
    previous_size: int | None
    kept_version: bool
    pending: bool = True


class Ledger:
    """The ledger of one cortex file, read from and written to its persona directory."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries

    @classmethod
    def parse(cls, data: bytes | None) -> Ledger:
        """The ledger stored as `data` (None: no ledger yet). Unreadable lines are skipped."""
        entries = []
        for line in (data or b"").splitlines():
            try:
                fields: Any = json.loads(line)
                entries.append(Entry(**fields))
            except (ValueError, TypeError):
                continue
        return cls(entries)

    def dump(self) -> bytes:
        """The ledger as stored: one JSON object per line, the newest last."""
        lines = (json.dumps(asdict(e), separators=(",", ":")) for e in self.entries[-LIMIT:])
        return "".join(line + "\n" for line in lines).encode()

    def settle(self, current: bytes | None) -> bool:
        """Confirm or drop a pending newest entry by the file's content; True if it changed."""
        if not self.entries or not self.entries[-1].pending:
            return False
        last = self.entries.pop()
        if last.sha256 == digest(current):
            self.entries.append(replace(last, pending=False))
        return True

    def find(self, key: str) -> Entry | None:
        """The confirmed entry of `key`, if the change under that key happened."""
        return next((e for e in reversed(self.entries) if e.key == key and not e.pending), None)

    def add(self, entry: Entry) -> None:
        """Record a change about to be committed (pending until the next `settle`)."""
        self.entries.append(entry)
