"""Batch runs: many runs of one agent, each round's requests sent as one message batch.

`Agent.run_batch` (`runner.run_batch`) drives the runs; `BatchStore` keeps what lets a
job pick its pending batches up again after a restart. See docs/batches.md.
"""

from .runner import BatchOutcome as BatchOutcome
from .runner import run_batch as run_batch
from .store import BatchStore as BatchStore

__all__ = ("BatchOutcome", "BatchStore", "run_batch")
