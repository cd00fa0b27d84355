"""The distributions as a user gets them.

The wheels of `agentloop-runner` and `agentloop-cortex` are built from a copy of the
sources without any package index, installed into a fresh virtual environment with the
index disabled (so `agentloop-cortex`'s dependency on `agentloop-runner` can only resolve to
the wheel built here), imported from there, run, and type-checked from a user's file with
`mypy --strict`. The fresh environment sees only the distributions the wheel declares as
dependencies (their closure, linked from this environment), so a missing dependency fails
here too. Last, the ignore rules must not hide the plugins' sources from git.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from agentloop.plugins import PluginManager

ROOT = Path(__file__).resolve().parents[2]
BIN = "Scripts" if sys.platform == "win32" else "bin"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for pip and mypy: no pip configuration, no index, no outside paths."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "PYTHON", "MYPY", "VIRTUAL_ENV", "ANTHROPIC_"))
    }
    env["PIP_CONFIG_FILE"] = os.devnull  # only the options on the command line count
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def run(*command: str | Path, cwd: Path, ok: bool = True) -> str:
    """Run a command and return its output; `cwd` is explicit so that a `python -c` run
    never imports `agentloop` from the checkout by accident."""
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        timeout=300,
    )
    output = done.stdout + done.stderr
    if ok:
        assert done.returncode == 0, f"{command} failed:\n{output}"
    else:
        assert done.returncode != 0, f"{command} should have failed:\n{output}"
    return output


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(archive.read(metadata).decode())
    return [Requirement(line) for line in headers.get_all("Requires-Dist") or []]


def dependency_closure(requirements: list[Requirement]) -> list[importlib.metadata.Distribution]:
    """The installed distributions that `requirements` need, transitively (extras followed)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    expanded: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are queued
    # Each requirement with the extra of the distribution that states it ("" for none).
    todo = [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        dist = importlib.metadata.distribution(requirement.name)
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{requirement} is not met here ({dist.version})"
        )
        found[name] = dist
        for wanted in ["", *sorted(canonicalize_name(e) for e in requirement.extras)]:
            if (name, wanted) not in expanded:
                expanded.add((name, wanted))
                todo.extend((Requirement(line), wanted) for line in dist.requires or [])
    return list(found.values())


def link_distributions(dists: list[importlib.metadata.Distribution], into: Path) -> None:
    """Make `into` a directory holding exactly these distributions (as symbolic links)."""
    into.mkdir()
    for dist in dists:
        assert dist.files, f"{dist.metadata['Name']} lists no files"
        tops = {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}
        for top in sorted(tops):
            source = Path(str(dist.locate_file(top)))
            if not source.exists() or (into / top).exists():
                continue  # a file listed but gone (e.g. .pyc), or shared by a namespace
            (into / top).symlink_to(source)


@dataclass(frozen=True)
class Installed:
    """The fresh environment with the two wheels installed."""

    python: Path
    site_packages: Path
    pip_output: str
    wheels: dict[str, Path]
    base: Path
    """A folder outside the checkout, to run commands in."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    setuptools = Version(importlib.metadata.version("setuptools"))
    assert setuptools >= Version("77"), (
        f'building offline needs setuptools>=77 here, found {setuptools}: pip install -e ".[dev]"'
    )
    base = tmp_path_factory.mktemp("packaging")

    # 1. Build both wheels from a copy of the sources (no stale build/ dir, repo untouched).
    source = base / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "site", "*.egg-info", "__pycache__",
            ".*_cache", ".hypothesis", "corpus",
        ),
    )  # fmt: skip
    wheelhouse = base / "wheels"
    run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", wheelhouse, source, source / "plugins" / "cortex", cwd=base,
    )  # fmt: skip
    wheels = {p.name.split("-")[0]: p for p in wheelhouse.glob("*.whl")}
    assert sorted(wheels) == ["agentloop_cortex", "agentloop_runner"], sorted(wheels)

    # 2. A fresh venv that sees only the dependencies the core wheel declares.
    venv = base / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=base)
    python = venv / BIN / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(run(python, "-c", purelib, cwd=base).strip())
    closure = dependency_closure(wheel_requirements(wheels["agentloop_runner"]))
    assert not [d for d in closure if canonicalize_name(d.metadata["Name"]).startswith("agentloop")]
    link_distributions(closure, base / "dependencies")
    (site_packages / "dependencies.pth").write_text(f"{base / 'dependencies'}\n")

    # 3. Install the plugin by name, index disabled: its `agentloop-runner` must be ours.
    pip_output = run(
        python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
        "agentloop-cortex", cwd=base,
    )  # fmt: skip
    return Installed(python, site_packages, pip_output, wheels, base)


PROBE = """
import importlib.metadata as md, json, sys
import agentloop, agentloop_cortex
from agentloop.plugins import PluginManager
def has(name):
    try:
        return md.distribution(name).version
    except md.PackageNotFoundError:
        return None
