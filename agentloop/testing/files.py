"""The Files API of `MessagesServer`: uploads kept in memory, and the file sources using them.

`POST /v1/files` (multipart, as the SDK's `client.beta.files.upload` sends it), `GET
/v1/files`, `GET /v1/files/{id}` and `DELETE /v1/files/{id}` answer as the API does, each
under the Files beta header. A message request under that beta may use `file` sources;
one naming a file the server does not hold is refused with the API's 400 (`file_problem`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from agentloop.files import FILES_BETA

__all__ = ("FILES_PATH", "FileStore", "StoredFile", "file_problem", "files_answer")

FILES_PATH = "/v1/files"
"""The Files API's path; a file's own is `/v1/files/{id}`."""


@dataclass(frozen=True)
class StoredFile:
    """One uploaded file."""

    id: str
    filename: str
    mime_type: str
    data: bytes

    def metadata(self) -> dict[str, Any]:
        """The file as the API describes it."""
        return {
            "type": "file",
            "id": self.id,
            "filename": self.filename,
            "mime_type": self.mime_type,
            "size_bytes": len(self.data),
            "created_at": "2025-01-01T00:00:00Z",
            "downloadable": False,
        }


class FileStore:
    """The files a `MessagesServer` holds, by id (thread-safe: handlers run in threads)."""

    def __init__(self) -> None:
        """An empty store."""
        self._files: dict[str, StoredFile] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)

    def add(self, filename: str, mime_type: str, data: bytes) -> StoredFile:
        """Keep an uploaded file under a new id."""
        with self._lock:
            stored = StoredFile(f"file_{next(self._numbers):024d}", filename, mime_type, data)
            self._files[stored.id] = stored
        return stored

    def get(self, file_id: str) -> StoredFile | None:
        """The file `file_id`, or None."""
        with self._lock:
            return self._files.get(file_id)

    def remove(self, file_id: str) -> bool:
        """Delete `file_id`; whether it was there."""
        with self._lock:
            return self._files.pop(file_id, None) is not None

    def __iter__(self) -> Iterator[StoredFile]:
        with self._lock:
            return iter(list(self._files.values()))


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_local"}


def files_answer(
    store: FileStore,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    betas: Sequence[str],
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body answering one Files API request."""
    if FILES_BETA not in betas:
        message = f"the Files API requires the beta header 'anthropic-beta: {FILES_BETA}'"
        return 400, _error("invalid_request_error", message)
    if path == FILES_PATH and method == "POST":
        return _upload(store, headers.get("content-type", ""), body)
    if path == FILES_PATH and method == "GET":
        data = [f.metadata() for f in store]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return 200, {"data": data, "has_more": False, "first_id": first, "last_id": last}
    file_id = path.removeprefix(FILES_PATH + "/")
    found = store.get(file_id)
    if found is None or "/" in file_id:
        return 404, _error("not_found_error", f"File not found: {file_id}")
    if method == "DELETE":
        store.remove(file_id)
        return 200, {"type": "file_deleted", "id": file_id}
    return 200, found.metadata()


def _upload(store: FileStore, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """Keep the `file` part of a multipart upload."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    for part in message.iter_parts() if message.is_multipart() else ():
        if part.get_param("name", header="content-disposition") == "file":
            data = part.get_payload(decode=True)
            filename = part.get_filename() or "unnamed"
            if isinstance(data, bytes):
                stored = store.add(filename, part.get_content_type(), data)
                return 200, stored.metadata()
    return 400, _error("invalid_request_error", "file: a multipart `file` part is required")


def file_problem(body: Mapping[str, Any], store: FileStore) -> str | None:
    """Why the API would refuse a request's `file` sources (a file it does not hold)."""
    for where, file_id in _file_sources(body.get("messages") or [], "messages"):
        if store.get(file_id) is None:
            return f"{where}.source.file_id: File not found: {file_id}"
    return None


def _file_sources(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Each `file` source under `value` (a message list, a block, ...): path and file id."""
    if isinstance(value, Mapping):
        source = value.get("source")
        if isinstance(source, Mapping) and source.get("type") == "file":
            yield where, str(source.get("file_id"))
        if "content" in value:
            yield from _file_sources(value["content"], f"{where}.content")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _file_sources(item, f"{where}.{index}")
