"""Where the library's log events go: to the stdlib logger `agentloop`, silent until the
application configures logging, then through its `logging` setup or its structlog
configuration for the stdlib, with their context.

Each case runs a script in a fresh interpreter, as an application would: logging
configuration is process-wide state.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from agentloop.logs import LOGGER_NAME, get_logger, stdlib_logger

# A run with two tool calls in one turn (one of them raises, so `tool.exception` is
# logged with a traceback), then a run whose model request fails (`run.error`).
RUNS = """
from agentloop import Agent, ProviderError, tool
from agentloop.testing import Fault, ScriptedProvider, reply, tool_call


@tool
def echo(value: str) -> str:
    \"\"\"Echo the value back.\"\"\"
    return value


@tool
def boom() -> str:
    \"\"\"Always fails.\"\"\"
    raise RuntimeError("broken on purpose")


calls = [tool_call("echo", {"value": "a"}), tool_call("boom")]
script = [reply(*calls), reply("done")]
result = Agent(provider=ScriptedProvider(script), tools=[echo, boom]).run_sync("go")
assert result.text == "done", result
try:
    Agent(provider=ScriptedProvider([Fault.overloaded()])).run_sync("go")
except ProviderError:
    pass
else:
    raise AssertionError("the second run should fail")
"""


def run_script(tmp_path: Path, setup: str, after: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(setup) + RUNS + textwrap.dedent(after))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def test_nothing_is_printed_when_the_application_configured_nothing(tmp_path: Path) -> None:
    done = run_script(tmp_path, "")
    assert (done.stdout, done.stderr) == ("", "")


def test_stdlib_logging_gets_the_events_with_their_fields(tmp_path: Path) -> None:
    setup = """
    import json
    import logging
    import sys

    logging.basicConfig(
        level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    records = []


    class Keep(logging.Handler):
        def emit(self, record):
            records.append(
                {"event": record.event, "level": record.levelname, **record.fields}
            )


    logging.getLogger("agentloop").addHandler(Keep())
    """
    after = """
    print(json.dumps(records, default=str))
    """
    done = run_script(tmp_path, setup, after)
    records: list[dict[str, Any]] = json.loads(done.stdout)
    events = [(r["event"], r["level"]) for r in records]
    assert events[:2] == [("run.start", "INFO"), ("model.request", "INFO")]
    assert ("tool.call", "DEBUG") in events and ("tool.exception", "ERROR") in events
    assert events[-2:] == [("run.start", "INFO"), ("run.error", "WARNING")]
    first_run = records[0]["run_id"]
    calls = [r for r in records if r["event"] == "tool.call"]
    assert {r["name"] for r in calls} == {"echo", "boom"}
    for record in calls:
        assert (record["run_id"], record["round"]) == (first_run, 1)
        assert record["tool_use_id"].startswith("toolu_")
    # What the application's own handler (basicConfig) prints: the fields are in the message.
    (echo,) = [r for r in calls if r["name"] == "echo"]
    (line,) = [x for x in done.stderr.splitlines() if "tool.call" in x and "'echo'" in x]
    assert line.startswith("DEBUG agentloop tool.call ")
    assert f"run_id='{first_run}'" in line and "round=1" in line
    assert f"tool_use_id='{echo['tool_use_id']}'" in line
    assert "RuntimeError: broken on purpose" in done.stderr  # tool.exception's traceback


def test_structlog_gets_the_events_with_their_context(tmp_path: Path) -> None:
    setup = """
    import logging
    import sys

    import structlog

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ]
        )
    )
    logging.getLogger("agentloop").addHandler(handler)
    logging.getLogger("agentloop").setLevel(logging.DEBUG)
    """
    done = run_script(tmp_path, setup)
    assert done.stderr == ""
    events = [json.loads(line) for line in done.stdout.splitlines()]
    names = [(e["event"], e["level"]) for e in events]
    assert names[:2] == [("run.start", "info"), ("model.request", "info")]
    assert ("tool.call", "debug") in names and ("tool.exception", "error") in names
    assert names[-2:] == [("run.start", "info"), ("run.error", "warning")]
    first_run = events[0]["run_id"]
    calls = [e for e in events if e["event"] == "tool.call"]
    assert {e["name"] for e in calls} == {"echo", "boom"}
    for event in calls:
        assert (event["run_id"], event["round"]) == (first_run, 1)
        assert event["tool_use_id"].startswith("toolu_")
    assert len({e["tool_use_id"] for e in calls}) == 2
    (failed,) = [e for e in events if e["event"] == "tool.exception"]
    assert "RuntimeError: broken on purpose" in failed["exception"]


def test_structlog_without_the_stdlib_leaves_the_events_on_the_agentloop_logger(
    tmp_path: Path,
) -> None:
    # The application's structlog prints its own events; agentloop's go to `logging`,
    # which this application did not configure.
    setup = """
    import structlog

    structlog.configure(processors=[structlog.processors.JSONRenderer()])
    structlog.get_logger().info("app.start")
    """
    done = run_script(tmp_path, setup)
    assert (done.stdout, done.stderr) == ('{"event": "app.start"}\n', "")


# --------------------------------------------------------------------------- in process


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """structlog back to its defaults for the test (other tests may have configured it)."""
    saved = structlog.get_config()
    was_configured = structlog.is_configured()
    structlog.reset_defaults()
    try:
        yield
    finally:
        if was_configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()


class _Loud:
    """A field value that records whether a log record was built from it."""

    def __init__(self) -> None:
        self.rendered = 0

    def __repr__(self) -> str:
        self.rendered += 1
        return "loud"


@pytest.mark.usefixtures("unconfigured_structlog")
def test_a_disabled_level_builds_no_record() -> None:
    value = _Loud()
    log = get_logger().bind(run_id="r1")
    assert isinstance(log, structlog.stdlib.BoundLogger)
    previous = stdlib_logger.level
    stdlib_logger.setLevel(logging.INFO)
    try:
        log.debug("tool.call", value=value)
        assert value.rendered == 0
        log.info("run.start", value=value)
        assert value.rendered == 1
    finally:
        stdlib_logger.setLevel(previous)


@pytest.mark.usefixtures("unconfigured_structlog")
def test_the_stdlib_record_points_at_the_line_that_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        get_logger().bind(round=2).debug("tool.call", tool_use_id="toolu_1", name="x")
    (record,) = caplog.records
    assert record.funcName == "test_the_stdlib_record_points_at_the_line_that_logged"
    assert record.getMessage() == "tool.call round=2 tool_use_id='toolu_1' name='x'"
    assert record.__dict__["fields"] == {"round": 2, "tool_use_id": "toolu_1", "name": "x"}


@pytest.mark.usefixtures("unconfigured_structlog")
def test_a_logger_bound_before_configuration_follows_it() -> None:
    log = get_logger().bind(run_id="r1")  # bound while structlog is unconfigured
    with capture_logs() as events:
        log.warning("run.error", error="boom")
    assert events == [
        {"run_id": "r1", "error": "boom", "event": "run.error", "log_level": "warning"}
    ]
