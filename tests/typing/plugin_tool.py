"""The plugin tool of docs/plugins.md, as the page writes it, and a bare `RunContext`.

`.ci/run` type-checks this folder with `mypy --strict`; tests/core/test_tools.py checks
that the page still holds this block.
"""

# acme_tools/tools.py
import json
import os
from dataclasses import dataclass
from pathlib import Path

from agentloop import RunContext, ToolError


@dataclass(frozen=True)
class Orders:
    """The plugin's deps: the order book its tools read."""

    status: dict[str, str]


def load_orders() -> Orders:
    """The order book in the JSON file ACME_ORDERS names (orders.json by default)."""
    path = Path(os.environ.get("ACME_ORDERS", "orders.json"))
    try:
        return Orders(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ToolError(f"the order book {path} cannot be read: {exc}") from exc


def lookup_order(order_id: str, ctx: RunContext[Orders]) -> str:
    """Status of an order.

    Args:
        order_id: The order number, e.g. "A1".
    """
    orders = ctx.deps.status  # the plugin's own deps, made by load_orders
    if order_id not in orders:
        raise ToolError(f"no order {order_id!r}; order numbers look like 'A1'")
    return orders[order_id]


def lookup_order_bare(order_id: str, ctx: RunContext) -> str:
    """A bare `RunContext` needs no type arguments: `deps` is `Any`."""
    table: dict[str, str] = ctx.deps["orders"]
    return table[order_id]
