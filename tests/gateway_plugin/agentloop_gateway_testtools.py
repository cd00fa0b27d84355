"""Tools for the gateway tests: a lookup, and a call that waits for the test to let it go."""

import anyio

import agentloop


def lookup(key: str) -> str:
    """Look a key up in the gateway's table."""
    return f"value-of-{key}"


async def rendezvous(port: int) -> str:
    """Tell the test on `port` that the call is running, then wait until it says go."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(b"started\n")
        received = b""
        while not received.endswith(b"go\n"):
            received += await stream.receive()
    return "released"


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(lookup)
    register(rendezvous, timeout=60.0)
