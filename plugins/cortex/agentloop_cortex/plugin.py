"""The agentloop plugin entry point: the cortex tools and the cortex part of the command.

Found through the `agentloop` entry-point group as `cortex = "agentloop_cortex.plugin"`.
The command's hooks live in `agentloop_cortex.cli`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentloop import hookimpl

from .cli import agentloop_register_commands, agentloop_run_options, agentloop_run_setup
from .tools import TOOLS

__all__ = (
    "agentloop_register_commands",
    "agentloop_register_tools",
    "agentloop_run_options",
    "agentloop_run_setup",
)


@hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Register read_file, write_file, append_file and replace_in_file."""
    for cortex_tool in TOOLS:
        register(cortex_tool)
