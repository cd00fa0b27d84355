"""Tools for the gateway tests: a lookup, and a call that waits for the test to let it go.

It also ships a capability, `gwmask`, that masks every "value" in what a tool returns.
"""

from dataclasses import replace

import anyio

import agentloop


def lookup(key: str) -> str:
    """Look a key up in the gateway's table."""
    return f"value-of-{key}"


async def rendezvous(port: int, who: str = "") -> str:
    """Tell the test on `port` that the call (`who`, if given) is running; wait for go."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"started {who}".rstrip().encode() + b"\n")
        received = b""
        while not received.endswith(b"go\n"):
            received += await stream.receive()
    return "released"


class Mask(agentloop.Capability):
    """Masks every "value" in what a gateway tool returns."""

    name = "gwmask"

    async def wrap_tool_call(self, ctx, call, call_next):
        result = await call_next(call)
        return replace(result, content=result.text.replace("value", "[masked]"))


@agentloop.hookimpl
def agentloop_register_capabilities(register):
    register("gwmask", Mask)


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(lookup)
    register(rendezvous, timeout=60.0)
