"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails
(`agentloop.capabilities.guardrails`), model fallback (`Fallback`) and retries
(`Retries`) are built on it. The names are imported on first use: plugins import
`agentloop.capabilities.base` at start-up, and the built-ins import the whole loop.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from .base import Capability as Capability
    from .base import Chain as Chain
    from .base import NextCall as NextCall
    from .base import NextRequest as NextRequest
    from .fallback import Fallback as Fallback
    from .guardrails import InputGuardrail as InputGuardrail
    from .guardrails import OutputGuardrail as OutputGuardrail
    from .guardrails import ToolGuardrail as ToolGuardrail
    from .retries import Retries as Retries

# Where each exported name is defined: the module (below this package) it is imported from.
_MODULES = {
    "Capability": "base",
    "Chain": "base",
    "Fallback": "fallback",
    "InputGuardrail": "guardrails",
    "NextCall": "base",
    "NextRequest": "base",
    "OutputGuardrail": "guardrails",
    "Retries": "retries",
    "ToolGuardrail": "guardrails",
}

__all__ = tuple(sorted(_MODULES))


def __getattr__(name: str) -> typing.Any:
    """An exported name, imported from its module on first use."""
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the ones not yet imported included."""
    return sorted({*globals(), *__all__})
