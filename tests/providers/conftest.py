"""The providers layer: the Anthropic and OpenAI-format providers over real SDK clients.

Its fixtures are the top-level ones (`serve`, `serve_chat`, `http_agent`); the
Chat Completions tests need the openai extra (`pip install 'agentloop-runner[openai]'`).
"""
