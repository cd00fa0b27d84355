"""Turn tool docstrings into descriptions for the tool's JSON schema.

Google, NumPy and Sphinx (reST) styles yield a tool description plus per-parameter text.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

__all__ = ["ParsedDocstring", "parse_docstring"]


@dataclass(frozen=True)
class ParsedDocstring:
    """The parts of a docstring that matter for a tool's JSON schema.

    Attributes:
        description: Summary plus extended description with all sections removed.
            Paragraph breaks from the source are kept; the text is stripped.
        params: Parameter name to description (multi-line text joined with single spaces).
        returns: The return (or yield) description, if the docstring has one.
    """

    description: str
    params: dict[str, str]
    returns: str | None


# Section kinds.
_PARAMS = "params"
_RETURNS = "returns"
_OTHER = "other"

_GOOGLE_SECTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "args",
            "arguments",
            "parameters",
            "params",
            "keyword args",
            "keyword arguments",
            "kwargs",
            "other args",
            "other arguments",
            "other parameters",
            "other params",
        ),
        _PARAMS,
    ),
    **dict.fromkeys(("returns", "return", "yields", "yield"), _RETURNS),
    **dict.fromkeys(
        (
            "raises",
            "raise",
            "except",
            "exceptions",
            "example",
            "examples",
            "note",
            "notes",
            "attributes",
            "attention",
            "caution",
            "danger",
            "error",
            "hint",
            "important",
            "tip",
            "todo",
            "warning",
            "warnings",
            "warns",
            "see also",
            "references",
            "methods",
        ),
        _OTHER,
    ),
}

_NUMPY_SECTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "parameters",
            "params",
            "arguments",
            "args",
            "other parameters",
            "keyword arguments",
        ),
        _PARAMS,
    ),
    **dict.fromkeys(("returns", "return"), _RETURNS),
    **dict.fromkeys(
        (
            "yields",
            "yield",
            "receives",
            "raises",
            "warns",
            "warnings",
            "warning",
            "see also",
            "notes",
            "note",
            "references",
            "examples",
            "example",
            "attributes",
            "methods",
            "todo",
        ),
        _OTHER,
    ),
}

_SPHINX_FIELDS: dict[str, str] = {
    **dict.fromkeys(
        ("param", "parameter", "arg", "argument", "key", "keyword", "kwarg", "kwparam"),
        _PARAMS,
    ),
    **dict.fromkeys(("returns", "return"), _RETURNS),
    **dict.fromkeys(
        (
            "type",
            "rtype",
            "raises",
            "raise",
            "except",
            "exception",
            "yields",
            "yield",
            "ytype",
            "var",
            "ivar",
            "cvar",
            "vartype",
            "meta",
        ),
        _OTHER,
    ),
}

_GOOGLE_HEADER_RE = re.compile(r"([A-Za-z][A-Za-z ]*?)\s*:")
_GOOGLE_INLINE_RETURNS_RE = re.compile(r"(returns?|yields?)\s*:\s*(\S.*)", re.IGNORECASE)
_UNDERLINE_RE = re.compile(r"-{3,}")
_SPHINX_FIELD_RE = re.compile(r":(?P<name>[^:`\s][^:`]*):(?:\s+(?P<body>.*))?")
_GOOGLE_NAMES_RE = re.compile(r"(\\?\*{0,2}\w+(?:\s*,\s*\\?\*{0,2}\w+)*)\s*")
_NAME_RE = re.compile(r"\w[\w.]*")


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split a Google, NumPy or Sphinx style docstring into its schema-relevant parts.

    The docstring is normalised with `inspect.cleandoc` first. Sections other than the
    parameter and return sections (raises, examples, notes, ...) are dropped. The parser
    is lenient and never raises: malformed input yields a best-effort result.

    Args:
        doc: The raw docstring, e.g. ``func.__doc__``; ``None`` is treated as empty.

    Returns:
        The parsed docstring; an empty `ParsedDocstring` for an empty or missing docstring.
    """
    if not isinstance(doc, str) or not doc.strip():
        return ParsedDocstring("", {}, None)
    try:
        return _parse(doc)
    except Exception:  # pragma: no cover - defensive; the parser is not expected to fail
        return ParsedDocstring(doc.strip(), {}, None)


class _Collector:
    """Mutable accumulator for the parts found while scanning a docstring."""

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.returns: str | None = None

    def add_param(self, name: str, description: str) -> None:
        name = _clean_name(name)
        description = description.strip()
        if not name or not description:
            return
        if not self.params.get(name):
            self.params[name] = description

    def set_returns(self, description: str) -> None:
        description = description.strip()
        if description and self.returns is None:
            self.returns = description


def _parse(doc: str) -> ParsedDocstring:
    text = inspect.cleandoc(doc)
    lines = [line.rstrip() for line in text.split("\n")]
    out = _Collector()
    description: list[str] = []
    removed_since_text = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and _indent(line) == 0:
            end = _try_section(lines, i, out)
            if end is not None:
                i = max(end, i + 1)
                removed_since_text = True
                continue
        if not line:
            # Do not let a removed section leave a double blank line behind.
            if removed_since_text and description and not description[-1]:
                i += 1
                continue
        else:
            removed_since_text = False
        description.append(line)
        i += 1
    return ParsedDocstring("\n".join(description).strip(), out.params, out.returns)


