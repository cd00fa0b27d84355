"""The cortex plugin's part of the `agentloop` command, added through agentloop's hooks.

`agentloop run` gets `--persona` and `--cortex-root`, exposes the cortex tools by default,
runs the offline demo (`agentloop_cortex.demo`) when there is no API key, and ends with
the persona's files and the directory they live in; `agentloop cortex` shows those files
without running anything.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop import ConfigurationError, RunResult, ToolError, hookimpl
from agentloop.hookspecs import RunSetup

from .config import CortexConfig, persona_problem
from .memory_store import MemoryStore
from .memory_tool import MEMORY_TOOL
from .store import FILENAMES
from .tools import TOOLS

if TYPE_CHECKING:
    from agentloop import Tool
    from agentloop.providers.base import Provider

__all__ = (
    "MEMORY_SYSTEM_PROMPT",
    "SYSTEM_PROMPT",
    "WRITE_TOOLS",
    "CortexRun",
    "agentloop_register_commands",
    "agentloop_run_options",
    "agentloop_run_setup",
    "cortex_config",
    "format_files",
)

SYSTEM_PROMPT = (
    "You have persistent files that outlive this conversation: memory.md, soul.md and "
    "relationship.md. Read them when they may help, and update them when you learn "
    "something worth keeping."
)
"""The system prompt of an `agentloop run` exposing the cortex tools, without `--system`."""

MEMORY_SYSTEM_PROMPT = (
    "Your memory folder, /memories, outlives this conversation: memory.md, soul.md and "
    "relationship.md live there. View it when it may help, and keep it up to date with "
    "the memory tool when you learn something worth keeping."
)
"""The system prompt of an `agentloop run --memory-tool`, without `--system`."""

WRITE_TOOLS = ("write_file", "append_file", "replace_in_file")
"""The cortex tools that change a file."""

_TOOL_NAMES = frozenset({*(t.name for t in TOOLS), MEMORY_TOOL.name})


def _writes(name: str, input: Any) -> bool:
    """Whether a cortex call changes a file (a memory command other than `view`)."""
    if name == MEMORY_TOOL.name:
        return isinstance(input, dict) and input.get("command") != "view"
    return name in WRITE_TOOLS


# --------------------------------------------------------------------------- hooks


@hookimpl
def agentloop_run_options(parser: argparse.ArgumentParser) -> None:
    """Add `--persona` and `--cortex-root` to `agentloop run`."""
    _add_options(parser.add_argument_group("cortex plugin"), run=True)


@hookimpl
def agentloop_run_setup(args: argparse.Namespace) -> RunSetup:
    """Expose the cortex tools by default, with their deps, prompt, demo and report.

    With `--memory-tool`, Claude's memory tool over the persona's folder stands in for
    the four cortex tools.
    """
    run = CortexRun(args.cortex_root, args.persona)
    memory = bool(getattr(args, "memory_tool", False))
    return RunSetup(
        exposed_by_default=True,
        deps=run.deps,
        system=MEMORY_SYSTEM_PROMPT if memory else SYSTEM_PROMPT,
        offline_model=_memory_demo_provider if memory else _demo_provider,
        report=run.report,
        check=run.check,
        tools=(MEMORY_TOOL,) if memory else None,
    )


def _demo_provider(tools: Sequence[Tool]) -> Provider:
    """The offline demo's model; its module imports the test doubles, so only now."""
    from .demo import demo_provider

    return demo_provider(tools)


def _memory_demo_provider(tools: Sequence[Tool]) -> Provider:
    """The memory tool's offline demo model, imported only now (as `_demo_provider`)."""
    from .memory_demo import memory_demo_provider

    return memory_demo_provider(tools)


@hookimpl
def agentloop_register_commands(register: Callable[..., argparse.ArgumentParser]) -> None:
    """Add `agentloop cortex`: show a persona's files and where they are."""
    command = register(
        "cortex", help="show a persona's cortex files and their directory", handler=show_command
    )
    _add_options(command)


def _add_options(group: Any, *, run: bool = False) -> None:
    group.add_argument("--persona", default="default", help="cortex persona (default: default)")
    group.add_argument(
        "--cortex-root",
        type=Path,
        default=Path("cortex"),
        metavar="DIR",
        help="directory holding one subdirectory per persona (default: ./cortex)",
    )
    if run:
        group.add_argument(
            "--memory-tool",
            action="store_true",
            help="give the model Claude's memory tool (/memories is the persona's folder) "
            "instead of the cortex tools",
        )


