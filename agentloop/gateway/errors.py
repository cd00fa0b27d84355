"""How the gateway answers what goes wrong, in the API's error shape.

`Refusal` is a request refused before any upstream request; `answer_failure` maps a failed run
to its answer (the upstream's own error where there is one, its message withheld when the
request it refused carried hidden turns); `store_failure` turns a session store failure
into the API's `api_error`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from agentloop._wire import compact_json
from agentloop.errors import ConfigurationError, HistoryError, MissingAPIKeyError, ProviderError
from agentloop.logs import get_logger

from .upstream import client_headers

if (
    TYPE_CHECKING
):  # the server's dependencies: `agentloop serve` and `agentloop tools` work without them
    from starlette.responses import Response

__all__ = (
    "HIDDEN_ERROR",
    "Failure",
    "Refusal",
    "StoreUnavailable",
    "answer_failure",
    "error_body",
    "json_answer",
    "store_failure",
)

_log = get_logger()


class Refusal(Exception):
    """A request answered with an API error before any upstream request."""

    def __init__(
        self, status: int, kind: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.details = details


def error_body(kind: str, message: str, request_id: str, details: Any = None) -> dict[str, Any]:
    """The API's error body: `{"type": "error", "error": {...}, "request_id": ...}`."""
    error: dict[str, Any] = {"type": kind, "message": message}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error, "request_id": request_id}


def json_answer(
    status: int, data: Any, request_id: str, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON answer whose `request-id` header is `request_id` (unless `headers` say)."""
    from starlette.responses import Response

    return Response(
        compact_json(data),
        status,
        headers={"request-id": request_id, **(headers or {})},
        media_type="application/json",
    )


_STATUS_OF = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}


@dataclass(frozen=True)
class Failure:
    """How a failed run is answered: status, body and headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


HIDDEN_ERROR = (
    "the upstream refused a request that carried turns this gateway keeps from the client; "
    "its message is withheld (see the gateway's logs under this request id)"
)
"""The message of an upstream error in a hidden round, in place of the upstream's own."""


def answer_failure(exc: Exception, request_id: str, *, hidden: bool = False) -> Failure:
    """How a failed run is answered: with the upstream's own error where there is one.

    An upstream error keeps the headers clients read from its answer
    (`ProviderError.headers`: retry advice, rate limits). When `hidden`, the failed
    request carried what the client must not see (the gateway's calls and results), and
    an upstream message may quote it: the message is replaced by `HIDDEN_ERROR`, its
    status and type kept (the original is logged).
    """
    if isinstance(exc, MissingAPIKeyError):
        body = error_body("authentication_error", "x-api-key header is required", request_id)
        return Failure(401, body, {})
    if isinstance(exc, ProviderError):
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            # The upstream's answer, unchanged (an error event inside a stream has no
            # status of its own: it gets the one its type has).
            status = exc.status_code or _STATUS_OF.get(body["error"].get("type"), 500)
            if hidden:
                _log.info("gateway.upstream_error_withheld", request_id=request_id, error=body)
                body = {**body, "error": {**body["error"], "message": HIDDEN_ERROR}}
                body["error"].pop("details", None)
            headers = client_headers(exc.headers)
            if isinstance(body.get("request_id"), str):  # the id the body names, in both
                headers["request-id"] = body["request_id"]
            return Failure(status, body, headers)
        # An HTTP answer's own text may quote the request; a connection error cannot.
        quoted = hidden and exc.status_code is not None
        message = HIDDEN_ERROR if quoted else f"upstream request failed: {exc}"
        return Failure(502, error_body("api_error", message, request_id), {})
    if isinstance(exc, (HistoryError, ConfigurationError)):
        return Failure(400, error_body("invalid_request_error", str(exc), request_id), {})
    if isinstance(exc, StoreUnavailable):
        _log.error("gateway.store_failed", error=str(exc))
        return Failure(500, error_body("api_error", str(exc), request_id), {})
    _log.error("gateway.internal_error", error=repr(exc), exc_info=exc)
    return Failure(500, error_body("api_error", "internal gateway error", request_id), {})


class StoreUnavailable(Exception):
    """A store (the session store, the durable runs' database) did not answer in time.

    Answered as the API answers its own failures: a 500 `api_error`, which clients retry.
    """


@contextmanager
def store_failure(doing: str, *, within: float = math.inf) -> Iterator[None]:
    """Answer a store failure as the API answers its own failures: a 500 `api_error`.

    A store that does not answer `within` seconds has failed too.
    """
    try:
        with anyio.fail_after(within):
            yield
    except TimeoutError as exc:
        _log.error("gateway.store_failed", doing=doing, error=f"no answer in {within:g} s")
        message = f"the session store did not answer within {within:g} seconds while {doing}"
        raise Refusal(500, "api_error", message) from exc
    except Exception as exc:
        _log.error("gateway.store_failed", doing=doing, error=repr(exc))
        raise Refusal(500, "api_error", f"the session store failed while {doing}") from exc
