"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails
(`agentloop.capabilities.guardrails`), model fallback and retries are built on it.
"""

from .base import Capability as Capability
from .base import Chain as Chain
from .base import NextCall as NextCall
from .base import NextRequest as NextRequest
from .guardrails import InputGuardrail as InputGuardrail
from .guardrails import OutputGuardrail as OutputGuardrail
from .guardrails import ToolGuardrail as ToolGuardrail

__all__ = (
    "Capability",
    "Chain",
    "InputGuardrail",
    "NextCall",
    "NextRequest",
    "OutputGuardrail",
    "ToolGuardrail",
)
