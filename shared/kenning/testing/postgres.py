"""The environment's PostgreSQL backend: the real worker and scheduler, in this process,
on a real database; time skipped by moving stored times (``kenning.storage.testing``).

The library's floors keep ``kenning`` from importing a service: the worker and the
scheduler are imported by name (``importlib``), only when this backend opens, as
``kenning``'s command line reaches them through entry points. Their settings are a
test's: polls of 50 ms behind LISTEN/NOTIFY, and every retry back-off releasing the
instance (``inline_retry_seconds=0``) so that back-offs are waits the clock skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kenning import codecs
from kenning.client import Client
from kenning.client.starts import start_on
from kenning.core.cancelling import cancel_and_wait
from kenning.core.limits import MAX_STREAM_ENTRIES
from kenning.db import Database, connect
from kenning.errors import WorkflowNotFoundError
from kenning.starting import Start
from kenning.storage import history as history_sql
from kenning.storage import inbox as inbox_sql
from kenning.storage import instances as instances_sql
from kenning.storage import outbox as outbox_sql
from kenning.storage import published as published_sql
from kenning.storage import streams as streams_sql
from kenning.storage import testing as testing_sql
from kenning.storage.replies import RequestState
from kenning.testing.state import HistoryEntry, InstanceState, OutgoingEvent

if TYPE_CHECKING:
    from kenning.app import App

# How long settle() waits for the worker, the inbox loop and the scheduler to finish
# what is runnable before it says what is still busy.
SETTLE_SECONDS = 60.0
_POLL = 0.01
# streams of one instance a test's state reads at most
MAX_STREAMS_READ = 1000


class PostgresBackend:
    """A database, a worker and a scheduler: production's code paths, time skipped."""

    def __init__(
        self, app: App, *, database_url: str | None, embedded: bool, migrate: bool, worker_options: dict[str, Any]
    ) -> None:
        self.app = app
        self.database_url = database_url
        self.embedded = embedded
        self.migrate = migrate
        self.worker_options = worker_options
        self.skipped = 0.0  # seconds of time skipped so far: now() is the clock plus this
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._stops: list[Any] = []
        self.database: Database | None = None
        self.client: Client | None = None

    async def open(self) -> None:
        url = self.database_url
        if self.embedded:
            from kenning.hosting.embedded import embedded_postgres

            server = embedded_postgres()
            url = await asyncio.to_thread(server.__enter__)
            self._stack.push(lambda *exc: server.__exit__(*exc))
        assert url is not None
        if self.migrate:
            from kenning.db.migrate import migrate

            await asyncio.to_thread(migrate, url)
        self.database = database = connect(url)
        self._stack.push_async_callback(database.dispose)
        self.client = Client(database=database)
        self._stack.push_async_callback(self.client.close)
        worker_module, scheduler_module = _services()
        worker_settings = {
            "poll_interval": 0.05,
            "lease_seconds": 10.0,
            "shutdown_grace_seconds": 2.0,
            "inline_retry_seconds": 0.0,
            **self.worker_options,
        }
        worker = worker_module.Worker(database, self.app, worker_module.WorkerSettings(**worker_settings))
        # no app: the scheduler fires timers and timeouts but ticks no cron schedule, as in
        # memory; the process's registry holds every workflow imported, a test's schedules
        # of other apps included, whose ticks would start instances of their own
        scheduler = scheduler_module.Scheduler(database, None, scheduler_module.SchedulerSettings(poll_interval=0.05))
        for name, service in (("worker", worker), ("scheduler", scheduler)):
            self._tasks.append(asyncio.create_task(service.run(), name=f"kenning-testing-{name}"))
            self._stops.append(service.stop)

    async def close(self) -> None:
        try:
            for stop in self._stops:
                stop()
            if self._tasks:
                done, late = await asyncio.wait(self._tasks, timeout=15)
                for task in late:
                    await cancel_and_wait(task)
                for task in done:
                    task.result()  # a service that crashed fails the test here
        finally:
            await self._stack.aclose()

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.skipped)

    def _db(self) -> Database:
        assert self.database is not None, "the environment is not open: use `async with WorkflowEnvironment(...)`"
        return self.database

    def _client(self) -> Client:
        assert self.client is not None, "the environment is not open: use `async with WorkflowEnvironment(...)`"
        return self.client

    # ---------------------------------------------------------------- what a test sends

    async def start(self, start: Start) -> str:
        async with self._db().connection() as conn:
            started = await start_on(conn, start, known=set())
        assert started is not None  # refused only with not_before (a cron tick)
        return started.instance_id

    async def send_event(
        self,
        event_type: str,
        data: Any,
        *,
        source: str,
        event_id: str,
        subject: str | None,
        instance_id: str | None,
        extensions: dict[str, Any],
    ) -> bool:
        # the attributes the ingress stores; the worker reads the event back from them
        attributes: dict[str, Any] = {"specversion": "1.0", "id": event_id, "source": source, "type": event_type}
        if subject is not None:
            attributes["subject"] = subject
        attributes.update(extensions)
        if instance_id is not None:
            attributes["kenninginstanceid"] = instance_id
        event = inbox_sql.NewEvent(source, event_id, event_type, attributes, data, None, instance_id)
        async with self._db().connection() as conn:
            (stored,) = await inbox_sql.inbox_insert_events(conn, [event])
        return stored

    async def send_message(self, instance_id: str, topic: str, data: Any, message_id: str) -> None:
        await self._client().send_message(instance_id, topic, data, message_id)

    async def publish(self, channel: str, data: Any, message_id: str) -> int:
        return await self._client().publish(channel, data, message_id)

    async def send_request(self, instance_id: str, topic: str, data: Any, request_id: str) -> None:
        await self._client().send_request(instance_id, topic, data, request_id)

    async def request_state(self, instance_id: str, request_id: str) -> RequestState | None:
        return await self._client().request_state(instance_id, request_id)

    async def cancel(self, instance_id: str) -> bool:
        return await self._client().cancel(instance_id)

    # ---------------------------------------------------------------- what a test reads

    async def state(self, instance_id: str) -> InstanceState:
        async with self._db().connection() as conn:
            row = await instances_sql.instance_get(conn, instance_id)
            if row is None:
                raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
            history = (await history_sql.history_load(conn, [instance_id], shown=True)).get(instance_id, [])
            values = {v.key: v.value for v in await published_sql.values_of(conn, instance_id)}
            search_attributes = await published_sql.search_attributes_of(conn, instance_id)
            streams, closed = {}, set()
            for stream in await streams_sql.streams_of(conn, instance_id, limit=MAX_STREAMS_READ):
                read = await streams_sql.stream_read(
                    conn, instance_id, stream.key, offset=0, limit=MAX_STREAM_ENTRIES, shown=True
                )
                if read is not None:
                    streams[stream.key] = tuple(read.entries)
                    if read.closed:
                        closed.add(stream.key)
        return InstanceState(
            instance_id=row.id,
            workflow_name=row.workflow_name,
            status=row.status,
            # opened as kenning.testing's memory backend opens them ("encrypted" without the key)
            result=codecs.shown(row.result),
            error=codecs.shown(row.error),
            cancel_requested=row.cancel_requested,
            history=tuple(HistoryEntry(r.step_id, r.kind, r.step_name, r.payload) for r in history),
            values=values,
            search_attributes=search_attributes,
            run=row.run,
            streams=streams,
            closed_streams=frozenset(closed),
        )

    async def instance_ids(self) -> list[str]:
        async with self._db().connection() as conn:
            rows = await instances_sql.instance_list(conn, limit=100_000)
        return sorted(r.id for r in rows)

    async def outbox(self) -> list[OutgoingEvent]:
        async with self._db().connection() as conn:
            rows = await outbox_sql.outbox_list(conn, limit=100_000)
        return [OutgoingEvent(r.event_type, r.source, r.data, r.instance_id) for r in reversed(rows)]

    # ---------------------------------------------------------------- running and time

    async def settle(self) -> None:
        """Wait until the worker, the inbox loop and the scheduler have nothing to do now,
        seen twice in a row (a NOTIFY in flight between two statements)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        quiet = 0
        busy: list[str] = []
        while quiet < 2:
            self._check_services()
            async with self._db().connection() as conn:
                busy = await testing_sql.testing_busy(conn)
            quiet = 0 if busy else quiet + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"still busy after {SETTLE_SECONDS:g} s: {', '.join(busy)}")
            await asyncio.sleep(_POLL)

    async def next_due(self) -> float | None:
        async with self._db().connection() as conn:
            return await testing_sql.testing_next_due(conn)

    async def skip(self, seconds: float) -> None:
        if seconds <= 0:
            return
        async with self._db().connection() as conn:
            await testing_sql.testing_skip(conn, seconds)
        self.skipped += seconds

    def _check_services(self) -> None:
        for task in self._tasks:
            if task.done():
                task.result()  # raises what ended it
                raise RuntimeError(f"{task.get_name()} stopped")


def _services() -> tuple[Any, Any]:
    """The worker's and the scheduler's packages, by name (see the module's docstring)."""
    return importlib.import_module("kenning_worker"), importlib.import_module("kenning_scheduler")
