"""Durable runs: the loop's two effects recorded by a workflow engine, surviving the process.

A run's model requests and tool calls go through `agentloop.effects`; an engine adapter
performs each as a step of a workflow whose id is the run's id, and a run replayed after
a crash gets every recorded outcome back instead of performing it again. The adapters
live in their own modules, each importing its engine only when used:
`agentloop.durable.dbos` (DBOS). `agentloop.durable.records` holds what they share: a
`RunResult` as JSON values, which is what a workflow records as its result.
"""
