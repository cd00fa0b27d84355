"""Durable runs on Temporal: the agent's loop as a workflow, each effect an activity.

`TemporalAgent(agent)` makes a workflow that runs the agent's own loop (a `Run` from
`Agent.start`, driven as always) with its two effects (`agentloop.effects`) performed as
activities: `model:{round}` sends one request, `tool:{round}:{tool_use_id}` runs one call
through the worker's registry. Temporal records each activity's JSON result; a worker that
replays the workflow after a crash gets those results back instead of performing the
effects again, and the loop rebuilds the same history. The run's id is the workflow id.

The workflow runs outside Temporal's sandbox (`sandboxed=False`): the sandbox re-imports a
workflow's module for every run, which a workflow made per agent cannot survive. The loop
is deterministic without it: it decides from values only, and the run's id is given.

| module | its job |
|---|---|
| `agent` | `TemporalAgent`: what workers hold, and the client's calls |
| `workflow` | the workflow's body, its effects and tasks, its updates and query |
| `activities` | the two activities, on a worker |
| `results` | a run's result or failure through its workflow's result |
| `worker` | `python -m agentloop.durable.temporal worker module:attribute` |
"""

from agentloop.durable.temporal.activities import without_sdk_retries
from agentloop.durable.temporal.agent import DurableAgent, TemporalAgent
from agentloop.durable.temporal.results import result_of
from agentloop.durable.temporal.worker import main
from agentloop.durable.temporal.workflow import (
    TemporalEffects,
    WorkflowTasks,
    decision_from_json,
    decision_to_json,
)

__all__ = (
    "DurableAgent",
    "TemporalAgent",
    "TemporalEffects",
    "WorkflowTasks",
    "decision_from_json",
    "decision_to_json",
    "main",
    "result_of",
    "without_sdk_retries",
)
