"""Benchmarks for agentloop (not part of the package): run `python -m benchmarks`."""
