"""`python -m agentloop.gateway [options]`: the same as `agentloop serve [options]`."""

import argparse
import sys

from .cli import add_serve_command, serve_command

parser = argparse.ArgumentParser(prog="python -m agentloop.gateway")
add_serve_command(parser.add_subparsers(dest="command", required=True))
raise SystemExit(serve_command(parser.parse_args(["serve", *sys.argv[1:]])))
