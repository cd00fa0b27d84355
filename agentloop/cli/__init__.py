"""The `agentloop` command: run an agent on a prompt, list plugins and tools, serve, chat.

It sits on top of the library: it loads plugins (`agentloop.plugins`), builds an `Agent`
and runs it, and it is the one place that configures logging (structlog over the stdlib
`logging`, to stderr). Plugins add commands and `run` options, and shape a run through the
hooks in `agentloop.hookspecs`; the command itself knows no plugin by name.

One job per module: `command` (the entry point, `main`), `parser` (subcommands and
options), `values` (the options' value types), `run` (`agentloop run` and `serve`),
`chat` (`agentloop chat --web`), `listing` (`plugins`, `tools`), `report` (what a run
prints), `logs` (the command's logging), `exits` (exit codes).
"""

from .command import main as main
from .report import format_tool_log as format_tool_log
from .report import format_transcript as format_transcript
from .report import print_result as print_result
from .report import result_to_json as result_to_json

__all__ = ("format_tool_log", "format_transcript", "main", "print_result", "result_to_json")
