"""`agentloop run`'s answers to calls that wait for approval: asked on the terminal.

When stdin is a terminal, each waiting call is shown with its input and reason and the
person answers `y` (run it), `n` (refuse it) or `e` (edit its input, then run it). When
stdin is not a terminal nobody can be asked, so every such call is refused, with a line
on stderr saying so. The command resumes the run with these decisions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

import anyio
from pydantic import ValidationError

from agentloop.approval import Approve, Decision, Deny
from agentloop.registry import ToolRegistry
from agentloop.result import ApprovalRequest
from agentloop.tools import describe_validation_error

__all__ = ("NOT_ASKED", "REFUSED", "decide")

REFUSED = "The user refused this call."
"""What the model is told of a call the person answered `n`."""

NOT_ASKED = (
    "Not approved: this call requires approval and nobody could be asked (agentloop run "
    "without a terminal)."
)
"""What the model is told of a call refused because stdin is not a terminal."""


async def decide(
    approvals: Sequence[ApprovalRequest],
    registry: ToolRegistry,
    *,
    interactive: bool,
    stdin: TextIO,
    out: TextIO,
) -> dict[str, Decision]:
    """A decision for each waiting call, asked on `out` and `stdin`.

    When not `interactive`, every call is refused, each with a line on `out` saying why.
    """
    decisions: dict[str, Decision] = {}
    for request in approvals:
        if not interactive:
            print(
                f"agentloop: refused {request.name} ({request.tool_use_id}): it requires "
                "approval and stdin is not a terminal to ask on",
                file=out,
                flush=True,
            )
            decisions[request.tool_use_id] = Deny(NOT_ASKED)
        else:
            decisions[request.tool_use_id] = await _ask(request, registry, stdin, out)
    return decisions


async def _ask(
    request: ApprovalRequest, registry: ToolRegistry, stdin: TextIO, out: TextIO
) -> Decision:
    shown = json.dumps(request.input, ensure_ascii=False)
    print(f"\n{request.name} wants to run with {shown}\n  ({request.reason})", file=out)
    while True:
        answer = await _read("Allow? [y]es / [n]o / [e]dit: ", stdin, out)
        answer = answer.lower() if answer is not None else None
        if answer is None or answer in ("n", "no"):
            return Deny(REFUSED)
        if answer in ("y", "yes"):
            return Approve()
        if answer in ("e", "edit"):
            edited = await _edit(request, registry, stdin, out)
            if edited is not None:
                return Approve(input=edited)
        else:
            print("Answer y, n or e.", file=out)


async def _edit(
    request: ApprovalRequest, registry: ToolRegistry, stdin: TextIO, out: TextIO
) -> dict[str, object] | None:
    """An edited input the tool accepts, or None to ask again (empty line or end of input)."""
    while True:
        line = await _read("New input (a JSON object; empty to go back): ", stdin, out)
        if not line:
            return None
        try:
            edited = json.loads(line)
        except json.JSONDecodeError as exc:
            print(f"Not JSON: {exc}", file=out)
            continue
        if not isinstance(edited, dict):
            print("The input must be a JSON object of arguments.", file=out)
            continue
        tool = registry.get(request.name)
        try:
            if tool is not None:
                tool.validate(edited)
        except ValidationError as exc:
            print(describe_validation_error(request.name, exc), file=out)
            continue
        return edited


async def _read(prompt: str, stdin: TextIO, out: TextIO) -> str | None:
    """One line of answer, stripped; None at the end of input.

    The event loop waits for the terminal to have a line (a terminal hands over whole
    lines), so Ctrl-C while it waits interrupts the command at once.
    """
    print(prompt, end="", file=out, flush=True)
    await anyio.wait_readable(stdin)
    line = stdin.readline()
    return line.strip() if line else None
