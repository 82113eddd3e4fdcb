"""The worker's inbox loop: CloudEvents and cancellations from the inbox to workflows.

Rows are claimed in batches (``FOR UPDATE SKIP LOCKED``, a fencing claim token) and each
is processed in one transaction that first marks it processed, then runs the app's
``on_event`` handlers, starts the ``event_handler`` workflows named like the event type
(idempotently: the instance's key is derived from the event's ``(source, id)``), and
delivers the event to the subscriptions that take it (docs/architecture.md invariant 3). A row whose
processing raises is retried with back-off and parked as ``failed`` after the maximum
attempts; it never blocks the rows behind it. The loop also gives each new subscription
the chance to take an event already in the inbox (``wait_event(since=...)``), and deletes
processed rows after the retention period.

Event data sealed by its writer (``kenning.codecs``) is opened here. A row this worker
cannot open (no key, or not the row's key) is given back uncounted, due again a little
later, for a worker with the key: never parked for it; a new subscription whose next event
it cannot open is left for the next pass. Each such reason is logged once per worker.

The app's ``on_event_received(instance_id, event_type, event_data)`` hook fires here, in
the worker that delivered the event, once per instance the event was delivered to and
only after the delivering transaction committed (a batch that rolls back and is redone
row by row reports each delivery once, when it commits). It does not fire when a replay
reads the recorded event again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from kenning import codecs
from kenning.app import App
from kenning.client.starts import start_on
from kenning.core.names import CHILD_EVENT_SOURCE, CHILD_EVENT_TYPE
from kenning.core.records import StoredEvent
from kenning.db import Database, Executor, executor_of
from kenning.db.errors import sqlstate
from kenning.errors import ObjectStoreError, ObjectStoreUnavailable, TerminalError
from kenning.events import ReceivedEvent, data_contains, event_from_inbox, event_history_payload, opaque_to_sql
from kenning.flow import BATCH_PARAMETER, Batch, BatchedEvent
from kenning.hooks import call_hook
from kenning.hosting.config import add_settings, positive_float, positive_int, setting, settings_from_args
from kenning.hosting.passloop import PassLoop
from kenning.observability import metrics, tracing
from kenning.observability.faults import fault_point
from kenning.registry import qualified_name
from kenning.starting import InvalidInputError, Start, prepare_start
from kenning.storage import inbox as inbox_sql
from kenning.storage import instances as instances_sql
from kenning.storage import receivers as receivers_sql
from kenning.storage import subscriptions as subscriptions_sql
from kenning.storage.inbox import ClaimedRow
from kenning.storage.receivers import Receiver
from kenning.workflow import Workflow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

_log = structlog.get_logger("kenning.worker.inbox")

# A lock held by a concurrent delivery, timeout or cancel (NOWAIT), a deadlock or a
# serialization failure: retry the row shortly, without counting an attempt.
_CONFLICTS = frozenset({"55P03", "40P01", "40001"})
_CLEANUP_BATCH = 1000
# Candidates read at once while a new subscription looks for a sealed event its match takes.
_CANDIDATES_PAGE = 100
# Distinct event types a worker counts apart in kenning_events_no_receiver_total and
# logs once each; event types come from outside, so the label's values stay bounded.
_NO_RECEIVER_TYPES = 100


@dataclass(frozen=True)
class InboxSettings:
    """The inbox loop's options, part of ``kenning worker``'s (``kenning.hosting.config``)."""

    enabled: bool = setting(True, flag="--inbox", help="process the inbox (CloudEvents, cancellations)")
    batch_size: int = setting(100, flag="--inbox-batch-size", type=positive_int, help="inbox rows claimed at once")
    max_attempts: int = setting(
        8, flag="--inbox-max-attempts", type=positive_int, help="attempts before a row is parked failed"
    )
    retry_seconds: float = setting(
        1.0, flag="--inbox-retry-seconds", type=positive_float, help="first retry back-off, doubled"
    )
    max_retry_seconds: float = setting(
        300.0, flag="--inbox-max-retry-seconds", type=positive_float, help="longest back-off"
    )
    retention_seconds: float = setting(  # processed rows kept for duplicates and since=
        86400.0,
        flag="--inbox-retention-seconds",
        type=positive_float,
        help="keep processed rows this long (duplicate detection, wait_event since=)",
    )
    cleanup_interval_seconds: float = setting(
        60.0, flag="--inbox-cleanup-interval", type=positive_float, help="seconds between retention sweeps"
    )
    # a receiver (event_handler workflow, on_event handler) no worker declared for this
    # long is retired: until then, events of its type wait for a worker that has it
    receiver_ttl_seconds: float = setting(
        300.0,
        flag="--inbox-receiver-ttl",
        type=positive_float,
        help="seconds a receiver declared by a worker stays live after that worker stopped renewing it",
    )
    conflict_retry_seconds: float = 0.05
    cancel_lock_wait_seconds: float = 0.1


def add_inbox_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kenning worker`` flags of the inbox loop (``WorkerSettings`` has them too)."""
    add_settings(parser, InboxSettings)


