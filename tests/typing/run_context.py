"""`RunContext` with explicit type arguments keeps them: `deps` is what was given.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run. An ignore below marks
an error mypy must report (`--strict` warns about an ignore that silences nothing).
"""

from typing_extensions import assert_type

from agentloop import RunContext


def typed(ctx: RunContext[int]) -> str:
    assert_type(ctx.deps, int)
    return ctx.deps  # type: ignore[return-value]
