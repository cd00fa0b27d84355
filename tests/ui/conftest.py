"""The front-end layer: the adapters against the protocols' npm clients, the chat page
in Chromium. Helpers are in _ui.py and tests/support.py."""
