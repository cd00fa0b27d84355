"""Files for a run's prompt or a tool's result: uploaded once, then referred to by id.

`upload(client, path)` sends a local file to the Files API (the SDK's
`client.beta.files.upload`, under the Files beta) and returns an `UploadedFile`, whose
`block()` is the `ImageBlock` or `DocumentBlock` that refers to it. A request whose
history holds such a block needs the same beta: `Agent(params={"betas": [FILES_BETA]})`,
which is also what lets the history check accept `file` sources.
"""

from __future__ import annotations

import mimetypes
import os
from dataclasses import dataclass
from typing import Any

import anyio

from .errors import ConfigurationError
from .messages import DocumentBlock, ImageBlock

__all__ = ("FILES_BETA", "UploadedFile", "upload")

FILES_BETA = "files-api-2025-04-14"
"""The `anthropic-beta` header of the Files API and of requests using its files."""


@dataclass(frozen=True)
class UploadedFile:
    """A file the Files API holds: what its upload answered."""

    id: str
    """The file's id (`file_...`), for `file` sources."""
    filename: str
    """The name it was uploaded under."""
    mime_type: str
    """Its MIME type, as the API stored it."""
    size_bytes: int
    """Its size in bytes."""

    def block(
        self, *, title: str | None = None, citations: bool = False
    ) -> ImageBlock | DocumentBlock:
        """The block that refers to the file: an `ImageBlock` for an image, else a document.

        `title` and `citations` apply to a document (see `DocumentBlock.from_file_id`).
        """
        if self.mime_type.startswith("image/"):
            return ImageBlock.from_file_id(self.id)
        return DocumentBlock.from_file_id(self.id, title=title, citations=citations)


async def upload(
    client: Any, path: str | os.PathLike[str], *, mime_type: str | None = None
) -> UploadedFile:
    """Upload the file at `path` to the Files API, under the Files beta.

    Args:
        client: An `anthropic.AsyncAnthropic` (the one the agent sends with).
        path: The local file; it is read whole.
        mime_type: Its MIME type; by default guessed from its name (PDF, PNG, text, ...).

    Raises:
        ConfigurationError: the file cannot be read.
        ProviderError: the API refused the upload (the subclass its status stands for).
    """
    import anthropic

    from .providers.anthropic import translate_error

    local = anyio.Path(path)
    try:
        data = await local.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot upload {path}: {exc.strerror or exc}") from None
    kind = mime_type or mimetypes.guess_type(local.name)[0] or "application/octet-stream"
    try:
        stored = await client.beta.files.upload(file=(local.name, data, kind), betas=[FILES_BETA])
    except anthropic.APIError as exc:
        raise translate_error(exc) from exc
    return UploadedFile(stored.id, stored.filename, stored.mime_type, stored.size_bytes)
