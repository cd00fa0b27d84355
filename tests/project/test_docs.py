"""The documentation: every hook documented, every page in the nav, runnable examples run.

A code block is runnable when the line right before its ```python fence is
`<!-- test: run -->`. Such a block must be a complete program that needs no network and
no API key (it uses agentloop.testing); it is run in a fresh interpreter.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import agentloop.hookspecs
from agentloop.pricing import cost_of
from agentloop.result import Usage

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
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


def runnable_blocks() -> list[Any]:
    blocks: list[Any] = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if before.strip() == RUN_MARKER:
                line = text.count("\n", 0, match.start()) + 1
                blocks.append(pytest.param(match.group(1), id=f"{page.name}:{line}"))
    return blocks


def test_runnable_blocks_are_found() -> None:
    ids = [p.id for p in runnable_blocks()]
    assert any(i.startswith("quickstart.md") for i in ids)
    assert any(i.startswith("testing.md") for i in ids)


@pytest.mark.parametrize("source", runnable_blocks())
def test_runnable_example(source: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(source)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


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