def inbox_settings_from_args(args: argparse.Namespace) -> InboxSettings:
    return settings_from_args(InboxSettings, args)


def event_start_key(source: str, event_id: str) -> str:
    """The idempotency key of an instance an event starts: one instance per event."""
    return "cloudevent:" + json.dumps([source, event_id], ensure_ascii=False)


@dataclass(frozen=True)
class _Received:
    """A delivery committed or about to be: what ``on_event_received`` is told."""

    instance_id: str
    event_type: str
    data: Any


def own_receivers(app: App) -> list[Receiver]:
    """What this app receives: its ``on_event`` handlers and ``event_handler`` workflows."""
    handlers = [
        Receiver(event_type, receivers_sql.HANDLER, qualified_name(handler))
        for event_type, registered in app.event_handlers.items()
        for handler in registered
    ]
    starters = [
        Receiver(wf.name, receivers_sql.WORKFLOW, wf.name) for wf in app.registry.workflows.values() if wf.event_handler
    ]
    return sorted(set(handlers + starters))


def batched_start(wf: Workflow[Any], batch: Batch, event_data: Any, data: dict[str, Any], seq: int) -> Start:
    """The start of a batch workflow's event: a batch of this one event, should it open one."""
    try:
        key = batch.key_of(data)
    except Exception as error:  # the user's key function, or a field the data lacks
        raise InvalidInputError(str(error)) from None
    start = prepare_start(wf, {BATCH_PARAMETER: [event_data]}, own_ids=True)
    return dataclasses.replace(start, batch=BatchedEvent(key, batch.max_size, batch.max_wait, seq, event_data))


def _history_payload(stored: StoredEvent, event: ReceivedEvent) -> tuple[dict[str, Any], bytes | None]:
    """The ``EventReceived`` row for ``event``. A child's end keeps its data as the inbox
    row holds it: the child's result and error in it are sealed already, as the child's
    row keeps them (``tell_parents`` copies them), so a reference to the child's object
    stays one the object store's upkeep sees (``kenning.hosting.objects.kept_elsewhere``).
    Opened and sealed again, the child's large result would be copied to a second object
    and the child's kept by nothing once its inbox row is gone, or, under encryption, its
    reference hidden inside the parent's envelope and the object deleted with the child.
    The same payload ``storage.children``'s ``_ENDED_PAYLOAD`` records from the child's row."""
    if not _is_child_end(stored) or stored.data_bytes is not None:
        return event_history_payload(event)
    payload, _ = event_history_payload(dataclasses.replace(event, data=None))
    payload["data"] = stored.data
    return payload, None


def _is_child_end(stored: StoredEvent) -> bool:
    """A child's end told to its parent (kenning/storage/children.py::tell_parents). Its
    receiver is the parent, which takes it from the inbox if it waits for that child, else
    from the child's row when it comes to wait (child_wait_or_suspend); a parent that waits
    for another child first (fan-out) or has ended takes nothing now, and that is no
    "no receiver": that signal is for events of a type nothing declares (a misspelling)."""
    return stored.event_type == CHILD_EVENT_TYPE and stored.source == CHILD_EVENT_SOURCE


def _opened_if_taken(candidate: StoredEvent, match: Any) -> ReceivedEvent | None:
    """The event of a candidate a new subscription may take, opened, if its ``match`` holds
    (plain data was tested in SQL already, sealed or offloaded data not); else None."""
    event = event_from_inbox(candidate)
    return event if match is None or not opaque_to_sql(candidate.data) or data_contains(event.data, match) else None


