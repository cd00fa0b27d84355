"""Typed output: output types, the tool mode, validation, retries and validators."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from agentloop import (
    Agent,
    AnthropicProvider,
    ConfigurationError,
    ModelRetry,
    OutputValidationError,
    RunContext,
    ToolError,
    lint_history,
    tool,
)
from agentloop.messages import parse_history
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call


class Forecast(BaseModel):
    """A weather forecast."""

    city: str
    temp_c: float = Field(ge=-90, le=60)


class Failure(BaseModel):
    """Why there is no forecast."""

    reason: str


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


calls: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    calls.append(city)
    return f"{city}: 21 C, sunny"


@tool
def strict_lookup(key: str) -> str:
    """Look a key up."""
    raise ToolError(f"no key {key!r}; try 'a'")


def lint(messages: list[dict[str, Any]]) -> None:
    lint_history(parse_history(messages))


def tools_sent(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in body.get("tools", [])}


@pytest.mark.both_formats
async def test_tool_mode_ends_in_the_round_of_the_final_result_call(http_agent: Any) -> None:
    calls.clear()
    script = [
        reply(tool_call("get_weather", {"city": "Paris"})),
        reply(tool_call("final_result", {"city": "Paris", "temp_c": 21})),
    ]
    agent, server = http_agent(
        script, tools=[get_weather], output_type=Forecast, output_mode="tool"
    )
    result = await agent.run("Weather in Paris?")
    assert result.output == Forecast(city="Paris", temp_c=21.0)
    assert result.stop_reason == "end_turn" and result.rounds == 2
    assert len(server.model.requests) == 2  # no request after the final result
    announced = tools_sent(server.model.requests[0])
    assert set(announced) == {"get_weather", "final_result"}
    schema = announced["final_result"]["input_schema"]
    assert schema["required"] == ["city", "temp_c"]
    assert schema["properties"]["temp_c"]["maximum"] == 60
    assert "A weather forecast." in announced["final_result"]["description"]
    # The final-result call is answered, so the history can be sent again as it is.
    assert result.messages[-1]["content"][0]["type"] == "tool_result"
    lint(result.messages)
    assert calls == ["Paris"]


@pytest.mark.parametrize(
    ("output_type", "sent", "expected"),
    [
        pytest.param(Forecast, {"city": "Rome", "temp_c": 30}, Forecast(city="Rome", temp_c=30), id="model"),
        pytest.param(Point, {"x": 1, "y": 2}, Point(1, 2), id="dataclass"),
        pytest.param(Movie, {"title": "Up", "year": 2009}, {"title": "Up", "year": 2009}, id="typeddict"),
        pytest.param(int, {"response": 42}, 42, id="int"),
        pytest.param(list[str], {"response": ["a", "b"]}, ["a", "b"], id="list"),
        pytest.param(Literal["yes", "no"], {"response": "no"}, "no", id="literal"),
    ],
)  # fmt: skip
async def test_each_kind_of_output_type_in_tool_mode(
    serve: Any, output_type: Any, sent: dict[str, Any], expected: Any
) -> None:
    server: MessagesServer = serve([reply(tool_call("final_result", sent))])
    agent = Agent(client=server.client(), output_type=output_type, output_mode="tool")
    result = await agent.run("go")
    assert result.output == expected
    schema = tools_sent(server.model.requests[0])["final_result"]["input_schema"]
    assert schema["type"] == "object"
    if "response" in sent:  # a type that is not an object travels inside one
        assert schema["required"] == ["response"]


async def test_a_union_offers_each_member_as_its_own_final_result_tool(serve: Any) -> None:
    server = serve([reply(tool_call("final_result_Failure", {"reason": "no such city"}))])
    agent: Agent[Any, Forecast | Failure] = Agent(
        client=server.client(), output_type=Forecast | Failure, output_mode="tool"
    )
    result = await agent.run("Weather in Atlantis?")
    assert result.output == Failure(reason="no such city")
    announced = tools_sent(server.model.requests[0])
    assert set(announced) == {"final_result_Forecast", "final_result_Failure"}
    assert announced["final_result_Failure"]["input_schema"]["required"] == ["reason"]


async def test_str_in_a_union_lets_plain_text_end_the_run(serve: Any) -> None:
    server = serve([reply("It is sunny.")])
    agent: Agent[Any, Forecast | str] = Agent(
        client=server.client(), output_type=Forecast | str, output_mode="tool"
    )
    result = await agent.run("Weather?")
    assert result.output == "It is sunny."
    assert set(tools_sent(server.model.requests[0])) == {"final_result"}


@pytest.mark.both_formats
async def test_str_is_the_default_output_the_final_text(http_agent: Any) -> None:
    agent, server = http_agent([reply("Hello there")])
    result = await agent.run("hi")
    assert result.output == result.text == "Hello there"
    assert "tools" not in server.model.requests[0]


async def test_output_type_per_run_overrides_the_agents(serve: Any) -> None:
    server = serve([reply(tool_call("final_result", {"response": 7}))])
    agent = Agent(client=server.client(), output_type=Forecast, output_mode="tool")
    result = await agent.run("a number", output_type=int)
    assert result.output == 7
    assert "temp_c" not in json.dumps(server.model.requests[0]["tools"])


@pytest.mark.both_formats
async def test_an_invalid_output_is_sent_back_naming_the_field(http_agent: Any) -> None:
    script = [
        reply(tool_call("final_result", {"city": "Paris", "temp_c": 99})),
        reply(tool_call("final_result", {"city": "Paris", "temp_c": 21})),
    ]
    agent, server = http_agent(script, output_type=Forecast, output_mode="tool")
    result = await agent.run("Weather in Paris?")
    assert result.output.temp_c == 21
    assert len(server.model.requests) == 2
    answer = server.model.requests[1]["messages"][-1]["content"][0]
    assert answer["is_error"] is True
    content = answer["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert "- temp_c: Input should be less than or equal to 60 (got 99)" in text
    lint(result.messages)


@pytest.mark.both_formats
async def test_invalid_every_time_ends_with_output_validation_error(http_agent: Any) -> None:
    bad = reply(tool_call("final_result", {"city": "Paris"}))
    agent, server = http_agent(
        lambda body: bad | {"content": [tool_call("final_result", {"city": "Paris"})]},
        output_type=Forecast,
        output_mode="tool",
        output_retries=1,
    )
    with pytest.raises(OutputValidationError) as caught:
        await agent.run("Weather in Paris?")
    assert len(server.model.requests) == 2  # the first try and one retry
    assert "temp_c: required argument is missing" in caught.value.problems
    partial = caught.value.result
    assert partial is not None and partial.output is None
    lint(partial.messages)  # the last failed call is answered: valid to continue
    assert partial.messages[-1]["content"][0]["is_error"] is True


async def test_a_validator_raising_tool_error_sends_the_model_back(serve: Any) -> None:
    script = [
        reply(tool_call("final_result", {"city": "Atlantis", "temp_c": 20})),
        reply(tool_call("final_result", {"city": "Paris", "temp_c": 20})),
    ]
    server = serve(script)
    agent = Agent(client=server.client(), output_type=Forecast, output_mode="tool")
    seen: list[tuple[str, Any]] = []

    @agent.output_validator
    async def known_city(ctx: RunContext[set[str]], forecast: Forecast) -> Forecast:
        seen.append((ctx.tool_name, ctx.deps))
        if forecast.city not in ctx.deps:
            raise ToolError(f"{forecast.city} is not a city we know")
        return forecast

    @agent.output_validator
    def upper(forecast: Forecast) -> Forecast:
        return forecast.model_copy(update={"city": forecast.city.upper()})

    result = await agent.run("Weather?", deps={"Paris"})
    assert result.output == Forecast(city="PARIS", temp_c=20)
    answer = server.model.requests[1]["messages"][-1]["content"][0]
    assert answer["is_error"] is True and "Atlantis is not a city we know" in str(answer)
    assert seen == [("final_result", {"Paris"})] * 2


async def test_tool_error_from_a_tool_is_an_error_result(serve: Any) -> None:
    server = serve([reply(tool_call("strict_lookup", {"key": "z"})), reply("done")])
    result = await Agent(client=server.client(), tools=[strict_lookup]).run("look z up")
    assert result.tool_calls[0].is_error
    assert result.tool_calls[0].output == "no key 'z'; try 'a'"


async def test_model_retry_still_works_as_tool_error_with_a_warning(serve: Any) -> None:
    @tool
    def old_style(key: str) -> str:
        """Look a key up, the old way."""
        raise ModelRetry(f"no key {key!r}")

    script = [reply(tool_call("old_style", {"key": "z"})), reply(output={"response": 3})]
    script.append(reply(output={"response": 4}))
    server = serve(script)
    agent = Agent(client=server.client(), tools=[old_style], output_type=int)

    @agent.output_validator
    def even(number: int) -> int:
        if number % 2:
            raise ModelRetry("the number must be even")
        return number

    with pytest.warns(DeprecationWarning, match="raise ToolError"):
        result = await agent.run("an even number")
    assert result.output == 4
    assert result.tool_calls[0].output == "no key 'z'"
    assert "the number must be even" in json.dumps(server.model.requests[2]["messages"][-1])


async def test_other_calls_of_the_final_turn_run_and_are_answered(serve: Any) -> None:
    calls.clear()
    final = tool_call("final_result", {"city": "Rome", "temp_c": 25})
    script = [
        reply(
            tool_call("get_weather", {"city": "Rome"}),
            final,
            tool_call("get_weather", {"city": "Oslo"}),
        )
    ]
    server = serve(script)
    agent = Agent(
        client=server.client(), tools=[get_weather], output_type=Forecast, output_mode="tool"
    )
    result = await agent.run("Weather?")
    assert result.output == Forecast(city="Rome", temp_c=25)
    assert len(server.model.requests) == 1
    assert sorted(calls) == ["Oslo", "Rome"]
    answers = result.messages[-1]["content"]
    assert [a["tool_use_id"] for a in answers] == [b["id"] for b in result.messages[-2]["content"]]
    lint(result.messages)


async def test_a_text_answer_in_tool_mode_is_sent_back(serve: Any) -> None:
    script = [
        reply("It is sunny in Paris."),
        reply(tool_call("final_result", {"city": "Paris", "temp_c": 20})),
    ]
    server = serve(script)
    agent = Agent(client=server.client(), output_type=Forecast, output_mode="tool")
    result = await agent.run("Weather?")
    assert result.output.city == "Paris"
    retry = server.model.requests[1]["messages"][-1]
    assert retry["role"] == "user" and "calling final_result" in json.dumps(retry)


async def test_a_run_that_ends_without_output_raises(serve: Any) -> None:
    server = serve(lambda body: reply(tool_call("get_weather", {"city": "Oslo"})))
    agent = Agent(client=server.client(), tools=[get_weather], output_type=Forecast, max_rounds=2)
    with pytest.raises(OutputValidationError, match="max_rounds"):
        await agent.run("Weather?")


def test_bad_output_options_are_refused_at_once() -> None:
    provider = ScriptedProvider([])
    with pytest.raises(ConfigurationError, match="output_retries"):
        Agent(provider=provider, output_type=int, output_retries=-1)
    with pytest.raises(ConfigurationError, match="output_mode"):
        Agent(provider=provider, output_type=int, output_mode="json")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="JSON schema"):
        Agent(provider=provider, output_type=type(lambda: 0))
    with pytest.raises(ConfigurationError, match="takes no parameter"):
        Agent(provider=provider).output_validator(lambda: None)


async def test_auto_is_the_tool_mode_for_a_provider_without_native_output(serve: Any) -> None:
    server = serve([reply(tool_call("final_result", {"response": 1}))])

    class Plain:
        def __init__(self) -> None:
            self.inner = AnthropicProvider(server.client())

        async def complete(self, request: Any) -> Any:
            return await self.inner.complete(request)

    result = await Agent(provider=Plain(), output_type=int).run("one")
    assert result.output == 1
    assert "output_config" not in server.model.requests[0]


# -- native structured output


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_native_output_on_the_messages_api(serve: Any, streamed: bool) -> None:
    server = serve([reply(output={"city": "Paris", "temp_c": 21})])
    provider = AnthropicProvider(server.client(), stream=streamed)
    agent = Agent(provider=provider, output_type=Forecast)  # auto: native here
    if streamed:
        async with agent.run_stream("Weather in Paris?") as stream:
            async for _ in stream:
                pass
        result = stream.result
        assert result is not None
    else:
        result = await agent.run("Weather in Paris?")
    assert result.output == Forecast(city="Paris", temp_c=21)
    body = server.model.requests[0]
    assert "tools" not in body
    schema = body["output_config"]["format"]["schema"]
    assert body["output_config"]["format"]["type"] == "json_schema"
    # Made acceptable by the SDK's transform_schema: closed, the range in the description.
    assert schema["additionalProperties"] is False
    assert "maximum" not in schema["properties"]["temp_c"]
    assert "maximum: 60" in schema["properties"]["temp_c"]["description"]
    lint(result.messages)


async def test_native_output_after_tool_calls(serve: Any) -> None:
    calls.clear()
    script = [
        reply(
            tool_call("get_weather", {"city": "Oslo"}), tool_call("get_weather", {"city": "Rome"})
        ),
        reply(output={"city": "Oslo", "temp_c": -3}),
    ]
    server = serve(script)
    agent = Agent(client=server.client(), tools=[get_weather], output_type=Forecast)
    result = await agent.run("Weather in Oslo and Rome?")
    assert result.output == Forecast(city="Oslo", temp_c=-3)
    assert sorted(calls) == ["Oslo", "Rome"]
    assert all("output_config" in body for body in server.model.requests)
    assert list(tools_sent(server.model.requests[0])) == ["get_weather"]


async def test_native_invalid_then_valid_names_the_field(serve: Any) -> None:
    script = [
        reply(output={"city": "Paris", "temp_c": 99}),
        reply(output={"city": "Paris", "temp_c": 19}),
    ]
    server = serve(script)
    agent = Agent(client=server.client(), output_type=Forecast, output_mode="native")
    result = await agent.run("Weather in Paris?")
    assert result.output.temp_c == 19
    retry = server.model.requests[1]["messages"][-1]
    assert retry["role"] == "user"
    assert "- temp_c: Input should be less than or equal to 60 (got 99)" in json.dumps(retry)
    lint(result.messages)


async def test_native_invalid_every_time_keeps_a_valid_history(serve: Any) -> None:
    server = serve(lambda body: reply("not json at all"))
    agent = Agent(client=server.client(), output_type=Forecast, output_retries=2)
    with pytest.raises(OutputValidationError, match="3 tries") as caught:
        await agent.run("Weather?")
    assert len(server.model.requests) == 3
    assert "Invalid JSON" in caught.value.problems
    partial = caught.value.result
    assert partial is not None and partial.messages[-1]["role"] == "assistant"
    lint(partial.messages)


async def test_native_validator_tool_error(serve: Any) -> None:
    script = [reply(output={"response": 3}), reply(output={"response": 4})]
    server = serve(script)
    agent = Agent(client=server.client(), output_type=int)

    @agent.output_validator
    def even(number: int) -> int:
        if number % 2:
            raise ToolError("the number must be even")
        return number

    result = await agent.run("an even number")
    assert result.output == 4
    assert "the number must be even" in json.dumps(server.model.requests[1]["messages"][-1])


@pytest.mark.parametrize(
    "output_type",
    [Forecast, Point, Movie, int, list[str], Literal["yes", "no"], Forecast | Failure, bool],
    ids=["model", "dataclass", "typeddict", "int", "list", "literal", "union", "bool"],
)
@pytest.mark.parametrize("mode", ["native", "tool"])
async def test_the_scripted_model_makes_output_from_the_schema(
    serve: Any, output_type: Any, mode: Any
) -> None:
    from agentloop.testing import schema_reply

    server = serve(schema_reply)
    agent: Agent[Any, Any] = Agent(
        client=server.client(), output_type=output_type, output_mode=mode
    )
    result = await agent.run("anything")
    assert len(server.model.requests) == 1
    assert result.output is not None


@pytest.mark.parametrize(
    ("part", "refused"),
    [
        pytest.param({"type": "integer", "minimum": 1}, "'minimum' is not supported", id="minimum"),
        pytest.param({"type": "string", "maxLength": 9}, "'maxLength' is not supported", id="maxLength"),
        pytest.param({"type": "array", "minItems": 2}, "'minItems' may only be 0 or 1", id="minItems"),
        pytest.param({"type": "object", "properties": {}}, "'additionalProperties' must be", id="open"),
        pytest.param({"type": "string", "format": "ipv9"}, "format 'ipv9' is not supported", id="format"),
        pytest.param({"$ref": "#"}, "recursive schemas are not supported", id="recursive"),
    ],
)  # fmt: skip
async def test_the_server_refuses_a_schema_the_api_refuses(
    serve: Any, part: dict[str, Any], refused: str
) -> None:
    import anthropic

    server = serve([reply("never")])
    schema = {"type": "object", "properties": {"n": part}, "required": ["n"]}
    schema["additionalProperties"] = False
    form = {"type": "json_schema", "schema": schema}
    with pytest.raises(anthropic.BadRequestError, match=refused) as caught:
        await server.client().messages.create(
            model="claude-scripted",
            max_tokens=10,
            messages=[{"role": "user", "content": "go"}],
            output_config={"format": form},
        )
    assert caught.value.status_code == 400
    # The provider sends the same schema rewritten by the SDK's transform_schema: accepted.
    if part != {"$ref": "#"}:
        params = {"output_config": {"format": form}}
        assert (await Agent(client=server.client(), params=params).run("go")).text == "never"


async def test_output_config_of_params_keeps_its_other_fields(serve: Any) -> None:
    server = serve([reply(output={"response": True})])
    agent = Agent(
        client=server.client(), output_type=bool, params={"output_config": {"effort": "low"}}
    )
    assert (await agent.run("yes?")).output is True
    config = server.model.requests[0]["output_config"]
    assert config["effort"] == "low" and config["format"]["type"] == "json_schema"


# -- Chat Completions and the prompted mode


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_native_output_over_chat_completions(serve_chat: Any, streamed: bool) -> None:
    from agentloop import OpenAIChatProvider

    chat = serve_chat([reply(output={"city": "Lima", "temp_c": 18})])
    provider = OpenAIChatProvider(chat.client(), compat="vllm", stream=streamed)
    assert provider.native_output
    result = await Agent(provider=provider, output_type=Forecast).run("Weather in Lima?")
    assert result.output == Forecast(city="Lima", temp_c=18)
    sent = chat.requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "final_result"
    assert sent["json_schema"]["strict"] is True
    assert sent["json_schema"]["schema"]["additionalProperties"] is False
    assert "tools" not in chat.requests[0]


async def test_a_schema_with_optional_fields_is_sent_without_strict(serve_chat: Any) -> None:
    from agentloop import OpenAIChatProvider

    class Note(BaseModel):
        text: str
        tags: list[str] = []

    chat = serve_chat([reply(output={"text": "hi"})])
    agent = Agent(provider=OpenAIChatProvider(chat.client(), compat="openai"), output_type=Note)
    assert (await agent.run("note")).output == Note(text="hi")
    assert chat.requests[0]["response_format"]["json_schema"]["strict"] is False


async def test_the_chat_server_refuses_a_strict_schema_openai_refuses(serve_chat: Any) -> None:
    from agentloop import OpenAIChatProvider
    from agentloop.errors import BadRequestError

    chat = serve_chat([reply("never")])
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    spec = {"name": "x", "schema": schema, "strict": True}
    params = {"response_format": {"type": "json_schema", "json_schema": spec}}
    agent = Agent(provider=OpenAIChatProvider(chat.client()), params=params)
    with pytest.raises(BadRequestError, match="'additionalProperties' is required"):
        await agent.run("go")


async def test_without_json_schema_auto_is_the_tool_mode_and_native_is_refused(
    serve_chat: Any,
) -> None:
    from agentloop import OpenAIChatProvider

    chat = serve_chat([reply(tool_call("final_result", {"response": 5}))])
    provider = OpenAIChatProvider(chat.client(), compat="ollama")
    assert (await Agent(provider=provider, output_type=int).run("five")).output == 5
    assert "response_format" not in chat.requests[0]
    with pytest.raises(ConfigurationError, match="no native structured output"):
        await Agent(provider=provider, output_type=int, output_mode="native").run("five")


@pytest.mark.both_formats
async def test_prompted_mode_puts_the_schema_in_the_system_prompt(http_agent: Any) -> None:
    answer = 'Here it is:\n```json\n{"city": "Kyiv", "temp_c": 4}\n```'
    agent, server = http_agent(
        [reply("no json here"), reply(answer)],
        system="You are a weather service.",
        output_type=Forecast,
        output_mode="prompted",
        cache="off",  # the system prompt is read as sent, without a cache breakpoint
    )
    result = await agent.run("Weather in Kyiv?")
    assert result.output == Forecast(city="Kyiv", temp_c=4)
    system = server.model.requests[0]["system"]
    assert system.startswith("You are a weather service.")
    assert '"temp_c"' in system and "JSON schema" in system
    body = server.model.requests[0]
    assert "output_config" not in body and "response_format" not in body and "tools" not in body
    assert "Invalid JSON" in json.dumps(server.model.requests[1]["messages"][-1])


async def test_prompted_mode_with_a_system_prompt_of_blocks(serve: Any) -> None:
    server = serve([reply('{"response": ["a", "b"]}')])
    system = [{"type": "text", "text": "Be brief."}]
    agent = Agent(
        client=server.client(), system=system, output_type=list[str], output_mode="prompted"
    )
    assert (await agent.run("two letters")).output == ["a", "b"]
    sent = server.model.requests[0]["system"]
    assert sent[0] == {"type": "text", "text": "Be brief."} and "JSON schema" in sent[1]["text"]


# -- streaming


class Report(BaseModel):
    title: str
    items: list[str]


async def _stream_events(agent: Agent[Any, Any], prompt: str) -> tuple[list[Any], Any]:
    async with agent.run_stream(prompt) as stream:
        events = [event async for event in stream]
    return events, stream.result


def _streamed_report(backend: str, mode: str, api: str) -> tuple[list[Any], Any]:
    import anyio

    from agentloop import OpenAIChatProvider
    from agentloop.events import OutputReady, PartialOutput
    from agentloop.testing import ChatCompletionsServer

    report = {"title": "Weekly", "items": [f"item number {i}" for i in range(40)]}
    answer = reply(output=report) if mode == "native" else reply(tool_call("final_result", report))

    async def main() -> tuple[list[Any], Any]:
        server: Any = (
            MessagesServer([answer])
            if api == "messages"
            else ChatCompletionsServer([answer], strict=True)
        )
        async with server:
            if api == "messages":
                provider: Any = AnthropicProvider(server.client(), stream=True)
            else:
                provider = OpenAIChatProvider(server.client(), compat="vllm", stream=True)
            agent = Agent(provider=provider, output_type=Report, output_mode=mode)  # type: ignore[arg-type]
            events, result = await _stream_events(agent, "report")
        kept = [e for e in events if isinstance(e, (PartialOutput, OutputReady))]
        return kept, result

    return anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("mode", ["native", "tool"])
@pytest.mark.parametrize("api", ["messages", "chat"])
def test_run_stream_yields_partial_outputs_then_the_final_one(
    backend: str, mode: str, api: str
) -> None:
    from agentloop.events import OutputReady, PartialOutput

    events, result = _streamed_report(backend, mode, api)
    partials = [e.output for e in events if isinstance(e, PartialOutput)]
    assert len(partials) >= 3
    assert all(isinstance(p, Report) and p.title == "Weekly" for p in partials)
    sizes = [len(p.items) for p in partials]
    assert sizes == sorted(sizes) and sizes[0] < 40
    # Partial validation leaves out the item still being written, never a cut-off one.
    assert all(item.startswith("item number ") for p in partials for item in p.items)
    assert isinstance(events[-1], OutputReady) and len(events[-1].output.items) == 40
    assert result.output == events[-1].output


def test_partial_json_reads_each_piece_once_into_the_value_so_far() -> None:
    from agentloop.partial import PartialJSON

    whole = {"a": [1, 2.5, {"b": 'x"y é'}], "c": None, "d": True, "e": "text"}
    text = json.dumps(whole, ensure_ascii=False)
    for size in (1, 3, 7, len(text)):
        parsed = PartialJSON()
        for start in range(0, len(text), size):
            parsed.feed(text[start : start + size])
        assert parsed.value == whole and parsed.size == len(text)
    parsed = PartialJSON()
    parsed.feed('{"a": [1, 2], "b": "unfini')
    assert parsed.value == {"a": [1, 2]}
    parsed.feed('shed"}}')  # one brace too many
    assert parsed.broken and parsed.value == {"a": [1, 2]}


async def test_a_large_output_is_checked_a_logarithmic_number_of_times() -> None:
    from agentloop.events import PartialOutput, TextDelta
    from agentloop.output import OutputRun, output_schema
    from agentloop.partial import PartialOutputs
    from agentloop.registry import ToolRegistry

    text = json.dumps({"title": "t", "items": ["x" * 40] * 2400})  # ~100 kB
    sent: list[Any] = []

    async def emit(event: Any) -> None:
        sent.append(event)

    output = OutputRun(
        output_schema(Report), "native", retries=0, validators=(), registry=ToolRegistry()
    )
    watch = PartialOutputs(output, emit, 1)
    step = len(text) // 2000
    for start in range(0, len(text), step):
        await watch(TextDelta(1, 0, text[start : start + step]))
    partials = [e for e in sent if isinstance(e, PartialOutput)]
    assert 5 <= len(partials) <= 30
    assert len(partials[-1].output.items) > 2400 // 2  # the last check: at two thirds or more


@pytest.mark.parametrize("mode", ["native", "tool"])
async def test_a_validator_that_fails_ends_the_run_with_its_error(serve: Any, mode: Any) -> None:
    answer = (
        reply(output={"response": 1})
        if mode == "native"
        else reply(tool_call("final_result", {"response": 1}))
    )
    server = serve([answer])
    agent = Agent(client=server.client(), output_type=int, output_mode=mode)

    @agent.output_validator
    def broken(number: int) -> int:
        raise LookupError("the lookup table is gone")

    with pytest.raises(LookupError, match="table is gone"):
        await agent.run("one")


async def test_validators_run_only_for_the_agents_own_output_type(serve: Any) -> None:
    server = serve([reply(output={"response": 5})])
    agent = Agent(client=server.client(), output_type=Forecast)

    @agent.output_validator
    def city_known(forecast: Forecast) -> Forecast:
        raise AssertionError("not for this run")

    assert (await agent.run("five", output_type=int)).output == 5
