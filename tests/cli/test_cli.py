"""The `agentloop` command: runs, the plugin hooks that shape them, listings, errors.

The command names no plugin, so these tests install their own small plugins: real
distributions (a module and its `.dist-info`) in a directory put on the path. The cortex
plugin's part of the command (its offline demo, report and options) is tested with the
plugin, in plugins/cortex/tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentloop import Agent, ConfigurationError
from agentloop.checks import parse_seconds
from agentloop.cli import main, values
from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, RawResponse

# A plugin using every command hook: a tool reading its deps, a `run` option, a run setup
# (deps, system prompt, offline model, report, check) and a command of its own.
GREETER = """\
from agentloop import ConfigurationError, RunContext, hookimpl
from agentloop.hookspecs import RunSetup
from agentloop.testing import ScriptedProvider, reply, tool_call


def greet(name: str, ctx: RunContext) -> str:
    \"\"\"Greet someone.\"\"\"
    return f"{ctx.deps['greeter']['greeting']}, {name}!"


def farewell(name: str) -> str:
    \"\"\"Say goodbye to someone.\"\"\"
    return f"Goodbye, {name}."


@hookimpl
def agentloop_register_tools(register):
    register(greet)
    register(farewell)


@hookimpl
def agentloop_run_options(parser):
    group = parser.add_argument_group("greeter plugin")
    group.add_argument("--greeting", default="Hello")
    group.add_argument("--greeter-fails", action="store_true")


def deps(args):
    if not args.greeting.strip():
        raise ConfigurationError("--greeting: say something")
    return {"greeter": {"greeting": args.greeting}}


def offline_model(tools):
    if "greet" not in [t.name for t in tools]:
        raise ConfigurationError("the greeter demo needs the greet tool")
    return ScriptedProvider([reply(tool_call("greet", {"name": "Ada"})), reply("Greeted.")])


def check(args, result):
    if args.greeter_fails:
        return "the greeter was told to fail"
    return None


@hookimpl
def agentloop_run_setup(args):
    return RunSetup(
        exposed_by_default=True,
        deps=lambda: deps(args),
        system="You greet people.",
        offline_model=offline_model,
        report=lambda result: [("Greetings", f"{len(result.tool_calls)} greeting(s)")],
        check=lambda result: check(args, result),
    )


def wave(args):
    print(f"waving at {args.who}")
    return 0


@hookimpl
def agentloop_register_commands(register):
    parser = register("wave", help="wave at someone", handler=wave)
    parser.add_argument("who")
"""

# A plugin with a tool and two capabilities, and nothing for the command.
PLAIN = """\
from dataclasses import replace

from agentloop import Capability, hookimpl


def shout(text: str) -> str:
    \"\"\"Shout the text.\"\"\"
    return text.upper()


class Loud(Capability):
    \"\"\"Every tool result in capitals.\"\"\"

    async def wrap_tool_call(self, ctx, call, call_next):
        result = await call_next(call)
        return replace(result, content=result.text.upper())


class Mark(Capability):
    \"\"\"Every tool result marked.\"\"\"

    async def wrap_tool_call(self, ctx, call, call_next):
        result = await call_next(call)
        return replace(result, content=result.text + " [marked]")


@hookimpl
def agentloop_register_tools(register):
    register(shout)


@hookimpl
def agentloop_register_capabilities(register):
    register("loud", Loud)  # a factory: a new one for each agent
    register("mark", Mark())  # an instance: shared
"""

# A plugin whose command hooks are broken: they must not break the command.
CLUMSY = """\
from agentloop import hookimpl


@hookimpl
def agentloop_run_options(parser):
    parser.add_argument("--model")  # taken by the command itself


@hookimpl
def agentloop_register_commands(register):
    register("run", help="a second run", handler=lambda args: 0)
