"""``kenning.Client``: start, inspect, await and cancel workflow instances.

Starting (``kenning.starting``) inserts a runnable instance and notifies workers in one
statement; it never runs workflow code in the caller.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from typing import Any

from kenning import serialization
from kenning.clients.results import DEFAULT_POLL_INTERVAL, ResultWaits
from kenning.clients.starts import Starter
from kenning.core.mailbox import Undelivered, refusal
from kenning.core.records import TERMINAL_STATUSES, InstanceRow, NewInstance, StartOutcome
from kenning.db import Database, connect
from kenning.db.groupcommit import GroupCommit
from kenning.errors import ConfigurationError, KenningError, WorkflowFailedError, WorkflowNotFoundError
from kenning.registry import REGISTRY
from kenning.starting import InvalidInputError as InvalidInputError  # re-exported: kenning.client's API
from kenning.starting import StartedInstance as StartedInstance  # re-exported
from kenning.starting import prepare_start
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage.messages import SendStatus
from kenning.workflow import Workflow


class ResultTimeoutError(KenningError, TimeoutError):
    """``result(timeout=...)`` ran out while the instance goes on."""


class Client:
    def __init__(
        self,
        database_url: str | None = None,
        *,
        database: Database | None = None,
        result_poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        if database is None:
            url = database_url or os.environ.get("KENNING_DATABASE_URL", "")
            database = connect(url, pool_size=2, max_overflow=8)
            self._owns_database = True
        else:
            self._owns_database = False
        self.database = database
        # concurrent start() calls (a web app's requests) share one insert, one commit and
        # one NOTIFY (kenning.starting)
        self.starter = Starter(database)
        # result() waits on one LISTEN connection of this client, opened by the first wait
        self.results = ResultWaits(database.listen_url, poll_interval=result_poll_interval)

    @property
    def starts(self) -> GroupCommit[NewInstance, StartOutcome]:
        """The group commit of this client's starts (statements run, starts carried)."""
        return self.starter.inserts

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.starter.close()  # starts not yet announced to the workers: now
        await self.results.close()
        if self._owns_database:
            await self.database.dispose()

    async def start(
        self,
        workflow: Workflow[Any] | str,
        /,
        *,
        instance_id: str | None = None,
        idempotency_key: str | None = None,
        queue: str | None = None,
        partition_key: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> StartedInstance:
        """Start an instance; starting again with the same ``instance_id`` or
        ``idempotency_key`` returns the existing instance (``created=False``).

        ``queue`` (default: the workflow's ``@workflow(queue=...)``) starts it in a queue
        whose limits the claim enforces (``kenning.Queue``); there ``partition_key`` names
        its partition (served round-robin, ``partition_concurrency`` per key) and
        ``priority`` orders it (lower first, default 0). The three names are taken by
        these parameters, so a workflow argument cannot be called ``queue``,
        ``partition_key`` or ``priority``."""
        start = prepare_start(
            workflow,
            kwargs,
            instance_id=instance_id,
            idempotency_key=idempotency_key,
            queue=queue,
            partition_key=partition_key,
            priority=priority,
        )
        self.results.expect(start.instance.instance_id)  # result() may then wait without reading first
        try:
            started = await self.starter.start(start)
        except BaseException:
            self.results.forget(start.instance.instance_id)
            raise
        assert started is not None  # only a start with not_before (a cron tick) can be refused
        if not started.created:
            self.results.forget(start.instance.instance_id)
        return started

    async def status(self, instance_id: str) -> InstanceRow:
        async with self.database.connection() as conn:
            row = await instances_sql.instance_get(conn, instance_id)
        if row is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return row

    async def result(self, instance_id: str, timeout: float | None = None) -> Any:
        """Wait for the instance to finish and return its result: woken by the NOTIFY of
        the statement that finished it (``kenning.clients.results``), read again every
        ``result_poll_interval`` seconds in case a notification was missed.

        Raises ``WorkflowFailedError`` if it failed or was cancelled, ``TimeoutError``
        after ``timeout`` seconds.
        """
        row = await self.results.until_finished(instance_id, lambda: self.status(instance_id), timeout)
        if row is None:  # the time ran out before a read: the caller hears how it stands
            row = await self.status(instance_id)
        if row.status not in TERMINAL_STATUSES:
            raise ResultTimeoutError(f"instance {instance_id} still {row.status} after {timeout} s")
        if row.status != "completed":
            raise WorkflowFailedError(instance_id, row.status, row.error)
        value = (row.result or {}).get("result")
        wf = REGISTRY.workflows.get(row.workflow_name)
        if wf is not None:
            value = serialization.from_json(
                value, serialization.type_hints(wf.func).get("return", inspect.Parameter.empty)
            )
        return value

    async def cancel(self, instance_id: str) -> bool:
        """Request cancellation: a waiting instance is compensated and ends ``cancelled``;
        a running one stops at its next step boundary; one parked as ``crash_loop`` is
        resumed to be compensated. False if it had already finished."""
        async with self.database.connection() as conn:  # one statement, its own transaction
            outcome = await instances_sql.instance_request_cancel(conn, instance_id)
        if outcome is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return outcome[1]

    async def send_message(self, instance_id: str, topic: str, data: Any = None, message_id: str | None = None) -> str:
        """Put ``data`` (JSON, or a pydantic model) into ``instance_id``'s ``topic`` mailbox,
        waking the instance if it waits in a ``receive`` of that topic (kenning/messages.py).
        Returns the message id: ``message_id`` if given (sending it again to this instance
        is a no-op, so a retry is safe), else a new one. Raises ``WorkflowNotFoundError``
        for an unknown instance, ``MessageUndeliverableError`` for one that has ended."""
        data = serialization.storable_json(data, f"message {topic!r} data")
        message_id = message_id or str(uuid.uuid4())
        async with self.database.transaction() as conn:
            await messages_sql.mailbox_lock(conn, instance_id)
            sent = await messages_sql.message_send(
                conn, instance_id=instance_id, topic=topic, message_id=message_id, data=data, sender_instance_id=None
            )
        if sent.status is SendStatus.UNKNOWN_INSTANCE:
            raise refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, None)
        if sent.status is SendStatus.FINISHED:
            raise refusal(Undelivered.FINISHED, instance_id, topic, sent.recipient_status)
        return message_id

    async def publish(self, channel: str, data: Any = None, message_id: str | None = None) -> int:
        """Broadcast ``data`` to every instance subscribed to ``channel`` (``kenning.subscribe``)
        that has not ended, each copy in its ``channel`` mailbox; returns how many it reached.
        ``message_id`` makes a retry safe (a subscriber that has the id gets no second copy)."""
        data = serialization.storable_json(data, f"message {channel!r} data")
        message_id = message_id or str(uuid.uuid4())
        async with self.database.transaction() as conn:
            recipients = await messages_sql.channel_lock_subscribers(conn, channel)
            return await messages_sql.channel_publish(
                conn,
                channel=channel,
                recipients=recipients,
                message_id=message_id,
                data=data,
                sender_instance_id=None,
            )

    async def list(
        self, *, status: str | None = None, workflow: str | None = None, limit: int = 50
    ) -> list[InstanceRow]:
        async with self.database.connection() as conn:
            return await instances_sql.instance_list(conn, status=status, workflow_name=workflow, limit=limit)


_default_clients: dict[asyncio.AbstractEventLoop, Client] = {}


def default_client() -> Client:
    """The client ``Workflow.start`` uses, from ``KENNING_DATABASE_URL``; one per event loop
    because async connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    client = _default_clients.get(loop)
    if client is None:
        if not os.environ.get("KENNING_DATABASE_URL"):
            raise ConfigurationError("Workflow.start needs KENNING_DATABASE_URL, or use kenning.Client(url).start")
        for stale in [lp for lp in _default_clients if lp.is_closed()]:
            del _default_clients[stale]
        client = _default_clients[loop] = Client()
    return client
