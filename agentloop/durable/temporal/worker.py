"""`python -m agentloop.durable.temporal worker module:attribute`: a `TemporalAgent`'s worker."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence

from temporalio.client import Client

from agentloop.durable.temporal.agent import TemporalAgent

__all__ = ("main",)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m agentloop.durable.temporal worker module:durable_agent --address ...`."""
    parser = argparse.ArgumentParser(prog="python -m agentloop.durable.temporal")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run a worker for a TemporalAgent's runs")
    worker.add_argument("target", help="module:attribute naming a TemporalAgent")
    worker.add_argument("--address", default="localhost:7233", help="Temporal server HOST:PORT")
    worker.add_argument("--namespace", default="default")
    worker.add_argument("--task-queue", default=None, help="default: the agent's task queue")
    worker.add_argument(
        "--max-cached-workflows",
        type=int,
        default=None,
        help="workflows kept in memory between tasks (0: replay each task from history)",
    )
    args = parser.parse_args(argv)
    module_name, _, attribute = args.target.partition(":")
    durable = getattr(importlib.import_module(module_name), attribute or "durable_agent")
    if not isinstance(durable, TemporalAgent):
        parser.error(f"{args.target} is a {type(durable).__name__}, not a TemporalAgent")
    options = {}
    if args.max_cached_workflows is not None:
        options["max_cached_workflows"] = args.max_cached_workflows

    async def serve() -> None:
        client = await Client.connect(args.address, namespace=args.namespace)
        await durable.worker(client, task_queue=args.task_queue, **options).run()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(130)
