"""Quickstart: two tools, one agent, one run (offline on a scripted model without a key)."""

import logging
import os
from typing import Literal

import structlog

from agentloop import Agent, tool
from agentloop.testing import ScriptedProvider, reply, tool_call

# The application, not the library, decides what gets logged: here warnings and up.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@tool
def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
    """Current weather for a city."""
    return f"{city}: 21 °{unit.upper()}, sunny"


@tool
async def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


script = [  # what the offline stand-in for Claude answers, request by request
    reply(tool_call("get_weather", {"city": "Paris"}), tool_call("add", {"a": 2, "b": 3})),
    reply("Paris is sunny at 21 °C, and 2 + 3 = 5."),
]
offline = None if os.environ.get("ANTHROPIC_API_KEY") else ScriptedProvider(script)

agent = Agent(provider=offline, tools=[get_weather, add], max_rounds=5)
result = agent.run_sync("Weather in Paris? And what is 2 + 3?")
print(result.text)
for call in result.tool_calls:
    print(f"  {call.name}({call.input}) -> {call.output}")
