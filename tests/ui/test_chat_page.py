"""The chat page in a real headless Chromium, as a person uses it.

Chromium (Debian's `chromium`; `.ci/run` installs it) is driven over the DevTools
protocol by puppeteer-core (tests/ui/chat_page.mjs). The page sends a prompt; the model
(a scripted Messages API on 127.0.0.1) calls two tools in parallel and a third that needs
approval; the browser sees both cards running at once (their tools wait until it has),
clicks "Approve", and reads the final answer and the cost. A screenshot of the finished
page is saved as a test artifact: in $AGENTLOOP_TEST_ARTIFACTS when set (CI keeps it;
docs/images/chat-page.png is a copy), else in the test's temporary folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest
from _ui import node, npm_prefix
from support import serving

from agentloop import Agent, tool
from agentloop.testing import MessagesServer, reply, tool_call
from agentloop.ui import chat_app

MODEL = "claude-sonnet-4-5"
CHROMIUM = os.environ.get("AGENTLOOP_TEST_CHROMIUM") or shutil.which("chromium") or ""


@pytest.fixture(scope="module", autouse=True)
def _browser() -> None:
    if not CHROMIUM:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does it)")
    npm_prefix("puppeteer-core")


@pytest.fixture
def screenshot(tmp_path: Path) -> Path:
    """Where the finished page's screenshot goes (see the module's docstring)."""
    artifacts = Path(os.environ.get("AGENTLOOP_TEST_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    return artifacts / "chat-page.png"


async def test_two_calls_run_at_once_a_third_is_approved_and_the_answer_shows(
    screenshot: Path,
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    release = anyio.Event()

    @tool
    async def get_weather(city: str) -> str:
        """Current weather for a city."""
        with anyio.fail_after(30):  # until the browser has seen both cards running
            await release.wait()
        return f"Sunny in {city}, 24°C"

    @tool(requires_approval=lambda ctx, input: f"a refund of {input['amount']} EUR")
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} EUR on {order}"

    async def released(request: object) -> PlainTextResponse:
        release.set()
        return PlainTextResponse("ok")

    script = [
        reply(
            "Let me look up both cities and start the refund.",
            tool_call("get_weather", {"city": "Paris"}),
            tool_call("get_weather", {"city": "Rome"}),
            tool_call("refund", {"order": "B2", "amount": 120}),
            model=MODEL,
            usage={"input_tokens": 1200, "output_tokens": 180},
        ),
        reply(
            "It is sunny in Paris and Rome (24°C), and order B2 was refunded 120 EUR.",
            model=MODEL,
            usage={"input_tokens": 1500, "output_tokens": 40},
        ),
    ]
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), model=MODEL, tools=[get_weather, refund])
        app = Starlette(
            routes=[
                Route("/test/release", released, methods=["POST"]),
                Mount("/", chat_app(agent)),
            ]
        )
        async with serving(app) as url:
            seen = await node("chat_page.mjs", url + "/", str(screenshot))

    assert seen["problems"] == [] and seen["error"] is None
    # everything the page loaded came from the package, through this server
    assert all(u.startswith(url) for u in seen["loaded"])
    assert sorted(seen["runningTogether"]) == [
        '{\n  "city": "Paris"\n}',
        '{\n  "city": "Rome"\n}',
    ]
    assert seen["waiting"]["tool"] == "refund"
    assert seen["waiting"]["reason"].endswith("a refund of 120 EUR")
    assert seen["waiting"]["statusBar"] == "waiting"
    assert seen["waiting"]["buttonsShown"] == 2  # approve and deny, on the waiting card only
    assert seen["buttonsShown"] == 0
    assert [(c["tool"], c["status"]) for c in seen["cards"]] == [
        ("get_weather", "done"),
        ("get_weather", "done"),
        ("refund", "done"),
    ]
    assert seen["cards"][0]["result"] == "Sunny in Paris, 24°C"
    assert seen["cards"][2]["result"] == "refunded 120 EUR on B2"
    assert all(" s" in c["state"] for c in seen["cards"])  # each shows its duration
    assert seen["cards"][2]["state"].startswith("approved · done")
    assert seen["answer"][-1] == (
        "It is sunny in Paris and Rome (24°C), and order B2 was refunded 120 EUR."
    )
    assert seen["tokens"] == str(1200 + 180 + 1500 + 40)
    assert seen["cost"].startswith("$0.0") and seen["cost"] != "$0.000000"
    assert seen["screenshotBytes"] > 10_000
