"""``Client``: start, inspect, await and cancel workflow instances (``kenning.Client``).

Starting (``kenning.starting``) inserts a runnable instance and notifies workers in one
statement; it never runs workflow code in the caller.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, overload

from typing_extensions import ParamSpec, TypeVar

from kenning import codecs, serialization
from kenning.app import database_url_of_apps, warn_unloaded_hooks
from kenning.client.forks import Fork, fork_action, fork_instance
from kenning.client.results import DEFAULT_POLL_INTERVAL, ResultWaits
from kenning.client.starts import Starter
from kenning.client.streams import StreamReaders
from kenning.client.unavailable import DEFAULT_RETRY_SECONDS, retried
from kenning.core.mailbox import Undelivered, refusal, request_answer, request_refusal
from kenning.core.names import STATUS_VALUE_KEY
from kenning.core.published import PublishedStatus, check_key, search_text, status_of
from kenning.core.records import TERMINAL_STATUSES, InstanceRow, NewInstance, StartOutcome
from kenning.core.streams import StreamEntry
from kenning.core.texts import text_refusal
from kenning.db import Database, connect
from kenning.db.groupcommit import GroupCommit
from kenning.errors import (
    ConfigurationError,
    KenningError,
    ValueNotPublishedError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from kenning.objects import payloads, restored
from kenning.registry import REGISTRY
from kenning.starting import InvalidInputError as InvalidInputError  # re-exported by kenning.client
from kenning.starting import StartedInstance as StartedInstance  # re-exported
from kenning.starting import prepare_start
from kenning.storage import actions as actions_sql
from kenning.storage import forks as forks_sql
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage import published as published_sql
from kenning.storage import replies as replies_sql
from kenning.storage.messages import SendStatus
from kenning.workflow import StartOptions, Workflow

R = TypeVar("R")
P = ParamSpec("P")

# the keywords Client.start takes as its own options, beside the workflow's arguments
_START_OPTIONS = ("instance_id", "idempotency_key", "queue", "partition_key", "priority")


class ResultTimeoutError(KenningError, TimeoutError):
    """``result(timeout=...)`` ran out while the instance goes on."""


class Client:
    def __init__(
        self,
        database_url: str | None = None,
        *,
        database: Database | None = None,
        result_poll_interval: float = DEFAULT_POLL_INTERVAL,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        """``retry_seconds``: how long a call that is safe to repeat (a read, a cancel, a
        message or request, whose id is fixed before the first attempt) is retried while
        the database is unavailable before it raises ``DatabaseUnavailableError``; a start
        raises it at once (``kenning.client.unavailable``)."""
        if retry_seconds < 0:
            raise ValueError(f"retry_seconds must not be negative, got {retry_seconds}")
        self.retry_seconds = retry_seconds
        if database is None:
            # as wf.start(): the environment's database, else the one this process's App names
            url = database_url or os.environ.get("KENNING_DATABASE_URL") or database_url_of_apps(REGISTRY) or ""
            database = connect(url, pool_size=2, max_overflow=8)
            self._owns_database = True
        else:
            self._owns_database = False
        self.database = database
        # concurrent start() calls (a web app's requests) share one insert, one commit and
        # one NOTIFY (kenning.starting)
        self.starter = Starter(database)
        # result() waits on one LISTEN connection of this client, opened by the first wait
        self.results = ResultWaits(
            database.listen_url, poll_interval=result_poll_interval, parameters=database.client_parameters
        )
        # read_stream's readers: on that same connection, one read per wake per stream
        self.streams = StreamReaders(database, self.results)

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
        await self.streams.close()
        await self.results.close()
        if self._owns_database:
            await self.database.dispose()

    @overload
    async def start(self, workflow: Workflow[R, P], /, *args: P.args, **kwargs: P.kwargs) -> StartedInstance[R]: ...
    # The options mixed with the arguments (the first form): the arguments are then
    # unchecked (PEP 612 allows no keyword beside the workflow's own); one overload per
    # option, each requiring it, so a start with none is checked above. Checked with
    # options: client.start(wf.options(instance_id=...), ...).
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, instance_id: str | None, **kwargs: Any
    ) -> StartedInstance[R]: ...
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, idempotency_key: str | None, **kwargs: Any
    ) -> StartedInstance[R]: ...
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, queue: str | None, **kwargs: Any
    ) -> StartedInstance[R]: ...
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, partition_key: str | None, **kwargs: Any
    ) -> StartedInstance[R]: ...
    @overload
    async def start(
        self, workflow: Workflow[R, P], /, *args: Any, priority: int | None, **kwargs: Any
    ) -> StartedInstance[R]: ...
    # a workflow by name: this process may not have its code, so nothing to check against
    @overload
    async def start(
        self,
        workflow: str,
        /,
        *,
        instance_id: str | None = None,
        idempotency_key: str | None = None,
        queue: str | None = None,
        partition_key: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> StartedInstance[Any]: ...
    async def start(self, workflow: Workflow[Any] | str, /, *args: Any, **kwargs: Any) -> StartedInstance[Any]:
        """Start an instance; starting again with the same ``instance_id`` or
        ``idempotency_key`` returns the existing instance (``created=False``).

        The workflow's arguments are checked against its signature here and by a type
        checker (positional ones are bound to its parameters' names); its options are
        given with ``wf.options(...)`` or as keywords here. ``queue`` (default: the
        workflow's ``@workflow(queue=...)``) starts it in a queue whose limits the claim
        enforces (``kenning.Queue``); there ``partition_key`` names its partition (served
        round-robin, ``partition_concurrency`` per key) and ``priority`` orders it (lower
        first, default 0). The options' names are taken by them, so a workflow argument
        cannot be called ``queue``, ``partition_key`` or ``priority``."""
        given = {name: kwargs.pop(name) for name in _START_OPTIONS if name in kwargs}
        options = (workflow.start_options if isinstance(workflow, Workflow) else StartOptions()).merged(**given)
        if options["on_parent_cancel"] is not None:
            raise InvalidInputError("on_parent_cancel= applies to start_child only, not to Client.start")
        start = prepare_start(
            workflow,
            named_arguments(workflow, args, kwargs),
            instance_id=options["instance_id"],
            idempotency_key=options["idempotency_key"],
            queue=options["queue"],
            partition_key=options["partition_key"],
            priority=options["priority"],
            timeout=options["timeout"],
            search_attributes=options["search_attributes"],
            debounce=options["debounce"],
        )
        self.results.expect(start.instance.instance_id)  # result() may then wait without reading first
        again = f" with instance_id={start.instance.instance_id!r}: it starts once"
        try:
            started = await retried(lambda: self.starter.start(start), "start", retry_seconds=0, again=again)
        except BaseException:
            self.results.forget(start.instance.instance_id)
            raise
        assert started is not None  # only a start with not_before (a cron tick) can be refused
        if not started.created:
            self.results.forget(start.instance.instance_id)
        return started

    async def status(self, instance_id: str) -> InstanceRow:
        checked_text("instance id", instance_id)
        return await self._status(instance_id, self.retry_seconds)

    async def _status(self, instance_id: str, retry_seconds: float) -> InstanceRow:
        async def read() -> InstanceRow | None:
            async with self.database.connection() as conn:
                return await instances_sql.instance_get(conn, instance_id)

        row = await retried(read, "status", retry_seconds=retry_seconds)
        if row is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return row

    @overload
    async def result(self, instance: StartedInstance[R], timeout: float | None = None) -> R: ...
    @overload
    async def result(self, instance: str, timeout: float | None = None) -> Any: ...
    async def result(self, instance: StartedInstance[Any] | str, timeout: float | None = None) -> Any:
        """Wait for the instance to finish and return its result, of the workflow's return
        type when given what ``start`` returned (an id alone says nothing of its type):
        woken by the NOTIFY of
        the statement that finished it (``kenning.client.results``), read again every
        ``result_poll_interval`` seconds in case a notification was missed.

        Raises ``WorkflowFailedError`` if it failed or was cancelled, ``TimeoutError``
        after ``timeout`` seconds.
        """
        instance_id = instance.instance_id if isinstance(instance, StartedInstance) else instance
        checked_text("instance id", instance_id)
        budget = self._retry_budget(timeout)
        row = await self.results.until_finished(instance_id, lambda: self._status(instance_id, budget()), timeout)
        if row is None:  # the time ran out before a read: the caller hears how it stands
            row = await self._status(instance_id, budget())
        if row.status not in TERMINAL_STATUSES:
            raise ResultTimeoutError(f"instance {instance_id} still {row.status} after {timeout} s")
        if row.status != "completed":
            raise WorkflowFailedError(instance_id, row.status, codecs.unseal(row.error))
        # a large value from the object store, then opened (the object holds it sealed); also
        # of a workflow this process does not know
        value = codecs.unseal(await restored((row.result or {}).get("result")))
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
        checked_text("instance id", instance_id)

        async def request_cancel() -> tuple[str, bool] | None:
            async with self.database.connection() as conn:  # one statement, its own transaction
                return await instances_sql.instance_request_cancel(conn, instance_id)

        outcome = await retried(request_cancel, "cancel", retry_seconds=self.retry_seconds)
        if outcome is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return outcome[1]

    async def fork(
        self,
        instance_id: str,
        from_step: int | str,
        *,
        input: Mapping[str, Any] | None = None,
        actor: str = "",
    ) -> Fork:
        """Fork an instance: a new instance whose history is this one's before
        ``from_step`` (a step number as ``kenning instances show`` numbers its history, or
        a step id), which then runs the workers' code from that step; the steps before it
        do not run again. ``input`` (keyword arguments, checked as a start's when this
        process knows the workflow) replaces the input the replay sees. The original is
        left as it is; the two link to each other (``forked_from``, ``forks``). Recorded
        in the operator action log (origin ``api``). Raises ``WorkflowNotFoundError``,
        ``ForkStepError`` (no such step) or ``InvalidInputError``. Not retried while the
        database is unavailable: a second attempt would make a second fork."""
        checked_text("instance id", instance_id)
        async with self.database.transaction() as conn:
            row = await instances_sql.instance_get(conn, instance_id)
            if row is None:
                raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
            forked = await fork_instance(conn, row, from_step, input)
            await actions_sql.action_record(conn, fork_action(row, forked, "api", actor))
        return forked

    async def forks(self, instance_id: str) -> list[forks_sql.ForkRow]:
        """The forks made of an instance, oldest first (its own ``forked_from`` says what
        it was forked from)."""
        checked_text("instance id", instance_id)

        async def read() -> list[forks_sql.ForkRow]:
            async with self.database.connection() as conn:
                return await forks_sql.forks_of(conn, instance_id)

        return await retried(read, "forks", retry_seconds=self.retry_seconds)

    async def send_message(self, instance_id: str, topic: str, data: Any = None, message_id: str | None = None) -> str:
        """Put ``data`` (JSON, or a pydantic model) into ``instance_id``'s ``topic`` mailbox,
        waking the instance if it waits in a ``receive`` of that topic (kenning/messages.py).
        Returns the message id: ``message_id`` if given (sending it again to this instance
        is a no-op, so a retry is safe), else a new one. Raises ``WorkflowNotFoundError``
        for an unknown instance, ``MessageUndeliverableError`` for one that has ended."""
        checked_text("instance id", instance_id)
        checked_text("topic", topic)
        if message_id is not None:
            checked_text("message id", message_id)
        with payloads.owned_by(instance_id):  # a large value lives with the receiver's objects
            data = serialization.storable_json(data, f"message {topic!r} data")
        # fixed before the first attempt: a retry (the client's own, or the caller's with this
        # id) finds it sent and sends nothing again
        sent_id = message_id or str(uuid.uuid4())
        sent = await retried(
            lambda: self._send(instance_id, topic, data, sent_id),
            "send_message",
            retry_seconds=self.retry_seconds,
            again=f" with message_id={sent_id!r}: it is sent once",
        )
        if sent.status is SendStatus.UNKNOWN_INSTANCE:
            raise refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, None)
        if sent.status is SendStatus.FINISHED:
            raise refusal(Undelivered.FINISHED, instance_id, topic, sent.recipient_status)
        return sent_id

    def _retry_budget(self, timeout: float | None) -> Callable[[], float]:
        """Seconds a call made now may retry while the database is away: the client's
        ``retry_seconds``, but no longer than what is left of a waiting call's ``timeout``."""
        if timeout is None:
            return lambda: self.retry_seconds
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        return lambda: max(0.0, min(self.retry_seconds, deadline - loop.time()))

    async def _send(self, instance_id: str, topic: str, data: Any, message_id: str) -> messages_sql.SendOutcome:
        async with self.database.transaction() as conn:
            await messages_sql.mailbox_lock(conn, instance_id)
            return await messages_sql.message_send(
                conn, instance_id=instance_id, topic=topic, message_id=message_id, data=data, sender_instance_id=None
            )

    async def request(
        self,
        instance_id: str,
        topic: str,
        data: Any = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        model: Any = None,
    ) -> Any:
        """Send ``data`` to ``instance_id``'s ``topic`` mailbox as a request and return the
        workflow's reply (``message.reply(ctx, value)``; ``model`` turns it into that
        pydantic model). The request is a message whose id is ``request_id`` (else a new
        one): asking again with the same ``request_id`` sends nothing twice and gets the
        same reply. Woken by the reply's commit (the NOTIFY ``result()`` waits on).

        Raises ``WorkflowNotFoundError`` (no such instance), ``MessageUndeliverableError``
        (it had ended when asked), ``RequestNotAnsweredError`` (it ended without replying:
        raised when the end commits), ``RequestRejectedError`` (it answered with
        ``reply_error``) and ``RequestTimeoutError`` after ``timeout`` seconds (the request
        stays in the mailbox; a later reply is still stored)."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"request timeout must not be negative, got {timeout}")
        checked_text("instance id", instance_id)
        checked_text("topic", topic)
        if request_id is not None:
            checked_text("request id", request_id)
        loop = asyncio.get_running_loop()
        began = loop.time()
        budget = self._retry_budget(timeout)
        with payloads.owned_by(instance_id):
            data = serialization.storable_json(data, f"request {topic!r} data")
        request_id = request_id or str(uuid.uuid4())
        await self.send_request(instance_id, topic, data, request_id, retry_seconds=budget())

        async def read() -> replies_sql.RequestState | None:
            return await self.request_state(instance_id, request_id, retry_seconds=budget())

        def answered(state: replies_sql.RequestState | None) -> bool:
            return state is None or state.replied or state.status in TERMINAL_STATUSES

        remaining = None if timeout is None else max(0.0, timeout - (loop.time() - began))
        state = await self.results.until(instance_id, read, answered, remaining)
        if state is None:  # deleted meanwhile (retention), or no read before the time ran out
            state = await read()
            if state is None:
                raise request_refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, request_id, None)
        value = request_answer(instance_id, topic, request_id, state, timeout=timeout)
        return value if model is None else serialization.from_json(value, model)

    async def send_request(
        self, instance_id: str, topic: str, data: Any, request_id: str, *, retry_seconds: float | None = None
    ) -> None:
        """``request``'s send: the message (JSON already) into the mailbox, once per id;
        retried for ``retry_seconds`` (else the client's) while the database is away."""
        sent = await retried(
            lambda: self._send(instance_id, topic, data, request_id),
            "request",
            retry_seconds=self.retry_seconds if retry_seconds is None else retry_seconds,
            again=f" with request_id={request_id!r}: it is sent once",
        )
        if sent.status is SendStatus.UNKNOWN_INSTANCE:
            raise request_refusal(Undelivered.UNKNOWN_INSTANCE, instance_id, topic, request_id, None)
        if sent.status is SendStatus.FINISHED:
            raise request_refusal(Undelivered.FINISHED, instance_id, topic, request_id, sent.recipient_status)

    async def request_state(
        self, instance_id: str, request_id: str, *, retry_seconds: float | None = None
    ) -> replies_sql.RequestState | None:
        """The instance's status and its reply to ``request_id`` (None: no such instance);
        retried for ``retry_seconds`` (else the client's) while the database is away."""

        async def read() -> replies_sql.RequestState | None:
            async with self.database.connection() as conn:
                return await replies_sql.request_state(conn, instance_id=instance_id, message_id=request_id)

        return await retried(
            read,
            "request",
            retry_seconds=self.retry_seconds if retry_seconds is None else retry_seconds,
            again=f" with request_id={request_id!r}: it is sent once",
        )

    async def publish(self, channel: str, data: Any = None, message_id: str | None = None) -> int:
        """Broadcast ``data`` to every instance subscribed to ``channel`` (``kenning.subscribe``)
        that has not ended, each copy in its ``channel`` mailbox; returns how many it reached.
        ``message_id`` makes a retry safe (a subscriber that has the id gets no second copy)."""
        checked_text("channel", channel)
        if message_id is not None:
            checked_text("message id", message_id)
        with payloads.owned_by(None):  # copied into many instances' rows: the sweep deletes it
            data = serialization.storable_json(data, f"message {channel!r} data")
        published_id = message_id or str(uuid.uuid4())  # fixed: a retry reaches nobody twice

        async def publish() -> int:
            async with self.database.transaction() as conn:
                recipients = await messages_sql.channel_lock_subscribers(conn, channel)
                return await messages_sql.channel_publish(
                    conn,
                    channel=channel,
                    recipients=recipients,
                    message_id=published_id,
                    data=data,
                    sender_instance_id=None,
                )

        return await retried(
            publish,
            "publish",
            retry_seconds=self.retry_seconds,
            again=f" with message_id={published_id!r}: no subscriber gets it twice",
        )

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        limit: int = 50,
        where: Mapping[str, str | int | float | bool] | None = None,
    ) -> list[InstanceRow]:
        """The newest ``limit`` instances, of ``status`` and ``workflow`` if given, and
        whose search attributes (``@workflow(search_attributes=...)``) hold every
        ``where`` pair (values compared as text: ``True`` is ``"true"``)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be a whole number of at least 0, got {limit!r}")
        for field, text in (("status", status), ("workflow", workflow)):
            if text is not None:
                checked_text(field, text)
        texts = search_where(where) if where else None

        async def read() -> list[InstanceRow]:
            async with self.database.connection() as conn:
                if texts:
                    return await published_sql.instance_list_where(
                        conn, texts, status=status, workflow_name=workflow, limit=limit
                    )
                return await instances_sql.instance_list(conn, status=status, workflow_name=workflow, limit=limit)

        return await retried(read, "list", retry_seconds=self.retry_seconds)

    async def get_value(self, instance_id: str, key: str, *, timeout: float | None = None) -> Any:
        """The value ``instance_id`` published last under ``key`` (``publish_value``),
        read without a worker, after its end too. With ``timeout`` (seconds), a key not
        yet published is waited for, woken by the publishing step's notification. Raises
        ``WorkflowNotFoundError`` for an unknown instance and ``ValueNotPublishedError``
        when the key is not published (by then, or the instance ended without it)."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"get_value timeout must not be negative, got {timeout}")
        checked_text("instance id", instance_id)
        try:
            check_key(key)
        except ValueError as error:
            raise InvalidInputError(str(error)) from None
        read = await self._read_value(instance_id, key, timeout)
        if read.value is None:
            waited = "" if timeout is None else f" within {timeout} s"
            raise ValueNotPublishedError(
                f"instance {instance_id!r} ({read.instance_status}) has not published {key!r}{waited}"
            )
        return read.value.value

    async def get_status(self, instance_id: str) -> PublishedStatus | None:
        """What the instance's last ``set_status`` published, None if it never did; raises
        ``WorkflowNotFoundError`` for an unknown instance."""
        checked_text("instance id", instance_id)
        read = await self._read_value(instance_id, STATUS_VALUE_KEY, None)
        return None if read.value is None else status_of(read.value.value, read.value.updated_at)

    async def values(self, instance_id: str) -> dict[str, Any]:
        """Every value the instance published, by key (``{}`` for an unknown instance)."""
        checked_text("instance id", instance_id)

        async def read() -> dict[str, Any]:
            async with self.database.connection() as conn:
                return {v.key: v.value for v in await published_sql.values_of(conn, instance_id)}

        return await retried(read, "values", retry_seconds=self.retry_seconds)

    async def read_stream(
        self, instance_id: str, key: str, offset: int = 0, *, follow: bool = True
    ) -> AsyncIterator[StreamEntry]:
        """The entries of the instance's stream ``key`` (``write_stream``) from ``offset``
        on, in order, each once; the iteration ends once the stream is closed and every
        entry was read (``close_stream``, or the instance's end). Readers never poll: one
        waits on the client's LISTEN connection, woken by the writes' commits (one
        connection however many read); ``follow=False`` ends at the last entry written.

        Raises ``WorkflowNotFoundError`` for an unknown instance; an instance deleted
        meanwhile (retention) ends the iteration. Close it early with
        ``contextlib.aclosing`` (or by finishing it) to stop listening at once."""
        async for entry in self.streams.read(instance_id, key, offset, follow=follow):
            if entry is not None:
                yield entry

    async def _read_value(self, instance_id: str, key: str, timeout: float | None) -> published_sql.ValueRead:
        async def read_once() -> published_sql.ValueRead | None:
            async with self.database.connection() as conn:
                return await published_sql.value_get(conn, instance_id, key)

        budget = self._retry_budget(timeout)

        async def read() -> published_sql.ValueRead:
            found = await retried(read_once, "get_value", retry_seconds=budget())
            if found is None:
                raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
            return found

        if timeout is None:
            return await read()
        found = await self.results.until(
            instance_id,
            read,
            lambda r: r.value is not None or r.instance_status in TERMINAL_STATUSES,
            timeout,
        )
        return found if found is not None else await read()  # None: the time ran out before a read


def checked_text(field: str, text: str) -> None:
    """``InvalidInputError`` naming ``field`` for text PostgreSQL cannot take (a NUL, a lone
    surrogate): said before any statement, not by the driver."""
    reason = text_refusal(text)
    if reason is not None:
        raise InvalidInputError(f"{field} {text!r} {reason}", f"{field} {reason}")


def search_where(where: Mapping[str, Any]) -> dict[str, str]:
    """``where``'s values as the text search attributes are indexed as; ``InvalidInputError``
    for a key or value that cannot be one."""
    texts: dict[str, str] = {}
    for key, value in where.items():
        try:
            check_key(key)
            text = search_text(key, value)
        except (TypeError, ValueError) as error:
            raise InvalidInputError(f"invalid where: {error}", str(error)) from None
        if text is None:
            raise InvalidInputError(f"invalid where: search attribute {key!r} needs a value, not None")
        texts[key] = text
    return texts


def named_arguments(workflow: Workflow[Any] | str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A start's arguments by parameter name (positional ones bound to the workflow's
    parameters); ``InvalidInputError`` for ones that do not fit."""
    if isinstance(workflow, Workflow):
        try:
            return workflow.named_arguments(args, kwargs)
        except TypeError as error:
            raise InvalidInputError(f"invalid input for workflow {workflow.name!r}: {error}", str(error)) from None
    if args:
        raise InvalidInputError(f"workflow {workflow!r} is given by name: pass its arguments by keyword")
    return kwargs


_default_clients: dict[asyncio.AbstractEventLoop, Client] = {}


def default_client() -> Client:
    """The client ``Workflow.start`` uses: ``KENNING_DATABASE_URL``, else the ``db_url`` of
    the ``App`` this process made (Edda's ``EddaApp(db_url=...)`` in ``main()``); one per
    event loop because async connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    client = _default_clients.get(loop)
    if client is None:
        url = os.environ.get("KENNING_DATABASE_URL") or database_url_of_apps(REGISTRY)
        if not url:
            raise ConfigurationError(
                "Workflow.start needs a database: make an App(db_url=...) in this process, set "
                "KENNING_DATABASE_URL, or use kenning.Client(url).start"
            )
        warn_unloaded_hooks(REGISTRY)
        for stale in [lp for lp in _default_clients if lp.is_closed()]:
            del _default_clients[stale]
        client = _default_clients[loop] = Client(url)
    return client


async def close_default_client() -> None:
    """Close the client ``Workflow.start`` opened in this event loop, if any (Edda's
    ``await app.shutdown()``): its connections, and its starts announced."""
    client = _default_clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.close()
