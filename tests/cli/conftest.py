"""The cli layer: the `agentloop` command and plugin discovery, run in real subprocesses.

Its tests install their own small plugins into temporary folders; no fixture is shared.
"""
