"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails
(`agentloop.capabilities.guardrails`), model fallback (`Fallback`) and retries
(`Retries`) are built on it.
"""

from .base import Capability as Capability
from .base import Chain as Chain
from .base import NextCall as NextCall
from .base import NextRequest as NextRequest
from .fallback import Fallback as Fallback
from .guardrails import InputGuardrail as InputGuardrail
from .guardrails import OutputGuardrail as OutputGuardrail
from .guardrails import ToolGuardrail as ToolGuardrail
from .retries import Retries as Retries

__all__ = (
    "Capability",
    "Chain",
    "Fallback",
    "InputGuardrail",
    "NextCall",
    "NextRequest",
    "OutputGuardrail",
    "Retries",
    "ToolGuardrail",
)
