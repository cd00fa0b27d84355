"""`python -m agentloop`: the same command as the `agentloop` console script."""

from .cli import main

raise SystemExit(main())
