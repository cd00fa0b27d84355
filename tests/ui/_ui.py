"""What the front-end tests share: the npm packages they drive, node, and the served app.

The protocols' own client code (`@ag-ui/client`, `ai`) and `puppeteer-core` (which drives
the system's Chromium) are installed from the npm registry into a cache folder
(`.ci/run` does it first; `npm_prefix` does it when one is missing); without npm, or
when the install fails, the tests that need them are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import serving

pytest.importorskip("starlette", reason="starlette is not installed (pip install '.[ui]')")

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

PACKAGES = ("@ag-ui/client@1.0.0", "ai@7.0.173", "puppeteer-core@25.16.0")
"""The npm packages the tests drive, pinned (`.ci/run` installs the same)."""

PREFIX = Path(
    os.environ.get("AGENTLOOP_TEST_NPM_PREFIX")
    or Path.home() / ".cache" / "agentloop-tests" / "npm"
)
"""Where `.ci/run` and `npm_prefix` install them (`npm install --prefix`)."""

HERE = Path(__file__).parent


def npm_prefix(*names: str) -> Path:
    """The prefix holding the npm packages `names` (installed on first use); else a skip."""
    missing = [p for p in PACKAGES if p.rsplit("@", 1)[0] in names and not _installed(p)]
    if missing:
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            pytest.skip(f"npm and node are needed to drive {', '.join(names)}")
        done = subprocess.run(
            [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", *missing],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not all(_installed(p) for p in missing):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"npm could not install {', '.join(missing)} into {PREFIX}: {last}")
    return PREFIX


def _installed(package: str) -> bool:
    name, version = package.rsplit("@", 1)
    manifest = PREFIX / "node_modules" / name / "package.json"
    return manifest.exists() and json.loads(manifest.read_text()).get("version") == version


async def node(script: str, *args: str) -> Any:
    """Run `tests/ui/<script>` with node and the args; its standard output's JSON."""
    done = await anyio.run_process(
        ["node", str(HERE / script), *args],
        env={**os.environ, "AGENTLOOP_TEST_NPM_PREFIX": str(PREFIX)},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"node {script} failed: {done.stderr.decode()[-3000:]}")
    return json.loads(done.stdout)


@dataclass(frozen=True)
class NodeClient:
    """A protocol's own npm client, run by node (`node`) against an endpoint.

    The `conftest.py` fixtures give one per protocol, its package installed (or the
    module's tests skipped).
    """

    package: str
    """The npm package the script drives (one of `PACKAGES`, without its version)."""
    script: str
    """The node program in tests/ui that runs it and prints what it parsed as JSON."""
    path: str
    """Where the endpoint is routed in the served app (`served(path, ...)`)."""

    async def __call__(self, url: str, **plan: Any) -> dict[str, Any]:
        """Run the client against the app at `url` with `plan`; what it parsed."""
        result: dict[str, Any] = await node(self.script, url + self.path, json.dumps(plan))
        return result


@asynccontextmanager
async def served(path: str, endpoint: Any) -> AsyncIterator[str]:
    """`endpoint` routed at `path` of a Starlette app on uvicorn; yields the app's URL."""
    app = Starlette(
        routes=[
            Route("/healthz", lambda request: PlainTextResponse("ok")),
            Route(path, endpoint, methods=["POST"]),
        ]
    )
    async with serving(app) as url:
        yield url
