"""The worker's ``InstancePort``: the engine's commands as fenced PostgreSQL statements.

It owns how a run's progress reaches the database:

- **Folding.** A finished step's record is held back until the next write and goes out
  with it: with the next step's record, inside the statement that completes the
  workflow or suspends it (one round trip, one commit), or first in the transaction of a
  step that writes rows with its record (a message, a publish, a reply, a published
  value, a stream entry: ``_write_with_record``, one commit). Compensations registered
  meanwhile ride along with whichever write comes next.
- **Group commit.** Step records and completions go through the worker's
  ``GroupCommit``: the writes of instances running side by side share one statement.
- **Fencing.** Every statement checks the lease token; zero rows means another worker
  holds the instance (``LeaseLostError``).
- **Error mapping.** The database being away is ``StorageUnavailable`` (the run ends,
  the instance is handed back); a value it refuses (SQLSTATE class 22 or 54) is the step's
  ``UnstorableValueError`` and the held-back record that rode along is dropped.
- **The step's transaction.** An activity that touched ``ctx.session`` or sent an outbox
  event is recorded inside its own transaction (``StepTransaction``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from kenning.context import StepScope
from kenning.core.limits import MAX_STREAM_ENTRIES
from kenning.core.mailbox import Undelivered
from kenning.core.names import EVENT_RECEIVED
from kenning.core.records import (
    ClaimedInstance,
    CompensationRecord,
    FoldedWrites,
    HistoryRecord,
    NewInstance,
    OutboxEvent,
    SuspendOutcome,
)
from kenning.core.streams import StreamEntry, stream_closed_error, stream_event, stream_full_error
from kenning.db import Database, Executor, executor_of
from kenning.db.errors import is_data_error, is_unavailable
from kenning.db.groupcommit import GroupCommit
from kenning.engine.commands import (
    AttemptCounted,
    BeginCompensating,
    ChildStarted,
    CloseStream,
    Complete,
    ContinueAsNew,
    CountAttempt,
    DroppedCompensation,
    FailSaga,
    Finish,
    MessageSent,
    Publish,
    PublishValue,
    ReceiveMessage,
    RecordHeartbeat,
    RecordStep,
    ReleaseWithDelay,
    ReplyMessage,
    SaveCompensation,
    SendMessage,
    StartChild,
    Subscribe,
    Suspend,
    SuspendOnTimer,
    WaitChild,
    WriteStream,
)
from kenning.engine.history import StepRecord
from kenning.errors import (
    CancelSeenBeforeWrite,
    LeaseLostError,
    StorageUnavailable,
    UnstorableValueError,
)
from kenning.observability.faults import fault_point
from kenning.storage import children as children_sql
from kenning.storage import deadlines as deadlines_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage import outbox as outbox_sql
from kenning.storage import published as published_sql
from kenning.storage import replies as replies_sql
from kenning.storage import runs as runs_sql
from kenning.storage import sagas as sagas_sql
from kenning.storage import streams as streams_sql
from kenning.storage import subscriptions as subscriptions_sql
from kenning.storage import timers as timers_sql
from kenning.storage.messages import SendStatus
from kenning.storage.writes import InstanceWrite

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

T = TypeVar("T")


class StepTransaction:
    """The transaction one activity or compensation attempt writes in.

    It is opened only when the attempt touches ``ctx.session`` or sends an outbox event,
    so an activity doing slow outside I/O holds no connection meanwhile. The record, the
    ``ctx.session`` writes and the outbox rows commit together.
    """

    def __init__(self, database: Database) -> None:
        # SQLAlchemy's engine is built, and SQLAlchemy imported, only when an attempt needs it
        self._database = database
        self._session: AsyncSession | None = None
        self._connection: AsyncConnection | None = None
        # Where Kenning's own statements ran: the psycopg connection under SQLAlchemy's.
        # SQLAlchemy never sees a disconnect there; ``_forget_dead_connection`` tells it.
        self._kenning: tuple[AsyncConnection, Executor] | None = None
        self._after_commit: list[Callable[[], Awaitable[None]]] = []

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this transaction has committed (never on rollback)."""
        self._after_commit.append(callback)

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            from sqlalchemy.ext.asyncio import AsyncSession

            self._session = AsyncSession(bind=self._database.engine, expire_on_commit=False)
        return self._session

    @property
    def in_transaction(self) -> bool:
        return self._session is not None or self._connection is not None

    async def connection(self) -> AsyncConnection:
        """The connection of this transaction, begun if it was not yet."""
        if self._session is not None:
            await self._session.flush()
            return await self._session.connection()
        if self._connection is None:
            self._connection = await self._database.engine.connect()
            await self._connection.begin()
        return self._connection

    async def executor(self) -> Executor:
        """Kenning's statements in this transaction (on the psycopg connection under it)."""
        connection = await self.connection()
        executor = await executor_of(connection)
        self._kenning = (connection, executor)
        return executor

    async def add_outbox_event(self, event: OutboxEvent) -> None:
        try:
            await self._outbox_insert(event)
        except Exception as error:
            # the database being away is not the attempt's failure: the run ends, the
            # instance is handed back and the attempt runs again (no attempt counted)
            if is_unavailable(error):
                raise StorageUnavailable(f"database unavailable while writing event {event.event_id}") from error
            raise

    async def _outbox_insert(self, event: OutboxEvent) -> None:
        await outbox_sql.outbox_insert(
            await self.executor(),
            event_id=event.event_id,
            instance_id=event.instance_id,
            event_type=event.event_type,
            source=event.source,
            subject=event.subject,
            content_type=event.content_type,
            data_json=event.data_json,
            data_bytes=event.data_bytes,
            extensions=event.extensions,
        )

    async def commit(self) -> None:
        try:
            if self._session is not None:
                await self._session.commit()
            elif self._connection is not None:
                await self._connection.commit()
        finally:
            await self.close()
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            await callback()

    async def rollback(self) -> None:
        """Roll back; a connection that died (the server rolled it back) is no error, so
        the error that ended the attempt is the one that counts."""
        self._after_commit = []  # rolled back: nothing happened to report
        try:
            await self._forget_dead_connection()
            if self._session is not None:
                await self._session.rollback()
            elif self._connection is not None:
                await self._connection.rollback()
        except Exception as error:
            if not is_unavailable(error):
                raise
        finally:
            await self.close()

    async def close(self) -> None:
        try:
            await self._forget_dead_connection()
        finally:
            session, connection = self._session, self._connection
            self._session = self._connection = None
            if session is not None:
                await session.close()
            if connection is not None:
                await connection.close()

    async def _forget_dead_connection(self) -> None:
        """A disconnect seen by Kenning's statements (the psycopg connection is broken)
        invalidates SQLAlchemy's connection over it: rolled back or closed, it is then
        dropped from the pool instead of being talked to."""
        kenning, self._kenning = self._kenning, None
        if kenning is not None:
            connection, executor = kenning
            if executor.driver.broken and not connection.invalidated:
                await connection.invalidate()


