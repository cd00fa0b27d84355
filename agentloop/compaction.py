"""Compaction: what is sent each round, made smaller than what is kept.

`Agent(history_processors=[...])` passes the run's messages through each processor before
every request; the result is sent (and checked against the API's rules), while the run's
own history, and so `RunResult.messages`, stays whole. Two strategies are shipped:
`clear_old_tool_results` (old results replaced by a short placeholder) and `summarize`
(older turns folded into one summary, by a model request counted in the run's usage).
A request refused for length is retried once with each strategy's `forced` form: each
run's `Compaction` keeps that one retry, so the loop only asks it.
`context_management_params` passes the Anthropic API's own (server-side) context
management through, with the beta header each of its edits needs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Union

from .context import RunContext
from .errors import BadRequestError, ConfigurationError, HistoryError
from .limits import price
from .messages import Message, TextBlock, ToolResultBlock, parse_history
from .providers.base import ModelRequest, ModelResponse, Provider

__all__ = (
    "CLEARED",
    "ClearOldToolResults",
    "Compaction",
    "HistoryProcessor",
    "Summarize",
    "apply_processors",
    "clear_old_tool_results",
    "context_management_params",
    "estimate_tokens",
    "is_length_refusal",
    "summarize",
)

HistoryProcessor = Union[  # noqa: UP007 (readable as a list)
    Callable[[list[Message]], "list[Message] | Awaitable[list[Message]]"],
    Callable[[RunContext[Any], list[Message]], "list[Message] | Awaitable[list[Message]]"],
]
"""A function (sync or async) from the messages to send to the messages to send instead,
optionally taking the run's `RunContext` first (its `round` is the request about to be
sent; `tool_use_id` and `tool_name` are empty). It gets a fresh list each round and may
return a new one or the one it got changed; the messages themselves are immutable."""

CLEARED = "[tool result cleared to save context]"
"""What `clear_old_tool_results` leaves in place of an old result."""

SUMMARY_PROMPT = (
    "Summarize the conversation below for the assistant that will continue it: the "
    "user's goal, what was done, tool results that still matter (with exact values), "
    "decisions made and what remains open. Answer with the summary only.\n\n"
)
"""The instruction a summary request starts with."""

SUMMARY_HEADER = "Summary of the conversation so far:\n\n"
"""How the summary message that replaces the older turns begins."""


def estimate_tokens(messages: Sequence[Message]) -> int:
    """The tokens `messages` are taken to cost: one per four characters of their JSON.

    A rule of thumb (the API counts in its own tokenizer), cheap enough to use every
    round, on every provider.
    """
    return -(-sum(len(m.wire_json) for m in messages) // 4)


async def apply_processors(
    processors: Sequence[HistoryProcessor],
    messages: Sequence[Message],
    context: RunContext[Any],
    *,
    forced: bool = False,
) -> list[Message]:
    """`messages` passed through each processor in turn.

    With `forced`, a processor that has a `forced` method (the shipped strategies) is
    applied through it instead: it compacts whatever the history's size.

    Raises:
        ConfigurationError: a processor returned something that is not a list of
            messages (wire dicts are accepted and parsed).
    """
    current = list(messages)
    for processor in processors:
        function: Any = getattr(processor, "forced", processor) if forced else processor
        if _takes_context(function):
            value = function(context, list(current))
        else:
            value = function(list(current))
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, list):
            raise ConfigurationError(
                f"history processor {processor!r} returned {type(value).__name__}, not a "
                "list of messages"
            )
        try:
            current = parse_history(value)
        except HistoryError as exc:
            raise ConfigurationError(
                f"history processor {processor!r} returned an invalid message: {exc}"
            ) from exc
    return current


class Compaction:
    """One run's history processors, and the one retry they allow after a length refusal.

    `messages` is what each request sends. When a request is refused for its length (the
    API's "prompt is too long", or a response stopping at the context window),
    `retry_after` says so once, and the next request is made with each processor's
    `forced` form, which compacts whatever the history's size; a second refusal in a
    row is the run's to report.
    """

    def __init__(
        self,
        processors: Sequence[HistoryProcessor],
        check: Callable[[Sequence[Message]], None] | None = None,
    ) -> None:
        """Compact with `processors`; `check` lints what they return (None: unchecked)."""
        self.processors = tuple(processors)
        self.check = check
        self.forcing = False
        """Whether the next request is a retry after a length refusal."""

    async def messages(self, history: Sequence[Message], ctx: RunContext[Any]) -> Sequence[Message]:
        """The messages to send: `history` through the processors (checked), if any."""
        if not self.processors:
            return history
        messages = await apply_processors(self.processors, history, ctx, forced=self.forcing)
        if self.check is not None:
            self.check(messages)
        return messages

    def retry_after(
        self, error: BaseException | None = None, stop_reason: str | None = None
    ) -> bool:
        """Whether to send again, compacted harder, after `error` or a turn's `stop_reason`.

        True once for a length refusal, when there are processors to compact with;
        any other outcome ends the forcing.
        """
        retry = (
            bool(self.processors)
            and not self.forcing
            and is_length_refusal(error, stop_reason=stop_reason)
        )
        self.forcing = retry
        return retry


def _takes_context(function: Callable[..., Any]) -> bool:
    """Whether `function` takes two positional arguments (context, messages)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 2


def is_length_refusal(error: BaseException | None = None, stop_reason: str | None = None) -> bool:
    """Whether a request was refused for its length.

    Either a response that stopped with `model_context_window_exceeded`, or the API's 400
    `invalid_request_error` "prompt is too long: N tokens > M maximum".
    """
    if stop_reason == "model_context_window_exceeded":
        return True
    return isinstance(error, BadRequestError) and "prompt is too long" in str(error).lower()


class ClearOldToolResults:
    """A processor replacing the content of all but the newest tool results.

    Each `tool_result` block keeps its `tool_use_id` and `is_error` (so every call stays
    answered, and the model still sees which failed); only its content becomes
    `placeholder`. The results of the last `keep_last` calls are left as they are.
    """

    def __init__(self, keep_last: int, placeholder: str = CLEARED) -> None:
        """Keep the newest `keep_last` results (0: clear all but the latest turn's)."""
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ConfigurationError(f"keep_last must be a whole number >= 0, not {keep_last!r}")
        if not isinstance(placeholder, str) or not placeholder.strip():
            raise ConfigurationError("placeholder must be a non-empty string")
        self.keep_last = keep_last
        self.placeholder = placeholder

    def __call__(self, messages: list[Message]) -> list[Message]:
        """`messages` with the older results cleared."""
        return self._clear(messages, self.keep_last)

    def forced(self, messages: list[Message]) -> list[Message]:
        """Clear every result but those of the latest user message (for a length retry)."""
        return self._clear(messages, 0)

    def _clear(self, messages: list[Message], keep_last: int) -> list[Message]:
        latest = _last_results_index(messages)
        seen = 0
        out = list(messages)
        for i in range(len(out) - 1, -1, -1):
            message = out[i]
            if message.role != "user" or isinstance(message.content, str):
                continue
            blocks = list(message.content)
            changed = False
            for j in range(len(blocks) - 1, -1, -1):
                block = blocks[j]
                if not isinstance(block, ToolResultBlock):
                    continue
                seen += 1
                if seen <= keep_last or i == latest or block.content == self.placeholder:
                    continue
                fields: dict[str, Any] = {
                    "tool_use_id": block.tool_use_id,
                    "content": self.placeholder,
                }
                if block.is_error:
                    fields["is_error"] = True
                blocks[j] = ToolResultBlock(**fields)
                changed = True
            if changed:
                out[i] = Message.of_blocks("user", blocks)
        return out

    def __repr__(self) -> str:
        return f"clear_old_tool_results(keep_last={self.keep_last})"


def _last_results_index(messages: Sequence[Message]) -> int:
    """The index of the last message, when it is a user message holding tool results."""
    if messages and messages[-1].role == "user":
        if any(isinstance(b, ToolResultBlock) for b in messages[-1].blocks):
            return len(messages) - 1
    return -1


def clear_old_tool_results(
    keep_last: int = 3, *, placeholder: str = CLEARED
) -> ClearOldToolResults:
    """A processor that clears all but the newest `keep_last` tool results.

    The results of the latest turn are always kept: the model is about to read them.
    Its `forced` form (used to retry a request refused for length) keeps only those.
    """
    return ClearOldToolResults(keep_last, placeholder)


class Summarize:
    """A processor folding older turns into one summary message, by a model request.

    When the messages are estimated (`estimate_tokens`) at more than
    `when_input_tokens_exceed`, everything before the last `keep_last` assistant turns is
    sent to the model as a transcript, with `SUMMARY_PROMPT`; what is sent instead is one
    user message holding the summary, then the kept turns verbatim. Each summary is kept
    (for the prefix it summarises), so later rounds reuse it until the history outgrows
    the limit again. The request's usage (and cost) is counted in the run's; when the
    run's `UsageLimits` leave no room for it, nothing is folded (the run's own next
    request then meets the limit).
    """

    def __init__(
        self,
        when_input_tokens_exceed: int,
        *,
        model: str | None = None,
        provider: Provider | None = None,
        client: Any = None,
        keep_last: int = 2,
        max_tokens: int = 2048,
        prompt: str = SUMMARY_PROMPT,
    ) -> None:
        """See `summarize`."""
        from .checks import check_count

        check_count("when_input_tokens_exceed", when_input_tokens_exceed)
        check_count("keep_last", keep_last)
        check_count("max_tokens", max_tokens)
        if provider is None and client is not None:
            from .providers import provider_for

            provider = provider_for(client)
        self.threshold = when_input_tokens_exceed
        self.model = model
        self.provider = provider
        self.keep_last = keep_last
        self.max_tokens = max_tokens
        self.prompt = prompt
        self._summaries: dict[str, tuple[int, str]] = {}  # prefix digest -> (length, summary)

    async def __call__(self, ctx: RunContext[Any], messages: list[Message]) -> list[Message]:
        """`messages`, with the older turns summarised when they are over the limit."""
        reused = self._reuse(messages)
        if estimate_tokens(reused) <= self.threshold:
            return reused
        return await self._fold(ctx, messages)

    async def forced(self, ctx: RunContext[Any], messages: list[Message]) -> list[Message]:
        """Summarise the older turns whatever their size (for a length retry)."""
        return await self._fold(ctx, messages)

    def _reuse(self, messages: list[Message]) -> list[Message]:
        """`messages` with the longest prefix summarised before replaced by its summary."""
        best: tuple[int, str] | None = None
        for digest, (length, summary) in self._summaries.items():
            if length <= len(messages) and _digest(messages[:length]) == digest:
                if best is None or length > best[0]:
                    best = (length, summary)
        if best is None:
            return messages
        return [_summary_message(best[1]), *messages[best[0] :]]

    async def _fold(self, ctx: RunContext[Any], messages: list[Message]) -> list[Message]:
        cut = _cut(messages, self.keep_last)
        if cut is None or ctx.limit_reached() is not None:
            return messages  # nothing to fold, or no budget left for the summary request
        folded = self._reuse(messages[:cut])
        summary = await self._summarize(ctx, folded)
        self._summaries[_digest(messages[:cut])] = (cut, summary)
        if len(self._summaries) > 32:  # many runs share an agent: keep the newest
            self._summaries.pop(next(iter(self._summaries)))
        return [_summary_message(summary), *messages[cut:]]

    async def _summarize(self, ctx: RunContext[Any], messages: Sequence[Message]) -> str:
        provider = self.provider or ctx.provider
        model = self.model or ctx.model
        if provider is None or not model:
            raise ConfigurationError(
                "summarize() outside a run needs model= and provider= (or client=)"
            )
        transcript = json.dumps([m.wire for m in messages], ensure_ascii=False, indent=1)
        request = ModelRequest(
            model=model,
            messages=[Message.user(self.prompt + transcript)],
            max_tokens=self.max_tokens,
        )
        response: ModelResponse = await provider.complete(request)
        ctx.add_usage(response.usage, price(response.usage, model))
        text = response.text.strip()
        return text or "(the model returned an empty summary)"

    def __repr__(self) -> str:
        return f"summarize(when_input_tokens_exceed={self.threshold})"


def _cut(messages: Sequence[Message], keep_last: int) -> int | None:
    """Where the kept turns start: the `keep_last`-th assistant message from the end.

    The kept part starts with an assistant message, so every tool_use in it is answered
    in it, and every one before it is answered before it. None when there is nothing
    before it to fold.
    """
    seen = 0
    for i in range(len(messages) - 1, 0, -1):
        if messages[i].role == "assistant":
            seen += 1
            if seen == keep_last:
                return i if messages[i - 1].role == "user" else None
    return None


def _digest(messages: Sequence[Message]) -> str:
    hasher = hashlib.sha256()
    for message in messages:
        hasher.update(message.wire_json)
        hasher.update(b"\n")
    return hasher.hexdigest()


def _summary_message(summary: str) -> Message:
    return Message.of_blocks("user", [TextBlock(text=SUMMARY_HEADER + summary)])


def summarize(
    when_input_tokens_exceed: int,
    *,
    model: str | None = None,
    provider: Provider | None = None,
    client: Any = None,
    keep_last: int = 2,
    max_tokens: int = 2048,
    prompt: str = SUMMARY_PROMPT,
) -> Summarize:
    """A processor folding older turns into one summary once the history grows too large.

    Args:
        when_input_tokens_exceed: Summarise when the messages are estimated at more
            tokens than this (see `estimate_tokens`).
        model: The model that writes the summary; by default the run's.
        provider: Where the summary request goes; by default the run's provider.
        client: An SDK client to make the provider from (as `Agent(client=...)`).
        keep_last: How many of the newest assistant turns (with the results answering
            them) are kept verbatim.
        max_tokens: `max_tokens` of the summary request.
        prompt: The instruction the transcript follows.
    """
    return Summarize(
        when_input_tokens_exceed,
        model=model,
        provider=provider,
        client=client,
        keep_last=keep_last,
        max_tokens=max_tokens,
        prompt=prompt,
    )


BETAS = {
    "clear_tool_uses_20250919": "context-management-2025-06-27",
    "clear_thinking_20251015": "context-management-2025-06-27",
    "compact_20260112": "compact-2026-01-12",
}
"""The beta each server-side context management edit is sent under (as the SDK names
them in `AnthropicBetaParam`)."""


def context_management_params(
    context_management: Mapping[str, Any], params: Mapping[str, Any]
) -> dict[str, Any]:
    """`params` with `context_management` and the betas its edits need added.

    An edit type this version does not know is sent as it is, under the context
    management beta; betas already in `params` are kept.

    Raises:
        ConfigurationError: `context_management` is not `{"edits": [{"type": ...}, ...]}`.
    """
    edits = context_management.get("edits") if isinstance(context_management, Mapping) else None
    if not isinstance(edits, (list, tuple)) or not all(
        isinstance(e, Mapping) and isinstance(e.get("type"), str) for e in edits
    ):
        raise ConfigurationError(
            'context_management must be {"edits": [{"type": "clear_tool_uses_20250919", '
            f"...}}, ...]}}, not {context_management!r}"
        )
    given = params.get("betas") or ()
    betas = [given] if isinstance(given, str) else list(given)
    for edit in edits:
        beta = BETAS.get(edit["type"], "context-management-2025-06-27")
        if beta not in betas:
            betas.append(beta)
    return {**params, "context_management": dict(context_management), "betas": betas}
