"""The agentloop plugin entry point: registers the cortex tools.

Found through the `agentloop` entry-point group as `cortex = "agentloop_cortex.plugin"`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentloop import hookimpl

from .tools import TOOLS

__all__ = ("agentloop_register_tools",)


@hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Register read_file, write_file, append_file and replace_in_file."""
    for cortex_tool in TOOLS:
        register(cortex_tool)
