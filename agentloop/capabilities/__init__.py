"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails, model
fallback (`Fallback`) and retries (`Retries`) are built on it.
"""

from .base import Capability as Capability
from .base import Chain as Chain
from .base import NextCall as NextCall
from .base import NextRequest as NextRequest
from .fallback import Fallback as Fallback
from .retries import Retries as Retries

__all__ = ("Capability", "Chain", "Fallback", "NextCall", "NextRequest", "Retries")
