"""The public surface: `__all__` lists exactly the names `agentloop` exposes."""

from __future__ import annotations

import types

import agentloop
import agentloop.testing


def public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_all_matches_the_exported_names() -> None:
    assert set(agentloop.__all__) == public_names(agentloop)
    assert set(agentloop.testing.__all__) == public_names(agentloop.testing)


def test_exported_names_are_documented() -> None:
    for name in agentloop.__all__:
        assert getattr(agentloop, name).__doc__, name
