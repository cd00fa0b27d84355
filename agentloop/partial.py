"""Streamed typed output: the output as it arrives, parsed in pieces and partially validated.

`Agent.run_stream` hands each round's events through `PartialOutputs`: the JSON of the
output (the text of a native answer, the input of a final-result call) goes into a
`PartialJSON`, whose push parser (ijson) reads each piece once, so the value so far is
always at hand without parsing from the start. It is validated with pydantic's partial
validation and reported as a `PartialOutput` event whenever it has grown by half since
the last check, so the checks too cost time linear in the output's size.
"""

from __future__ import annotations

from typing import Any

import ijson  # type: ignore[import-untyped]  # no stubs; used through two calls
from pydantic import ValidationError

from .events import Event, PartialOutput, TextDelta, ToolCallStarted, ToolInputDelta
from .output import OutputChoice, OutputRun
from .turn import Emit

__all__ = ("PartialJSON", "PartialOutputs")


class PartialJSON:
    """A JSON value that arrives in pieces: `feed` each, read `value` at any time.

    `value` holds every complete scalar so far and the containers opened around them
    (a string or number still arriving is left out). After invalid JSON, `broken` is
    true and `value` stays as it was.
    """

    def __init__(self) -> None:
        """An empty value, waiting for its first piece."""
        self._events = ijson.sendable_list()
        self._parser = ijson.basic_parse_coro(self._events, use_float=True)
        self._stack: list[Any] = []  # the open containers, innermost last
        self._keys: list[str | None] = []  # the key awaiting a value, per open container
        self.value: Any = None
        self.size = 0
        """Characters fed so far."""
        self.broken = False

    def feed(self, piece: str) -> None:
        """Parse `piece`, the next part of the JSON text."""
        if self.broken or not piece:
            return
        self.size += len(piece)
        try:
            self._parser.send(piece.encode())
        except ijson.JSONError:
            self.broken = True
            return
        for event, data in self._events:
            self._take(event, data)
        del self._events[:]

    def _take(self, event: str, data: Any) -> None:
        if event == "map_key":
            self._keys[-1] = data
        elif event in ("end_map", "end_array"):
            self._stack.pop()
            self._keys.pop()
        elif event in ("start_map", "start_array"):
            container: Any = {} if event == "start_map" else []
            self._put(container)
            self._stack.append(container)
            self._keys.append(None)
        else:
            self._put(data)

    def _put(self, item: Any) -> None:
        if not self._stack:
            self.value = item
        elif isinstance(self._stack[-1], list):
            self._stack[-1].append(item)
        else:
            self._stack[-1][self._keys[-1]] = item


class PartialOutputs:
    """One round's events, with a `PartialOutput` after each piece that changed the output."""

    def __init__(self, output: OutputRun, emit: Emit, round_: int) -> None:
        """Watch round `round_` of a run whose output is `output`; events go on to `emit`."""
        self.output = output
        self.emit = emit
        self.round = round_
        self.json: PartialJSON | None = None
        self.choice: OutputChoice | None = output.schema.whole
        self.tool_use_id: str | None = None
        self.checked = 0  # the size of the JSON at the last validation
        self.reported: Any = None

    async def __call__(self, event: Event) -> None:
        """Pass `event` on, then report the output if it grew."""
        await self.emit(event)
        if self.output.mode == "native" and isinstance(event, TextDelta):
            await self._feed(event.text)
        elif self.output.mode == "tool" and isinstance(event, ToolCallStarted):
            if self.tool_use_id is None and event.name in self.output.tool_names:
                self.tool_use_id = event.tool_use_id
                self.choice = next(c for c in self.output.schema.choices if c.name == event.name)
        elif isinstance(event, ToolInputDelta) and event.tool_use_id == self.tool_use_id:
            await self._feed(event.partial_json)

    async def _feed(self, piece: str) -> None:
        if self.json is None:
            self.json = PartialJSON()
        self.json.feed(piece)
        if self.json.size - self.checked < max(self.checked // 2, 1):
            return
        self.checked = self.json.size
        assert self.choice is not None
        try:
            value = self.choice.validate(self.json.value, partial=True)
        except ValidationError:
            return  # not enough of it yet (a required field still to come)
        if value != self.reported:
            self.reported = value
            await self.emit(PartialOutput(self.round, value))
