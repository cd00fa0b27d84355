"""The Message Batches API of `MessagesServer`: `/v1/messages/batches` and its results.

A batch posted to `POST /v1/messages/batches` is answered from the server's script at
once, each request in turn as `POST /v1/messages` would be (a `Fault` becomes an
`errored` result, a request the linter refuses an `invalid_request_error`), and its
usage says `service_tier: "batch"`. The batch then stays `in_progress` for the server's
`batch_delay` seconds, as a real one waits its turn; `GET .../{id}` reports it,
`GET .../{id}/results` serves its JSONL once it has ended, and `POST .../{id}/cancel`
ends it at once with every result `canceled`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from agentloop.errors import AgentloopError

from .scripted import Fault, ScriptedModel

if TYPE_CHECKING:
    from .http import RecordedRequest, ScriptedHandler

__all__ = ("BATCHES_PATH", "Batch", "BatchQueue", "answer_batch", "batch_route", "results_file")

BATCHES_PATH = "/v1/messages/batches"
"""Where batches are created (`POST`); a batch's own paths are under it."""

_ROUTE = re.compile(r"/v1/messages/batches(?:/(?P<id>[^/]+)(?:/(?P<action>results|cancel))?)?")


def batch_route(path: str) -> tuple[str | None, str | None] | None:
    """`(batch id, "results" | "cancel" | None)` for a batch path, or None for another path."""
    found = _ROUTE.fullmatch(path)
    return None if found is None else (found["id"], found["action"])


@dataclass
class Batch:
    """One batch: its requests' answers, when it was made, and whether it was cancelled."""

    id: str
    results: list[dict[str, Any]]
    """A JSONL line of the results for each request, in the order they came."""
    created: float
    ready: float
    """When (`time.monotonic()`) processing ends, unless it is cancelled first."""
    cancelled: float | None = None
    made_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def ended(self, now: float) -> bool:
        """Whether processing has ended (done, or cancelled)."""
        return self.cancelled is not None or now >= self.ready

    def lines(self) -> list[dict[str, Any]]:
        """The results file: a cancelled batch's requests are all `canceled`."""
        if self.cancelled is None:
            return self.results
        return [{"custom_id": r["custom_id"], "result": {"type": "canceled"}} for r in self.results]

    def body(self, base_url: str, now: float) -> dict[str, Any]:
        """The `message_batch` object the API reports at `now`."""
        ended = self.ended(now)
        kinds = [line["result"]["type"] for line in self.lines()]
        counts = {k: kinds.count(k) if ended else 0 for k in ("succeeded", "errored", "canceled")}
        at = self.made_at.isoformat().replace("+00:00", "Z")
        return {
            "type": "message_batch",
            "id": self.id,
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {**counts, "expired": 0, "processing": 0 if ended else len(kinds)},
            "created_at": at,
            "expires_at": (self.made_at + timedelta(hours=24)).isoformat().replace("+00:00", "Z"),
            "ended_at": at if ended else None,
            "cancel_initiated_at": at if self.cancelled is not None else None,
            "archived_at": None,
            "results_url": f"{base_url}{BATCHES_PATH}/{self.id}/results" if ended else None,
        }


class BatchQueue:
    """The batches a `MessagesServer` holds, answered from its script (thread-safe)."""

    def __init__(self, delay: float = 0.0) -> None:
        """Hold batches that each stay `in_progress` for `delay` seconds."""
        self.delay = delay
        """Seconds a batch stays `in_progress` before its results are ready."""
        self.batches: dict[str, Batch] = {}
        """Every batch made, by id."""
        self._lock = threading.Lock()

    def create(self, model: ScriptedModel, body: Mapping[str, Any]) -> Batch:
        """A new batch of `body["requests"]`, each answered from `model` now.

        Raises:
            ValueError: the body is not a list of `{custom_id, params}` with unique ids.
        """
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise ValueError("requests: a non-empty list is required")
        ids = [r.get("custom_id") if isinstance(r, Mapping) else None for r in requests]
        if any(not isinstance(i, str) for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("requests: each needs a unique custom_id")
        with self._lock:  # one batch's answers come from the script in order
            results = [_result(model, r["custom_id"], r.get("params")) for r in requests]
            now = time.monotonic()
            batch = Batch(f"msgbatch_{len(self.batches) + 1:04d}", results, now, now + self.delay)
            self.batches[batch.id] = batch
        return batch

    def finish(self) -> None:
        """End every batch still in progress now, as if its turn had come (for tests)."""
        with self._lock:
            now = time.monotonic()
            for batch in self.batches.values():
                batch.ready = min(batch.ready, now)

    def cancel(self, batch_id: str) -> Batch | None:
        """End the batch `batch_id` now, if it is still in progress; None if unknown."""
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is not None and not batch.ended(time.monotonic()):
                batch.cancelled = time.monotonic()
            return batch


def _result(model: ScriptedModel, custom_id: str, params: Any) -> dict[str, Any]:
    """The results line of one request, answered from `model`."""
    if not isinstance(params, Mapping):
        return _errored(custom_id, "invalid_request_error", "params: an object is required")
    try:
        answer = model.respond({**params, "stream": False})
    except AgentloopError as exc:
        return _errored(custom_id, "invalid_request_error", str(exc))
    if isinstance(answer, Fault):
        error = answer.error_body["error"]
        return _errored(custom_id, error["type"], error["message"])
    if not isinstance(answer, dict):  # a paced or raw answer: its message, if it has one
        answer = dict(getattr(answer, "message", None) or getattr(answer, "json", {}))
    usage = {**(answer.get("usage") or {}), "service_tier": "batch"}
    message = {**answer, "usage": usage}
    return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}


def _errored(custom_id: str, kind: str, message: str) -> dict[str, Any]:
    error = {"type": "error", "error": {"type": kind, "message": message}, "request_id": None}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": error}}


def results_file(batch: Batch) -> bytes:
    """The batch's results as the `.jsonl` file the API serves."""
    return "".join(json.dumps(line) + "\n" for line in batch.lines()).encode()


def answer_batch(handler: ScriptedHandler, queue: BatchQueue, seen: RecordedRequest) -> None:
    """Answer a request to a batch path (`seen.body` is None for a `GET`)."""
    owner = handler.server.owner
    route = batch_route(seen.path)
    assert route is not None
    batch_id, action = route
    posted = seen.body is not None
    if batch_id is None and posted:
        try:
            batch = queue.create(owner.model, seen.body)
        except ValueError as exc:
            handler._json(400, _error("invalid_request_error", str(exc)))
            return
        handler._json(200, batch.body(owner.base_url, time.monotonic()))
        return
    found = queue.batches.get(batch_id or "")
    if found is None or posted != (action == "cancel"):
        handler._json(404, _error("not_found_error", f"no batch at {seen.path}"))
        return
    if action == "cancel":
        found = queue.cancel(found.id) or found
    now = time.monotonic()
    if action == "results":
        if not found.ended(now):
            handler._json(400, _error("invalid_request_error", "the batch is still in progress"))
        else:
            handler._send(200, results_file(found), "application/x-jsonl")
        return
    handler._json(200, found.body(owner.base_url, now))


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_local"}
