"""The weather plugin's tools and the hook that registers them.

The readings are invented (seeded by the city name) so the example runs offline and
gives the same answer every time.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Literal

import anyio

import agentloop
from agentloop import ToolError


def _celsius(city: str, day: int = 0) -> float:
    seed = zlib.crc32(f"{city.strip().lower()}:{day}".encode())
    return round(-5 + (seed % 350) / 10, 1)


def _convert(celsius: float, units: Literal["metric", "imperial"]) -> str:
    if units == "imperial":
        return f"{celsius * 9 / 5 + 32:.1f} °F"
    return f"{celsius:.1f} °C"


def get_weather(city: str, units: Literal["metric", "imperial"] = "metric") -> str:
    """Current temperature in a city.

    Args:
        city: City name, e.g. "Paris".
        units: "metric" for Celsius, "imperial" for Fahrenheit.
    """
    if not city.strip():
        raise ToolError("city is empty: pass a city name such as 'Paris'")
    return f"{city}: {_convert(_celsius(city), units)}"


async def get_forecast(city: str, days: int = 3) -> list[str]:
    """Daily temperature forecast for a city (async: it waits on a pretend service).

    Args:
        city: City name, e.g. "Rome".
        days: How many days ahead, 1 to 7.
    """
    if not 1 <= days <= 7:
        raise ToolError(f"days must be between 1 and 7, got {days}")
    await anyio.sleep(0.01)
    return [f"day {d}: {_convert(_celsius(city, d), 'metric')}" for d in range(1, days + 1)]


@agentloop.hookimpl
def agentloop_register_tools(register: Callable[..., Any]) -> None:
    """Give agentloop this plugin's tools."""
    register(get_weather)
    register(get_forecast, timeout=5.0)
