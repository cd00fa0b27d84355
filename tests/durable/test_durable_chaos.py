"""Durable runs survive SIGKILL: same result as an uninterrupted run, each effect once.

Each run is played by a child process (_chaos_child.py) on an engine's state, killed
at an injected crash point or at a seeded random moment, and started again on the same
state until the run completes. The run must then equal an uninterrupted `Agent.run` over
the same script (messages, stop reason, rounds, usage, tool log), its ledger must hold
exactly one effect per (run_id, tool_use_id) of the keyed tools, and the model must have
been asked again only for responses a crash kept from being recorded. The negative
control (`tally`, which ignores the key) and the engine-less `direct` child show that
these checks fail when they should.

Some runs are read as streams (`run_stream`, by every attempt, from the stream's first
item): once the events of each attempt a `StepRestarted` supersedes are dropped, the
events the completing attempt read must equal those of an uninterrupted
`Agent.run_stream` of the same script (`stream_problems`).

`AGENTLOOP_CHAOS_RUNS=200` plays that many seeded random runs per engine (one test each)
instead of the default two, and as many streamed ones instead of the default one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from _chaos import (
    APPROVE,
    CRASH_ENV,
    KEYED,
    ChaosModel,
    Crash,
    World,
    chaos_agent,
    effects_by_key,
    external_results,
    plan,
    prompt_for,
    read_lines,
    summary,
)
from _chaos_child import ATTEMPT_SECONDS, STREAM_ENV, ForkServer, temporal_agent
from _durable_engines import (  # the servers are session fixtures
    ENGINES,
    Engine,
    postgres_server,  # noqa: F401
    temporal_server,  # noqa: F401
)
from _events import STREAMED, by_kind, without_eager

from agentloop import AnthropicProvider
from agentloop.durable.streams import event_from_json
from agentloop.events import (
    Event,
    RunFinished,
    RunStarted,
    StepRestarted,
    ToolProgress,
    ToolResultEvent,
)
from agentloop.testing import MessagesServer, ScriptedProvider

# A run may take a dozen attempts; a session's servers stop in its last test's teardown.
pytestmark = [pytest.mark.durable, pytest.mark.timeout(300)]

MAX_ATTEMPTS = 12
RANDOM_RUNS = int(os.environ.get("AGENTLOOP_CHAOS_RUNS", "2"))
RANDOM_STREAMED_RUNS = int(os.environ.get("AGENTLOOP_CHAOS_RUNS", "1"))


# ---------------------------------------------------------------- playing a run


@dataclass
class Played:
    """A run played to its end across processes, and its traces."""

    seed: int
    external: bool
    run_id: str
    folder: Path
    result: dict[str, Any]
    kills: int
    requests: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] | None = None
    """What the completing attempt read from the run's stream (a streamed run)."""

    @property
    def ledger(self) -> list[dict[str, Any]]:
        return read_lines(self.folder / "ledger.jsonl")


@pytest.fixture
def model_server(tmp_path: Path) -> Iterator[tuple[MessagesServer, Path]]:
    """The scripted Messages API the children talk to; its request log is in the folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    with MessagesServer(ChaosModel(folder)) as server:
        yield server, folder / "requests.jsonl"


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    """The fork server every attempt of this module's runs is forked from."""
    server = ForkServer()
    yield server
    server.close()


