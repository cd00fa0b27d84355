"""Small wire helpers every layer shares: compact JSON bytes and random ids.

JSON goes out compact and UTF-8, as the API writes it. Text holding lone surrogates
(which UTF-8 cannot carry, e.g. from a file name that is not UTF-8) is written with JSON
escapes instead, exactly as the API itself sends such text, so it is never lost.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

__all__ = ("base62", "compact_json", "random_id")

_ALPHABET = string.ascii_letters + string.digits


def compact_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """`value` as compact UTF-8 JSON; lone surrogates written as JSON escapes."""
    try:
        return json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys
        ).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys).encode()


def base62(number: int, length: int) -> str:
    """The last `length` base62 digits of `number` (letters and digits only)."""
    chars = []
    for _ in range(length):
        number, digit = divmod(number, 62)
        chars.append(_ALPHABET[digit])
    return "".join(chars)


def random_id(prefix: str = "", length: int = 24) -> str:
    """`prefix` and `length` random base62 characters."""
    return prefix + base62(int.from_bytes(secrets.token_bytes(length), "big"), length)