def show_command(args: argparse.Namespace) -> int:
    """`agentloop cortex`: print the persona's directory and files.

    Raises:
        ConfigurationError: the root is missing or not a directory (showing empty files
            would hide a mistyped path).
    """
    config = cortex_config(args.cortex_root, args.persona)
    root = Path(os.path.abspath(config.root))
    if not root.exists():
        raise ConfigurationError(f"--cortex-root: no such folder: {root}")
    if not root.is_dir():
        raise ConfigurationError(f"--cortex-root: {root} is not a directory")
    print(format_files(config))
    return 0


# --------------------------------------------------------------------------- a run


class CortexRun:
    """The cortex side of one `agentloop run`: its deps, its report and its check."""

    def __init__(self, root: Path, persona: str) -> None:
        """For the persona `persona` under `root` (checked when `deps()` is called)."""
        self.root = root
        self.persona = persona
        self.config: CortexConfig | None = None
        """The run's configuration, once `deps()` has built it."""

    def deps(self) -> dict[str, CortexConfig]:
        """`{"cortex": CortexConfig(...)}`, once the root is known to be usable.

        Raises:
            ConfigurationError: an invalid persona, or a root that is not a directory
                this process can write in (it is created when missing).
        """
        config = cortex_config(self.root, self.persona)
        check_root(config)
        self.config = config
        return {"cortex": config}

    def report(self, result: RunResult) -> list[tuple[str, str]]:
        """The report's "Cortex files" section: the directory and each file's text."""
        config = self.config or cortex_config(self.root, self.persona)
        return [("Cortex files", format_files(config))]

    def check(self, result: RunResult) -> str | None:
        """Why the run failed at its cortex job, or None.

        It failed when every write it tried failed, or, when it tried none, every cortex
        call it made failed (a file it could not read).
        """
        calls = [call for call in result.tool_calls if call.name in _TOOL_NAMES]
        writes = [call for call in calls if _writes(call.name, call.input)]
        tried = writes or calls
        if not tried or not all(call.is_error for call in tried):
            return None
        config = self.config or cortex_config(self.root, self.persona)
        what = "write" if writes else "cortex call"
        count = f"the {what}" if len(tried) == 1 else f"all {len(tried)} {what}s"
        return (
            f"the cortex files in {persona_directory(config)} could not be "
            f"{'changed' if writes else 'used'}: {count} failed ({tried[0].output})"
        )


def cortex_config(root: Path, persona: str) -> CortexConfig:
    """A `CortexConfig` from the command's options.

    Raises:
        ConfigurationError: the persona name or the root is invalid.
    """
    try:
        return CortexConfig(root=root.expanduser(), persona=persona)
    except ValueError as exc:
        option = "--persona" if persona_problem(persona) else "--cortex-root"
        raise ConfigurationError(f"{option}: {exc}") from exc


def persona_directory(config: CortexConfig) -> Path:
    """The absolute directory of the configured persona's files."""
    return Path(os.path.realpath(config.root)) / config.persona


def check_root(config: CortexConfig) -> None:
    """Make sure the persona's files can be written: create the root, then try it.

    Raises:
        ConfigurationError: the root (or the persona's directory) is not a directory,
            cannot be created, or cannot be written in; the message names the path.
    """
    root = Path(os.path.abspath(config.root))
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except FileExistsError:
        raise ConfigurationError(f"--cortex-root: {root} is not a directory") from None
    except OSError as exc:
        raise ConfigurationError(f"--cortex-root: cannot create {root}: {exc.strerror}") from None
    persona = root / config.persona
    if persona.exists() and not persona.is_dir():
        raise ConfigurationError(f"--persona: {persona} exists and is not a directory")
    target = persona if persona.is_dir() else root
    try:
        handle, probe = tempfile.mkstemp(prefix=".agentloop-probe-", dir=target)
    except OSError as exc:
        raise ConfigurationError(
            f"--cortex-root: cannot write in {target}: {exc.strerror}"
        ) from None
    os.close(handle)
    os.unlink(probe)


def format_files(config: CortexConfig) -> str:
    """The persona's directory, then each cortex file's text under a header with its size.

    Other files of the folder (made with the memory tool) follow the three cortex files.
    """
    parts = [f"directory: {persona_directory(config)}"]
    try:
        store = MemoryStore(config)
    except ToolError as exc:
        return f"{parts[0]}\n(cannot read the files: {exc.message})"
    try:
        others = [e.name for e in store.entries() if e.name not in FILENAMES]
    except ToolError:
        others = []  # each cortex file below says what stops it being read
    for name in (*FILENAMES, *others):
        try:
            content = store.read(name)
        except ToolError as exc:
            parts.append(f"--- {name} (cannot read it: {exc.message})")
            continue
        size = len(content.encode())
        parts.append(f"--- {name} ({size} bytes)\n{content.rstrip() or '(empty)'}")
    return "\n".join(parts)
