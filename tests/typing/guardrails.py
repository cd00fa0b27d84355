"""Guardrail functions as users write them type-check: sync or async, with typed values.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run. An ignore below marks
an error mypy must report (`--strict` warns about an ignore that silences nothing).
"""

from typing import Any

from agentloop import InputGuardrail, OutputGuardrail, RunContext, ToolGuardrail
from agentloop.calls import ToolResult


def no_keys(ctx: RunContext, prompt: str) -> str | None:
    return "No keys." if "sk-" in prompt else None


async def moderate(ctx: RunContext[int], prompt: Any) -> str | None:
    return None


async def always_passes(ctx: RunContext, output: object) -> None:
    return None


def safe_path(ctx: RunContext, input: dict[str, Any]) -> str | None:
    return None if ".." not in str(input.get("path")) else "Inside the project only."


def no_secrets(ctx: RunContext, result: ToolResult) -> str | None:
    return "Withheld." if "sk-" in result.text else None


def a_score(ctx: RunContext, prompt: str) -> float:
    return 0.5


guards = [
    InputGuardrail(no_keys),
    InputGuardrail(moderate, parallel=True, name="moderation"),
    OutputGuardrail(always_passes),
    ToolGuardrail(before=safe_path, after=no_secrets, tools=["read_file"], end_run=True),
    InputGuardrail(a_score),  # type: ignore[arg-type]
]
