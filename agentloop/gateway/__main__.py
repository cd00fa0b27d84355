"""`python -m agentloop.gateway [options]`: the same as `agentloop serve [options]`.

It runs the `agentloop` command's `serve`, so the plugins' options, logging (`-v`,
`--log-json`), errors and exit codes are the same.
"""

import sys

from agentloop.cli import main

raise SystemExit(main(["serve", *sys.argv[1:]]))