def play(
    forks: ForkServer,
    engine: Engine,
    server: tuple[MessagesServer, Path],
    folder: Path,
    seed: int,
    *,
    external: bool = False,
    crashes: Sequence[str] = (),
    kill_after: Sequence[float | None] = (),
    stream: bool = False,
    part: str = "",
) -> Played:
    """Play one run in child processes until one completes it.

    Attempt n dies at `crashes[n]` (a `Crash` spec) and/or is killed by this process after
    `kill_after[n]` seconds; later attempts run undisturbed. `stream`: each attempt reads
    the run with `run_stream`. `part`: `"helper"` plays the run that calls the helper.
    """
    folder.mkdir(parents=True)
    run_id = f"chaos-{seed}-{uuid.uuid4().hex[:8]}"
    prompt = prompt_for(seed, external=external, part=part)
    kills = 0
    for n in range(MAX_ATTEMPTS):
        crash = crashes[n] if n < len(crashes) else ""
        timed = kill_after[n] if n < len(kill_after) else None
        env = {**engine.env, CRASH_ENV: crash, STREAM_ENV: "1" if stream else ""}
        stderr = str(folder / f"stderr-{n}.txt")
        pid = forks.start(engine.name, str(folder), run_id, prompt, server[0].base_url, env, stderr)
        code = forks.wait(timed if timed is not None else ATTEMPT_SECONDS)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            code = forks.wait(ATTEMPT_SECONDS)
            assert timed is not None, f"attempt {n} of run {run_id} hung:\n{_tail(folder, n)}"
        if code == 0:
            break
        assert code == -signal.SIGKILL, f"attempt {n} failed ({code}):\n{_tail(folder, n)}"
        kills += 1
    else:
        pytest.fail(f"run {run_id} did not complete in {MAX_ATTEMPTS} attempts")
    requests = [
        r
        for r in read_lines(server[1])
        if (r["seed"], r["external"], r["part"]) == (seed, external, part)
    ]
    result = json.loads((folder / "result.json").read_text())
    events = None
    if stream:
        events = [event_from_json(e) for e in json.loads((folder / "events.json").read_text())]
    return Played(seed, external, run_id, folder, result, kills, requests, events)


def _tail(folder: Path, n: int) -> str:
    return (folder / f"stderr-{n}.txt").read_text()[-4000:]


_references: dict[tuple[int, bool, str], dict[str, Any]] = {}


def reference(seed: int, external: bool, folder: Path, part: str = "") -> dict[str, Any]:
    """The summary of an uninterrupted plain `Agent.run` of the same script."""
    if (seed, external, part) not in _references:
        folder.mkdir(parents=True, exist_ok=True)

        async def run() -> dict[str, Any]:
            with MessagesServer(ChaosModel(folder)) as server:
                client = server.client()
                agent = chaos_agent(AnthropicProvider(client), World(folder, Crash()))
                prompt = prompt_for(seed, external=external, part=part)
                result = await agent.run(prompt, external_tools=[APPROVE] if external else ())
                if external:
                    assert result.stop_reason == "tool_use" and result.pending
                    result = await agent.resume(result.state, results=external_results(seed))
                await client.close()
            return summary(result)

        _references[seed, external, part] = anyio.run(run)
    return _references[seed, external, part]


_stream_references: dict[tuple[int, bool], list[Any]] = {}


def reference_events(seed: int, external: bool, folder: Path) -> list[Any]:
    """The events of an uninterrupted plain `Agent.run_stream` of the same script (then
    `Agent.resume_stream` with the external results), as a durable run publishes them:
    each call ready once its response is whole (`without_eager`)."""
    if (seed, external) not in _stream_references:
        folder.mkdir(parents=True, exist_ok=True)

        async def run() -> list[Event]:
            with MessagesServer(ChaosModel(folder)) as server:
                client = server.client()
                agent = chaos_agent(AnthropicProvider(client), World(folder, Crash()))
                prompt = prompt_for(seed, external=external)
                async with agent.run_stream(
                    prompt, external_tools=[APPROVE] if external else ()
                ) as stream:
                    events = [event async for event in stream]
                if external:
                    paused = stream.result
                    assert paused is not None and paused.pending and paused.state is not None
                    async with agent.resume_stream(
                        paused.state, results=external_results(seed)
                    ) as resumed:
                        events += [event async for event in resumed]
                await client.close()
            return events

        _stream_references[seed, external] = without_eager(anyio.run(run))
    return _stream_references[seed, external]


