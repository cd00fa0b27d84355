"""The plugin tool of docs/plugins.md, as the page writes it: a bare `RunContext`.

`.ci/run` type-checks this folder with `mypy --strict`; tests/core/test_tools.py checks
that the page still holds this block.
"""

# acme_tools/tools.py
from agentloop import RunContext, ToolError


def lookup_order(order_id: str, ctx: RunContext) -> str:
    """Status of an order.

    Args:
        order_id: The order number, e.g. "A1".
    """
    orders: dict[str, str] = ctx.deps["orders"]  # the service passes its data in deps
    if order_id not in orders:
        raise ToolError(f"no order {order_id!r}; order numbers look like 'A1'")
    return orders[order_id]