"""

PLUGINS = {"greeter": GREETER, "plain": PLAIN, "clumsy": CLUMSY}


def install(site: Path, name: str, source: str) -> None:
    """Install a one-module plugin distribution into `site`, as pip would lay it out."""
    module = f"agentloop_cli_test_{name}"
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.0.1.dist-info"
    info.mkdir()
    dist = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[agentloop]\n{name} = {module}\n")


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the test plugins, installed."""
    root = tmp_path_factory.mktemp("site")
    for name, source in PLUGINS.items():
        install(root, name, source)
    return root


@pytest.fixture
def plugins(
    site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[pytest.MonkeyPatch]:
    """The test plugins on the path, only `greeter` loaded, no API key, in a temp dir.

    Set `AGENTLOOP_PLUGINS` again through the returned monkeypatch to load others.
    """
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(ENV_VAR, "greeter")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    yield monkeypatch


def agentloop(*args: str, site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m agentloop ARGS` with the test plugins, no API key unless given."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", ENV_VAR)
    }
    path = os.pathsep.join(p for p in (str(site), clean.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "agentloop", *args],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": path, ENV_VAR: "greeter", **env},
        timeout=60,
    )


def closed_port() -> int:
    """A local port nothing listens on (connections to it are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --------------------------------------------------------------------------- runs


def test_offline_run_uses_the_plugins_setup(site: Path) -> None:
    done = agentloop("run", "Greet Ada", site=site)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "agentloop: ANTHROPIC_API_KEY is not set, so this runs the offline demo of the "
        "'greeter' plugin on a scripted model (set the key to talk to Claude).\n"
    )
    out = done.stdout
    for expected in (
        "[round 1]   tool greet: ok",
        "== Transcript ==\nuser: Greet Ada\nassistant -> greet(name='Ada')",
        "tool greet <- Hello, Ada!",
        "== Tool log ==",
        "== Greetings ==\n1 greeting(s)",
        "== Result ==\nstop_reason=end_turn, rounds=2",
    ):
        assert expected in out
    assert out.index("== Tool log ==") < out.index("== Greetings ==") < out.index("== Result")
    assert out.rstrip().endswith("Greeted.")


def test_plugin_options_reach_its_deps(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--greeting", "Ahoy", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tool_calls"][0]["output"] == "Ahoy, Ada!"


def test_a_plugin_refusing_its_option_exits_2(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--greeting", " "]) == 2
    assert capsys.readouterr().err == "agentloop: error: --greeting: say something\n"


def test_a_failed_check_exits_1_after_the_report(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--greeter-fails", "--offline"]) == 1
    captured = capsys.readouterr()
    assert "== Greetings ==" in captured.out
    assert captured.err == "agentloop: error: the greeter was told to fail\n"


def test_run_with_a_key_talks_to_the_api(site: Path) -> None:
    with MessagesServer(["Hello from the model."]) as server:
        done = agentloop(
            "run",
            "Say hello",
            "--model",
            "claude-test",
            "--max-tokens",
            "100",
            site=site,
            ANTHROPIC_API_KEY="sk-ant-test",
            ANTHROPIC_BASE_URL=server.base_url,
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.rstrip().endswith("Hello from the model.")
    assert "(no tool calls)" in done.stdout
    request = server.requests[0]
    mark = {"type": "ephemeral"}  # prompt caching, on by default
    assert (request["model"], request["system"], request["max_tokens"]) == (
        "claude-test",
        # the exposed plugin's prompt, as --system is not given
        [{"type": "text", "text": "You greet people.", "cache_control": mark}],
        100,
    )
    assert [t["name"] for t in request["tools"]] == ["greet", "farewell"]
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say hello", "cache_control": mark}]}
    ]


def test_system_option_wins_and_plugins_are_chosen(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process, so an API client left open would fail the test suite (ResourceWarning).
    plugins.setenv(ENV_VAR, "greeter,plain")
    plugins.setenv("ANTHROPIC_API_KEY", "k")
    with MessagesServer(["ok"]) as server:
        plugins.setenv("ANTHROPIC_BASE_URL", server.base_url)
        assert main(["run", "hi", "--system", "Be brief.", "--plugin", "plain"]) == 0
    request = server.requests[0]
    assert request["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert [t["name"] for t in request["tools"]] == ["shout"]
    assert "== Greetings ==" not in capsys.readouterr().out  # greeter is not exposed


def test_offline_json_with_json_logs(site: Path) -> None:
    done = agentloop(
        "run", "hi", "--offline", "--json", "--log-json", site=site, ANTHROPIC_API_KEY="k"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["stop_reason"], result["rounds"], result["text"]) == ("end_turn", 2, "Greeted.")
    events = [json.loads(line) for line in done.stderr.splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "run.start" and names[-1] == "run.end"
    (call,) = [e for e in events if e["event"] == "tool.call"]
    assert call["level"] == "debug" and call["run_id"] == result["run_id"]
    assert call["tool_use_id"] == result["tool_calls"][0]["tool_use_id"]


def test_api_error_exits_1(site: Path) -> None:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "nope"}}
    with MessagesServer([RawResponse(status=400, json=error)]) as server:
        done = agentloop(
            "run", "hi", site=site, ANTHROPIC_API_KEY="k", ANTHROPIC_BASE_URL=server.base_url
        )
    assert done.returncode == 1
    assert done.stderr == "agentloop: error: 400 invalid_request_error: nope\n"


def test_unreachable_api_tells_each_retry_then_one_error_line(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv("ANTHROPIC_API_KEY", "k")
    plugins.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    assert main(["run", "hi"]) == 1
    # The SDK's default of two retries, each told as its wait begins (0.5 s, then 1 s,
    # less up to a quarter).
    first, second, last = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"agentloop: retrying in 0\.[45] s: connection refused", first)
    assert re.fullmatch(r"agentloop: retrying in (0\.[89]|1\.0) s: connection refused", second)
    assert last == "agentloop: error: could not reach the Anthropic API: Connection error."
    # With -v, the library's own event is logged as well.
    assert main(["run", "hi", "-v"]) == 1
    assert "run.error" in capsys.readouterr().err


def test_no_offline_model_is_one_error_line(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "")
    assert main(["run", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentloop: error: no offline model available: ANTHROPIC_API_KEY")
    assert err.count("\n") == 1 and "Set ANTHROPIC_API_KEY" in err


def test_an_offline_model_refusing_the_tools_exits_2(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "greeter,plain")
    assert main(["run", "hi", "--plugin", "plain"]) == 2
    err = capsys.readouterr().err
    assert "none of the exposed plugins (plain) provides one" in err
    assert main(["run", "hi", "--tool", "farewell"]) == 2
    assert capsys.readouterr().err == ("agentloop: error: the greeter demo needs the greet tool\n")


def test_a_plugin_command(plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wave", "Ada"]) == 0
    assert capsys.readouterr().out == "waving at Ada\n"
    assert main(["--help"]) == 0
    assert "wave at someone" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    assert "greeter plugin:" in capsys.readouterr().out


def test_broken_command_hooks_do_not_break_the_command(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "clumsy,greeter")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "FAILED clumsy (agentloop_cli_test_clumsy): agentloop_run_options: " in out
    assert "FAILED clumsy (agentloop_cli_test_clumsy): agentloop_register_commands: " in out
    assert main(["run", "hi", "--json"]) == 0


@pytest.mark.parametrize(
    ("order", "output"),
    [
        pytest.param(["loud", "mark"], "HELLO, ADA! [MARKED]", id="loud-outermost"),
        pytest.param(["mark", "loud"], "HELLO, ADA! [marked]", id="mark-outermost"),
    ],
)
def test_capabilities_named_on_the_command_line_wrap_the_run_in_order(
    order: list[str], output: str, plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "greeter,plain")
    named = [word for name in order for word in ("--capability", name)]
    assert main(["run", "hi", "--offline", "--json", "--tool", "greet", *named]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tool_calls"][0]["output"] == output
    # What the model was sent is the changed result.
    assert result["messages"][2]["content"][0]["content"] == output


def test_an_unknown_capability_is_a_usage_error_listing_the_known_ones(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "greeter,plain")
    expected = "agentloop: error: unknown capability name(s): nope; available: loud, mark\n"
    assert main(["run", "hi", "--offline", "--capability", "nope"]) == 2
    assert capsys.readouterr().err == expected
    upstream = f"http://127.0.0.1:{closed_port()}"
    assert main(["serve", "--upstream", upstream, "--capability", "nope"]) == 2
    assert capsys.readouterr().err == expected
    plugins.setenv(ENV_VAR, "greeter")
    assert main(["run", "hi", "--offline", "--capability", "loud"]) == 2
    assert capsys.readouterr().err == (
        "agentloop: error: unknown capability name(s): loud; available: none\n"
    )


# --------------------------------------------------------------------------- listing


def test_plugins_command(plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listed["plugins"]] == ["greeter"]
    assert listed["plugins"][0]["tools"] == ["greet", "farewell"]
    assert {"name": "plain", "dist": "agentloop-cli-test-plain 0.0.1"} in listed["switched_off"]
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "greeter 0.0.1 (agentloop-cli-test-greeter): greet, farewell"
    assert (
        "plain (agentloop-cli-test-plain 0.0.1): installed, switched off by AGENTLOOP_PLUGINS"
        in lines
    )
    plugins.setenv(ENV_VAR, "greeter,plain")
    assert main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["capabilities"]) for p in listed["plugins"]] == [
        ("greeter", []),
        ("plain", ["loud", "mark"]),
    ]
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "plain 0.0.1 (agentloop-cli-test-plain): shout; capabilities: loud, mark"


def test_plugins_switched_off_are_not_called_missing(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.setenv(ENV_VAR, "")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "no plugins installed" not in out
    assert out.startswith("no plugins loaded: AGENTLOOP_PLUGINS='' switches them off\n")
    assert "greeter (agentloop-cli-test-greeter 0.0.1): installed, switched off by" in out
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no plugin tools: AGENTLOOP_PLUGINS switches off ")
    assert "greeter" in out


def test_tools_command(plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools"]) == 0
    assert capsys.readouterr().out == (
        "greet     [greeter]  Greet someone.\nfarewell  [greeter]  Say goodbye to someone.\n"
    )
    assert main(["tools", "--json"]) == 0
    listed, _ = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["plugin"]) == ("greet", "greeter")
    assert listed["input_schema"]["required"] == ["name"]


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            [], "agentloop: error: the following arguments are required: COMMAND", id="no-command"
        ),
        pytest.param(
            ["run"],
            "agentloop run: error: the following arguments are required: prompt",
            id="no-prompt",
        ),
        pytest.param(
            ["run", "hi", "--concurrency", "abc"],
            "agentloop run: error: argument --concurrency: expected a whole number >= 1, got 'abc'",
            id="not-a-number",
        ),
        pytest.param(
            ["run", "hi", "--max-rounds", "0"],
            "argument --max-rounds: expected a whole number >= 1, got '0'",
            id="zero",
        ),
        pytest.param(
            ["run", "hi", "--timeout", "nan"],
            "argument --timeout: expected a number of seconds > 0, got 'nan'",
            id="nan-seconds",
        ),
        pytest.param(
            ["run", "   "],
            "argument prompt: expected some text to send, got '   '",
            id="blank-prompt",
        ),
        pytest.param(
            ["run", ""], "argument prompt: expected some text to send, got ''", id="empty-prompt"
        ),
        pytest.param(
            ["run", "hi", "--plugin", "nope"], "unknown plugin name(s): nope", id="plugin"
        ),
        pytest.param(["run", "hi", "--tool", "nope"], "unknown tool name(s): nope", id="tool"),
        pytest.param(
            ["run", "hi", "--log-js"], "unrecognized arguments: --log-js", id="no-abbreviations"
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str],
    message: str,
    plugins: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1, err
    assert "_positive_int" not in err and "usage:" not in err


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("agentloop ")


def test_the_command_leaves_structlog_as_it_found_it(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import structlog

    structlog.reset_defaults()
    assert main(["tools"]) == 0
    assert not structlog.is_configured()


def test_core_names_no_plugin() -> None:
    package = Path(__file__).resolve().parents[2] / "agentloop"
    named = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "cortex" in path.read_text().lower()
    ]
    assert named == []


def test_transcript_lists_text_calls_and_results() -> None:
    from agentloop.cli import format_transcript

    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "greet", "input": {"name": "Ada"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "x" * 100,
                    "is_error": True,
                }
            ],
        },
    ]
    assert format_transcript(messages).splitlines() == [
        "user: hi",
        "assistant: Looking.",
        "assistant -> greet(name='Ada')",
        "tool greet [error] <- " + "x" * 67 + "...",
    ]


def test_run_on_a_chat_completions_server(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agentloop run --provider openai --base-url URL --model NAME`, as for Ollama."""
    from agentloop.testing import ChatCompletionsServer, reply, tool_call

    script = [reply(tool_call("greet", {"name": "Ada"})), reply("Greeted.")]
    with ChatCompletionsServer(script, strict=True) as server:
        code = main(
            [
                "run",
                "hi",
                "--provider",
                "openai",
                "--base-url",
                server.base_url + "/v1",
                "--model",
                "qwen3:8b",
                "--compat",
                "ollama",
                "--json",
            ]
        )
        assert code == 0, capsys.readouterr().err
        result = json.loads(capsys.readouterr().out)
        assert result["text"] == "Greeted." and result["tool_calls"][0]["output"] == "Hello, Ada!"
        assert server.requests[0]["model"] == "qwen3:8b"


def test_compat_without_the_openai_provider_is_a_usage_error(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--compat", "ollama"]) == 2
    assert (
        capsys.readouterr().err == "agentloop: error: --compat applies to --provider openai only\n"
    )


# --------------------------------------------------------------------------- start-up and values

HEAVY = ("anthropic", "openai", "pydantic", "structlog", "opentelemetry", "agentloop.plugins")


def test_version_imports_nothing_heavy() -> None:
    script = (
        "import sys\n"
        "from agentloop.cli import main\n"
        "assert main(['--version']) == 0\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    version, heavy = done.stdout.splitlines()
    assert version.startswith("agentloop ") and heavy == "[]"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("2.5", 2.5, id="seconds"),
        pytest.param("inf", math.inf, id="no-limit"),
        pytest.param("0", None, id="zero"),
        pytest.param("-inf", None, id="minus-inf"),
        pytest.param("nan", None, id="nan"),
        pytest.param("soon", None, id="text"),
    ],
)
def test_seconds_are_what_agent_takes(text: str, value: float | None) -> None:
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError, match="expected a number of seconds"):
            values.seconds(text)
        with pytest.raises(ConfigurationError):
            Agent(tool_timeout=parse_seconds("tool_timeout", text))
    else:
        assert values.seconds(text) == value
        assert Agent(tool_timeout=value).config.tool_timeout == value


def test_a_session_lifetime_must_end() -> None:
    assert values.finite_seconds("60") == 60.0
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        values.finite_seconds("inf")


@pytest.mark.parametrize("text", ["0", "-1", "1.0", "two", "true"])
def test_counts_are_whole_numbers_from_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number >= 1"):
        values.whole_number(text)


def test_an_infinite_timeout_runs(
    plugins: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "hi", "--timeout", "inf", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "Greeted."
