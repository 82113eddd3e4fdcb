"""``WorkflowEnvironment``: a team's own workflows under test, in memory or on PostgreSQL,
with time that skips (Temporal's time-skipping test environment is the model).

One API, two backends: in memory (``kenning.testing.inmemory``, no database) or on a real
PostgreSQL with the real worker and scheduler in this process
(``kenning.testing.postgres``). The same test runs on both, and
``tests/integration/test_port_contract.py`` proves they agree.

Time skips only when everything waits: ``sleep`` first lets every runnable instance run
and every event be delivered, then moves the clock from one due wait to the next (each
firing, and what it wakes running, before the next), up to the duration asked for.
``WorkflowHandle.result`` skips as far as it must for the instance to end.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

import structlog

from kenning import codecs, serialization
from kenning.activity import Activity
from kenning.app import App
from kenning.client.client import named_arguments, search_where
from kenning.core.mailbox import Undelivered, request_answer, request_refusal
from kenning.core.names import STATUS_VALUE_KEY
from kenning.core.published import PublishedStatus, status_of
from kenning.core.records import TERMINAL_STATUSES
from kenning.core.streams import StreamEntry, check_stream_key
from kenning.errors import ConfigurationError, KenningError, ValueNotPublishedError, WorkflowFailedError
from kenning.events import reserved_attribute_error
from kenning.starting import prepare_start
from kenning.testing.inmemory import MemoryBackend
from kenning.testing.overrides import Overrides
from kenning.testing.state import Backend, HistoryEntry, InstanceState, OutgoingEvent
from kenning.workflow import StartOptions, Workflow

_log = structlog.get_logger("kenning.testing")

DEFAULT_SOURCE = "tests"  # the CloudEvent source of events a test sends


class WaitsForeverError(KenningError):
    """``result()`` of an instance that waits for something only the test can send: no
    timer or timeout is due, so skipping time cannot end it."""


def seconds_of(duration: timedelta | float) -> float:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {duration!r}")
    return seconds


R = TypeVar("R")
P = ParamSpec("P")


class WorkflowHandle(Generic[R]):
    """One instance of the environment: its result (of the workflow's return type),
    status and history."""

    def __init__(self, env: WorkflowEnvironment, instance_id: str) -> None:
        self.env = env
        self.instance_id = instance_id

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.instance_id}>"

    async def result(self) -> R:
        """The instance's result once it has ended, skipping time as far as needed (its
        timers, timeouts and back-offs fire). Raises ``WorkflowFailedError`` if it failed
        or was cancelled, ``WaitsForeverError`` if it waits for an event or a message
        and nothing is due."""
        state = await self.env.run_until(self.instance_id)
        if state.status != "completed":
            raise WorkflowFailedError(state.instance_id, state.status, codecs.unseal(state.error))
        value = (state.result or {}).get("result")
        wf = self.env.app.registry.workflows.get(state.workflow_name)
        if wf is not None:
            hints = serialization.type_hints(wf.func)
            value = serialization.from_json(value, hints.get("return", inspect.Parameter.empty))
        return cast("R", value)

    async def state(self) -> InstanceState:
        """Status, stored result and error, and history, after everything runnable ran."""
        await self.env.settle()
        return await self.env.backend.state(self.instance_id)

    async def status(self) -> str:
        return (await self.state()).status

    async def history(self) -> list[HistoryEntry]:
        return list((await self.state()).history)

    async def cancel(self) -> bool:
        return await self.env.cancel(self.instance_id)

    async def send_message(self, topic: str, data: Any = None, message_id: str | None = None) -> str:
        return await self.env.send_message(self.instance_id, topic, data, message_id)

    async def request(
        self,
        topic: str,
        data: Any = None,
        *,
        timeout: timedelta | float | None = None,
        request_id: str | None = None,
        model: Any = None,
    ) -> Any:
        """``WorkflowEnvironment.request`` to this instance."""
        env = self.env
        return await env.request(self.instance_id, topic, data, timeout=timeout, request_id=request_id, model=model)

    async def get_value(self, key: str) -> Any:
        """``Client.get_value``: what the instance published last under ``key``."""
        return await self.env.get_value(self.instance_id, key)

    def read_stream(self, key: str, offset: int = 0) -> AsyncIterator[StreamEntry]:
        """``WorkflowEnvironment.read_stream`` of this instance."""
        return self.env.read_stream(self.instance_id, key, offset)

    async def stream_closed(self, key: str) -> bool:
        """``WorkflowEnvironment.stream_closed`` of this instance."""
        return await self.env.stream_closed(self.instance_id, key)


class WorkflowEnvironment:
    """Run workflows under test: ``async with WorkflowEnvironment() as env`` (in memory),
    ``WorkflowEnvironment(database_url=...)`` (a migrated or empty PostgreSQL database of
    the test's own) or ``WorkflowEnvironment(embedded=True)`` (a PostgreSQL started from
    the ``kenning[embedded]`` wheel).

    ``app``: the App whose workflows, hooks and retry defaults run (default: one over
    every registered workflow). ``start_time``: the in-memory clock's start (default: now).
    ``worker_options``: ``WorkerSettings`` fields for the PostgreSQL worker.
    """

    def __init__(
        self,
        app: App | None = None,
        *,
        database_url: str | None = None,
        embedded: bool = False,
        migrate: bool = True,
        start_time: datetime | None = None,
        worker_options: dict[str, Any] | None = None,
    ) -> None:
        if database_url is not None and embedded:
            raise ConfigurationError("WorkflowEnvironment: give database_url or embedded=True, not both")
        self.app = app or App("kenning-testing")
        self.backend: Backend
        if database_url is not None or embedded:
            from kenning.testing.postgres import PostgresBackend

            if start_time is not None:
                raise ConfigurationError("WorkflowEnvironment: start_time is the in-memory clock's, not PostgreSQL's")
            self.backend = PostgresBackend(
                self.app,
                database_url=database_url,
                embedded=embedded,
                migrate=migrate,
                worker_options=dict(worker_options or {}),
            )
            self.mode = "postgresql"
        else:
            self.backend = MemoryBackend(self.app, start_time=start_time)
            self.mode = "memory"
        self.overrides = Overrides(self.app.registry)
        self._open = False

    def __repr__(self) -> str:
        return f"<WorkflowEnvironment {self.mode}>"

    async def __aenter__(self) -> WorkflowEnvironment:
        await self.backend.open()
        self._open = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._open = False
        try:
            await self.backend.close()
        finally:
            self.overrides.restore()

    # ---------------------------------------------------------------- starting and sending

    @overload
    async def start(self, workflow: Workflow[R, P], /, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle[R]: ...
    # options mixed with the arguments leave the arguments unchecked (PEP 612), as with
    # Client.start; checked with options: env.start(wf.options(instance_id=...), ...)
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, instance_id: str | None, **kwargs: Any
    ) -> WorkflowHandle[R]: ...
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, idempotency_key: str | None, **kwargs: Any
    ) -> WorkflowHandle[R]: ...
    @overload
    async def start(
        self,
        workflow: str,
        /,
        *,
        instance_id: str | None = None,
        idempotency_key: str | None = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]: ...
    async def start(self, workflow: Workflow[Any] | str, /, *args: Any, **kwargs: Any) -> WorkflowHandle[Any]:
        """Start an instance (its arguments checked as ``Client.start`` checks them, by
        the type checker too) and run it until it waits or ends."""
        self._check_open()
        given = {name: kwargs.pop(name) for name in ("instance_id", "idempotency_key") if name in kwargs}
        options = (workflow.start_options if isinstance(workflow, Workflow) else StartOptions()).merged(**given)
        start = prepare_start(
            workflow,
            named_arguments(workflow, args, kwargs),
            instance_id=options["instance_id"],
            idempotency_key=options["idempotency_key"],
            registry=self.app.registry,
            timeout=options["timeout"],
            search_attributes=options["search_attributes"],
            flow_control=False,  # the testing backends start each at once (no bursts)
        )
        started = await self.backend.start(start)
        await self.settle()
        return WorkflowHandle(self, started)

    def handle(self, instance_id: str) -> WorkflowHandle[Any]:
        """A handle on an instance started otherwise (by an event, as a child)."""
        return WorkflowHandle(self, instance_id)

    async def send_event(
        self,
        event_type: str,
        data: Any = None,
        *,
        source: str = DEFAULT_SOURCE,
        event_id: str | None = None,
        subject: str | None = None,
        instance_id: str | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> bool:
        """Receive a CloudEvent as the ingress would, then deliver it as the worker does:
        ``event_handler`` workflows of its type start, waiting instances whose ``match``
        and ``since`` take it wake. ``instance_id`` addresses one instance (the
        ``kenninginstanceid`` extension). False: a duplicate ``(source, event_id)``."""
        self._check_open()
        refused = reserved_attribute_error(event_type, source)
        if refused is not None:
            raise ValueError(refused)
        data = serialization.storable_json(data, f"event {event_type!r} data")
        stored = await self.backend.send_event(
            event_type,
            data,
            source=source,
            event_id=event_id or str(uuid.uuid4()),
            subject=subject,
            instance_id=instance_id,
            extensions=dict(extensions or {}),
        )
        await self.settle()
        return stored

    async def send_message(self, instance_id: str, topic: str, data: Any = None, message_id: str | None = None) -> str:
        """``Client.send_message``: into the instance's ``topic`` mailbox, waking its receive."""
        self._check_open()
        data = serialization.storable_json(data, f"message {topic!r} data")
        message_id = message_id or str(uuid.uuid4())
        await self.backend.send_message(instance_id, topic, data, message_id)
        await self.settle()
        return message_id

    async def request(
        self,
        instance_id: str,
        topic: str,
        data: Any = None,
        *,
        timeout: timedelta | float | None = None,
        request_id: str | None = None,
        model: Any = None,
    ) -> Any:
        """``Client.request``: send the request, run the instance (skipping time up to
        ``timeout``, its timers and timeouts firing) until it replies or ends; the reply,
        or ``Client.request``'s errors (``RequestTimeoutError`` once ``timeout`` of the
        environment's time passed). Without ``timeout``, ``WaitsForeverError`` when
        nothing is due and the instance has not replied."""
        self._check_open()
        data = serialization.storable_json(data, f"request {topic!r} data")
        request_id = request_id or str(uuid.uuid4())
        total = None if timeout is None else seconds_of(timeout)
        remaining = total
        await self.backend.send_request(instance_id, topic, data, request_id)
        await self.settle()
        while True:
            state = await self.backend.request_state(instance_id, request_id)
            if state is None:
                raise request_refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, request_id, None)
            if state.replied or state.status in TERMINAL_STATUSES or remaining == 0.0:
                value = request_answer(instance_id, topic, request_id, state, timeout=total)
                return value if model is None else serialization.from_json(value, model)
            due = await self.backend.next_due()
            if due is None and remaining is None:
                raise WaitsForeverError(
                    f"request {topic!r} ({request_id}) to instance {instance_id}: it is {state.status}, has not "
                    "replied, and nothing is due"
                )
            step = remaining if due is None or (remaining is not None and due > remaining) else max(due, 0.0)
            assert step is not None
            await self.backend.skip(step)
            remaining = None if remaining is None else max(0.0, remaining - step)
            await self.settle()

    async def publish(self, channel: str, data: Any = None, message_id: str | None = None) -> int:
        """``Client.publish``: to every instance subscribed to ``channel``; how many it reached."""
        self._check_open()
        data = serialization.storable_json(data, f"message {channel!r} data")
        reached = await self.backend.publish(channel, data, message_id or str(uuid.uuid4()))
        await self.settle()
        return reached

    async def cancel(self, instance_id: str) -> bool:
        """``Client.cancel``, then the compensations run; False if it had already ended."""
        self._check_open()
        cancelled = await self.backend.cancel(instance_id)
        await self.settle()
        return cancelled

    def override(self, target: Activity[Any] | Callable[..., Any], replacement: Callable[..., Any]) -> None:
        """Replace an ``@activity`` (or an ``@compensation``) with ``replacement`` until
        the environment closes; history keeps the activity's name."""
        self.overrides.replace(target, replacement)

    # ---------------------------------------------------------------- time

    def now(self) -> datetime:
        """The environment's clock: the wall clock plus the time skipped."""
        return self.backend.now()

    async def settle(self) -> None:
        """Run everything runnable until every instance waits or has ended."""
        self._check_open()
        await self.backend.settle()

    async def sleep(self, duration: timedelta | float) -> None:
        """Skip ``duration`` (a ``timedelta`` or seconds): the timers, timeouts and retry
        back-offs due within it fire in their order, each after what the previous woke
        has run."""
        remaining = seconds_of(duration)
        await self.settle()
        while True:
            due = await self.backend.next_due()
            if due is None or due > remaining:
                await self.backend.skip(remaining)
                await self.settle()
                return
            step = max(due, 0.0)
            await self.backend.skip(step)
            remaining -= step
            await self.settle()

    async def run_until(self, instance_id: str) -> InstanceState:
        """Skip time until ``instance_id`` has ended; its final state."""
        await self.settle()
        while True:
            state = await self.backend.state(instance_id)
            if state.finished:
                return state
            due = await self.backend.next_due()
            if due is None:
                raise WaitsForeverError(
                    f"instance {instance_id} is {state.status} and nothing is due: it waits for an event or "
                    "a message the test has not sent"
                )
            await self.backend.skip(max(due, 0.0))
            await self.settle()

    # ---------------------------------------------------------------- reading

    async def instances(self, where: Mapping[str, str | int | float | bool] | None = None) -> list[WorkflowHandle[Any]]:
        """Every instance, those started by events and children included; with ``where``,
        those whose search attributes hold every pair (``Client.list(where=...)``), by id."""
        ids = await self.backend.instance_ids()
        if where:
            wanted = search_where(where).items()
            states = [await self.backend.state(i) for i in ids]
            ids = sorted(s.instance_id for s in states if wanted <= s.search_attributes.items())
        return [WorkflowHandle(self, i) for i in ids]

    async def get_value(self, instance_id: str, key: str) -> Any:
        """``Client.get_value`` after everything runnable ran: the value ``instance_id``
        published last under ``key``; ``ValueNotPublishedError`` if it has not (nothing
        is waited for: the environment has settled), ``WorkflowNotFoundError`` for an
        unknown instance."""
        await self.settle()
        state = await self.backend.state(instance_id)
        if key not in state.values:
            raise ValueNotPublishedError(f"instance {instance_id!r} ({state.status}) has not published {key!r}")
        return state.values[key]

    async def read_stream(self, instance_id: str, key: str, offset: int = 0) -> AsyncIterator[StreamEntry]:
        """``Client.read_stream`` after everything runnable ran: the entries of the
        instance's stream ``key`` from ``offset`` on, in order, as a client reads them
        (``StreamEntry``), on either backend. The iteration ends at the last entry written
        by then (nothing more happens until the test acts; ``stream_closed`` says whether
        the stream is closed). ``WorkflowNotFoundError`` for an unknown instance."""
        check_stream_key(key)
        if offset < 0:
            raise ValueError(f"a stream's offset is not negative, got {offset}")
        await self.settle()
        state = await self.backend.state(instance_id)
        for entry in state.streams.get(key, ()):
            if entry.offset >= offset:
                yield entry

    async def stream_closed(self, instance_id: str, key: str) -> bool:
        """Whether the instance's stream ``key`` is closed (``close_stream``, or the
        instance has ended), after everything runnable ran."""
        await self.settle()
        state = await self.backend.state(instance_id)
        return key in state.closed_streams or state.finished

    async def get_status(self, instance_id: str) -> PublishedStatus | None:
        """``Client.get_status``: what the instance's last ``set_status`` published."""
        await self.settle()
        return status_of((await self.backend.state(instance_id)).values.get(STATUS_VALUE_KEY), None)

    async def outbox(self) -> list[OutgoingEvent]:
        """The events activities sent with ``send_event_transactional``, oldest first."""
        return await self.backend.outbox()

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("the environment is not open: use `async with WorkflowEnvironment(...) as env`")
