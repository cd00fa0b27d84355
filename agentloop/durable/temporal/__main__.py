"""`python -m agentloop.durable.temporal worker module:attribute --address ...`."""

from agentloop.durable.temporal.worker import main

main()
