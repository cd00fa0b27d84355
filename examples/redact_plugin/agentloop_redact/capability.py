"""The redact plugin's capability and the hook that registers it.

`Redact` wraps each tool call of a run: the tool runs as it would, and what it returns is
scrubbed of e-mail addresses and payment card numbers before the model (and the run's
history, its log and a durable run's record) sees it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import agentloop
from agentloop import Capability, RunContext, TextBlock
from agentloop.calls import ToolCall, ToolResult
from agentloop.capabilities import NextCall

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
"""An e-mail address, as people write them (not every address RFC 5322 allows)."""

CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
"""13 to 19 digits, perhaps grouped by spaces or dashes: a card number if its check digit
says so (see `luhn`)."""


def luhn(digits: str) -> bool:
    """Whether `digits` pass the Luhn check every payment card number passes."""
    total = 0
    for position, digit in enumerate(reversed(digits)):
        value = int(digit) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def redact(text: str) -> str:
    """`text` with its e-mail addresses and card numbers replaced by placeholders.

    A card number keeps its last four digits, so a person reading along can still tell
    two cards apart; a run of digits that fails the check (an order number) is kept.
    """

    def card(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group())
        return f"[card ending {digits[-4:]}]" if luhn(digits) else match.group()

    return CARD.sub(card, EMAIL.sub("[email]", text))


class Redact(Capability):
    """Scrubs e-mail addresses and card numbers from every tool result of a run."""

    name = "redact"

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        """Run the call, then redact the text of its result (images and the rest kept)."""
        result = await call_next(call)
        content = result.content
        if isinstance(content, str):
            return replace(result, content=redact(content))
        if isinstance(content, list):
            scrubbed = [
                TextBlock(text=redact(b.text)) if isinstance(b, TextBlock) else b for b in content
            ]
            return replace(result, content=scrubbed)
        return result


@agentloop.hookimpl
def agentloop_register_capabilities(register: Callable[..., Any]) -> None:
    """Give agentloop this plugin's capability, as `redact`."""
    register("redact", Redact)
