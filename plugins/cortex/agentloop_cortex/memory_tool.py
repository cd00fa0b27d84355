"""Claude's memory tool (`memory_20250818`) over the persona's folder.

The Messages API defines the tool (the model is trained on its six commands: `view`,
`create`, `str_replace`, `insert`, `delete`, `rename`, on paths under `/memories`); the
application runs it. Here `/memories` is the persona's folder, so `/memories/memory.md`
is cortex's `memory.md`, and every command goes through a `MemoryStore`: atomic writes,
version history, size limits, and no path outside the folder (traversal, subfolders and
symlinks are refused). A refusal reaches the model as an `is_error` result saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from agentloop import RunContext, Tool, ToolError

from .config import config_from_deps
from .memory_store import MemoryStore
from .store import Change

__all__ = ("MEMORY_DIR", "MEMORY_TOOL", "MEMORY_TOOL_TYPE", "memory", "memory_file")

MEMORY_DIR: Final = "/memories"
"""The directory the model's paths start with: the persona's folder."""

MEMORY_TOOL_TYPE: Final = "memory_20250818"
"""The tool's `type` in a request: the API announces its own description and schema."""

_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert", "delete", "rename"],
        },
        "path": {"type": "string", "description": "A path under /memories."},
        "view_range": {"type": "array", "items": {"type": "integer"}},
        "file_text": {"type": "string"},
        "old_str": {"type": "string"},
        "new_str": {"type": "string"},
        "insert_line": {"type": "integer"},
        "insert_text": {"type": "string"},
        "old_path": {"type": "string"},
        "new_path": {"type": "string"},
    },
    "required": ["command"],
}
"""The commands' input, for a provider that announces the tool as a plain function."""


def memory_file(path: object) -> str | None:
    """The file of the persona folder that `path` names, or None for `/memories` itself.

    Raises:
        ToolError: `path` is not under `/memories`, climbs out of it, or names a subfolder.
    """
    if not isinstance(path, str):
        raise ToolError(f"path must be a string starting with {MEMORY_DIR}, not {path!r}")
    if path in (MEMORY_DIR, MEMORY_DIR + "/"):
        return None
    if not path.startswith(MEMORY_DIR + "/"):
        raise ToolError(f"The path must start with {MEMORY_DIR}, got: {path}")
    parts = path[len(MEMORY_DIR) + 1 :].split("/")
    if any(part in ("..", ".") for part in parts):
        raise ToolError(f"The path {path} would leave {MEMORY_DIR}: '.' and '..' are refused")
    if len(parts) > 1:
        raise ToolError(
            f"The path {path} names a subfolder; {MEMORY_DIR} holds files only "
            f"(use a name such as {MEMORY_DIR}/{'-'.join(p for p in parts if p)})"
        )
    return parts[0]


def memory(ctx: RunContext[Any], input: dict[str, Any]) -> str:
    """Run one memory tool command on the persona's folder and say what it did."""
    command = input.get("command")
    run = _COMMANDS.get(command) if isinstance(command, str) else None
    if run is None:
        raise ToolError(f"unknown command {command!r}: use one of {', '.join(_COMMANDS)}")
    store = MemoryStore(config_from_deps(getattr(ctx, "deps", None)))
    key = getattr(ctx, "idempotency_key", None)
    return run(store, input, key if isinstance(key, str) else None)


def _text(input: Mapping[str, Any], field: str) -> str:
    value = input.get(field)
    if not isinstance(value, str):
        raise ToolError(f"{field} must be text (a string), not {value!r}")
    return value


def _file(input: Mapping[str, Any], field: str = "path") -> str:
    name = memory_file(input.get(field))
    if name is None:
        raise ToolError(f"{field}: {MEMORY_DIR} is the folder itself; name a file in it")
    return name


def _existing(store: MemoryStore, input: Mapping[str, Any], field: str = "path") -> str:
    name = _file(input, field)
    if not store.exists(name):
        raise ToolError(f"The path {input[field]} does not exist. Please provide a valid path.")
    return name


