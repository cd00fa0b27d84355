"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails
(`agentloop.capabilities.guardrails`), model fallback (`Fallback`) and retries
(`Retries`) are built on it. The names are imported on first use: plugins import
`agentloop.capabilities.base` at start-up, and the built-ins import the whole loop.
"""

import typing

from agentloop.lazy import lazy_exports as _lazy_exports

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

__getattr__, __dir__ = _lazy_exports(globals(), _MODULES)
