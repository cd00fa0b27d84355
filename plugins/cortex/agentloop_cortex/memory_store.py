"""The persona folder as the memory tool sees it: any file in it, listed, created, removed.

`MemoryStore` is a `CortexStore` that reads and writes any plain file name in the
persona's directory (not only the three cortex files) and adds what the memory tool
needs besides: a listing, creating a new file, inserting lines, deleting and renaming.
Each change goes through the store's own steps (`_change` and `_commit`), so it is
atomic, serialised with every other writer, refuses symlinks and oversized content, and
keeps the previous version in the file's history, deleted files included.
"""

from __future__ import annotations

import os
import re
import stat
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Final

from agentloop import ToolError

from .files import check_entry
from .store import Change, CortexStore

__all__ = ("NAME_PATTERN", "Entry", "MemoryStore")

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
"""The file names a persona folder may hold: 1-128 ASCII letters, digits, '.', '_' or
'-', not starting with a dot (cortex keeps its own entries, all hidden, beside them)."""


@dataclass(frozen=True)
class Entry:
    """A file of the persona folder, as a listing shows it."""

    name: str
    size: int
    """Size in bytes."""


class MemoryStore(CortexStore):
    """Every plain file of one persona's folder, with cortex's safety and history."""

    def _name(self, filename: object) -> str:
        """`filename` if it is a plain file name of the folder (no path, not hidden)."""
        if isinstance(filename, str) and NAME_PATTERN.fullmatch(filename):
            return filename
        raise ToolError(
            f"invalid file name {filename!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "not starting with '.' (the folder has no subdirectories)"
        )

    def entries(self) -> list[Entry]:
        """The folder's files, by name (hidden entries and anything not a file left out)."""
        found: list[Entry] = []
        with self._os_errors("list", "."), ExitStack() as held:
            pfd = self._open_persona(create=False)
            if pfd is None:
                return []
            held.callback(os.close, pfd)
            for name in sorted(os.listdir(pfd)):
                if NAME_PATTERN.fullmatch(name) is None:
                    continue
                info = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    found.append(Entry(name, info.st_size))
        return found

    def exists(self, filename: str) -> bool:
        """Whether `filename` is a file of the folder; a symlink there is refused."""
        name = self._name(filename)
        with self._os_errors("look up", name), ExitStack() as held:
            pfd = self._open_persona(create=False)
            if pfd is None:
                return False
            held.callback(os.close, pfd)
            check_entry(pfd, name, "file", self._label(name))
            try:
                os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
        return True

    def create(self, filename: str, content: str, *, key: str | None = None) -> Change:
        """Make the new file `filename` hold `content`; an existing file is refused."""
        name = self._name(filename)
        data = self._encode(content, "file_text")
        self._check_size(name, len(data))

        def new(old: bytes | None) -> bytes:
            if old is not None:
                raise ToolError(f"{name} already exists: edit it, or delete it first")
            return data

        return self._change(name, new, key)

    def insert(self, filename: str, line: int, text: str, *, key: str | None = None) -> Change:
        """Insert `text` as whole lines after line `line` of `filename` (0: at the top)."""
        name = self._name(filename)
        self._encode(text, "insert_text")
        if isinstance(line, bool) or not isinstance(line, int):
            raise ToolError(f"insert_line must be a whole number, not {line!r}")

        def edit(old: bytes | None) -> bytes:
            if old is None:
                raise ToolError(f"{name} does not exist")
            try:
                lines = old.decode("utf-8").splitlines(keepends=True)
            except UnicodeDecodeError:
                raise ToolError(
                    f"{name} is not valid UTF-8, so lines cannot be inserted into it"
                ) from None
            if not 0 <= line <= len(lines):
                raise ToolError(
                    f"insert_line {line} is outside the file: it has {len(lines)} lines, "
                    f"so give 0 to {len(lines)}"
                )
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            added = text if text.endswith("\n") else text + "\n"
            return "".join([*lines[:line], added, *lines[line:]]).encode("utf-8")

        return self._change(name, edit, key)

    def delete(self, filename: str) -> Change:
        """Remove `filename`, keeping its content in its history (unless none is kept)."""
        name = self._name(filename)
        with self._os_errors("delete", name), ExitStack() as held:
            pfd = self._open_persona(create=False)
            if pfd is None:
                raise ToolError(f"{name} does not exist")
            held.callback(os.close, pfd)
            self._refuse_planted(pfd, name)
            held.enter_context(self._locked(pfd, name))
            self._refuse_planted(pfd, name)
            old = self._read_bytes(pfd, name)
            if old is None:
                raise ToolError(f"{name} does not exist")
            kept = self.config.history > 0
            self._commit(pfd, name, None, old if kept else None)
        return Change(name, 0, len(old), kept)

    def rename(self, old_name: str, new_name: str) -> Change:
        """Give the file `old_name` the name `new_name`, which must not exist yet.

        Both names' locks are held (in name order, so two renames cannot wait on each
        other), and the file is moved with one `rename`: it is never missing or doubled.
        Its history stays under the old name.
        """
        old, new = self._name(old_name), self._name(new_name)
        if old == new:
            raise ToolError(f"{old} already has that name")
        with self._os_errors("rename", old), ExitStack() as held:
            pfd = self._open_persona(create=False)
            if pfd is None:
                raise ToolError(f"{old} does not exist")
            held.callback(os.close, pfd)
            for name in sorted((old, new)):
                self._refuse_planted(pfd, name)
                held.enter_context(self._locked(pfd, name))
                self._refuse_planted(pfd, name)
            content = self._read_bytes(pfd, old)
            if content is None:
                raise ToolError(f"{old} does not exist")
            if self._read_bytes(pfd, new) is not None:
                raise ToolError(f"{new} already exists: delete it first, or pick another name")
            os.rename(old, new, src_dir_fd=pfd, dst_dir_fd=pfd)
            os.fsync(pfd)
        return Change(new, len(content), len(content), False)