def without_superseded(events: list[Event]) -> list[Event]:
    """`events` without those of each attempt a `StepRestarted` supersedes, nor the restarts.

    `StepRestarted(r, None, a)` voids the round-r model events before it (the response's
    stream events and what is derived from them); `StepRestarted(r, call, a)` voids that
    call's progress and result before it.
    """
    kept: list[Event | None] = list(events)
    for n, event in enumerate(events):
        if not isinstance(event, StepRestarted):
            continue
        kept[n] = None
        for m in range(n):
            earlier = kept[m]
            if event.tool_use_id is None:
                void = isinstance(earlier, STREAMED) and earlier.round == event.round
            else:
                void = (
                    isinstance(earlier, (ToolProgress, ToolResultEvent))
                    and earlier.tool_use_id == event.tool_use_id
                )
            if void:
                kept[m] = None
    return [e for e in kept if e is not None]


def stream_problems(
    events: list[Event], expected: list[Any], messages: list[Any], runs: int
) -> list[str]:
    """Everything that shows a streamed durable run's events were not those of an
    uninterrupted run (empty: they were).

    `events`: what the durable run's reader read; `expected`: `reference_events`;
    `messages`: the durable run's result's; `runs`: how many times the loop ran (and so
    started and finished: 2 when the run waited for external results).
    """
    found = []
    shown = without_superseded(events)
    if by_kind(shown) != by_kind(expected):
        difference = _first_difference(by_kind(shown), by_kind(expected))
        found.append(f"the events differ from the uninterrupted run's: {difference}")
    for kind in (RunStarted, RunFinished):
        count = sum(1 for e in events if isinstance(e, kind))
        if count != runs:
            found.append(f"{count} {kind.__name__} events for {runs} runs of the loop")
    last = events[-1] if events else None
    if not isinstance(last, RunFinished):
        found.append(f"the last event is {type(last).__name__}, not RunFinished")
    elif json.loads(json.dumps(summary(last.result)["messages"])) != messages:
        found.append("the last RunFinished's messages are not the run's result's")
    return found


def _first_difference(seen: list[Any], expected: list[Any]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(seen, expected, strict=False)) if a != b), None)
    if n is None:
        return f"{len(seen)} events where {len(expected)} were expected"
    return f"event {n}: {str(seen[n])[:300]} where {str(expected[n])[:300]} was expected"


def check_stream(played: Played, folder: Path) -> None:
    """The streamed run's events are an uninterrupted run's (see `stream_problems`)."""
    assert played.events is not None
    expected = reference_events(played.seed, played.external, folder)
    runs = 2 if played.external else 1
    found = stream_problems(played.events, expected, played.result["messages"], runs)
    assert found == [], f"seed {played.seed}: {found}"


def problems(played: Played, expected: dict[str, Any]) -> list[str]:
    """Everything that shows the run was not durable (empty: it was)."""
    found = []
    for name in ("messages", "stop_reason", "rounds", "text", "usage", "tool_calls"):
        if played.result[name] != expected[name]:
            found.append(f"{name} differs from the uninterrupted run's")
    calls = [c for calls in plan(played.seed, external=played.external) for c in calls]
    ledger = played.ledger
    for call in calls:
        effects = sum(1 for e in ledger if e["key"].endswith(f":{call.id}"))
        if call.name in KEYED and effects != 1:
            found.append(f"{call.name} {call.id}: {effects} effects")
    if any(not e["key"].startswith(f"{played.run_id}:") for e in ledger):
        found.append("effects under another run's id")
    model_rounds = len(plan(played.seed, external=played.external))
    if len(played.requests) > model_rounds + played.kills:
        found.append(
            f"{len(played.requests)} model requests for {model_rounds} rounds and "
            f"{played.kills} kills: responses recorded before a crash were asked for again"
        )
    return found


def replays(engine: Engine, played: Played) -> None:
    """Temporal: the run's history, crashes and retries included, replays without error."""
    if engine.name != "temporal":
        return
    from temporalio.client import Client
    from temporalio.worker import Replayer

    async def replay() -> Any:
        client = await Client.connect(engine.env["AGENTLOOP_CHAOS_TEMPORAL"])
        history = await client.get_workflow_handle(played.run_id).fetch_history()
        # Nothing is performed on a replay: the provider and the tools are never called.
        agent = chaos_agent(ScriptedProvider([]), World(played.folder, Crash()))
        durable = temporal_agent(agent, played.run_id)
        return await Replayer(workflows=[durable.workflow]).replay_workflow(
            history, raise_on_replay_failure=False
        )

    assert anyio.run(replay).replay_failure is None