def _kept(change: Change) -> str:
    return " The previous version was kept in the history." if change.kept_version else ""


def _view(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    name = memory_file(input.get("path"))
    if name is None:
        entries = store.entries()
        total = sum(e.size for e in entries)
        lines = [f"{_size(total)}\t{MEMORY_DIR}"]
        lines += [f"{_size(e.size)}\t{MEMORY_DIR}/{e.name}" for e in entries]
        return (
            f"Here're the files and directories up to 2 levels deep in {MEMORY_DIR}, "
            "excluding hidden items:\n" + "\n".join(lines)
        )
    name = _existing(store, input)
    lines = store.read(name).splitlines()
    first, last = _range(input.get("view_range"), len(lines))
    shown = [f"{n:6d}\t{line}" for n, line in enumerate(lines[first - 1 : last], start=first)]
    return f"Here's the content of {input['path']} with line numbers:\n" + "\n".join(shown)


def _range(given: object, count: int) -> tuple[int, int]:
    """The 1-based first and last lines `view_range` asks for (all lines without it)."""
    if given is None:
        return 1, count
    if (
        not isinstance(given, list)
        or len(given) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in given)
    ):
        raise ToolError(f"view_range must be [first, last] line numbers, not {given!r}")
    first, last = given
    last = count if last == -1 else last
    if not 1 <= first <= max(count, 1) or not first <= last <= count:
        raise ToolError(
            f"view_range {given} is outside the file's {count} lines: give [first, last] "
            f"with 1 <= first <= last <= {count} (last -1: to the end)"
        )
    return first, last


def _create(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    change = store.create(_file(input), _text(input, "file_text"), key=key)
    return f"File created successfully at: {input['path']} ({change.size} bytes)"


def _str_replace(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    name = _existing(store, input)
    change = store.replace(name, _text(input, "old_str"), _text(input, "new_str"), key=key)
    return f"The memory file {input['path']} has been edited.{_kept(change)}"


def _insert(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    name = _existing(store, input)
    line = input.get("insert_line")
    if isinstance(line, bool) or not isinstance(line, int):
        raise ToolError(f"insert_line must be a whole number, not {line!r}")
    change = store.insert(name, line, _text(input, "insert_text"), key=key)
    return f"The file {input['path']} has been edited.{_kept(change)}"


def _delete(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    if memory_file(input.get("path")) is None:
        raise ToolError(f"Cannot delete the {MEMORY_DIR} directory itself")
    change = store.delete(_existing(store, input))
    return f"Successfully deleted {input['path']}.{_kept(change)}"


def _rename(store: MemoryStore, input: Mapping[str, Any], key: str | None) -> str:
    old = _existing(store, input, "old_path")
    store.rename(old, _file(input, "new_path"))
    return f"Successfully renamed {input['old_path']} to {input['new_path']}"


def _size(size: int) -> str:
    """A size as a listing shows it: 512B, 1.5K, 2.0M."""
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}K"
    return f"{size / (1024 * 1024):.1f}M"


_COMMANDS: Final[dict[str, Callable[[MemoryStore, Mapping[str, Any], str | None], str]]] = {
    "view": _view,
    "create": _create,
    "str_replace": _str_replace,
    "insert": _insert,
    "delete": _delete,
    "rename": _rename,
}

MEMORY_TOOL = Tool(
    memory,
    name="memory",
    description=(
        f"Your memory folder, {MEMORY_DIR}: view it, and create, edit, delete and rename "
        "the files in it. They outlive this conversation: memory.md holds facts worth "
        "remembering, soul.md your identity and voice, relationship.md what you know about "
        "the person you talk with."
    ),
    input_schema=_SCHEMA,
)
"""The memory tool, announced as `{"type": "memory_20250818", "name": "memory"}`."""
MEMORY_TOOL.definition = replace(MEMORY_TOOL.definition, type=MEMORY_TOOL_TYPE)
