"""`python -m agentloop.gateway [options]`: the same as `agentloop serve [options]`.

Like the `agentloop` command, it configures logging for itself (warnings on stderr;
every event with `-v`, JSON lines with `--log-json`) and puts it back when it ends.
"""

import argparse
import sys

from agentloop.cli.logs import command_logging, configure_logging, logging_options

from .cli import add_serve_command, serve_command

parser = argparse.ArgumentParser(prog="python -m agentloop.gateway")
add_serve_command(parser.add_subparsers(dest="command", required=True), parents=[logging_options()])
args = parser.parse_args(["serve", *sys.argv[1:]])
with command_logging():
    configure_logging(json_logs=args.log_json, verbose=args.verbose)
    code = serve_command(args)
raise SystemExit(code)