def tally_effects(played: Played) -> int:
    """How many effects the negative control had for its one call."""
    (call,) = [c for calls in plan(played.seed) for c in calls if c.name == "tally"]
    return effects_by_key(played.ledger).get(f"{played.run_id}:{call.id}", 0)


def first(seed: int, name: str, *, external: bool = False) -> str:
    """The id of the run's first call of tool `name`."""
    return next(c.id for calls in plan(seed, external=external) for c in calls if c.name == name)


def random_crashes(rng: random.Random) -> tuple[list[str], list[float | None]]:
    """One to three kills: at the n-th observable moment, or after a random time."""
    crashes: list[str] = []
    timed: list[float | None] = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.5:
            crashes.append(f"event:{rng.randint(1, 30)}")
            timed.append(None)
        else:
            crashes.append("")
            timed.append(rng.uniform(0.3, 3.0))
    return crashes, timed


# ---------------------------------------------------------------- the harness


def test_the_script_is_a_pure_function_of_the_request(tmp_path: Path) -> None:
    model = ChaosModel(tmp_path)
    body = {"messages": [{"role": "user", "content": prompt_for(7)}], "max_tokens": 9}
    assert model(dict(body)) == model(dict(body))
    assert [len(r) for r in plan(7)[:2]] == [3, 3] and plan(7)[-1] == []
    assert plan(7) == plan(7) and plan(7) != plan(8)
    assert len(read_lines(tmp_path / "requests.jsonl")) == 2


def test_a_run_without_an_engine_completes_unharmed_when_not_killed(
    forks: ForkServer, model_server: tuple[MessagesServer, Path], tmp_path: Path
) -> None:
    played = play(forks, ENGINES["direct"], model_server, tmp_path / "run", 11)
    assert played.kills == 0
    # A plain run has an id of its own, not the one the test gave.
    assert problems(played, reference(11, False, tmp_path / "ref")) == [
        "effects under another run's id"
    ]
    assert sorted(effects_by_key(played.ledger).values()) == [1] * len(played.ledger)


def test_the_checks_catch_a_restart_without_an_engine(
    forks: ForkServer, model_server: tuple[MessagesServer, Path], tmp_path: Path
) -> None:
    """Killed after round 2's response, a plain run starts over: the checks see it."""
    played = play(
        forks, ENGINES["direct"], model_server, tmp_path / "run", 12, crashes=["after-model:3"]
    )
    found = problems(played, reference(12, False, tmp_path / "ref"))
    assert played.kills == 1 and played.result == reference(12, False, tmp_path / "ref")
    assert any(p.endswith(": 2 effects") for p in found)
    assert any("model requests" in p for p in found)


def differ(found: list[str]) -> bool:
    """Whether `found` is exactly: the events differ."""
    return len(found) == 1 and found[0].startswith("the events differ from")


