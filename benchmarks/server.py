"""The benchmark's Messages-API server, in its own process.

    python -m benchmarks.server [--port 0]

Prints `port N` once it listens, then serves `benchmarks.scenarios.respond` until it is
terminated. It does not lint or keep requests: it must not be what is measured.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from agentloop.messages import Message
from agentloop.testing import MessagesServer, ScriptedModel
from benchmarks.scenarios import respond


class BenchModel(ScriptedModel):
    """A `ScriptedModel` that neither parses histories nor keeps request bodies."""

    def __init__(self) -> None:
        super().__init__(respond, lint=False)
        self.sinks: list[list[Any]] = [self.requests]

    def check(self, body: Mapping[str, Any], *, allow_file_sources: bool = False) -> list[Message]:
        return []

    def respond(self, body: Mapping[str, Any], *, allow_file_sources: bool = False) -> Any:
        answer = super().respond(body, allow_file_sources=allow_file_sources)
        for sink in self.sinks:
            sink.clear()
        return answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    model = BenchModel()
    server = MessagesServer(model, port=args.port)
    model.sinks.append(server.requests)
    model.sinks.append(server.request_times)
    model.sinks.append(server.recorded)  # whole bodies: S6 would keep every history
    server.start()
    print(f"port {server.base_url.rsplit(':', 1)[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
