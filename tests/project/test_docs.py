"""The documentation: every hook documented, every page in the nav, every example runs.

Every ```python block of docs/ (sub-folders too) and of the README is a complete program:
it is run in a fresh interpreter, and all of them are type-checked by one `mypy --strict`
run. A block that is not a program (a signature, a piece of a class, a step of a longer
example) says so with `<!-- test: fragment -->` on the line right before its fence;
`<!-- test: run -->` there is accepted and changes nothing. The blocks run offline: the
interpreter's `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` point at a local
`MessagesServer` that answers any request (`schema_reply`), so `Agent(model=...)` code runs
as a reader would write it.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support import mypy_strict

import agentloop.hookspecs
from agentloop.pricing import cost_of
from agentloop.result import Usage
from agentloop.testing import MessagesServer, schema_reply

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PLUGINS = ROOT / "plugins"
RUN_MARKER = "<!-- test: run -->"
FENCE = re.compile(r"^```python\s*$\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def hook_names() -> list[str]:
    return [
        name
        for name, value in inspect.getmembers(agentloop.hookspecs, inspect.isfunction)
        if hasattr(value, "agentloop_spec")
    ]


def test_there_are_hooks() -> None:
    assert "agentloop_register_tools" in hook_names()


@pytest.mark.parametrize("hook", hook_names())
def test_every_hook_is_documented(hook: str) -> None:
    pages = (DOCS / "hooks.md").read_text() + (DOCS / "plugins.md").read_text()
    assert hook in pages, f"hook {hook} is not mentioned in docs/hooks.md or docs/plugins.md"


class _Loader(yaml.SafeLoader):
    """A YAML loader that ignores tags such as mkdocs' !ENV or !!python/name."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages(nav: object) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            found |= nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= nav_pages(value)
    return found


def test_every_page_is_in_the_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    in_nav = nav_pages(config["nav"])
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert pages - in_nav == set(), "pages missing from the mkdocs.yml nav"
    assert in_nav - pages == set(), "nav entries without a page"


FRAGMENT_MARKER = "<!-- test: fragment -->"
BLOCK_SOURCES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One ```python block of a page: where it is and what it says."""

    page: str
    line: int
    source: str

    @property
    def module(self) -> str:
        """A module name for the block, unique among all the blocks."""
        return "doc_" + re.sub(r"\W", "_", self.page.removesuffix(".md")) + f"_{self.line}"


def python_blocks() -> list[tuple[Block, str]]:
    """Every ```python block of the README and docs/, with the line before its fence."""
    found = []
    for page in BLOCK_SOURCES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            line = text.count("\n", 0, match.start()) + 2  # the block's first line
            where = page.relative_to(ROOT).as_posix()
            found.append((Block(where, line, match.group(1)), before))
    return found


def runnable_blocks() -> list[Block]:
    """The blocks that are programs: all but those marked as fragments."""
    return [block for block, before in python_blocks() if before != FRAGMENT_MARKER]


# What a page asks its reader to install beside agentloop (the dev extra has it all): a
# block importing one of these modules is skipped, saying so, where it is missing.
OPTIONAL = {"opentelemetry.sdk": "opentelemetry-sdk"}


def missing_package(block: Block) -> str | None:
    """The optional package the block imports and this interpreter lacks, if any."""
    for module, package in OPTIONAL.items():
        if re.search(rf"^\s*(from|import) {re.escape(module)}\b", block.source, re.MULTILINE):
            if importlib.util.find_spec(module) is None:
                return package
    return None


def test_runnable_blocks_are_found() -> None:
    pages = {block.page for block in runnable_blocks()}
    assert {"docs/quickstart.md", "docs/testing.md", "README.md"} <= pages
    markers = {before for _, before in python_blocks() if before.startswith("<!-- test")}
    assert markers <= {RUN_MARKER, FRAGMENT_MARKER}, "an unknown test marker"


@pytest.fixture(scope="module")
def generic_model() -> Iterator[MessagesServer]:
    """A local Messages API that answers any request, for the blocks' default clients."""
    with MessagesServer(schema_reply) as server:
        yield server