def test_the_stream_check_catches_a_duplicated_result_or_a_superseded_delta(
    tmp_path: Path,
) -> None:
    """`stream_problems` on an uninterrupted run's events, tampered with: it must object."""
    events = reference_events(28, True, tmp_path / "ref")
    finished = [e for e in events if isinstance(e, RunFinished)]
    messages = json.loads(json.dumps(summary(finished[-1].result)["messages"]))
    assert stream_problems(events, events, messages, 2) == []
    # An attempt of round 1's model step that died, then the restart: not a problem.
    first_round = [e for e in events if isinstance(e, STREAMED) and e.round == 1]
    cut = events.index(first_round[0])
    died = first_round[: len(first_round) // 2]
    restarted = [*events[:cut], *died, StepRestarted(1, None, 2), *events[cut:]]
    assert stream_problems(restarted, events, messages, 2) == []
    # The same deltas of a superseded attempt, left in (no restart said): a problem.
    left_in = [*events[:cut], *died, *events[cut:]]
    assert differ(stream_problems(left_in, events, messages, 2))
    # A call's result published twice (no restart of its step said): a problem.
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    at = events.index(result)
    twice = [*events[: at + 1], result, *events[at + 1 :]]
    assert differ(stream_problems(twice, events, messages, 2))
    # ...but published again by a restarted attempt of its step: not a problem.
    retried = [*events[: at + 1], StepRestarted(result.round, result.tool_use_id, 2), result]
    retried += events[at + 1 :]
    assert stream_problems(retried, events, messages, 2) == []
    # A run that finished once more, or whose last event is not its end: problems.
    assert "3 RunFinished events for 2 runs of the loop" in stream_problems(
        [*events, finished[-1]], events, messages, 2
    )
    assert "the last event is RoundFinished, not RunFinished" in stream_problems(
        [e for e in events if e is not finished[-1]], events, messages, 2
    )
    assert stream_problems(events, events, messages[:-1], 2) == [
        "the last RunFinished's messages are not the run's result's"
    ]


# ---------------------------------------------------------------- the engines


@pytest.fixture(params=[e for e in ENGINES.values() if e.durable], ids=lambda e: e.id)
def engine(request: pytest.FixtureRequest) -> Engine:
    engine: Engine = request.param
    return engine.ready(request)


CRASH_POINTS = [
    pytest.param(13, False, lambda s: [f"after-effect:{first(s, 'note_sync')}"], id="after-effect"),
    pytest.param(14, False, lambda s: ["after-model:2"], id="after-model"),
    pytest.param(15, False, lambda s: [f"mid-tool:{first(s, 'note')}"], id="mid-tool"),
    pytest.param(16, False, lambda s: ["between:1"], id="between-completions"),
    pytest.param(17, True, lambda s: ["external-wait"], id="external-wait"),
    pytest.param(
        18,
        True,
        lambda s: [
            f"after-effect:{first(s, 'slow', external=True)}",
            "after-model:2",
            "external-wait",
        ],
        id="three-in-a-row",
    ),
]


@pytest.mark.parametrize(("seed", "external", "crashes"), CRASH_POINTS)
def test_a_run_killed_at_a_crash_point_completes_as_if_never_killed(
    forks: ForkServer,
    engine: Engine,
    model_server: tuple[MessagesServer, Path],
    tmp_path: Path,
    seed: int,
    external: bool,
    crashes: Any,
) -> None:
    planned = crashes(seed)
    played = play(
        forks, engine, model_server, tmp_path / "run", seed, external=external, crashes=planned
    )
    assert played.kills == len(planned)
    assert problems(played, reference(seed, external, tmp_path / "ref")) == []
    replays(engine, played)


def test_the_negative_control_ignoring_its_key_has_its_effect_twice(
    forks: ForkServer, engine: Engine, model_server: tuple[MessagesServer, Path], tmp_path: Path
) -> None:
    crash = f"after-effect:{first(19, 'tally')}"
    played = play(forks, engine, model_server, tmp_path / "run", 19, crashes=[crash])
    assert played.kills == 1
    assert problems(played, reference(19, False, tmp_path / "ref")) == []
    assert tally_effects(played) == 2
    replays(engine, played)


RANDOM = [pytest.param(n, False, id=f"run-{n}") for n in range(RANDOM_RUNS)] + [
    pytest.param(n, True, id=f"streamed-{n}") for n in range(RANDOM_STREAMED_RUNS)
]


@pytest.mark.parametrize(("n", "stream"), RANDOM)
def test_runs_killed_at_seeded_random_moments_complete_as_if_never_killed(
    forks: ForkServer,
    engine: Engine,
    model_server: tuple[MessagesServer, Path],
    tmp_path: Path,
    n: int,
    stream: bool,
) -> None:
    """Read with `run_stream` (`stream`), its events are an uninterrupted run's too."""
    rng = random.Random((4723 if stream else 2311) + n)
    seed = (500 if stream else 100) + n
    external = rng.random() < 0.3
    crashes, timed = random_crashes(rng)
    played = play(
        forks,
        engine,
        model_server,
        tmp_path / "run",
        seed,
        external=external,
        crashes=crashes,
        kill_after=timed,
        stream=stream,
    )
    found = problems(played, reference(seed, external, tmp_path / "ref"))
    assert found == [], f"seed {seed}, crashes {crashes}, {timed}: {found}"
    if stream:
        check_stream(played, tmp_path / "ref-stream")
    replays(engine, played)


@pytest.mark.parametrize("tool", ["note", "note_sync"])
def test_a_run_killed_inside_a_sub_agents_call_has_each_of_its_effects_once(
    forks: ForkServer,
    engine: Engine,
    model_server: tuple[MessagesServer, Path],
    tmp_path: Path,
    tool: str,
) -> None:
    """Killed right after a sub-agent's tool had its effect, before the sub-agent's call
    was recorded: the call runs again, its sub-run under the same id (derived from the
    call's key), so the sub-agent's tools find their keys in the ledger."""
    seed = 41
    (helper,) = plan(seed, part="helper")[0]
    inside = plan(seed, part="sub")[0]
    killed = next(c for c in inside if c.name == tool)
    played = play(
        forks,
        engine,
        model_server,
        tmp_path / "run",
        seed,
        part="helper",
        crashes=[f"after-effect:{killed.id}"],
    )
    assert played.kills == 1
    sub_run = f"{played.run_id}:{helper.id}"
    assert effects_by_key(played.ledger) == {f"{sub_run}:{c.id}": 1 for c in inside}
    # The killed call was started twice, under one key.
    starts = [s["key"] for s in read_lines(played.folder / "starts.jsonl")]
    assert [k for k in starts if k.endswith(f":{killed.id}")] == [f"{sub_run}:{killed.id}"] * 2
    expected = reference(seed, False, tmp_path / "ref", part="helper")
    for name in ("messages", "stop_reason", "rounds", "text", "tool_calls"):
        assert played.result[name] == expected[name], name
    assert len(played.requests) == len(plan(seed, part="helper"))  # none asked again
    replays(engine, played)


# ---------------------------------------------------------------- streamed runs


STREAMED_CRASH_POINTS = [
    pytest.param(23, False, lambda s: ["mid-stream:2"], id="mid-stream"),
    pytest.param(24, False, lambda s: ["after-model:2"], id="after-model"),
    pytest.param(25, False, lambda s: [f"mid-tool:{first(s, 'note')}"], id="mid-tool"),
    pytest.param(26, False, lambda s: ["between:1"], id="between-completions"),
    pytest.param(27, True, lambda s: ["external-wait"], id="external-wait"),
]


@pytest.mark.parametrize(("seed", "external", "crashes"), STREAMED_CRASH_POINTS)
def test_a_streamed_run_killed_at_a_crash_point_streams_an_uninterrupted_run_s_events(
    forks: ForkServer,
    engine: Engine,
    model_server: tuple[MessagesServer, Path],
    tmp_path: Path,
    seed: int,
    external: bool,
    crashes: Any,
) -> None:
    planned = crashes(seed)
    played = play(
        forks,
        engine,
        model_server,
        tmp_path / "run",
        seed,
        external=external,
        crashes=planned,
        stream=True,
    )
    assert played.kills == len(planned)
    assert problems(played, reference(seed, external, tmp_path / "ref")) == []
    check_stream(played, tmp_path / "ref-stream")
    if planned == ["mid-stream:2"]:
        # What the dead model step streamed was read back, so its restart is said; a
        # reader that ignored the restart would show the dead attempt's deltas.
        assert played.events is not None
        assert [e.round for e in played.events if isinstance(e, StepRestarted)] == [2]
        ignored = [e for e in played.events if not isinstance(e, StepRestarted)]
        expected = reference_events(seed, external, tmp_path / "ref-stream")
        assert differ(stream_problems(ignored, expected, played.result["messages"], 1))
    replays(engine, played)
