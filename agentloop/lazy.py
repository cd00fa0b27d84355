"""Lazy exports: a package's names imported from their modules on first use (PEP 562).

`agentloop`, its `capabilities`, `gateway` and `providers` packages, and plugins such as
`agentloop_mcp` export names whose modules are slow to import (the SDKs, the whole loop);
each hands its table of names to `lazy_exports` for its module `__getattr__` and `__dir__`.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ("lazy_exports",)


def lazy_exports(
    namespace: dict[str, Any],
    modules: Mapping[str, str],
    *,
    computed: Mapping[str, Callable[[], Any]] | None = None,
    deprecated: Mapping[str, tuple[str, str, str]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's `__getattr__` and `__dir__` for names imported on first use.

    Assign them at the module's top level (`__getattr__, __dir__ = lazy_exports(...)`)
    and import the same names under `if typing.TYPE_CHECKING:` so type checkers see them.
    A name once imported is kept in the module's globals, so `__getattr__` runs once per
    name.

    Args:
        namespace: The module's `globals()`.
        modules: Each exported name and the module, relative to the package, that
            defines it (`{"Capability": "base"}`).
        computed: Names whose value a function makes on first use (`__version__`).
        deprecated: Old names still importable with a `DeprecationWarning`: each maps to
            (module, new name, the warning's text); not kept, so each use warns.

    Returns:
        The module's `__getattr__` (an unknown name raises `AttributeError` as Python's
        own does) and its `__dir__` (the exported names included before their first use).
    """
    package = namespace["__package__"]
    module_name = namespace["__name__"]
    made = dict(computed or {})
    old = dict(deprecated or {})

    def __getattr__(name: str) -> Any:
        if name in old:
            module, new, why = old[name]
            warnings.warn(why, DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(f".{module}", package), new)
        if name in made:
            value = made[name]()
        elif name in modules:
            value = getattr(importlib.import_module(f".{modules[name]}", package), name)
        else:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *modules, *made})

    return __getattr__, __dir__
