"""What a type checker refuses in user code: wrong direct tool calls, wrong deps.

tests/typing holds code that must type-check (`.ci/run` runs `mypy --strict` on it); this
runs mypy once on small modules of mistakes and expects each one reported, with no
`# type: ignore` in sight.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import mypy_strict

ROOT = Path(__file__).resolve().parents[2]

TOOL_CALLS = '''\
from dataclasses import dataclass

from agentloop import RunContext, tool


@dataclass
class Shop:
    owner: str


@dataclass
class Bank:
    vault: int


@tool
def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


@tool(timeout=5.0)
async def owner(ctx: RunContext[Shop]) -> str:
    """The shop's owner."""
    return ctx.deps.owner


async def main(bank: RunContext[Bank]) -> None:
    add("one")
    text: str = add(1, 2)
    add(1, 2, 3)
    await owner(bank)
    number: int = await owner(RunContext("run", 1, deps=Shop("Ada")))
'''

AGENT_DEPS = """\
from dataclasses import dataclass

from agentloop import Agent, RunContext, tool


@dataclass
class Shop:
    owner: str


@dataclass
class Bank:
    vault: int


@tool
def owner(ctx: RunContext[Shop]) -> str:
    \"\"\"The shop's owner.\"\"\"
    return ctx.deps.owner


agent = Agent(deps_type=Shop, tools=[owner])


async def main() -> None:
    await agent.run("hi", deps=123)
    agent.run_sync("hi", deps=Bank(1))
    await agent.resume({}, deps="shop")
    async with agent.start("hi", deps=Bank(1)) as run:
        print(run.result.text)


def vault(ctx: RunContext[Shop]) -> None:
    print(ctx.deps.vault)
"""

MISTAKES = {
    "tool_calls.py": (
        TOOL_CALLS,
        [
            (29, r'Argument 1 to "__call__" of "Tool" has incompatible type "str"; '
                 r'expected "int"'),
            (30, r'Incompatible types in assignment \(expression has type "int", variable '
                 r'has type "str"\)'),
            (31, r'Too many arguments for "__call__" of "Tool"'),
            (32, r'Argument 1 to "__call__" of "Tool" has incompatible type '
                 r'"RunContext\[Bank\]"; expected "RunContext\[Shop\]"'),
            (33, r'Incompatible types in assignment \(expression has type "str", variable '
                 r'has type "int"\)'),
        ],
    ),
    "agent_deps.py": (
        AGENT_DEPS,
        [
            # The entry points besides `start` are defined on `RunLayers`, which `Agent`
            # inherits; mypy names the class that defines the method.
            (26, r'No overload variant of "run" of "RunLayers" matches argument types "str", '
                 r'"int"'),
            (27, r'No overload variant of "run_sync" of "RunLayers" matches argument types '
                 r'"str", "Bank"'),
            (28, r'Argument "deps" to "resume" of "RunLayers" has incompatible type "str"; '
                 r'expected "Shop"'),
            (29, r'No overload variant of "start" of "Agent" matches argument types "str", '
                 r'"Bank"'),
            (34, r'"Shop" has no attribute "vault"'),
        ],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """mypy --strict's report on every module of `MISTAKES`, checked in one run.

    mypy runs in the checkout, as `.ci/run` runs it on tests/typing just before, so it
    finds agentloop there and reuses that run's cache.
    """
    folder = tmp_path_factory.mktemp("mistakes")
    for name, (source, _) in MISTAKES.items():
        (folder / name).write_text(source)
    output = mypy_strict([folder / name for name in MISTAKES], ROOT)
    # Each line without its folder (a module mypy's cache holds unchanged keeps the folder
    # of the run that cached it).
    return re.sub(r"^[^:\n]*/(?=[^/:\n]+\.py:)", "", output, flags=re.MULTILINE)


@pytest.mark.timeout(600)  # a cold mypy cache on a busy machine
@pytest.mark.parametrize("module", list(MISTAKES))
def test_mypy_reports_each_mistake(mypy_output: str, module: str) -> None:
    errors = [
        e for e in mypy_output.splitlines() if e.startswith(f"{module}:") and ": error: " in e
    ]
    expected = MISTAKES[module][1]
    for line, message in expected:
        assert any(re.match(rf"{re.escape(module)}:{line}: error: {message}", e) for e in errors), (
            f"{module}:{line}: no {message!r} in:\n{mypy_output}"
        )
    assert len(errors) == len(expected), mypy_output