def _try_section(lines: list[str], i: int, out: _Collector) -> int | None:
    """Consume a section starting at ``lines[i]``; return the index after it, or None."""
    line = lines[i]

    # NumPy: a header line followed by a dashed underline.
    if _is_underlined(lines, i):
        kind = _NUMPY_SECTIONS.get(_normalise_header(line))
        if kind is None:
            return None  # An unknown heading is ordinary description text.
        end = _numpy_body_end(lines, i + 2)
        _handle_numpy(kind, lines[i + 2 : end], out)
        return end

    # Google: ``Args:`` on a line of its own, or ``Returns: text``.
    google = _google_header(line, first_line=i == 0)
    if google is not None:
        kind, inline = google
        end = _indented_block_end(lines, i + 1)
        _handle_google(kind, inline, lines[i + 1 : end], out)
        return end

    # Sphinx: ``:param name: text`` field lists.
    match = _SPHINX_FIELD_RE.fullmatch(line)
    if match is not None:
        words = match.group("name").split()
        kind = _SPHINX_FIELDS.get(words[0].lower()) if words else None
        if kind is None:
            return None
        end = _indented_block_end(lines, i + 1)
        body = " ".join([match.group("body") or "", *(s.strip() for s in lines[i + 1 : end])])
        body = _join_words(body)
        if kind == _PARAMS and len(words) >= 2:
            out.add_param(words[-1], body)
        elif kind == _RETURNS:
            out.set_returns(body)
        return end
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _normalise_header(text: str) -> str:
    return " ".join(text.split()).lower()


def _join_words(text: str) -> str:
    return " ".join(text.split())


def _clean_name(name: str) -> str:
    name = name.strip().replace("\\", "").lstrip("*").strip()
    return name if _NAME_RE.fullmatch(name) else ""


def _is_underlined(lines: list[str], i: int) -> bool:
    if i + 1 >= len(lines) or not lines[i].strip():
        return False
    below = lines[i + 1]
    return _indent(below) == 0 and _UNDERLINE_RE.fullmatch(below) is not None


def _google_header(line: str, *, first_line: bool) -> tuple[str, str] | None:
    """Return ``(kind, inline_text)`` if ``line`` opens a Google-style section."""
    match = _GOOGLE_HEADER_RE.fullmatch(line)
    if match is not None:
        kind = _GOOGLE_SECTIONS.get(_normalise_header(match.group(1)))
        return None if kind is None else (kind, "")
    if not first_line:
        inline = _GOOGLE_INLINE_RETURNS_RE.fullmatch(line)
        if inline is not None:
            return _RETURNS, inline.group(2)
    return None


def _indented_block_end(lines: list[str], start: int) -> int:
    """Index of the first non-blank, unindented line at or after ``start``."""
    j = start
    while j < len(lines) and (not lines[j] or _indent(lines[j]) > 0):
        j += 1
    return j


def _numpy_body_end(lines: list[str], start: int) -> int:
    """Index where a NumPy section body ends: the next heading of any style."""
    j = start
    while j < len(lines):
        line = lines[j]
        if line and _indent(line) == 0:
            if _is_underlined(lines, j):
                return j
            # ``Args:`` but not a NumPy entry such as ``kwargs :`` (space before the colon).
            if not line.endswith(" :") and _google_header(line, first_line=True) is not None:
                return j
        j += 1
    return j


def _block_entries(body: list[str]) -> list[tuple[str, list[str]]]:
    """Group a section body into ``(entry line, deeper-indented lines)`` pairs."""
    entries: list[tuple[str, list[str]]] = []
    base: int | None = None
    for line in body:
        if not line.strip():
            continue
        indent = _indent(line)
        if base is None:
            base = indent
        if indent <= base or not entries:
            entries.append((line.strip(), []))
        else:
            entries[-1][1].append(line.strip())
    return entries


def _handle_numpy(kind: str, body: list[str], out: _Collector) -> None:
    entries = _block_entries(body)
    if kind == _PARAMS:
        for head, rest in entries:
            names, _, _type = head.partition(":")
            text = " ".join(rest)
            for name in names.split(","):
                out.add_param(name, text)
    elif kind == _RETURNS:
        parts = [" ".join(rest) if rest else head for head, rest in entries]
        out.set_returns(_join_words(" ".join(parts)))


def _handle_google(kind: str, inline: str, body: list[str], out: _Collector) -> None:
    if kind == _RETURNS:
        out.set_returns(_join_words(" ".join([inline, *body])))
        return
    if kind != _PARAMS:
        return
    current: tuple[list[str], list[str]] | None = None
    entries: list[tuple[list[str], list[str]]] = []
    base: int | None = None
    for line in body:
        stripped = line.strip()
        if not stripped:
            continue
        indent = _indent(line)
        if base is None:
            base = indent
        parsed = _google_entry(stripped) if indent <= base else None
        if parsed is not None:
            current = (parsed[0], [parsed[1]])
            entries.append(current)
        elif current is not None:
            current[1].append(stripped)
    for names, text in entries:
        description = _join_words(" ".join(text))
        for name in names:
            out.add_param(name, description)


def _google_entry(text: str) -> tuple[list[str], str] | None:
    """Parse ``name: text`` / ``name (type): text`` into ``(names, text)``."""
    match = _GOOGLE_NAMES_RE.match(text)
    if match is None:
        return None
    pos = match.end()
    if pos < len(text) and text[pos] == "(":
        close = _matching_paren(text, pos)
        if close < 0:
            return None
        pos = close + 1
        while pos < len(text) and text[pos].isspace():
            pos += 1
    if pos >= len(text) or text[pos] != ":":
        return None
    return match.group(1).split(","), text[pos + 1 :].strip()


def _matching_paren(text: str, start: int) -> int:
    depth = 0
    for pos in range(start, len(text)):
        char = text[pos]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return pos
    return -1
