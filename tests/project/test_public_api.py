"""The public surface: `__all__` is an explicit list, and the layout tells the data flow.

Layers point down: no import circle among agentloop's modules (type-only imports
included), nothing below the package face imports `agent.py`, only `history.py` changes a
run's history, and the core names no plugin.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

import agentloop
import agentloop.testing

PACKAGE = Path(agentloop.__file__).parent

PUBLIC = (
    "Agent",
    "AgentConfig",
    "AgentloopError",
    "AnthropicProvider",
    "ApprovalRequest",
    "ApprovalRequested",
    "Approve",
    "Capability",
    "CodeExecution",
    "ConfigurationError",
    "ContentBlock",
    "Deny",
    "DocumentBlock",
    "Event",
    "Fallback",
    "GuardrailTripped",
    "HistoryError",
    "ImageBlock",
    "InputGuardrail",
    "Message",
    "ModelResponded",
    "ModelRetry",
    "ModelStreamEvent",
    "OpenAIChatProvider",
    "OutputGuardrail",
    "OutputValidationError",
    "PluginManager",
    "Provider",
    "ProviderError",
    "RedactedThinkingBlock",
    "RedisSession",
    "RepairReport",
    "RequestRetry",
    "RequestStarted",
    "Retries",
    "RoundFinished",
    "Run",
    "RunContext",
    "RunError",
    "RunFinished",
    "RunOptions",
    "RunResult",
    "RunStarted",
    "SQLiteSession",
    "ServerTool",
    "ServerToolResultBlock",
    "ServerToolUseBlock",
    "Session",
    "SessionConflict",
    "SessionError",
    "StepRestarted",
    "StopReason",
    "TextBlock",
    "TextDelta",
    "ThinkingBlock",
    "ThinkingDelta",
    "Tool",
    "ToolCallFailed",
    "ToolCallReady",
    "ToolCallRecord",
    "ToolCallStarted",
    "ToolDefinition",
    "ToolError",
    "ToolGuardrail",
    "ToolInputDelta",
    "ToolLog",
    "ToolProgress",
    "ToolResultBlock",
    "ToolResultEvent",
    "ToolSearch",
    "ToolUseBlock",
    "ToolUserContent",
    "UnknownBlock",
    "Usage",
    "UsageLimitExceeded",
    "UsageLimits",
    "WebFetch",
    "WebSearch",
    "hookimpl",
    "lint_history",
    "plugin_capabilities",
    "plugin_tools",
    "raw_tools",
    "repair",
    "tool",
)


def public_names(module: types.ModuleType) -> set[str]:
    # `dir()`, not `vars()`: agentloop's names are imported on first use.
    return {
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    }


def test_all_is_the_pinned_list() -> None:
    assert agentloop.__all__ == PUBLIC
    assert public_names(agentloop) == set(PUBLIC)


def test_exported_names_are_the_ones_of_their_modules() -> None:
    """The lazily imported names are the objects of their modules, and no submodule of the
    same name hides one once every module is imported."""
    for name in modules():
        if name.count(".") == 1 and name != "agentloop.__main__":  # not the subpackages'
            importlib.import_module(name)
    for name in PUBLIC:
        value = getattr(agentloop, name)
        assert not isinstance(value, types.ModuleType), name
        module = importlib.import_module(f"agentloop.{agentloop._MODULES[name]}")
        assert getattr(module, name) is value, name


def test_an_old_name_still_imports_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="RunStream is now Run"):
        assert agentloop.RunStream is agentloop.Run  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="RunStream is now agentloop.Run"):
        from agentloop.stream import RunStream  # type: ignore[attr-defined]
    assert RunStream is agentloop.Run


def test_the_version_is_the_distributions() -> None:
    assert agentloop.__version__ == metadata.version("agentloop-runner")


def test_testing_all_matches_its_exported_names() -> None:
    assert set(agentloop.testing.__all__) == public_names(agentloop.testing)


def test_exported_names_are_documented() -> None:
    for name in agentloop.__all__:
        value = getattr(agentloop, name)
        if isinstance(value, type) or (callable(value) and not hasattr(value, "__origin__")):
            assert value.__doc__, name
        else:  # a type alias: a docstring follows its assignment
            assert alias_docstring(agentloop._MODULES[name], name), name


def alias_docstring(module: str, name: str) -> str | None:
    """The docstring under `name = ...` in an agentloop module."""
    body = ast.parse((PACKAGE / f"{module.replace('.', '/')}.py").read_text()).body
    for node, after in itertools.pairwise(body):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if [t.id for t in targets if isinstance(t, ast.Name)] == [name]:
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                return str(after.value.value)
    return None


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every agentloop module `name` imports, at run time or for type checking only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            # `from agentloop import x` may name a module or a name defined in a module.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def test_no_import_circle_among_modules() -> None:
    edges = graph()
    # The package faces only re-export; they are where circles are allowed to close.
    faces = {"agentloop", "agentloop.providers", "agentloop.testing"}
    edges = {k: {v for v in vs if v not in faces} for k, vs in edges.items() if k not in faces}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_nothing_below_the_face_imports_the_agent() -> None:
    allowed = {"agentloop", "agentloop.__main__"}
    # The gateway, like the command line, the durable adapters and the front-end
    # endpoints, sits on top of the agent.
    on_top = ("agentloop.gateway.", "agentloop.cli.", "agentloop.durable.", "agentloop.ui.")
    importers = {
        k for k, vs in graph().items() if "agentloop.agent" in vs and not k.startswith(on_top)
    }
    assert importers <= allowed, importers - allowed


def test_only_history_changes_a_history() -> None:
    """No module but history.py mutates a list of messages in place."""
    mutators = {"append", "extend", "insert", "pop", "remove", "clear", "__setitem__"}
    offenders = []
    for name, path in modules().items():
        if name == "agentloop.history":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in mutators:
                    target = node.func.value
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Subscript):
                        target = t.value
            if isinstance(target, ast.Attribute) and target.attr in ("messages", "_messages"):
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_the_core_names_no_plugin() -> None:
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("agentloop_"), (name, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("agentloop_"), (name, alias.name)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "agentloop_cortex" not in node.value, (name, node.lineno)


def test_every_module_logs_through_the_silent_logger() -> None:
    """A library is silent until the application configures logging: only `agentloop.logs`
    may ask structlog for a logger (an unconfigured structlog prints to stdout)."""
    offenders = []
    for name, path in modules().items():
        if name == "agentloop.logs":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("get_logger", "getLogger", "wrap_logger")
                and isinstance(node.value, ast.Name)
                and node.value.id == "structlog"
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_importing_agentloop_imports_no_sdk() -> None:
    """`import agentloop` is cheap: its names are imported on first use."""
    heavy = ("anthropic", "openai", "pydantic", "structlog", "opentelemetry")
    script = f"import sys, agentloop; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "[]\n"


def test_no_library_file_is_over_600_lines() -> None:
    """A module past 600 lines holds more than one job: split it (agent.py: 400 at most)."""
    root = Path(agentloop.__file__).parent
    plugins = Path(__file__).parents[2] / "plugins"
    files = [*root.rglob("*.py"), *plugins.glob("*/agentloop_*/**/*.py")]
    lengths = {str(f): len(f.read_text().splitlines()) for f in files}
    assert [f for f, n in lengths.items() if n > 600] == []
    assert lengths[str(root / "agent.py")] <= 400
