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

ROOT = Path(__file__).resolve().parents[1]
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