class PgInstancePort:
    """One run's lease on one instance, in PostgreSQL."""

    def __init__(
        self,
        *,
        database: Database,
        claimed: ClaimedInstance,
        writes: GroupCommit[InstanceWrite, bool | None],
    ) -> None:
        self.database = database
        self.writes = writes  # the worker's group commit of step records and completions
        self.instance_id = claimed.id
        self.token = claimed.lease_token
        self._cancel = claimed.cancel_requested
        self._pending: StepRecord | None = None
        self._unsaved: list[CompensationRecord] = []
        # concurrent steps of one instance (asyncio.gather) take turns writing
        self._lock = asyncio.Lock()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel

    def open_step(self) -> StepTransaction:
        return StepTransaction(self.database)

    # ------------------------------------------------------------------ error mapping

    async def _storage(self, write: Awaitable[T], what: str = "a write", *, drops_held: bool = True) -> T:
        """Await one of Kenning's own writes, mapping the database's errors to the engine's
        (every write of the port comes through here).

        The database being away is ``StorageUnavailable``. A value the database refuses
        (SQLSTATE class 22 or 54) would be refused again on every replay: that is the
        step's error, ``UnstorableValueError``, and, when the write carried it
        (``drops_held``), the held-back record that rode along is dropped. Values are
        checked before they get here (``serialization.storable_json``); this is the
        guard for what the check missed."""
        try:
            return await write
        except Exception as error:
            if is_unavailable(error):
                raise StorageUnavailable(f"database unavailable while writing {what} of {self.instance_id}") from error
            if is_data_error(error):
                if drops_held:
                    self.discard()
                reason = str(getattr(error, "orig", None) or error).strip().splitlines()
                raise UnstorableValueError(
                    f"{what} cannot be stored: {reason[0] if reason else type(error).__name__}"
                ) from error
            raise

    async def _run(self, write: Callable[[Executor], Awaitable[T]], *, transaction: bool) -> T:
        """``write``'s statements: in one transaction, or in autocommit (one statement is
        atomic on its own: one round trip, no BEGIN and COMMIT)."""
        if transaction:
            async with self.database.transaction() as conn:
                return await write(conn)
        async with self.database.connection() as conn:
            return await write(conn)

    async def _autocommit(self, statement: Callable[[Executor], Awaitable[T]], what: str = "a write") -> T:
        return await self._storage(self._run(statement, transaction=False), what)

    def _lost(self, before: str) -> LeaseLostError:
        return LeaseLostError(f"lease on {self.instance_id} was lost before {before}")

    # ------------------------------------------------------------------ step records

    async def _write_record(self, conn: Executor, record: StepRecord) -> None:
        saved = len(self._unsaved)
        flag = await history_sql.history_record_step(
            conn,
            instance_id=self.instance_id,
            token=self.token,
            step_id=record.step_id,
            kind=record.kind,
            step_name=record.step_name,
            payload=record.payload,
            payload_bytes=record.payload_bytes,
            compensations=self._unsaved[:saved],
            clear_attempts=record.clear_attempts,
            timing=record.timing.as_json() if record.timing else None,
        )
        self._recorded(record, flag, saved)

    def _recorded(self, record: StepRecord, flag: bool | None, saved: int) -> None:
        """After a step write: ``saved`` compensations went with it (a parallel branch may
        have registered more meanwhile; those wait for the next write)."""
        if flag is None:
            raise self._lost(f"step {record.step_id!r} was recorded")
        del self._unsaved[:saved]
        self._cancel = self._cancel or flag

    async def _flush_locked(self) -> None:
        record, self._pending = self._pending, None
        if record is None:
            return
        if record.foldable:
            sent = [c.to_json() for c in self._unsaved]
            write = InstanceWrite(self.instance_id, self.token, steps=[record.as_json()], compensations=sent)
            (flag,) = await self._storage(self.writes.store([write]), f"step {record.step_id}")
            self._recorded(record, flag, len(sent))
        else:
            await self._autocommit(lambda conn: self._write_record(conn, record), f"step {record.step_id}")
        fault_point("step.after_commit")

    async def flush(self) -> None:
        async with self._lock:
            await self._flush_locked()

    def discard(self) -> None:
        self._pending = None

    def save_compensation(self, command: SaveCompensation) -> None:
        self._unsaved.append(command.record)

    async def record_step(self, command: RecordStep, step: StepScope | None = None) -> None:
        record, what = command.record, command.what or f"step {command.record.step_id}"
        try:
            async with self._lock:
                await self._flush_locked()
                if isinstance(step, StepTransaction) and step.in_transaction:
                    transaction = step

                    async def write_in_step() -> None:
                        executor = await transaction.executor()
                        # no user code runs from here to the commit, so a worker cut off
                        # now has its lock on the instance row freed by the server
                        await self.database.bound_transaction(executor)
                        await self._write_record(executor, record)
                        await transaction.commit()
                        fault_point("step.after_commit")

                    # the attempt's own ctx.session writes go in this statement's commit
                    await self._storage(write_in_step(), f"{what} (with its ctx.session writes)")
                    return
                if step is not None:
                    await step.close()
                if command.defer:
                    self._pending = record
                else:
                    await self._autocommit(lambda conn: self._write_record(conn, record), what)
                    fault_point("step.after_commit")
        except BaseException:
            # whatever failed (the deferred record's write, this one, a cancel while
            # waiting for the lock), the step's transaction ends with it: its ctx.session
            # writes and row locks must not outlive the step (a no-op once committed)
            if step is not None:
                await step.rollback()
            raise

    async def _take_folded(self) -> FoldedWrites:
        """The deferred record and unsaved compensations, for a statement that folds them
        in (call with the lock held; rare record shapes are written first)."""
        if self._pending is not None and not self._pending.foldable:
            await self._flush_locked()
        record, self._pending = self._pending, None
        return FoldedWrites(
            pending_steps=[] if record is None else [record.as_json()],
            compensations=[c.to_json() for c in self._unsaved],
        )

    # ------------------------------------------------------------------ single statements

    async def _write_now(self, statement: Callable[[Executor], Awaitable[T]], what: str = "a write") -> T:
        """One fenced statement, after the deferred record, each its own commit."""
        async with self._lock:
            await self._flush_locked()
            return await self._autocommit(statement, what)

    async def _write_with_record(self, write: Callable[[Executor], Awaitable[T]], record: StepRecord) -> T:
        """``write``'s statements in one transaction: a step whose rows (a message, a
        reply, a value, a stream entry) and record commit together; ``write`` writes the
        record (``_write_record``, whose LeaseLostError rolls the rows back). Every step of
        that shape comes through here.

        The held-back record (the step just before) goes first in the same transaction:
        one commit for both, as a suspend folds it in (an agent's model response and the
        tool-call event after it were two commits a step). Its fence reads the cancel flag
        as a flush would: a cancel committed since the last write commits the record alone
        and raises ``CancelSeenBeforeWrite`` (the engine ends the step cancelled, as after a
        flush). Should the transaction fail, the record is held back again with the
        compensations it took (a refused write, a closed stream, leaves the step before it
        to the next commit, as it found it); should the database refuse a value there, the
        two are written again one after the other, so the refusal is the step's whose value
        it is and a refused held-back record is dropped, as ``_storage`` has it."""
        what = f"step {record.step_id}"

        async def folding(conn: Executor, held: StepRecord) -> tuple[T] | None:
            await self._write_record(conn, held)
            if self._cancel:
                return None  # committed: the record, not the step's rows
            return (await write(conn),)

        async with self._lock:
            held, self._pending = self._pending, None
            if held is not None:
                unsaved = list(self._unsaved)
                try:
                    written = await self._storage(
                        self._run(lambda conn: folding(conn, held), transaction=True), what, drops_held=False
                    )
                except UnstorableValueError:
                    self._hold_again(held, unsaved)
                    await self._flush_locked()  # alone: a refusal of its own drops it
                    written = None if self._cancel else (await self._storage(self._run(write, transaction=True), what),)
                except Exception:
                    self._hold_again(held, unsaved)
                    raise
                if written is None:
                    raise CancelSeenBeforeWrite(f"instance {self.instance_id} was cancelled before {what}")
                return written[0]
            return await self._storage(self._run(write, transaction=True), what)

    def _hold_again(self, held: StepRecord, unsaved: list[CompensationRecord]) -> None:
        """After a rolled-back fold: ``held`` is held back again, with the compensations
        its write took (those registered meanwhile stay, after them)."""
        still = {id(c) for c in self._unsaved}
        self._unsaved = [c for c in unsaved if id(c) not in still] + self._unsaved
        self._pending = held

    async def count_attempt(self, command: CountAttempt) -> AttemptCounted:
        outcome = await self._write_now(
            lambda conn: instances_sql.instance_record_attempt(
                conn, self.instance_id, self.token, command.step_id, command.attempt, command.error
            )
        )
        if outcome is None:
            raise self._lost(f"it counted attempt {command.attempt} of {command.step_id!r}")
        elapsed, cancel = outcome
        self._cancel = self._cancel or cancel
        return AttemptCounted(elapsed, self._cancel)

    async def record_heartbeat(self, command: RecordHeartbeat) -> bool:
        # Its own commit, outside the lock: the attempt is still running, so nothing held
        # back belongs before it, and a step write of a concurrent branch need not wait.
        # Its errors are the engine's to log (a heartbeat is best effort), never mapped
        # to the run's: a refused value here must not drop the held-back record.
        async with self.database.connection() as conn:
            return await instances_sql.instance_record_heartbeat(
                conn, self.instance_id, self.token, command.step_id, command.details
            )

    async def deadline_passed(self) -> datetime | None:
        async def read() -> datetime | None:
            async with self.database.connection() as conn:
                return await deadlines_sql.instance_deadline_passed(conn, self.instance_id)

        return await self._storage(read(), "a read of its deadline")

    async def release(self, command: ReleaseWithDelay) -> None:
        released = await self._write_now(
            lambda conn: instances_sql.instance_release(conn, self.instance_id, self.token, command.delay)
        )
        if not released:
            raise self._lost("it released the instance for a retry back-off")

    async def continue_as_new(self, command: ContinueAsNew) -> int | None:
        """What is held back is written first (a cancel found by the continue must leave
        the run's steps and compensations for its saga), then ``runs_sql.run_continue``."""
        continued = await self._write_now(
            lambda conn: runs_sql.run_continue(conn, self.instance_id, self.token, command.input),
            "the next run's input",
        )
        if continued is None:
            raise self._lost("it continued as new")
        if continued.run is None:
            self._cancel = True
        return continued.run

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        """Register what the instance waits for and release the lease in one fenced
        statement, together with the step recorded just before (folded), refusing when
        cancellation was requested."""
        fault_point("instance.before_release")
        async with self._lock:
            folded = await self._take_folded()
            outcome = await self._autocommit(lambda conn: self._suspend_statement(conn, command, folded))
            if outcome is not SuspendOutcome.LEASE_LOST:
                self._unsaved = []
        if outcome is SuspendOutcome.CANCELLED:
            self._cancel = True
        return outcome

    def _suspend_statement(self, conn: Executor, command: Suspend, folded: FoldedWrites) -> Awaitable[SuspendOutcome]:
        if isinstance(command, SuspendOnTimer):
            return timers_sql.timer_register_and_suspend(
                conn,
                folded=folded,
                instance_id=self.instance_id,
                token=self.token,
                step_id=command.step_id,
                step_name=command.step_name,
                due_at=command.due_at,
                delay_seconds=command.delay_seconds,
            )
        return subscriptions_sql.subscription_register_and_suspend(
            conn,
            folded=folded,
            instance_id=self.instance_id,
            token=self.token,
            step_id=command.step_id,
            step_name=command.step_name,
            event_type=command.event_type,
            match=command.match,
            since_at=command.since_at,
            since_seconds=command.since_seconds,
            timeout_seconds=command.timeout_seconds,
        )

    async def start_child(self, command: StartChild) -> ChildStarted:
        """The child's row and the step naming it, with what is held back, in one fenced
        statement (kenning.storage.children)."""
        async with self._lock:
            folded = await self._take_folded()
            child = NewInstance(
                instance_id=command.child_id,
                workflow_name=command.workflow_name,
                source_hash=command.source_hash,
                input_json=command.input,
                trace_context=command.trace_context,
                queue_name=command.queue_name,
                partition_key=command.partition_key,
                priority=command.priority,
                timeout_seconds=command.timeout_seconds,
                search_attributes=command.search_attributes,
            )
            outcome = await self._autocommit(
                lambda conn: children_sql.child_start_and_record(
                    conn,
                    parent_id=self.instance_id,
                    token=self.token,
                    step_id=command.step_id,
                    step_name=command.step_name,
                    child=child,
                    on_parent_cancel=command.on_parent_cancel,
                    pinned=command.pinned,
                    folded=folded,
                ),
                f"step {command.step_id} (the child's input)",
            )
            if outcome is None:
                raise self._lost(f"step {command.step_id!r} started its child")
            if not outcome.cancel_requested:
                self._unsaved = []
        fault_point("step.after_commit")
        self._cancel = self._cancel or outcome.cancel_requested
        return ChildStarted(outcome.recorded, outcome.cancel_requested, outcome.taken_by)

    async def wait_child(self, command: WaitChild) -> HistoryRecord | SuspendOutcome:
        """Take the child's end, or subscribe to it and release the lease: one fenced
        statement, the held-back record folded in."""
        fault_point("instance.before_release")
        async with self._lock:
            folded = await self._take_folded()
            waited = await self._autocommit(
                lambda conn: children_sql.child_wait_or_suspend(
                    conn,
                    instance_id=self.instance_id,
                    token=self.token,
                    step_id=command.step_id,
                    step_name=command.step_name,
                    child_id=command.child_id,
                    folded=folded,
                )
            )
            if waited is None:
                return SuspendOutcome.LEASE_LOST
            if not waited.cancel_requested:
                self._unsaved = []
        if waited.cancel_requested:
            self._cancel = True
            return SuspendOutcome.CANCELLED
        if waited.ended is not None:
            return HistoryRecord(command.step_id, EVENT_RECEIVED, command.step_name, waited.ended)
        return SuspendOutcome.SUSPENDED

    async def complete(self, command: Complete) -> bool:
        """The completion, with the last step's record, in one group-committed statement;
        False when a cancel committed first: the record and compensations are written, the
        instance is left to be compensated."""
        fault_point("instance.before_release")
        async with self._lock:
            folded = await self._take_folded()
            write = InstanceWrite(
                self.instance_id,
                self.token,
                steps=folded.pending_steps,
                compensations=folded.compensations,
                complete=True,
                result=command.result,
            )
            stored = await self._storage(self.writes.store([write]), command.what or "the completion")
            if stored[0] is not None:
                self._unsaved = []
        if stored[0] is None:
            raise self._lost("completion")
        self._cancel = self._cancel or stored[0]
        return not stored[0]

    async def begin_compensating(self, command: BeginCompensating) -> list[DroppedCompensation]:
        unsaved = list(self._unsaved)
        try:
            await self._write_begin(command, unsaved)
            return []
        except UnstorableValueError as refused:
            if not unsaved:
                raise  # the error is always storable (encode_error): nothing else to leave out
            reason = str(refused)
        await self._write_begin(command, [])
        return [DroppedCompensation(c, reason) for c in unsaved]

    async def _write_begin(self, command: BeginCompensating, comps: list[CompensationRecord]) -> None:
        sent = [c.to_json() for c in comps]
        ok = await self._write_now(
            lambda conn: instances_sql.instance_begin_compensating(
                conn, self.instance_id, self.token, command.error, sent
            )
        )
        if not ok:
            raise self._lost("compensating")
        self._unsaved = []

    async def finish(self, command: Finish | FailSaga) -> None:
        fault_point("instance.before_release")
        if isinstance(command, FailSaga):
            finished = await self._write_now(
                lambda conn: sagas_sql.saga_fail(conn, self.instance_id, self.token, command.error)
            )
        else:
            finished = await self._write_now(
                lambda conn: instances_sql.instance_finish(
                    conn, self.instance_id, self.token, command.status.value, command.error
                )
            )
        if not finished:
            raise self._lost("it finished")

    # ------------------------------------------------------------------ messages

    async def send_message(self, command: SendMessage) -> MessageSent:
        """The message and the sending step's record in one transaction, after the mailbox's
        lock (kenning.storage.messages); a refused send writes nothing."""
        record = command.record

        async def write(conn: Executor) -> MessageSent:
            await messages_sql.mailbox_lock(conn, command.instance_id)
            sent = await messages_sql.message_send(
                conn,
                instance_id=command.instance_id,
                topic=command.topic,
                message_id=command.message_id,
                data=command.data,
                sender_instance_id=self.instance_id,
            )
            if sent.status is SendStatus.UNKNOWN_INSTANCE:
                return MessageSent(Undelivered.UNKNOWN_INSTANCE)
            if sent.status is SendStatus.FINISHED:
                return MessageSent(Undelivered.FINISHED, sent.recipient_status)
            await self._write_record(conn, record)  # LeaseLostError rolls the message back
            return MessageSent(None, sent.recipient_status)

        answer = await self._write_with_record(write, record)
        if answer.refused is None:
            fault_point("step.after_commit")
        return answer

    async def subscribe(self, command: Subscribe) -> None:
        async def write(conn: Executor) -> None:
            await messages_sql.channel_subscribe(conn, channel=command.channel, instance_id=self.instance_id)
            await self._write_record(conn, command.record)

        await self._write_with_record(write, command.record)

    async def publish(self, command: Publish) -> int:
        """The subscribers' mailbox locks, then the copies and the step's record, in one
        transaction (kenning.storage.messages)."""

        async def write(conn: Executor) -> int:
            recipients = await messages_sql.channel_lock_subscribers(conn, command.channel)
            reached = await messages_sql.channel_publish(
                conn,
                channel=command.channel,
                recipients=recipients,
                message_id=command.message_id,
                data=command.data,
                sender_instance_id=self.instance_id,
            )
            record = dataclasses.replace(command.record, payload={**command.record.payload, "subscribers": reached})
            await self._write_record(conn, record)
            return reached

        reached = await self._write_with_record(write, command.record)
        fault_point("step.after_commit")
        return reached

    async def receive_message(self, command: ReceiveMessage) -> HistoryRecord | SuspendOutcome:
        """Take the mailbox's oldest message (recorded) or register the wait and release the
        lease, in one fenced statement after the mailbox's lock, folding what is held back."""
        async with self._lock:
            folded = await self._take_folded()

            async def write(conn: Executor) -> HistoryRecord | SuspendOutcome:
                await messages_sql.mailbox_lock(conn, self.instance_id)
                return await messages_sql.message_receive_or_wait(
                    conn,
                    instance_id=self.instance_id,
                    token=self.token,
                    step_id=command.step_id,
                    step_name=command.step_name,
                    topic=command.topic,
                    timeout_seconds=command.timeout_seconds,
                    folded=folded,
                )

            outcome = await self._storage(self._run(write, transaction=True), f"step {command.step_id}")
            if outcome is not SuspendOutcome.LEASE_LOST:
                self._unsaved = []
        if outcome is SuspendOutcome.CANCELLED:
            self._cancel = True
        return outcome

    async def reply_message(self, command: ReplyMessage) -> bool:
        """The reply row and the replying step's record in one transaction (the record's
        fence rolls the reply back when the lease moved); a message replied to before
        writes nothing."""

        async def write(conn: Executor) -> bool:
            replied = await replies_sql.reply_insert(
                conn,
                instance_id=self.instance_id,
                message_id=command.message_id,
                value=command.value,
                error=command.error,
            )
            if replied:
                await self._write_record(conn, command.record)  # LeaseLostError rolls the reply back
            return replied

        replied = await self._write_with_record(write, command.record)
        if replied:
            fault_point("step.after_commit")
        return replied

    # ------------------------------------------------------------------ published values

    async def publish_value(self, command: PublishValue) -> None:
        """The value (its search text too) and the step's record in one transaction
        (kenning.storage.published); a lost lease rolls the value back."""

        async def write(conn: Executor) -> None:
            await published_sql.value_publish(
                conn,
                instance_id=self.instance_id,
                key=command.key,
                value=command.value,
                searchable=command.searchable,
                search_value=command.search_value,
            )
            await self._write_record(conn, command.record)

        await self._write_with_record(write, command.record)
        fault_point("step.after_commit")

    # ------------------------------------------------------------------ durable streams

    async def write_stream(self, command: WriteStream) -> StreamEntry:
        """From workflow code: the entry and the step's record in one transaction (after
        what is held back; a lost lease rolls the entry back). From an activity: the entry
        on its own commit, at once, outside the lock (nothing held back belongs before it,
        and a concurrent branch's step write need not wait for it)."""

        async def write(conn: Executor) -> StreamEntry:
            written = await streams_sql.stream_write(
                conn,
                instance_id=self.instance_id,
                token=self.token,
                key=command.key,
                value=command.value,
                step_id=command.step_id,
                attempt=command.attempt,
                writer=f"{self.token}:{command.attempt}",
                max_entries=MAX_STREAM_ENTRIES,
            )
            if written.entry is None:
                if not written.leased:
                    raise self._lost(f"it wrote to stream {command.key!r}")
                state = await streams_sql.stream_state(conn, self.instance_id, command.key)
                if state.closed:
                    raise stream_closed_error(self.instance_id, command.key)
                raise stream_full_error(self.instance_id, command.key)
            if command.publish:  # the entry's CloudEvent, committed with it (the relayer sends it)
                event = stream_event(self.instance_id, command.key, written.entry)
                await outbox_sql.outbox_insert(
                    conn,
                    event_id=event.event_id,
                    instance_id=self.instance_id,
                    event_type=event.event_type,
                    source=event.source,
                    subject=event.subject,
                    content_type="application/json",
                    data_json=event.data_json,
                )
            if command.record is not None:
                payload = {**command.record.payload, "offset": written.entry.offset}
                await self._write_record(conn, dataclasses.replace(command.record, payload=payload))
            return written.entry

        if command.record is not None:
            entry = await self._write_with_record(write, command.record)
            fault_point("step.after_commit")
            return entry
        # one statement unless an outbox row goes with it: autocommit, one round trip
        return await self._on_its_own(write, f"an entry of stream {command.key!r}", transaction=command.publish)

    async def close_stream(self, command: CloseStream) -> None:
        """As ``write_stream``: with the step's record, or on its own commit."""

        async def close(conn: Executor) -> None:
            if not await streams_sql.stream_close(
                conn, instance_id=self.instance_id, token=self.token, key=command.key
            ):
                raise self._lost(f"it closed stream {command.key!r}")
            if command.record is not None:
                await self._write_record(conn, command.record)

        if command.record is not None:
            await self._write_with_record(close, command.record)
            fault_point("step.after_commit")
            return
        await self._on_its_own(close, f"the close of stream {command.key!r}", transaction=False)

    async def _on_its_own(self, write: Callable[[Executor], Awaitable[T]], what: str, *, transaction: bool) -> T:
        """``write`` now, committed on its own: in a transaction when it writes with more
        than one statement, else in autocommit (its one write statement is atomic, and a
        read after a refusal needs no transaction). A refused value leaves what is held
        back as it is (it is not this write's: the attempt writing goes on, or fails, on
        its own)."""
        return await self._storage(self._run(write, transaction=transaction), what, drops_held=False)
