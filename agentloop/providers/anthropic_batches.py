"""The Message Batches API through the official SDK: send requests as one batch, collect them.

`agentloop.batches` hands this module each round's requests of its runs; it sends them
with `messages.batches.create` (the beta one when a request needs betas), polls
`retrieve` until the batch has ended, and reads the results file line by line as the
JSON the API wrote (through `with_streaming_response`), so each message's blocks are
kept verbatim, as `AnthropicProvider.complete` keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anthropic
import anyio
import httpx2

from agentloop import errors

from .anthropic import AnthropicProvider, _translate
from .base import ModelRequest, ModelResponse

__all__ = ("BatchAnswer", "BatchClient")

BatchAnswer = ModelResponse | errors.ProviderError
"""What one request of a batch came back as: its response, or why it has none."""


class BatchClient:
    """Sends and collects message batches with the client of an `AnthropicProvider`."""

    def __init__(self, provider: AnthropicProvider, *, poll_interval: float) -> None:
        """Batches of `provider`'s requests; their status read every `poll_interval` s."""
        self.provider = provider
        self.poll_interval = poll_interval
        # Typed loosely: of the SDK's clients, the first-party one has batches (checked
        # by `agentloop.batches.run_batch`), the Bedrock and Vertex AI ones have none.
        self.client: Any = provider.client

    async def send(self, requests: Mapping[str, ModelRequest]) -> str:
        """Send `requests` (by custom id) as one batch; return its id.

        Raises:
            ProviderError: the API refused the batch.
        """
        entries, betas = [], set()
        for custom_id, request in requests.items():
            params, needed = self.provider.batch_entry(request)
            entries.append({"custom_id": custom_id, "params": params})
            betas.update(needed)
        client = self.client
        try:
            if betas:
                batch = await client.beta.messages.batches.create(
                    requests=entries, betas=sorted(betas)
                )
            else:
                batch = await client.messages.batches.create(requests=entries)
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        return str(batch.id)

    async def collect(self, batch_id: str) -> dict[str, BatchAnswer]:
        """Wait until batch `batch_id` has ended; its answers by custom id.

        Raises:
            ProviderError: the API failed to report the batch or its results.
        """
        batches = self.client.messages.batches
        try:
            # The API has no way to wait on a batch: ask again every `poll_interval`.
            while True:
                batch = await batches.retrieve(batch_id)
                if batch.processing_status == "ended":
                    break
                await anyio.sleep(self.poll_interval)
            answers: dict[str, BatchAnswer] = {}
            async with batches.with_streaming_response.results(batch_id) as lines:
                async for line in lines.iter_lines():
                    if line.strip():
                        item = json.loads(line)
                        answers[item["custom_id"]] = _answer(item["result"])
        except anthropic.APIError as exc:
            raise _translate(exc) from exc
        except httpx2.TransportError as exc:
            raise errors.APIConnectionError(f"a batch's results were cut short: {exc!r}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.InvalidResponseError(
                f"the batch's results cannot be read: {exc!r}"
            ) from exc
        return answers

    async def cancel(self, batch_id: str) -> None:
        """Ask the API to cancel batch `batch_id` (its requests not yet done are not billed)."""
        try:
            await self.client.messages.batches.cancel(batch_id)
        except anthropic.APIError as exc:
            raise _translate(exc) from exc


def _answer(result: Mapping[str, object]) -> BatchAnswer:
    """One results line's `result`: the message, or the error it stands for."""
    kind = result.get("type")
    if kind == "succeeded" and isinstance(result.get("message"), Mapping):
        return ModelResponse.from_wire(result["message"])
    if kind == "errored":
        body = result.get("error")
        return errors.api_error(None, body, message=json.dumps(body))
    return errors.BatchRequestError(f"the batch's request was {kind}: it has no response")
