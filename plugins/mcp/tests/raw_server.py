"""A hand-written MCP server over stdio, for what a server built with the SDK will not do.

It speaks line-delimited JSON-RPC with the initialize handshake and answers `initialize`,
`ping`, `tools/list` and `tools/call`; any other request is ignored, never answered (as
some servers do with `server/discover`). Options:

    --tools JSON        the tool listing to offer (default: one tool, `echo`)
    --instructions TXT  the server's instructions
    --garbage           write a line that is not JSON-RPC for every line read
    --mute              answer nothing at all (no handshake)

`tools/call` of `crash` exits the process mid-call; `cut_emoji` answers with a lone UTF-16
surrogate in its text (a JavaScript string cut mid-emoji); `latin1` with a byte that is not
UTF-8 in its text; `unreadable` with a reply whose result is not a tool result; any other
tool echoes its arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ECHO = {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", default=json.dumps([ECHO]))
    parser.add_argument("--instructions", default=None)
    parser.add_argument("--garbage", action="store_true")
    parser.add_argument("--mute", action="store_true")
    args = parser.parse_args()
    tools = json.loads(args.tools)
    for line in sys.stdin:
        message = json.loads(line)
        if args.garbage:
            print("this is not JSON-RPC", flush=True)
        if args.mute or "id" not in message:
            continue
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            result: dict[str, object] = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
            if args.instructions:
                result["instructions"] = args.instructions
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            name = params.get("name")
            if name == "crash":
                os._exit(1)
            if name == "latin1":
                head = json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "result": {"content": [{"type": "text", "text": "caf"}]},
                    }
                )
                raw = head.replace('"caf"', '"caf\xe9"').encode("latin-1")
                sys.stdout.buffer.write(raw + b"\n")
                sys.stdout.flush()
                continue
            text = json.dumps(params.get("arguments") or {}, sort_keys=True)
            if name == "cut_emoji":
                text = "cut \ud83d"  # json.dumps writes it as the escape \ud83d
            result = {"content": [{"type": "text", "text": text}]}
            if name == "unreadable":
                result = {"content": "not a list"}
        else:
            continue  # ignored, never answered
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


if __name__ == "__main__":
    main()
