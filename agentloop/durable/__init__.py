"""Durable runs: the loop's two effects (a model request, a tool call) as an engine's steps.

`agentloop.durable.temporal` runs an agent's loop as a Temporal workflow.
"""