manager = PluginManager()
manager.load_entry_points()
print(json.dumps({
    "runner": has("agentloop-runner"),
    "old_name": has("agentloop"),
    "cortex_requires": md.distribution("agentloop-cortex").requires,
    "agentloop": agentloop.__file__,
    "agentloop_cortex": agentloop_cortex.__file__,
    "plugin_tools": sorted(t.name for t in manager.select(plugins=["cortex"])),
}))
"""


@pytest.mark.slow  # a wheel build, a venv and a cold mypy run: about 25 s
def test_the_plugin_resolves_its_dependency_to_our_wheel(installed: Installed) -> None:
    output = installed.pip_output
    for wheel in installed.wheels.values():
        assert wheel.name in output, output  # both came from the wheelhouse
    assert re.search(
        r"Successfully installed agentloop-cortex-0\.1\.0 agentloop-runner-0\.1\.0", output
    ), output


@pytest.mark.slow  # a wheel build, a venv and a cold mypy run: about 25 s
def test_the_installed_distribution_is_imported_not_the_checkout(installed: Installed) -> None:
    facts: dict[str, Any] = json.loads(run(installed.python, "-c", PROBE, cwd=installed.base))
    assert facts["runner"] == "0.1.0"
    assert facts["old_name"] is None
    assert any(
        r.replace(" ", "").startswith("agentloop-runner>=") for r in facts["cortex_requires"]
    )
    for module in ("agentloop", "agentloop_cortex"):
        path = Path(facts[module])
        assert path.is_relative_to(installed.site_packages), path
        assert not path.is_relative_to(ROOT), path
        assert (path.parent / "py.typed").is_file(), f"{module} has no py.typed marker"
    here = PluginManager()
    here.load_entry_points()
    assert facts["plugin_tools"] == sorted(t.name for t in here.select(plugins=["cortex"]))
    version = run(installed.python.parent / "agentloop", "--version", cwd=installed.base)
    assert version.strip() == "agentloop 0.1.0"


SERVICE = '''
"""A user's service module: a tool, a plugin hook, an agent, a run."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from agentloop import Agent, RunContext, RunResult, hookimpl, tool
from agentloop.testing import ScriptedProvider, reply, tool_call


@dataclass
class Shop:
    orders: dict[str, str]


@tool
async def lookup_order(order_id: str, ctx: RunContext[Shop]) -> str:
    """Status of an order.

    Args:
        order_id: The order number, e.g. "A1".
    """
    return ctx.deps.orders.get(order_id, "unknown")


@hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Give agentloop this module's tools."""
    register(lookup_order, timeout=5.0)


def make_agent() -> Agent:
    script = [reply(tool_call("lookup_order", {"order_id": "A1"})), reply("It has shipped.")]
    return Agent(provider=ScriptedProvider(script), tools=[lookup_order], tool_concurrency=4)


async def main() -> RunResult:
    return await make_agent().run("Where is A1?", deps=Shop({"A1": "shipped"}))


if __name__ == "__main__":
    result = anyio.run(main)
    assert result.text == "It has shipped.", result.text
    assert [c.output for c in result.tool_calls] == ["shipped"]
    print("ok")
'''

# Proves mypy reads agentloop's real annotations (an untyped package would accept this).
MISTAKE = """
from agentloop import Agent

agent = Agent(tool_concurrency="eight")
"""


@pytest.mark.slow  # a wheel build, a venv and a cold mypy run: about 25 s
def test_a_user_module_type_checks_strictly_against_the_installed_package(
    installed: Installed, tmp_path: Path
) -> None:
    (tmp_path / "service.py").write_text(SERVICE)
    (tmp_path / "mistake.py").write_text(MISTAKE)
    assert run(installed.python, "service.py", cwd=tmp_path).splitlines()[-1] == "ok"
    mypy = (sys.executable, "-m", "mypy", "--python-executable", installed.python,
            "--cache-dir", tmp_path / ".mypy_cache", "--no-error-summary")  # fmt: skip
    assert run(*mypy, "--strict", "service.py", cwd=tmp_path) == ""
    wrong = run(*mypy, "--strict", "mistake.py", cwd=tmp_path, ok=False)
    assert re.search(r"mistake\.py:4: error: .*\"tool_concurrency\".*\[arg-type\]", wrong), wrong


# --------------------------------------------------------------------------- git


def test_the_plugins_sources_are_not_ignored() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True
    )
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        done = subprocess.run(
            ["git", "check-ignore", "-v", "--no-index", path],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0

    for path in (
        "plugins/cortex/agentloop_cortex/new_module.py",
        "plugins/cortex/tests/test_new.py",
        "plugins/cortex/pyproject.toml",
        "tests/core/corpus/anthropic/new_exchange.json",
    ):
        assert not ignored(path), path
    assert ignored("cortex/memory.md")  # the demo's persona folder at the root still is


@pytest.mark.slow  # two wheel builds
@pytest.mark.parametrize("plugin", ["cortex", "mcp"])
def test_a_plugin_wheel_ships_its_licence_and_a_readme_that_renders_on_an_index(
    plugin: str, tmp_path: Path
) -> None:
    source = tmp_path / plugin
    shutil.copytree(
        ROOT / "plugins" / plugin,
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"),
    )
    run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", tmp_path / "wheels", source, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = (n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        description = archive.read(metadata).decode()
    # The index renders the README away from the repository: a relative link leads nowhere.
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links and all(link.startswith("https://") for link in links), links
