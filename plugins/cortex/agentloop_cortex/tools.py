"""The cortex tools the model calls: read, write, append to and edit its persona files.

Each tool finds its `CortexConfig` in the run's `deps` (see `config_from_deps`) and works
through a `CortexStore`; whatever the store refuses reaches the model as an `is_error`
result with the store's message.
"""

from __future__ import annotations

from typing import Any

from agentloop import RunContext, tool

from .config import config_from_deps
from .store import Change, CortexFile, CortexStore

__all__ = ("TOOLS", "append_file", "read_file", "replace_in_file", "write_file")


def _store(ctx: RunContext[Any]) -> CortexStore:
    # A tool may also be called as a plain function, with whatever `ctx` the caller has.
    return CortexStore(config_from_deps(getattr(ctx, "deps", None)))


def _key(ctx: RunContext[Any]) -> str | None:
    """The call's idempotency key: a retried or resumed call changes a file only once."""
    key = getattr(ctx, "idempotency_key", None)
    return key if isinstance(key, str) else None


def _kept(change: Change) -> str:
    if change.kept_version:
        return f" The previous version ({change.previous_size} bytes) was kept in the history."
    return ""


@tool
def read_file(filename: CortexFile, ctx: RunContext[Any]) -> str:
    """Read one of your persistent files and return its whole text.

    Your files outlive this conversation: memory.md holds facts and events worth
    remembering, soul.md your identity, values and voice, relationship.md what you know
    about the person you talk with and how you relate. A file that was never written
    reads as an empty document.

    Args:
        filename: Which file to read: "memory.md", "soul.md" or "relationship.md".
        ctx: The run's context (injected by agentloop, not part of the schema).
    """
    return _store(ctx).read(filename)


@tool
def write_file(filename: CortexFile, content: str, ctx: RunContext[Any]) -> str:
    """Replace the whole text of one of your persistent files.

    Everything in the file is replaced by `content`, so include what you want to keep;
    for small changes prefer append_file or replace_in_file. The previous version is kept
    in a bounded history. Files are limited in size (the error says the limit).

    Args:
        filename: Which file to write: "memory.md", "soul.md" or "relationship.md".
        content: The complete new text of the file (Markdown).
        ctx: The run's context (injected by agentloop, not part of the schema).
    """
    change = _store(ctx).write(filename, content, key=_key(ctx))
    return f"Wrote {change.size} bytes to {change.filename}.{_kept(change)}"


@tool
def append_file(filename: CortexFile, content: str, ctx: RunContext[Any]) -> str:
    """Add text at the end of one of your persistent files, creating it if needed.

    The text is added exactly as given: start it with a newline if it should begin on a
    new line. The previous version is kept in a bounded history.

    Args:
        filename: Which file to extend: "memory.md", "soul.md" or "relationship.md".
        content: The text to add at the end of the file.
        ctx: The run's context (injected by agentloop, not part of the schema).
    """
    change = _store(ctx).append(filename, content, key=_key(ctx))
    return (
        f"Appended {change.size - (change.previous_size or 0)} bytes to {change.filename} "
        f"(now {change.size} bytes).{_kept(change)}"
    )


@tool
def replace_in_file(filename: CortexFile, old: str, new: str, ctx: RunContext[Any]) -> str:
    """Replace one passage of one of your persistent files with new text.

    `old` must occur exactly once in the file (copy it exactly from read_file, with
    enough surrounding text to make it unique); otherwise nothing changes and the error
    says how many times it occurs. Use an empty `new` to delete the passage. The previous
    version is kept in a bounded history.

    Args:
        filename: Which file to edit: "memory.md", "soul.md" or "relationship.md".
        old: The exact text to replace; must occur exactly once in the file.
        new: The text to put in its place (may be empty).
        ctx: The run's context (injected by agentloop, not part of the schema).
    """
    change = _store(ctx).replace(filename, old, new, key=_key(ctx))
    return f"Replaced 1 passage in {change.filename} (now {change.size} bytes).{_kept(change)}"


TOOLS = (read_file, write_file, append_file, replace_in_file)
"""Every cortex tool, in the order they are registered."""
