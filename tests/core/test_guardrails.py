"""Guardrails: input, output and tool checks passing and tripping, and what a trip leaves.

Runs talk to `MessagesServer` through the SDK, JSON and streamed (`http_agent`); the
parallel input check's streamed cases run on every streaming provider (`STREAMING`).
"""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from agentloop import (
    Agent,
    Capability,
    ConfigurationError,
    GuardrailTripped,
    InputGuardrail,
    OutputGuardrail,
    RunContext,
    ToolGuardrail,
    lint_history,
    tool,
)
from agentloop.calls import ToolResult
from agentloop.capabilities import NextRequest
from agentloop.compaction import clear_old_tool_results
from agentloop.events import ToolCallReady, ToolResultEvent
from agentloop.messages import parse_history
from agentloop.providers.base import BlockStop, ModelRequest, ModelResponse
from agentloop.testing import Fault, SteppedProvider, reply, tool_call

STREAMING = ["stepped", "anthropic-sse", "openai-sse"]  # the `streaming_provider` kinds (conftest)

ran: list[str] = []


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value of {key}"


@tool
async def secret(key: str) -> str:
    """Read a secret."""
    ran.append(f"secret:{key}")
    return f"the secret {key} is 1234-5678"


@pytest.fixture(autouse=True)
def _nothing_ran_yet() -> None:
    ran.clear()


def valid(result: Any) -> None:
    assert result is not None
    lint_history(parse_history(result.messages))


def checking(verdict: str | None, seen: list[Any], kind: str) -> Any:
    """A guardrail function, sync or async, that records what it saw and says `verdict`."""

    def check(ctx: RunContext, value: Any) -> str | None:
        seen.append(value)
        return verdict

    async def acheck(ctx: RunContext, value: Any) -> str | None:
        await anyio.lowlevel.checkpoint()
        seen.append(value)
        return verdict

    return check if kind == "sync" else acheck


KINDS = [pytest.param("sync", id="sync"), pytest.param("async", id="async")]


# -- input


@pytest.mark.parametrize("kind", KINDS)
async def test_an_input_guardrail_that_passes_lets_the_run_go_on(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []
    agent, _ = http_agent(
        [reply(tool_call("lookup", {"key": "a"})), reply("done")],
        tools=[lookup],
        capabilities=[InputGuardrail(checking(None, seen, kind))],
    )
    result = await agent.run("look a up")
    assert result.text == "done" and ran == ["a"] and seen == ["look a up"]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_input_guardrail_that_trips_ends_the_run_before_any_request(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []
    check = checking("No keys in prompts.", seen, kind)
    agent, server = http_agent(
        [reply(tool_call("lookup", {"key": "a"}))],
        tools=[lookup],
        capabilities=[InputGuardrail(check, name="no_keys")],
    )
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("my key is sk-123")
    error = caught.value
    assert error.guardrail == "no_keys" and error.message == "No keys in prompts."
    assert "no_keys" in str(error) and "No keys in prompts." in str(error)
    assert server.requests == [] and ran == []
    assert error.result is not None and error.result.stop_reason == "error"
    assert error.result.usage.requests == 0
    valid(error.result)


async def test_a_guardrail_is_named_after_its_function(http_agent: Any) -> None:
    def no_keys(ctx: RunContext, prompt: Any) -> str | None:
        return "No keys." if "sk-" in str(prompt) else None

    agent, _ = http_agent([], capabilities=[InputGuardrail(no_keys)])
    with capture_logs() as logs, pytest.raises(GuardrailTripped) as caught:
        await agent.run("sk-123")
    assert caught.value.guardrail == "no_keys"
    [tripped] = [e for e in logs if e["event"] == "guardrail.tripped"]
    assert tripped["log_level"] == "warning" and tripped["kind"] == "InputGuardrail"
    assert (tripped["guardrail"], tripped["message"]) == ("no_keys", "No keys.")


async def test_an_input_guardrail_checks_the_last_user_message_of_a_history(
    http_agent: Any,
) -> None:
    # As the gateway and durable runs start: the new input is the history's last message.
    seen: list[Any] = []
    agent, server = http_agent([], capabilities=[InputGuardrail(checking("no", seen, "sync"))])
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "my key is sk-1"}]},
    ]
    with pytest.raises(GuardrailTripped):
        await agent.run(history=history)
    assert server.requests == []
    assert [[block.text for block in value] for value in seen] == [["my key is sk-1"]]


