"""The gateway layer's fixtures (its helpers are in _gateway.py and tests/support.py).

The gateway extra (Starlette, uvicorn, redis) is needed: without it, every module that
imports _gateway.py is skipped, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import postgres_cluster


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of this module's own, in a temporary directory; its base URL."""
    with postgres_cluster() as url:
        yield url
