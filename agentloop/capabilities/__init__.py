"""Capabilities: one middleware surface around a run, and the ones agentloop ships.

`Capability` is the surface (see `agentloop.capabilities.base`); guardrails, model
fallback and retries are built on it.
"""

from .base import Capability as Capability
from .base import Chain as Chain
from .base import NextCall as NextCall
from .base import NextRequest as NextRequest

__all__ = ("Capability", "Chain", "NextCall", "NextRequest")
