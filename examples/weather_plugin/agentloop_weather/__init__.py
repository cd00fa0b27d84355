"""Example agentloop plugin: made-up weather, served through the `agentloop` entry point."""