def offline_env(server: MessagesServer) -> dict[str, str]:
    """This environment, with the SDK's key and address pointed at `server`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "PYTEST_")) and k != "PYTHONPATH"
    }
    env["ANTHROPIC_BASE_URL"] = server.base_url
    env["ANTHROPIC_API_KEY"] = "sk-ant-docs-test"
    return env


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=f"{b.page}:{b.line}") for b in runnable_blocks()]
)
def test_runnable_example(block: Block, generic_model: MessagesServer, tmp_path: Path) -> None:
    if (package := missing_package(block)) is not None:
        pytest.skip(f"{block.page} needs {package}, which is not installed")
    script = tmp_path / f"{block.module}.py"
    script.write_text(block.source)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=offline_env(generic_model),
        timeout=60,
    )
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stdout}{done.stderr}"


@pytest.mark.timeout(600)  # a cold mypy cache on a busy machine
def test_runnable_examples_type_check(tmp_path: Path) -> None:
    """`mypy --strict` accepts every runnable block, checked in one run."""
    blocks = {f"{b.module}.py": b for b in runnable_blocks() if missing_package(b) is None}
    for name, block in blocks.items():
        (tmp_path / name).write_text(block.source)
    # The plugins are installed in editable mode, which mypy cannot follow.
    plugins = os.pathsep.join(map(str, sorted(PLUGINS.iterdir())))
    output = mypy_strict(
        sorted(tmp_path.glob("*.py")), ROOT, env={**os.environ, "MYPYPATH": plugins}
    )
    report = []
    for found in re.finditer(r"^[^\n]*?([\w]+\.py):(\d+): (.*)$", output, re.MULTILINE):
        name, number, message = found.groups()
        block = blocks.get(name)
        where = f"{block.page}:{block.line + int(number) - 1}" if block else f"{name}:{number}"
        report.append(f"{where}: {message}")
    assert report == [] and output == "", "\n".join(report) or output


def test_the_quickstarts_first_run_needs_no_key(tmp_path: Path) -> None:
    """The Quickstart's first block that runs an agent works offline, with no key at all."""
    runs = [b for b in runnable_blocks() if b.page == "docs/quickstart.md" and ".run" in b.source]
    script = tmp_path / "first_run.py"
    script.write_text(runs[0].source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tool_result" in done.stdout


# --------------------------------------------------------------------------- model names

# A model name as the docs write one: `claude-` then a family or a version number
# (`claude-sonnet-5-5`, `claude-3-5-sonnet-20240620`, `claude-haiku-4-5-20251001`).
MODEL_NAME = re.compile(
    r"\bclaude-(?:sonnet|opus|haiku|instant|\d)[a-z0-9]*(?:[-.][a-z0-9]+)*", re.IGNORECASE
)
# Where users copy a model name from. The recorded corpus in tests/ names the models it was
# recorded with and is deliberately left out.
MODEL_NAME_SOURCES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    *sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in {".py", ".md", ".toml"}),
]


def model_names() -> list[tuple[str, int, str]]:
    found = []
    for path in MODEL_NAME_SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for match in MODEL_NAME.finditer(line):
                found.append((path.relative_to(ROOT).as_posix(), number, match.group()))
    return found


def lines_naming_a_fallback() -> list[tuple[str, int, str]]:
    """The lines of the docs, README and examples that give `Fallback` its models."""
    return [
        (path.relative_to(ROOT).as_posix(), number, line)
        for path in MODEL_NAME_SOURCES
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "Fallback(" in line
    ]


def test_the_model_name_pattern() -> None:
    text = "use claude-sonnet-5-5. Or claude-3-5-sonnet-20240620, claude-2.1 and claude-code."
    assert MODEL_NAME.findall(text) == [
        "claude-sonnet-5-5",
        "claude-3-5-sonnet-20240620",
        "claude-2.1",
    ]


def test_docs_readme_and_examples_name_the_default_model() -> None:
    """Every model name a user can copy is the one the code uses by default."""
    from agentloop.agent import DEFAULT_MODEL

    found = model_names()
    assert any(where == "README.md" for where, _, _ in found), "the README names no model"
    # A fallback names a second model: a real one (with a known price), given to Fallback.
    second = {
        (where, number)
        for where, number, line in lines_naming_a_fallback()
        if all(cost_of(name, Usage(requests=1)) is not None for name in MODEL_NAME.findall(line))
    }
    wrong = [
        f"{where}:{number}: {name}"
        for where, number, name in found
        if name != DEFAULT_MODEL and (where, number) not in second
    ]
    assert wrong == [], f"model names other than DEFAULT_MODEL = {DEFAULT_MODEL!r}"


# --------------------------------------------------------------------------- the plugin example

FILE_BLOCK = re.compile(
    r"^```(?:python|toml)\s*$\n# (\S+)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL
)


def file_blocks(page: str) -> dict[str, list[str]]:
    """The code blocks of a docs page that open with a `# path/of/the/file` comment."""
    blocks: dict[str, list[str]] = {}
    for match in FILE_BLOCK.finditer((DOCS / page).read_text()):
        blocks.setdefault(match.group(1), []).append(match.group(2))
    return blocks


def test_the_plugin_authors_pytest_example_passes_as_written(tmp_path: Path) -> None:
    """The acme-tools plugin of docs/plugins.md with the tests and pytest configuration of
    docs/testing.md, copied into a project as the pages show them, passes its own tests."""
    plugin, testing = file_blocks("plugins.md"), file_blocks("testing.md")
    (package := tmp_path / "acme_tools").mkdir()
    (package / "__init__.py").write_text("")
    for name in ("tools.py", "plugin.py"):
        (package / name).write_text("".join(plugin[f"acme_tools/{name}"]))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_acme_tools.py").write_text(
        "".join(testing["tests/test_acme_tools.py"])
    )
    pyproject = "\n".join(plugin["pyproject.toml"] + testing["pyproject.toml"])
    assert "[tool.pytest.ini_options]" in pyproject
    (tmp_path / "pyproject.toml").write_text(pyproject)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "PYTEST_")) and k != "PYTHONPATH"
    }
    env["PYTHONPATH"] = str(tmp_path)  # as if acme-tools were installed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout
