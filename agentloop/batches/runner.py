"""Many runs driven together, each round's model requests sent as one message batch.

`run_batch` starts a run of the agent for each prompt. A run's model request does not go
out on its own: its `Effects` hand it to the job's `_Rounds`, which waits until every
run still going has its next request ready (or has ended), sends those requests as one
batch (`agentloop.providers.anthropic_batches`), polls it, and hands each run its
response. Tool calls run here, as in any run; the next round's batch follows. A batch's
responses carry `service_tier: "batch"`, so each run's cost is at the batch rate.

Every response and tool result is recorded in a `BatchStore`, with each batch's id
while it is pending. Started again with the same job and store after a crash, each run
replays from its records (a recorded call is not run again), and a request already in a
pending batch waits for that batch rather than going out again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from agentloop.calls import ToolCall, ToolResult
from agentloop.errors import AgentloopError, ConfigurationError, ProviderError
from agentloop.messages import ContentBlock
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.result import RunResult

from .store import BatchStore

if TYPE_CHECKING:
    from agentloop.effects import OnEvent, Send
    from agentloop.providers.anthropic_batches import BatchClient
    from agentloop.providers.base import Provider
    from agentloop.run import Run

__all__ = ("BatchOutcome", "run_batch")

Prompt = str | Sequence[ContentBlock] | None
"""A run's prompt, as `Agent.start` takes it."""

BatchOutcome = RunResult[Any] | AgentloopError
"""What one run of a batch job ended with: its result, or the error that ended it (whose
`.result`, when it has one, holds the partial run)."""


async def run_batch(
    start: Callable[..., Run[Any]],
    provider: Provider,
    prompts: Sequence[Prompt],
    *,
    job: str = "batch",
    store: BatchStore | None = None,
    poll_interval: float = 30.0,
    **options: Any,
) -> list[BatchOutcome]:
    """A run made by `start` (`Agent.start`) for each prompt; batches sent by `provider`.

    Each round's requests go as one message batch. See `Agent.run_batch`, which
    documents the other arguments.
    """
    from agentloop.providers.anthropic import AnthropicProvider
    from agentloop.providers.anthropic_batches import BatchClient

    if not isinstance(provider, AnthropicProvider):
        raise ConfigurationError(
            f"run_batch sends message batches, which {type(provider).__name__} cannot: "
            "it needs the Anthropic provider"
        )
    if not hasattr(provider.client.messages, "batches"):
        raise ConfigurationError(f"{type(provider.client).__name__} has no message batches")
    if not poll_interval > 0:
        raise ConfigurationError(f"poll_interval must be > 0 seconds, not {poll_interval!r}")
    refused = sorted({"stream", "effects", "run_id", "on_event"} & set(options))
    if refused:
        raise ConfigurationError(f"run_batch sets {', '.join(refused)} itself")
    store = store if store is not None else BatchStore()
    records = await store.effects(job)
    rounds = _Rounds(
        BatchClient(provider, poll_interval=poll_interval),
        store,
        job,
        live=len(prompts),
        pending=await store.pending(job),
    )
    outcomes: list[BatchOutcome | None] = [None] * len(prompts)

    async def drive(index: int, prompt: Prompt) -> None:
        effects = _RunEffects(rounds, index, records.get(index, {}))
        try:
            run = start(prompt, stream=False, effects=effects, run_id=f"{job}-{index}", **options)
            async with run:
                pass
            outcomes[index] = run.result
        except AgentloopError as exc:
            outcomes[index] = exc
        finally:
            rounds.ended()

    async with anyio.create_task_group() as group:
        rounds.group = group
        for index, prompt in enumerate(prompts):
            group.start_soon(drive, index, prompt)
    return [outcome for outcome in outcomes if outcome is not None]


@dataclass
class _Ask:
    """One run's request waiting for the batch that answers it."""

    request: ModelRequest
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: ModelResponse | ProviderError | None = None


class _Rounds:
    """The job's rounds: collects the live runs' requests, sends and collects batches."""

    def __init__(
        self,
        client: BatchClient,
        store: BatchStore,
        job: str,
        *,
        live: int,
        pending: dict[str, str],
    ) -> None:
        self.client = client
        self.store = store
        self.job = job
        self.live = live
        self.pending = pending  # custom id -> the id of the batch it was sent in
        self.asks: dict[str, _Ask] = {}
        self.group: anyio.abc.TaskGroup | None = None

    async def ask(self, custom_id: str, request: ModelRequest) -> ModelResponse:
        """The response to one run's request, once its batch has been collected."""
        ask = self.asks[custom_id] = _Ask(request)
        self._send_when_ready()
        await ask.done.wait()
        assert ask.answer is not None
        if isinstance(ask.answer, ProviderError):
            raise ask.answer
        return ask.answer

    def ended(self) -> None:
        """A run has ended: it no longer holds the next batch back."""
        self.live -= 1
        self._send_when_ready()

    def _send_when_ready(self) -> None:
        """Once every live run waits, send the new requests; wait for the pending batches."""
        if not self.asks or len(self.asks) < self.live:
            return
        asks, self.asks = self.asks, {}
        assert self.group is not None
        by_batch: dict[str | None, dict[str, _Ask]] = {}
        for custom_id, ask in asks.items():
            by_batch.setdefault(self.pending.get(custom_id), {})[custom_id] = ask
        for batch_id, batch_asks in by_batch.items():
            self.group.start_soon(self._answer, batch_id, batch_asks)

    async def _answer(self, batch_id: str | None, asks: dict[str, _Ask]) -> None:
        """Send `asks` as a new batch (no `batch_id`) or wait for theirs; answer each."""
        answers: dict[str, ModelResponse | ProviderError] = {}
        try:
            if batch_id is None:
                batch_id = await self.client.send({i: a.request for i, a in asks.items()})
                await self.store.sent(self.job, batch_id, asks)
            answers = {i: _batched(a) for i, a in (await self._collect(batch_id)).items()}
        except ProviderError as exc:
            answers = dict.fromkeys(asks, exc)
        if batch_id is not None:
            effects = [
                (*_parse(custom_id), answer.to_json())
                for custom_id, answer in answers.items()
                if isinstance(answer, ModelResponse)
            ]
            await self.store.collected(self.job, batch_id, effects)
        for custom_id, ask in asks.items():
            missing = ProviderError(f"the batch has no result for {custom_id}")
            ask.answer = answers.get(custom_id, missing)
            ask.done.set()

    async def _collect(self, batch_id: str) -> dict[str, ModelResponse | ProviderError]:
        """The batch's answers; a batch nothing will pick up again is cancelled if left."""
        try:
            return await self.client.collect(batch_id)
        except BaseException:
            if not self.store.durable:
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self.client.cancel(batch_id)
            raise


class _RunEffects:
    """One run's effects: its model requests go to the job's rounds; all are recorded."""

    def __init__(self, rounds: _Rounds, index: int, records: dict[str, dict[str, Any]]) -> None:
        self.rounds = rounds
        self.index = index
        self.records = records

    async def model(
        self, request: ModelRequest, round_: int, send: Send, stream: OnEvent | None
    ) -> ModelResponse:
        """The recorded response of round `round_`, or the one its batch brings."""
        recorded = self.records.get(f"model:{round_}")
        if recorded is not None:
            return ModelResponse.from_json(recorded)
        return await self.rounds.ask(f"run-{self.index}-round-{round_}", request)

    async def tool(
        self, call: ToolCall, round_: int, run: Callable[[], Awaitable[ToolResult]]
    ) -> ToolResult:
        """The recorded result of `call`, or its result now (then recorded)."""
        recorded = self.records.get(f"tool:{call.id}")
        if recorded is not None:
            return ToolResult.from_json(recorded)
        result = await run()
        await self.rounds.store.record(
            self.rounds.job, (self.index, f"tool:{call.id}", result.to_json())
        )
        return result


def _parse(custom_id: str) -> tuple[int, str]:
    """The run index and record key of a custom id `run-{index}-round-{round}`."""
    _, index, _, round_ = custom_id.split("-")
    return int(index), f"model:{round_}"


def _batched(answer: ModelResponse | ProviderError) -> ModelResponse | ProviderError:
    """A batch's response, counted as a batched request whatever its usage says."""
    if isinstance(answer, ProviderError):
        return answer
    return replace(answer, usage=replace(answer.usage, batch_requests=answer.usage.requests))
