"""Durable requests (`agentloop serve --durable dbos[:URL]`): each request a durable run.

A client request the gateway runs with its own tools becomes a run of one
`agentloop.durable.dbos.DurableAgent` whose id is the request's run id (`runs`): every
model request and tool call is a DBOS step, recorded in the DBOS system database. When
the gateway dies mid-run, a live or restarted gateway recovers the run (`launch`),
its recorded steps are not performed again, and the client's retry of the same request
attaches to it: the gateway's tools do not run twice (a tool that was running at the
crash runs again, under the same `RunContext.idempotency_key`). A retry of a request
whose run finished gets the recorded answer, with no new upstream request.

What a run records is the conversation and the client's tools; how each model request is
sent (the model, `max_tokens`, the other fields, the client's credential) is never
written to the database. The gateway's one durable agent finds, by the run's id, the
agent the gateway built for the client's request: its outermost capability
(`ClientFields`) gives each model request that request's fields, so the gateway's own
capabilities, inside it, see and change the request the upstream gets, and its provider
(`RequestProvider`) sends it with that agent's upstream client. A run recovered before
its client came back waits for the client's retry (at most `attach_wait` seconds) before
its next model request.

A run that failed (an upstream error) stays failed in DBOS; the client's retry of that
request starts a new attempt under the next id (`{run_id}-2`, ...), which goes on from
the partial history the gateway kept, as without `--durable`. So does a run left under
way by another version of the gateway (DBOS recovers only its own version's runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from agentloop.agent import Agent
from agentloop.capabilities.base import Capability, NextRequest
from agentloop.checks import check_seconds
from agentloop.context import RunContext
from agentloop.errors import ConfigurationError, ProviderError
from agentloop.logs import get_logger
from agentloop.providers.base import ModelRequest, ModelResponse, StreamEvent, StreamingProvider
from agentloop.registry import ToolRegistry
from agentloop.result import RunResult

from .calls import Call, continued_trace
from .defaults import DBOS_FILE, DURABLE_LEASE
from .errors import StoreUnavailable

if TYPE_CHECKING:
    from dbos import DBOSClient, DBOSConfig

    from agentloop.durable.dbos import DurableAgent
    from agentloop.durable.streams import DurableStream

__all__ = (
    "DBOS_FILE",
    "ClientFields",
    "DBOSRequests",
    "DurableRequests",
    "Finished",
    "RequestProvider",
    "dbos_url",
    "given_up_when",
    "open_durable",
)

_log = get_logger()

NAME = "agentloop-gateway"
"""The durable agent's name: its workflow is `agentloop.agentloop-gateway.run`."""

_FAILED = frozenset({"ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"})
"""DBOS statuses of a run that will not finish: a retry starts a new attempt."""

_UNDER_WAY = frozenset({"PENDING", "ENQUEUED", "DELAYED"})

_MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class Finished:
    """A finished run and its model responses, as the gateway answers them."""

    result: RunResult[Any]
    responses: list[ModelResponse]
    run_id: str
    """The id the run had (the request's run id, or a later attempt's)."""


class DurableRequests(Protocol):
    """How the gateway runs a request as a durable run (see the module)."""

    async def open(self) -> None:
        """Start the engine (and recover the runs a previous process left)."""
        ...

    async def aclose(self) -> None:
        """Stop the engine."""
        ...

    async def run(self, call: Call, run_id: str) -> Finished:
        """Run `call` as the durable run `run_id`, or attach to it when it exists.

        Raises:
            Exception: what the run raised (a `ProviderError`, ...).
        """
        ...

    async def starts(self, run_id: str) -> str | None:
        """The id of the attempt a request of run `run_id` starts, or None if it attaches.

        None when the run's latest attempt exists (under way or finished).
        """
        ...

    def stream(self, call: Call, attempt: str) -> AbstractAsyncContextManager[DurableStream[Any]]:
        """Start `call` as the attempt `attempt` (from `starts`), its events as they come.

        Leaving the block stops reading: the run goes on without this reader.
        """
        ...

    async def watch(self, run_id: str, patience: float) -> None:
        """Ask the database about run `run_id` now and then, for as long as it answers.

        Raises:
            StoreUnavailable: the database failed, or did not answer within `patience`
                seconds (the run itself waits for it, and goes on when it is back).
        """
        ...