def _takes_session(handler: Callable[..., Any]) -> bool:
    return "session" in inspect.signature(handler).parameters


def _is_conflict(error: BaseException) -> bool:
    """Psycopg's error, or SQLAlchemy's wrapping it (statements in a handler's transaction)."""
    return sqlstate(error) in _CONFLICTS


class InboxProcessor:
    def __init__(
        self,
        database: Database,
        app: App,
        settings: InboxSettings,
        *,
        worker_id: str,
        poll_interval: float,
        lease_seconds: float,
    ) -> None:
        self.database = database
        self.app = app
        self.settings = settings
        self.poll_interval = poll_interval
        self.lease_seconds = lease_seconds
        self.log = _log.bind(worker_id=worker_id)
        self.starters: dict[str, list[Workflow[Any]]] = {}
        for wf in app.registry.workflows.values():
            if wf.event_handler:
                self.starters.setdefault(wf.name, []).append(wf)
        self._known_definitions: set[tuple[str, str]] = set()
        self.receivers = own_receivers(app)
        self.scope = inbox_sql.ClaimScope(self.receivers, settings.receiver_ttl_seconds)
        self._next_declare = float("-inf")  # the first pass declares them
        self._no_receiver_types: set[str] = set()
        self._next_cleanup = float("-inf")  # the first pass sweeps
        self._unreadable_told: set[str] = set()  # each key problem logged once by this worker
        self.loop = PassLoop(
            self._pass, log=self.log, failed_event="inbox.loop_failed", retry_seconds=min(poll_interval, 1.0)
        )

    def wake(self) -> None:
        self.loop.wake()

    def stop(self) -> None:
        """Finish the row in hand, give the rest of the batch back, and return."""
        self.loop.stop()

    # ---------------------------------------------------------------- the loop

    async def run(self) -> None:
        self.log.info("inbox.started", handlers=sorted(self.app.event_handlers), starters=sorted(self.starters))
        await self.loop.run()
        self.log.info("inbox.stopped")

    async def _pass(self) -> float:
        """One pass: a batch of rows, new subscriptions' catch-up, the retention sweep when
        due; then 0 if either was busy, else the seconds until a row is due."""
        clock = asyncio.get_running_loop()
        if clock.time() >= self._next_declare:
            await self._declare_receivers()
            self._next_declare = clock.time() + self.settings.receiver_ttl_seconds / 5
        busy = await self._process_batch()
        busy = await self._catch_up() or busy
        if clock.time() >= self._next_cleanup:
            await self._cleanup()
            self._next_cleanup = clock.time() + self.settings.cleanup_interval_seconds
        return 0.0 if busy else await self._seconds_until_next()

    async def _declare_receivers(self) -> None:
        """Declare (renew) this app's receivers before claiming: from then on, a worker on
        another version of the app leaves events of these types to workers that have them."""
        async with self.database.connection() as conn:
            await receivers_sql.receivers_declare(conn, self.receivers)

    async def _seconds_until_next(self) -> float:
        async with self.database.connection() as conn:
            until = await inbox_sql.inbox_seconds_until_next(conn, self.scope)
        if until is None:
            return self.poll_interval
        return min(self.poll_interval, max(until, 0.001))

    async def _process_batch(self) -> bool:
        """Claim and process one batch; True if it was full (more may be waiting).

        The claim commits first (it counts the attempt). Events without handlers are then
        processed together in one transaction, one commit for all; if any of them raises
        or meets a lock, that transaction rolls back and every row is processed alone,
        in a transaction of its own, where a failure is recorded against that row only.
        """
        async with self.database.connection() as conn:  # one statement, committed at once
            claimed = await inbox_sql.inbox_claim_pending(
                conn, limit=self.settings.batch_size, lease_seconds=self.lease_seconds, scope=self.scope
            )
        rows = await self._process_together(claimed) if len(claimed) > 1 else claimed
        for position, row in enumerate(rows):
            if self.loop.stopping:
                rest = [(r.event.inbox_id, r.claim_token) for r in rows[position:]]
                async with self.database.connection() as conn:
                    await inbox_sql.inbox_release(conn, rest)
                self.log.info("inbox.released", rows=len(rest))
                return False
            await self._process(row)
        return len(claimed) == self.settings.batch_size

    async def _process_together(self, claimed: list[ClaimedRow]) -> list[ClaimedRow]:
        """Process the events of a batch that only start workflows and wake waiting ones
        in one transaction; returns the rows left to process one by one (events with
        ``on_event`` handlers, which must not run again because another event failed,
        cancellations, rows out of attempts, or all of them if the transaction failed)."""
        together = [
            r
            for r in claimed
            if r.kind == "event"
            and r.attempts <= self.settings.max_attempts
            and not self.app.event_handlers.get(r.event.event_type)
        ]
        grouped = {r.event.inbox_id for r in together}
        alone = [r for r in claimed if r.event.inbox_id not in grouped]
        if len(together) < 2 or self.loop.stopping:
            return claimed
        started: list[tuple[str, str]] = []
        received: list[_Received] = []
        unreceived: list[ClaimedRow] = []
        try:
            async with self._transaction(with_session=False) as (user, conn):  # no handlers here
                marked = await inbox_sql.inbox_mark_processed(
                    conn, [(r.event.inbox_id, r.claim_token) for r in together]
                )
                for row in together:
                    log = self._row_log(row)
                    if row.event.inbox_id not in marked:
                        log.warning("inbox.claim_lost")
                        continue
                    with tracing.delivering(row.event.event_type, row.event.event_id, row.event.attributes):
                        if not await self._apply_event(user, conn, row, log, started, received):
                            unreceived.append(row)
                await inbox_sql.inbox_mark_no_receiver(conn, [r.event.inbox_id for r in unreceived])
        except Exception as error:
            self.log.debug("inbox.batch_retried_alone", rows=len(together), error=repr(error))
            return claimed
        fault_point("delivery.after_commit")
        self._known_definitions.update(started)
        self._report_unreceived(unreceived)
        await self._report_received(received)
        return alone

    @contextlib.asynccontextmanager
    async def _transaction(self, with_session: bool) -> AsyncIterator[tuple[AsyncConnection | None, Executor]]:
        """The transaction of a row (or a batch): on the pool, unless an ``on_event``
        handler takes a session: then SQLAlchemy's (``db.engine``), the handler's session
        joining it, and Kenning's statements on the psycopg connection under it, so the
        handler's writes commit or roll back with the row marked processed."""
        if not with_session:
            async with self.database.transaction() as conn:
                yield None, conn
            return
        async with self.database.engine.begin() as user:
            yield user, await executor_of(user)

    def _handlers_take_session(self, event_type: str) -> bool:
        return any(_takes_session(handler) for handler in self.app.event_handlers.get(event_type, []))

    # ---------------------------------------------------------------- one row

    def _row_log(self, row: ClaimedRow) -> Any:
        stored = row.event
        log = self.log.bind(inbox_id=stored.inbox_id, event_type=stored.event_type, source=stored.source)
        return log.bind(event_id=stored.event_id)

    async def _process(self, row: ClaimedRow) -> None:
        stored = row.event
        log = self._row_log(row)
        if row.attempts > self.settings.max_attempts:
            # The claim counts attempts, so a row whose processing killed its worker every
            # time ends here instead of looping for ever.
            message = f"gave up after {row.attempts - 1} attempts; the last one never finished (worker died?)"
            await self._record_failure(row, log, message, park=True)
            return
        started: list[tuple[str, str]] = []
        received: list[_Received] = []
        unreceived: list[ClaimedRow] = []
        try:
            with_session = row.kind == "event" and self._handlers_take_session(stored.event_type)
            async with self._transaction(with_session) as (user, conn):
                if not await inbox_sql.inbox_mark_processed(conn, [(stored.inbox_id, row.claim_token)]):
                    log.warning("inbox.claim_lost")
                    return
                if row.kind == "cancel":
                    await self._apply_cancel(conn, row, log)
                else:
                    with tracing.delivering(stored.event_type, stored.event_id, stored.attributes):
                        if not await self._apply_event(user, conn, row, log, started, received):
                            unreceived.append(row)
                            await inbox_sql.inbox_mark_no_receiver(conn, [stored.inbox_id])
        except Exception as error:
            if _is_conflict(error):
                log.debug("inbox.lock_conflict", error=str(getattr(error, "orig", error)))
                async with self.database.connection() as conn:
                    await inbox_sql.inbox_release(
                        conn, [(stored.inbox_id, row.claim_token)], self.settings.conflict_retry_seconds
                    )
                return
            if isinstance(error, codecs.CodecError):  # this worker's keys, not the event: wait for the key
                await self._defer_unreadable(row, log, str(error))
                return
            if isinstance(error, ObjectStoreError | ObjectStoreUnavailable):
                # the event's data could not reach the object store: the event waits for
                # it, undelivered, its attempt not counted (never parked: nothing is lost)
                log.error("inbox.object_store_unavailable", error=str(error))
                async with self.database.connection() as conn:
                    await inbox_sql.inbox_release(
                        conn, [(stored.inbox_id, row.claim_token)], self.settings.retry_seconds
                    )
                return
            await self._record_failure(
                row, log, f"{type(error).__name__}: {error}", park=isinstance(error, TerminalError)
            )
            return
        fault_point("delivery.after_commit")
        self._known_definitions.update(started)
        self._report_unreceived(unreceived)
        await self._report_received(received)

    def _report_unreceived(self, rows: list[ClaimedRow]) -> None:
        """Events that committed with nothing to receive them: counted by type, and each
        type logged once by this worker (not once per event: a flood would drown the log)."""
        for row in rows:
            event_type = row.event.event_type
            first = event_type not in self._no_receiver_types
            if first and len(self._no_receiver_types) < _NO_RECEIVER_TYPES:
                self._no_receiver_types.add(event_type)
                self._row_log(row).warning(
                    "event.no_receiver",
                    hint="no event_handler workflow, on_event handler or waiting instance takes this type;"
                    " later events of it are counted in kenning_events_no_receiver_total, not logged",
                )
            label = event_type if event_type in self._no_receiver_types else "other"
            metrics.EVENTS_NO_RECEIVER.labels(label).inc()

    async def _report_received(self, received: list[_Received]) -> None:
        """``on_event_received`` for deliveries that committed (a failing hook is logged)."""
        for item in received:
            await call_hook(self.app.hooks, "on_event_received", item.instance_id, item.event_type, item.data)

    def _tell_unreadable(self, log: Any, message: str, **fields: Any) -> None:
        """An event this worker cannot open: an error the first time for each reason (the
        operator has a key to give), debug after (every row of the kind says the same)."""
        if message in self._unreadable_told:
            log.debug("event.unreadable", error=message, **fields)
            return
        self._unreadable_told.add(message)
        log.error(
            "event.unreadable",
            error=message,
            hint="left for a worker with the key (nothing is parked for it): give this worker KENNING_ENCRYPTION_KEYS",
            **fields,
        )

    def _unreadable_delay(self) -> float:
        return min(self.settings.max_retry_seconds, 5 * self.settings.retry_seconds)

    async def _defer_unreadable(self, row: ClaimedRow, log: Any, message: str) -> None:
        delay = self._unreadable_delay()
        self._tell_unreadable(log, message, retry_in=delay)
        try:
            async with self.database.connection() as conn:
                if not await inbox_sql.inbox_defer(
                    conn, row.event.inbox_id, row.claim_token, error=message, delay_seconds=delay
                ):
                    log.warning("inbox.claim_lost", failure=message)
        except Exception as error:  # the claim's lease expires and another claim retries it
            log.warning("inbox.failure_not_recorded", error=repr(error), failure=message)

    async def _record_failure(self, row: ClaimedRow, log: Any, message: str, *, park: bool) -> None:
        try:
            async with self.database.connection() as conn:
                outcome = await inbox_sql.inbox_record_failure(
                    conn,
                    row.event.inbox_id,
                    row.claim_token,
                    error=message,
                    max_attempts=self.settings.max_attempts,
                    retry_seconds=self.settings.retry_seconds,
                    max_retry_seconds=self.settings.max_retry_seconds,
                    park=park,
                )
        except Exception as error:  # the claim's lease expires and another claim retries it
            log.warning("inbox.failure_not_recorded", error=repr(error), failure=message)
            return
        if outcome is None:
            log.warning("inbox.claim_lost", failure=message)
        elif outcome[0] == "failed":
            metrics.INBOX_PARKED.inc()
            log.error("inbox.failed", attempts=row.attempts, error=message)
        else:
            log.warning("inbox.retry", attempts=row.attempts, delay=round(outcome[1], 3), error=message)

    async def _apply_cancel(self, conn: Executor, row: ClaimedRow, log: Any) -> None:
        instance_id = row.event.instance_id or ""
        # A running instance's row stays locked while its step's write is pending: do not
        # stall the loop on it, retry shortly instead (a lock conflict).
        await inbox_sql.inbox_limit_lock_wait(conn, self.settings.cancel_lock_wait_seconds)
        outcome = await instances_sql.instance_request_cancel(conn, instance_id)
        if outcome is None:
            log.info("instance.cancel_unknown", instance_id=instance_id)
        else:
            log.info("instance.cancel_requested", instance_id=instance_id, status=outcome[0], applied=outcome[1])

    async def _apply_event(
        self,
        user: AsyncConnection | None,
        conn: Executor,
        row: ClaimedRow,
        log: Any,
        started: list[tuple[str, str]],
        received: list[_Received],
    ) -> bool:
        """Deliver one event in the row's transaction; False if nothing received it."""
        stored = row.event
        event = event_from_inbox(stored)
        handlers = self.app.event_handlers.get(stored.event_type, [])
        if handlers:
            # a handler may take its time inside this transaction: no idle bound meanwhile
            # (the pool's sessions have one; SQLAlchemy's, under ``user``, have none), and
            # Kenning's statements after it (starts, deliveries that lock instances) have one
            if user is None:
                await self.database.unbound_transaction(conn)
            for handler in handlers:
                await self._call_handler(user, handler, event)
            await self.database.bound_transaction(conn)
        for wf in self.starters.get(stored.event_type, []):
            await self._start(conn, wf, event, log, started, seq=stored.inbox_id)
        payload, payload_bytes = _history_payload(stored, event)
        deliveries = await subscriptions_sql.subscription_deliver_event(
            conn,
            event_type=stored.event_type,
            source=stored.source,
            event_id=stored.event_id,
            received_at=stored.received_at,
            data=event.data if stored.data_bytes is None else None,  # opened: matched in SQL as a parameter
            target_instance_id=stored.instance_id,
            payload=payload,
            payload_bytes=payload_bytes,
            trace=tracing.current_carrier(),  # the delivery's (tracing.delivering)
        )
        for delivery in deliveries:
            log.debug(
                "event.delivered",
                instance_id=delivery.instance_id,
                workflow=delivery.workflow_name,
                step=delivery.step_id,
            )
        received.extend(_Received(d.instance_id, stored.event_type, event.data) for d in deliveries)
        log.debug("event.processed", handlers=len(handlers), delivered=len(deliveries), attempts=row.attempts)
        return bool(handlers or self.starters.get(stored.event_type) or deliveries or _is_child_end(stored))

    async def _call_handler(
        self, user: AsyncConnection | None, handler: Callable[..., Any], event: ReceivedEvent
    ) -> None:
        """``handler(event)``; a handler with a ``session`` parameter also gets a session in
        the row's transaction (``user``: SQLAlchemy's, see ``_transaction``), so its writes
        commit with the row marked processed."""
        if not _takes_session(handler):
            await handler(event)
            return
        assert user is not None, "a handler taking a session runs in SQLAlchemy's transaction"
        from sqlalchemy.ext.asyncio import AsyncSession  # imported when a handler first needs it

        session = AsyncSession(bind=user, join_transaction_mode="create_savepoint", expire_on_commit=False)
        try:
            await handler(event, session=session)
            await session.commit()  # releases the savepoint; the row's transaction commits it
        finally:
            await session.close()

    async def _start(
        self,
        conn: Executor,
        wf: Workflow[Any],
        event: ReceivedEvent,
        log: Any,
        started: list[tuple[str, str]],
        *,
        seq: int,
    ) -> None:
        """Start ``wf`` with the event's data, in the event row's transaction (kenning.starting);
        definitions it registers are listed in ``started``, known once that commits. A
        debounced workflow's start joins its key's burst; a batch workflow's event (``seq``:
        its inbox id, its place in arrival order) joins its key's batch (kenning/flow.py)."""
        data = event.data if isinstance(event.data, dict) else {}
        try:
            if wf.batch is not None:
                start = batched_start(wf, wf.batch, event.data, data, seq)
            else:
                start = prepare_start(wf, data, idempotency_key=event_start_key(event.source, event.id), own_ids=True)
                if start.debounce is not None:  # the burst records the event's inbox id
                    start = dataclasses.replace(start, debounce=dataclasses.replace(start.debounce, seq=seq))
        except InvalidInputError as error:
            raise TerminalError(f"event data is not valid input for workflow {wf.name!r}: {error.detail}") from None
        result = await start_on(conn, start, known=self._known_definitions, registered=started)
        assert result is not None  # refused only with not_before (a cron tick)
        log.debug("workflow.started_by_event", instance_id=result.instance_id, workflow=wf.name, created=result.created)

    # ---------------------------------------------------------------- subscriptions and cleanup

    async def _catch_up(self) -> bool:
        """Offer each new subscription the oldest event already in the inbox that it takes
        (the ``since`` window, or an event processed while it was being committed)."""
        limit = self.settings.batch_size
        received: list[_Received] = []
        async with self.database.transaction() as conn:
            unchecked = await subscriptions_sql.subscription_claim_unchecked(conn, limit=limit)
            checked: list[tuple[str, str]] = []
            for sub in unchecked:
                key = (sub.instance_id, sub.step_id)
                try:
                    taken = await self._taken(conn, sub)
                except codecs.CodecError as error:  # left unchecked: the next pass (or a worker with the key)
                    self._tell_unreadable(self.log, str(error), instance_id=sub.instance_id, step=sub.step_id)
                    continue
                if taken is None:
                    checked.append(key)
                    continue
                stored, event = taken
                try:
                    payload, payload_bytes = _history_payload(stored, event)
                except ObjectStoreError as error:  # left unchecked: the next round tries again
                    self.log.error("inbox.object_store_unavailable", error=str(error), inbox_id=stored.inbox_id)
                    continue
                try:
                    # a savepoint: one delivery undone alone
                    async with (
                        conn.driver.transaction(),
                        tracing.delivering(stored.event_type, stored.event_id, stored.attributes),
                    ):
                        delivery = await subscriptions_sql.subscription_deliver_to(
                            conn,
                            instance_id=sub.instance_id,
                            step_id=sub.step_id,
                            payload=payload,
                            payload_bytes=payload_bytes,
                            trace=tracing.current_carrier(),  # the delivery's (tracing.delivering)
                        )
                except Exception as error:
                    if not _is_conflict(error):
                        raise
                    continue  # left unchecked: the next round tries again
                if delivery is None:
                    checked.append(key)
                else:
                    self.log.debug(
                        "event.delivered",
                        instance_id=delivery.instance_id,
                        workflow=delivery.workflow_name,
                        step=delivery.step_id,
                        inbox_id=stored.inbox_id,
                        event_type=stored.event_type,
                        earlier=True,
                    )
                    received.append(_Received(delivery.instance_id, event.type, event.data))
            await subscriptions_sql.subscription_mark_checked(conn, checked)
        await self._report_received(received)
        return len(unchecked) == limit

    async def _taken(
        self, conn: Executor, sub: subscriptions_sql.UncheckedSubscription
    ) -> tuple[StoredEvent, ReceivedEvent] | None:
        """The oldest inbox event ``sub`` takes, opened, or None. The claim found the oldest
        candidate; one whose data SQL could not test (sealed) is tested here on the opened
        data, and if ``match`` does not hold the next candidates are read, in order, so the
        event taken is the one SQL would have taken from plain data. Raises
        ``CodecError`` for a candidate this worker cannot open."""
        if sub.event is None:
            return None
        candidate = sub.event
        event = _opened_if_taken(candidate, sub.match)
        if event is not None:
            return candidate, event
        while True:
            page = await subscriptions_sql.subscription_candidates_after(
                conn, instance_id=sub.instance_id, step_id=sub.step_id, after=candidate, limit=_CANDIDATES_PAGE
            )
            for candidate in page:
                event = _opened_if_taken(candidate, sub.match)
                if event is not None:
                    return candidate, event
            if len(page) < _CANDIDATES_PAGE:
                return None

    async def _cleanup(self) -> None:
        total = 0
        while not self.loop.stopping:
            async with self.database.connection() as conn:
                deleted = await inbox_sql.inbox_delete_processed(
                    conn, retention_seconds=self.settings.retention_seconds, limit=_CLEANUP_BATCH
                )
            total += deleted
            if deleted < _CLEANUP_BATCH:
                break
        if total:
            self.log.info("inbox.cleaned", deleted=total, retention_seconds=self.settings.retention_seconds)
