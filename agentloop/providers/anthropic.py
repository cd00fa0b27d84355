"""The Anthropic provider: a `ModelRequest` sent through the official `AsyncAnthropic` client.

The client is the user's (base_url, retries, headers, timeouts stay theirs). Responses are
read as the JSON the API sent, so blocks keep every field verbatim; SDK exceptions become
typed agentloop errors with the SDK exception as `__cause__`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import anthropic

from agentloop import errors

from .base import ModelRequest, ModelResponse

__all__ = ("AnthropicProvider",)

_CREATE_PARAMS = frozenset(
    inspect.signature(anthropic.resources.messages.AsyncMessages.create).parameters
) - {"self"}


class AnthropicProvider:
    """Sends requests to the Anthropic Messages API with `AsyncAnthropic`.

    Request fields that `messages.create` does not take as parameters (for example
    `temperature` in SDK 2.x) are sent through `extra_body`.
    """

    def __init__(
        self,
        client: anthropic.AsyncAnthropic | None = None,
        *,
        stream: bool = False,
        **client_options: Any,
    ) -> None:
        """Create a provider.

        Args:
            client: The client to use; by default one is made from `client_options` and
                the environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
            stream: Receive each response as a stream (`messages.stream`) and return the
                accumulated message, instead of one JSON body.
            **client_options: Passed to `AsyncAnthropic(...)` when no client is given.
        """
        self.client = client if client is not None else anthropic.AsyncAnthropic(**client_options)
        self.stream = stream

    def _check_credentials(self) -> None:
        client = self.client
        headers = {k.lower() for k in getattr(client, "_custom_headers", {}) or {}}
        if (
            client.api_key
            or client.auth_token
            or getattr(client, "credentials", None) is not None
            or "x-api-key" in headers
            or "authorization" in headers
        ):
            return
        raise errors.MissingAPIKeyError(
            "No Anthropic API key: set ANTHROPIC_API_KEY, or pass "
            "client=AsyncAnthropic(api_key=...). (No request was sent.)"
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the response; API failures raise `ProviderError`s."""
        self._check_credentials()
        params = _sdk_params(request.to_wire())
        try:
            if self.stream:
                async with self.client.messages.stream(**params) as stream:
                    message = await stream.get_final_message()
                body: Mapping[str, Any] = message.to_dict(mode="json", warnings=False)
            else:
                raw = await self.client.messages.with_raw_response.create(**params)
                body = await raw.json()
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        if not isinstance(body, Mapping):
            raise errors.ProviderError(f"unexpected response body: {body!r}"[:300])
        return ModelResponse.from_wire(body)


def _sdk_params(body: dict[str, Any]) -> dict[str, Any]:
    extra = {k: body.pop(k) for k in list(body) if k not in _CREATE_PARAMS}
    if extra:
        body["extra_body"] = {**extra, **(body.get("extra_body") or {})}
    return body


def _translate(exc: anthropic.APIError) -> errors.ProviderError:
    """The agentloop error for an SDK error."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status_code", None)
    request_id = getattr(exc, "request_id", None)
    detail = _error_message(body) or str(exc)
    kind = _error_type(body)
    cls: type[errors.ProviderError]
    if isinstance(exc, anthropic.APIConnectionError):
        cls = errors.APIConnectionError
        detail = f"could not reach the Anthropic API: {exc}"
    elif "credit balance" in detail.lower() or kind == "billing_error" or status == 402:
        cls = errors.CreditBalanceError
        detail = f"credit balance exhausted: {detail}"
    elif status in (401, 403):
        cls = errors.AuthenticationError
    elif status == 429:
        cls = errors.RateLimitError
    elif status == 529 or kind == "overloaded_error":
        cls = errors.OverloadedError
    elif status == 400:
        cls = errors.BadRequestError
    elif status is not None and status >= 500:
        cls = errors.ServerError
    else:
        cls = errors.ProviderError
    prefix = f"{status} {kind}: " if status else ""
    return cls(f"{prefix}{detail}", status_code=status, request_id=request_id, body=body)


def _error_message(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
    return ""


def _error_type(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("type"), str):
            return str(error["type"])
    return "error"