@asynccontextmanager
async def given_up_when(check: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """The block, given up (cancelled) when `check` raises `StoreUnavailable`.

    The engine waits for an unreachable database as long as it takes, and so would its
    reader: a client is answered instead, and its retry finds the run where it stopped.

    Raises:
        StoreUnavailable: what `check` raised.
    """
    failed: list[StoreUnavailable] = []
    body = anyio.CancelScope()

    async def watch() -> None:
        try:
            await check()
        except StoreUnavailable as exc:
            failed.append(exc)
            body.cancel()

    watching = anyio.create_task_group()
    await watching.__aenter__()
    try:
        watching.start_soon(watch)
        with body:
            yield
    finally:
        watching.cancel_scope.cancel()
        # Not given the block's error: the task group would wrap it in an ExceptionGroup,
        # and the block's own error is what the caller answers.
        await watching.__aexit__(None, None, None)
    if failed:
        raise failed[0]


def dbos_url(option: str, store: str) -> str:
    """The DBOS system database URL `--durable` names.

    `dbos` alone: a SQLite file next to a SQLite session store (else in the working
    directory); `dbos:URL`: that URL (`sqlite:///PATH`, `postgresql://...`).

    Raises:
        ConfigurationError: the option names another engine, or an empty URL.
    """
    engine, _, url = option.partition(":")
    if engine != "dbos":
        raise ConfigurationError(
            f"--durable: unknown engine {engine!r}; use dbos or dbos:URL (a DBOS system "
            "database URL)"
        )
    if url:
        return url
    if ":" in option:
        raise ConfigurationError("--durable: dbos: needs a URL after the colon")
    if store.startswith("sqlite:///"):
        folder = PurePosixPath(store.removeprefix("sqlite:///")).parent
        return f"sqlite:///{folder / DBOS_FILE}"
    return f"sqlite:///{DBOS_FILE}"


def open_durable(
    option: str, *, store: str, registry: ToolRegistry, **options: Any
) -> DBOSRequests:
    """The durable engine `--durable` names (not yet opened).

    Raises:
        ConfigurationError: a bad option, or DBOS is not installed.
    """
    url = dbos_url(option, store)
    try:
        import dbos  # noqa: F401  (only whether it can be imported)
    except ImportError:
        raise ConfigurationError(
            "--durable dbos needs DBOS: pip install 'agentloop-runner[gateway,dbos]'"
        ) from None
    return DBOSRequests(url, registry=registry, **options)


class RequestProvider:
    """The durable agent's provider: each model request sent with its client's upstream client.

    It keeps the agent the gateway built for each run's request (`attach`), found by the
    run's id: `ClientFields` takes the request's fields from it, and this provider sends
    the request with its provider.
    """

    def __init__(self, attach_wait: float) -> None:
        """A provider whose recovered runs wait `attach_wait` seconds for their client."""
        self.attach_wait = attach_wait
        self._agents: dict[str, Agent[Any, Any]] = {}
        self._arrived: dict[str, anyio.Event] = {}

    def attach(self, run_id: str, agent: Agent[Any, Any]) -> None:
        """`agent` sends the model requests of run `run_id` from now on."""
        self._agents[run_id] = agent
        self._arrived.pop(run_id, anyio.Event()).set()

    def detach(self, run_id: str, agent: Agent[Any, Any]) -> None:
        """Forget `agent` (unless another request attached since)."""
        if self._agents.get(run_id) is agent:
            del self._agents[run_id]

    async def agent_of(self, run_id: str) -> Agent[Any, Any]:
        """The agent of run `run_id`'s client request, once its client has sent it.

        Raises:
            ProviderError: the client did not send it within `attach_wait` seconds.
        """
        agent = self._agents.get(run_id)
        if agent is not None:
            return agent
        _log.info("gateway.durable_waiting", run_id=run_id, detail="for the client's retry")
        arrived = self._arrived.setdefault(run_id, anyio.Event())
        with anyio.move_on_after(self.attach_wait):
            await arrived.wait()
        agent = self._agents.get(run_id)
        if agent is None:
            self._arrived.pop(run_id, None)
            raise ProviderError(
                f"run {run_id} was recovered, but its client did not send the request "
                f"again within {self.attach_wait:g} seconds"
            )
        return agent

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` with the upstream client of the run's client request."""
        agent = await self._current()
        response: ModelResponse = await agent.provider.complete(request)
        return response

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Stream `request` with the run's client's upstream client (when its client streams).

        The events go to the run's stream (the model step's `on_event`); a client that
        does not stream has its request sent as one JSON request.
        """
        agent = await self._current()
        if isinstance(agent.provider, StreamingProvider):
            return await agent.provider.stream(request, on_event)
        response: ModelResponse = await agent.provider.complete(request)
        return response

    async def _current(self) -> Agent[Any, Any]:
        """The agent of the client request of the DBOS workflow running here."""
        from dbos import DBOS

        run_id = DBOS.workflow_id
        if run_id is None:
            raise ConfigurationError("the gateway's durable agent runs only in DBOS workflows")
        return await self.agent_of(run_id)


class ClientFields(Capability):
    """The durable agent's outermost capability: each request as its client's request says.

    The durable agent builds each request from its own settings; this keeps the
    conversation and the tools, and takes everything else (model, `max_tokens`, system,
    the other fields) from the agent the gateway built for the run's request.
    """

    name = "gateway-client-fields"

    def __init__(self, agents: RequestProvider) -> None:
        """Fields from the agents `agents` keeps, by run id."""
        self.agents = agents

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        """Send `request` with the fields of the run's client request."""
        agent = await self.agents.agent_of(ctx.run_id)
        config = agent.config
        sent = dataclasses.replace(
            request,
            model=agent.model,
            max_tokens=config.max_tokens,
            system=config.system,
            tool_choice=config.tool_choice,
            thinking=config.thinking,
            metadata=config.metadata,
            stop_sequences=config.stop_sequences,
            params=config.request_params,
        )
        return await call_next(sent)


class DBOSRequests:
    """Requests as runs of a DBOS `DurableAgent` (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        registry: ToolRegistry,
        max_rounds: int,
        tool_concurrency: int,
        tool_timeout: float,
        deps: Any = None,
        attach_wait: float = 3600.0,
        executor_id: str | None = None,
        lease_seconds: float = DURABLE_LEASE,
        capabilities: Sequence[Capability] = (),
    ) -> None:
        """Runs recorded in the DBOS system database at `url`, with the gateway's tools.

        `deps` is what the tools get (it is not recorded); a recovered run waits at most
        `attach_wait` seconds for its client's retry. `executor_id` is this process's in
        the database and the key of its lease (`agentloop.durable.dbos.launch`; new for
        each process when None): at start it recovers the runs a process of its id left
        under way, and while it lives it takes over those of a process whose lease ran
        out (`lease_seconds` unrenewed). `capabilities` wrap every run (inside its steps:
        what they do to a response or a result is recorded with it).

        Raises:
            ConfigurationError: `lease_seconds` is not a finite number of seconds > 0.
        """
        check_seconds("durable_lease", lease_seconds, finite=True)
        self.url = url
        self.executor_id = executor_id
        self.lease_seconds = lease_seconds
        self.provider = RequestProvider(attach_wait)
        self.deps = deps
        self.agent: Agent[Any, Any] = Agent(
            NAME,
            provider=self.provider,
            tools=registry,
            max_rounds=max_rounds,
            tool_concurrency=tool_concurrency,
            tool_timeout=tool_timeout,
            name=NAME,
            cache="off",
            capabilities=[ClientFields(self.provider), *capabilities],
        )
        self.durable: DurableAgent[Any] | None = None
        self.probe: DBOSClient | None = None
        """What `watch` asks the database through."""
        self.launched: AsyncExitStack | None = None
        """DBOS launched in the fleet (`agentloop.durable.dbos.launch`), until `aclose`."""

    async def open(self) -> None:
        """Register the durable agent, launch DBOS in the fleet (`launch`), recovering runs."""
        from dbos import DBOSClient

        from agentloop.durable.dbos import DurableAgent
        from agentloop.durable.dbos_fleet import launch

        # DBOS logs through its own handler; only its warnings are the gateway's business.
        config: DBOSConfig = {"name": NAME, "system_database_url": self.url, "log_level": "WARNING"}
        if self.executor_id is not None:
            config["executor_id"] = self.executor_id
        self.durable = DurableAgent(self.agent, name=NAME, deps_factory=lambda _: self.deps)
        self.launched = AsyncExitStack()
        launching = launch(config, lease_seconds=self.lease_seconds)
        lease = await self.launched.enter_async_context(launching)
        self.probe = DBOSClient(
            system_database_url=self.url, retry_connection_errors=False, system_database_pool_size=2
        )
        _log.info(
            "gateway.durable", engine="dbos", database=_shown(self.url), executor=lease.executor_id
        )

    async def aclose(self) -> None:
        """Stop DBOS, also when its database is down (the fleet takes over its runs)."""
        from dbos import DBOS

        if self.probe is not None:
            self.probe.destroy()
            self.probe = None
        self.durable = None
        launched, self.launched = self.launched, None
        if launched is not None:
            await launched.aclose()
        DBOS.destroy(destroy_registry=True)  # DBOS is down: this forgets the durable agent

    async def run(self, call: Call, run_id: str) -> Finished:
        """Run `call` durably as `run_id` (or its latest attempt), or attach to it."""
        assert self.durable is not None, "open() first"
        attempt, _ = await self._attempt(run_id)
        self.provider.attach(attempt, call.agent)
        try:
            with continued_trace(call):
                result = await self.durable.run(
                    None,
                    run_id=attempt,
                    history=call.history,
                    external_tools=call.client_tools,
                )
        finally:
            self.provider.detach(attempt, call.agent)
        return Finished(result, await self._responses(attempt), attempt)

    async def starts(self, run_id: str) -> str | None:
        """The id of the attempt a request of `run_id` starts, or None if it attaches."""
        attempt, exists = await self._attempt(run_id)
        return None if exists else attempt

    @asynccontextmanager
    async def stream(self, call: Call, attempt: str) -> AsyncIterator[DurableStream[Any]]:
        """Start `call` as `attempt` and read its events (see `DurableRequests.stream`).

        The request's agent sends the run's model requests until the block is left.
        """
        assert self.durable is not None, "open() first"
        self.provider.attach(attempt, call.agent)
        try:
            async with self.durable.run_stream(
                None, run_id=attempt, history=call.history, external_tools=call.client_tools
            ) as stream:
                yield stream
        finally:
            self.provider.detach(attempt, call.agent)

    async def watch(self, run_id: str, patience: float) -> None:
        """Check the database answers every `patience / 2` seconds; raise when it does not.

        Checked through a client that raises on a lost connection: DBOS itself waits and
        tries again for as long as it takes, which is right for the run, not for a probe.
        """
        assert self.probe is not None, "open() first"
        while True:
            with anyio.move_on_after(patience) as probe:
                try:
                    await self.probe.check_connection_async()
                except Exception as exc:
                    raise StoreUnavailable(f"the durable runs' database failed: {exc}") from exc
            if probe.cancelled_caught:
                raise StoreUnavailable(
                    f"the durable runs' database did not answer within {patience:g} seconds; "
                    "the run goes on when it is back: send the request again"
                )
            await anyio.sleep(patience / 2)

    async def _attempt(self, run_id: str) -> tuple[str, bool]:
        """`run_id`, or the id of the attempt after the last one that failed; if it exists."""
        from dbos import DBOS

        from agentloop.durable.dbos_workflow import status_row

        for number in range(1, _MAX_ATTEMPTS + 1):
            attempt = run_id if number == 1 else f"{run_id}-{number}"
            status = await status_row(attempt)  # without its input: the whole conversation
            if status is None:
                return attempt, False
            if status.status in _FAILED:
                continue
            if status.status in _UNDER_WAY and status.app_version not in (
                None,
                DBOS.application_version,
            ):
                # Left by another version of the gateway: no process of this one recovers it.
                _log.warning(
                    "gateway.durable_run_abandoned",
                    run_id=attempt,
                    version=status.app_version,
                    detail="left under way by another version of the gateway; tried again",
                )
                continue
            return attempt, True
        raise ProviderError(f"run {run_id} failed {_MAX_ATTEMPTS} times; not tried again")

    async def _responses(self, run_id: str) -> list[ModelResponse]:
        """The model responses recorded by the run, in order."""
        from dbos import DBOS

        assert self.durable is not None
        name = self.durable.model_step_name
        steps = await DBOS.list_workflow_steps_async(run_id)
        return [
            ModelResponse.from_json(step["output"])
            for step in sorted(steps, key=lambda s: s["function_id"])
            if step["function_name"] == name and isinstance(step["output"], Mapping)
        ]


def _shown(url: str) -> str:
    """`url` without a password."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, _ = head.partition("://")
    return f"{scheme}://***@{tail}"
