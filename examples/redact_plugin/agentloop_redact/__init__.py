"""Example agentloop plugin: a capability keeping personal data in tool results from the model."""