async def test_an_input_guardrail_does_not_check_tool_results(http_agent: Any) -> None:
    seen: list[Any] = []
    agent, _ = http_agent(
        [reply("done")], capabilities=[InputGuardrail(checking("no", seen, "sync"))]
    )
    history = [
        {"role": "user", "content": "look a up"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ]
    result = await agent.run(history=history)
    assert result.text == "done" and seen == []


def broken(ctx: RunContext, value: Any) -> str | None:
    raise ValueError("the classifier is down")


async def test_a_guardrail_that_raises_trips_and_is_logged(http_agent: Any) -> None:
    agent, server = http_agent([reply("never")], capabilities=[InputGuardrail(broken)])
    with capture_logs() as logs:
        with pytest.raises(GuardrailTripped) as caught:
            await agent.run("hi")
    assert caught.value.guardrail == "broken" and server.requests == []
    assert "ValueError: the classifier is down" in caught.value.message
    failed = [e for e in logs if e["event"] == "guardrail.failed"]
    assert failed and failed[0]["guardrail"] == "broken" and failed[0]["log_level"] == "error"


@pytest.mark.parametrize("answer", [True, False, "", 0])
async def test_a_guardrail_that_returns_neither_none_nor_a_message_trips(
    http_agent: Any, answer: Any
) -> None:
    agent, server = http_agent(
        [reply("never")], capabilities=[InputGuardrail(lambda ctx, value: answer)]
    )
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("hi")
    assert repr(answer) in caught.value.message and server.requests == []


# -- input, beside the first request


class Spy(Capability):
    """Inside the guardrail: says when the request goes out and when it came back."""

    def __init__(self) -> None:
        self.sent = anyio.Event()
        self.responded = anyio.Event()
        self.cancelled = False

    async def wrap_request(
        self, ctx: RunContext, request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        self.sent.set()
        try:
            response = await call_next(request)
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        self.responded.set()
        return response


async def test_a_parallel_input_guardrail_passes_and_is_asked_once_per_run(
    http_agent: Any,
) -> None:
    seen: list[Any] = []
    spy = Spy()

    async def check(ctx: RunContext, prompt: Any) -> None:
        await spy.sent.wait()  # the request is under way while the check runs
        seen.append(prompt)

    agent, server = http_agent(
        [reply(tool_call("lookup", {"key": "a"})), reply("done")],
        tools=[lookup],
        capabilities=[InputGuardrail(check, parallel=True)],
    )
    result = await agent.run("look a up", capabilities=[spy])
    assert result.text == "done" and ran == ["a"] and seen == ["look a up"]
    assert len(server.requests) == 2
    valid(result)


async def test_a_parallel_input_guardrail_cancels_the_request_in_flight(
    http_agent: Any,
) -> None:
    spy = Spy()

    async def check(ctx: RunContext, prompt: Any) -> str:
        await spy.sent.wait()
        return "Not today."

    slow = Fault.slow(60, reply(tool_call("lookup", {"key": "a"})))
    agent, _ = http_agent(
        [slow], tools=[lookup], capabilities=[InputGuardrail(check, parallel=True)]
    )
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("look a up", capabilities=[spy])
    assert caught.value.message == "Not today."
    assert spy.cancelled and not spy.responded.is_set() and ran == []
    # No response came in: nothing to count (as when any run is cancelled mid-request).
    assert caught.value.result is not None and caught.value.result.usage.requests == 0
    valid(caught.value.result)


async def test_a_parallel_input_guardrail_that_trips_after_the_response_counts_its_usage(
    http_agent: Any,
) -> None:
    spy = Spy()

    async def check(ctx: RunContext, prompt: Any) -> str:
        await spy.responded.wait()
        return "Too late, but still no."

    usage = {"input_tokens": 7, "output_tokens": 3}
    agent, _ = http_agent(
        [reply(tool_call("lookup", {"key": "a"}), usage=usage)],
        tools=[lookup],
        capabilities=[InputGuardrail(check, parallel=True)],
    )
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("look a up", capabilities=[spy])
    result = caught.value.result
    assert result is not None and ran == [] and not spy.cancelled
    assert result.usage.requests == 1
    assert (result.usage.input_tokens, result.usage.output_tokens) == (7, 3)
    # The response never reached the history: the run ends with the prompt alone.
    assert result.tool_calls == [] and len(result.messages) == 1
    valid(result)


@pytest.mark.parametrize("kind", STREAMING)
async def test_eager_calls_wait_for_a_parallel_input_guardrail_then_run(
    streaming_provider: Any, kind: str
) -> None:
    ready = anyio.Event()
    before_pass: list[str] = []

    async def check(ctx: RunContext, prompt: Any) -> None:
        await ready.wait()  # a call is ready while the response streams
        await anyio.wait_all_tasks_blocked()  # an unchecked call would have run by now
        before_pass.extend(ran)

    script = [reply(tool_call("lookup", {"key": "a"}), "and more text"), reply("done")]
    async with streaming_provider(kind, script) as provider:
        agent = Agent(
            provider=provider, tools=[lookup], capabilities=[InputGuardrail(check, parallel=True)]
        )
        async with agent.run_stream("look a up") as run:
            async for event in run:
                if isinstance(event, ToolCallReady):
                    assert event.eager
                    ready.set()
    assert before_pass == [] and ran == ["a"]
    assert run.result.text == "done"
    valid(run.result)


@pytest.mark.parametrize("kind", STREAMING)
async def test_a_parallel_input_guardrail_tripping_mid_stream_runs_no_eager_call(
    streaming_provider: Any, kind: str
) -> None:
    held = anyio.Event()

    async def hold(n: int, event: Any) -> None:
        if isinstance(event, BlockStop) and event.block.type == "tool_use":
            held.set()  # the call is ready (and started): hold the stream here
            await anyio.sleep_forever()

    async def check(ctx: RunContext, prompt: Any) -> str:
        await held.wait()
        return "No."

    spy = Spy()
    script = [reply(tool_call("lookup", {"key": "a"}), "never sent")]
    async with streaming_provider(kind, script, hold) as provider:
        agent = Agent(
            provider=provider, tools=[lookup], capabilities=[InputGuardrail(check, parallel=True)]
        )
        ready: list[ToolCallReady] = []
        with pytest.raises(GuardrailTripped) as caught:
            async with agent.run_stream("look a up", capabilities=[spy]) as run:
                async for event in run:
                    if isinstance(event, ToolCallReady):
                        ready.append(event)
    result = caught.value.result
    assert [e.eager for e in ready] == [True]  # it started, and waited for the check
    assert spy.cancelled and ran == [] and result is not None
    [call] = result.tool_calls
    assert call.is_error and call.output == "Not run: the input check 'check' did not pass."
    assert result.usage.requests == 0  # the response never came in whole
    valid(result)


async def test_a_parallel_input_check_dropped_with_a_refused_request_is_asked_again(
    http_agent: Any,
) -> None:
    asked: list[Any] = []

    async def check(ctx: RunContext, prompt: Any) -> None:
        asked.append(prompt)
        if len(asked) == 1:
            await anyio.sleep_forever()  # still checking when the refusal comes back

    agent, server = http_agent(
        [Fault.prompt_too_long(), reply("done")],
        history_processors=[clear_old_tool_results(5)],
        capabilities=[InputGuardrail(check, parallel=True)],
    )
    result = await agent.run("hi")
    assert result.text == "done" and asked == ["hi", "hi"] and len(server.requests) == 2
    valid(result)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_parallel_input_guardrail_holds_eager_calls_on_either_backend(backend: str) -> None:
    async def one_run(verdict: str | None) -> Any:
        ready = anyio.Event()

        async def hook(n: int, event: Any) -> None:
            if isinstance(event, BlockStop) and event.block.type == "tool_use":
                ready.set()
                if verdict is not None:
                    await anyio.sleep_forever()  # the stream stays open until the trip

        async def check(ctx: RunContext, prompt: Any) -> str | None:
            await ready.wait()
            await anyio.wait_all_tasks_blocked()  # an unchecked call would have run by now
            before_verdict.extend(ran)
            return verdict

        before_verdict: list[str] = []
        script = [reply(tool_call("lookup", {"key": "a"})), reply("done")]
        agent = Agent(
            provider=SteppedProvider(script, hook),
            tools=[lookup],
            capabilities=[InputGuardrail(check, parallel=True)],
        )
        ran.clear()
        async with agent.run_stream("look a up") as run:
            async for _ in run:
                pass
        assert before_verdict == []
        return run.result

    async def main() -> None:
        with anyio.fail_after(10):
            assert (await one_run(None)).text == "done" and ran == ["a"]
            with pytest.raises(GuardrailTripped) as caught:
                await one_run("No.")
            assert ran == [] and caught.value.result is not None
            valid(caught.value.result)

    anyio.run(main, backend=backend)


# -- output


@pytest.mark.parametrize("kind", KINDS)
async def test_an_output_guardrail_that_passes_hands_the_result_over(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []
    agent, _ = http_agent(
        [reply(tool_call("lookup", {"key": "a"})), reply("the value is 1")],
        tools=[lookup],
        capabilities=[OutputGuardrail(checking(None, seen, kind))],
    )
    result = await agent.run("look a up")
    assert result.text == "the value is 1" and seen == ["the value is 1"]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_output_guardrail_that_trips_raises_with_the_partial_result(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []
    agent, server = http_agent(
        [reply(tool_call("lookup", {"key": "a"})), reply("the secret is 1234")],
        tools=[lookup],
        capabilities=[OutputGuardrail(checking("It leaks a secret.", seen, kind), name="leaks")],
    )
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("look a up")
    assert caught.value.guardrail == "leaks" and caught.value.message == "It leaks a secret."
    result = caught.value.result
    assert result is not None and result.stop_reason == "error"
    assert result.text == "the secret is 1234" and result.usage.requests == 2
    assert ran == ["a"] and len(server.requests) == 2
    valid(result)


class Forecast(BaseModel):
    city: str
    temp_c: int


async def test_an_output_guardrail_checks_a_typed_output(http_agent: Any) -> None:
    seen: list[Any] = []

    def plausible(ctx: RunContext, output: Forecast) -> str | None:
        seen.append(output)
        return None if -60 < output.temp_c < 60 else "Not a temperature on Earth."

    script = [
        reply(output={"city": "Paris", "temp_c": 21}),
        reply(output={"city": "X", "temp_c": 99}),
    ]
    agent, _ = http_agent(script, output_type=Forecast, capabilities=[OutputGuardrail(plausible)])
    result = await agent.run("Weather in Paris?")
    assert result.output == Forecast(city="Paris", temp_c=21) and seen == [result.output]
    with pytest.raises(GuardrailTripped, match="Not a temperature on Earth"):
        await agent.run("Weather in X?")


# -- tools


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_guardrail_that_trips_before_answers_the_call_and_the_tool_does_not_run(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []
    guard = ToolGuardrail(before=checking("Secrets are not for you.", seen, kind), tools=["secret"])
    script = [reply(tool_call("secret", {"key": "k"}), tool_call("lookup", {"key": "a"}))]
    script.append(reply("done"))
    agent, _ = http_agent(script, tools=[lookup, secret], capabilities=[guard])
    result = await agent.run("go")
    assert result.text == "done" and ran == ["a"] and seen == [{"key": "k"}]
    denied, looked = result.tool_calls
    assert denied.is_error and denied.output == "Secrets are not for you."
    assert not looked.is_error and looked.output == "value of a"
    valid(result)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_guardrail_that_trips_after_replaces_the_result(
    http_agent: Any, kind: str
) -> None:
    seen: list[Any] = []

    def scan(ctx: RunContext, result: ToolResult) -> str | None:
        seen.append((ctx.tool_name, result.text))
        return "The result held a secret; it was withheld." if "1234" in result.text else None

    async def ascan(ctx: RunContext, result: ToolResult) -> str | None:
        return scan(ctx, result)

    script = [reply(tool_call("secret", {"key": "k"}), tool_call("lookup", {"key": "a"}))]
    script.append(reply("done"))
    guard = ToolGuardrail(after=scan if kind == "sync" else ascan)
    agent, server = http_agent(script, tools=[lookup, secret], capabilities=[guard])
    async with agent.start("go") as run:
        shown = [e.output async for e in run if isinstance(e, ToolResultEvent)]
    result = run.result
    assert sorted(ran) == ["a", "secret:k"]  # both ran
    assert sorted(shown) == ["The result held a secret; it was withheld.", "value of a"]
    withheld, looked = result.tool_calls
    assert withheld.is_error and withheld.output == "The result held a secret; it was withheld."
    assert looked.output == "value of a"
    sent = server.requests[1]["messages"][-1]["content"]
    assert not any("1234" in str(block["content"]) for block in sent)  # ids are random hex
    assert sorted(seen) == [("lookup", "value of a"), ("secret", "the secret k is 1234-5678")]
    valid(result)


@pytest.mark.parametrize("where", ["before", "after"])
async def test_a_tool_guardrail_may_end_the_run_and_no_tool_runs_after(
    http_agent: Any, where: str
) -> None:
    def no_secrets(ctx: RunContext, value: Any) -> str | None:
        return "Secrets end this run." if ctx.tool_name == "secret" else None

    script = [reply(tool_call("secret", {"key": "k"})), reply(tool_call("lookup", {"key": "a"}))]
    guard = ToolGuardrail(**{where: no_secrets}, end_run=True)
    agent, server = http_agent(script, tools=[lookup, secret], capabilities=[guard])
    with pytest.raises(GuardrailTripped) as caught:
        await agent.run("go")
    assert caught.value.guardrail == "no_secrets" and len(server.requests) == 1
    assert ran == ([] if where == "before" else ["secret:k"])
    result = caught.value.result
    assert result is not None and result.stop_reason == "error"
    assert result.tool_calls[0].is_error and "1234" not in result.tool_calls[0].output
    valid(result)


async def test_a_tool_guardrail_that_raises_answers_the_call_with_its_failure(
    http_agent: Any,
) -> None:
    script = [reply(tool_call("lookup", {"key": "a"})), reply("done")]
    agent, _ = http_agent(script, tools=[lookup], capabilities=[ToolGuardrail(before=broken)])
    with capture_logs() as logs:
        result = await agent.run("go")
    assert ran == [] and result.tool_calls[0].is_error
    assert "failed (ValueError: the classifier is down)" in result.tool_calls[0].output
    assert any(e["event"] == "guardrail.failed" and e["tool"] == "lookup" for e in logs)
    valid(result)


# -- sub-agents


async def test_guardrails_apply_inside_a_sub_agent(http_agent: Any) -> None:
    def no_keys(ctx: RunContext, prompt: Any) -> str | None:
        return "No keys." if "sk-" in str(prompt) else None

    worker, _ = http_agent(
        [reply(tool_call("secret", {"key": "w"})), reply("found nothing")],
        tools=[lookup, secret],
        name="worker",
        capabilities=[
            InputGuardrail(no_keys),
            ToolGuardrail(before=lambda ctx, value: "Not here.", tools=["secret"]),
        ],
    )
    boss, _ = http_agent(
        [
            reply(tool_call("worker", {"prompt": "find the secret"})),
            reply(tool_call("worker", {"prompt": "use sk-1"})),
            reply("the worker could not"),
        ],
        tools=[worker.as_tool()],
    )
    result = await boss.run("go")
    assert result.text == "the worker could not" and ran == []
    first, second = result.tool_calls
    assert first.output == "found nothing"
    assert second.is_error and "guardrail 'no_keys' tripped: No keys." in second.output
    valid(result)


# -- configuration


def test_guardrail_tripped_pickles_whole() -> None:
    # A durable engine records a run's error and raises it again in another process.
    error = GuardrailTripped("No keys.", guardrail="no_keys")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is GuardrailTripped and str(again) == str(error)
    assert (again.guardrail, again.message, again.result) == ("no_keys", "No keys.", None)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: InputGuardrail("not a function"), id="input-not-callable"),
        pytest.param(lambda: InputGuardrail(broken, parallel="yes"), id="parallel-not-bool"),
        pytest.param(lambda: InputGuardrail(broken, name=""), id="empty-name"),
        pytest.param(lambda: OutputGuardrail(None), id="output-not-callable"),
        pytest.param(lambda: ToolGuardrail(), id="tool-no-function"),
        pytest.param(lambda: ToolGuardrail(before=broken, tools="lookup"), id="tools-a-string"),
        pytest.param(lambda: ToolGuardrail(before=broken, tools=[1]), id="tools-not-names"),
        pytest.param(lambda: ToolGuardrail(after=broken, end_run=1), id="end-run-not-bool"),
    ],
)
def test_a_guardrail_made_wrong_is_refused(make: Any) -> None:
    with pytest.raises(ConfigurationError):
        make()
