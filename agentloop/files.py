"""Files for a run's prompt or a tool's result: uploaded once, then referred to by id.

`upload(client, path)` sends a local file to the Files API (the SDK's
`client.beta.files.upload`, under the Files beta) and returns an `UploadedFile`, whose
`block()` is the `ImageBlock` or `DocumentBlock` that refers to it. A request whose
history holds such a block needs the same beta: `files_params` adds it to the request
(`request.build_request`), so nobody has to remember `betas=`.
"""

from __future__ import annotations

import mimetypes
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from .errors import ConfigurationError
from .messages import ContentBlock, DocumentBlock, ImageBlock, Message, ToolResultBlock

__all__ = ("FILES_BETA", "UploadedFile", "files_params", "upload")

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


def files_params(messages: Sequence[Message], params: Mapping[str, Any]) -> Mapping[str, Any]:
    """A request's `params`, with the Files beta added when `messages` refer to a file.

    `params` is returned as it is when no block has a `file` source, or when it names
    the beta already (in `betas` or an `anthropic-beta` header).
    """
    # Kept with each message, so a long history is read once, not every round.
    if not any(m.converted(_FILES_KEY, _holds_a_file) for m in messages):
        return params
    headers = params.get("extra_headers") or {}
    given = params.get("betas") or ()
    betas = [given] if isinstance(given, str) else list(given)
    if any("files-api" in str(b) for b in [headers.get("anthropic-beta", ""), *betas]):
        return params
    return {**params, "betas": [*betas, FILES_BETA]}


_FILES_KEY = ("agentloop.refers-to-a-file",)


def _holds_a_file(message: Message) -> bool:
    return not isinstance(message.content, str) and _refers_to_a_file(message.content)


def _refers_to_a_file(blocks: Iterable[ContentBlock]) -> bool:
    for block in blocks:
        if isinstance(block, ToolResultBlock) and not isinstance(block.content, str):
            if _refers_to_a_file(block.content):
                return True
        source = getattr(block, "source", None)
        if isinstance(source, dict) and source.get("type") == "file":
            return True
    return False
