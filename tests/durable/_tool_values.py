"""Tool values that cannot be sent as they are, for both engines' tests (not a test module).

A durable run whose tool returns one of these records a result (an error the model can
read, or the bytes in base64) and ends normally, as a plain run does.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import RunResult, Tool, tool
from agentloop.lint import lint_history
from agentloop.messages import parse_history
from agentloop.testing import ScriptedProvider, reply, tool_call


def _cyclic() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


UNSENDABLE = pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        pytest.param(_cyclic(), True, "its return value cannot be sent to the model", id="cycle"),
        pytest.param(object(), True, "its return value cannot be sent to the model", id="object"),
        pytest.param(b"\x89PNG\xff", False, "in base64:", id="bytes"),
    ],
)
"""Parametrizes a test with `value` (what the tool returns), `error` and `says` (the result)."""


def giving(value: Any) -> tuple[Tool, ScriptedProvider]:
    """A `give` tool returning `value`, and a model that calls it once, then says "Done."."""

    @tool
    async def give() -> Any:
        """Give."""
        return value

    return give, ScriptedProvider([reply(tool_call("give", {}, id="toolu_give")), reply("Done.")])


def check_recorded(result: RunResult[Any], error: bool, says: str) -> None:
    """The run ended normally, with one call's result saying `says`, in a valid history."""
    assert (result.stop_reason, result.text) == ("end_turn", "Done.")
    (record,) = result.tool_calls
    assert record.is_error is error and says in record.output
    lint_history(parse_history(result.messages))
