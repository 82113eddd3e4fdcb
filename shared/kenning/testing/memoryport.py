"""An in-memory ``InstancePort``: the engine without a database, for unit tests and the
in-memory backend of ``kenning.testing``.

``MemoryPort`` is one run's lease on a ``MemoryInstance`` (``kenning.testing.memorystate``):
a deferred step record is held back until the next write, as the worker's port holds it
(no folding into one statement, no group commit: each write lands at once).
``run_until_rest`` claims and runs an instance the way a worker would, resuming it after
timers and retry back-offs, until it waits for an event or ends.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kenning.context import StepScope
from kenning.core.limits import MAX_STREAM_ENTRIES
from kenning.core.mailbox import Undelivered
from kenning.core.names import (
    CHILD_STARTED,
    EVENT_RECEIVED,
    MESSAGE_RECEIVED,
)
from kenning.core.records import (
    CompensationRecord,
    HistoryRecord,
    OutboxEvent,
    SuspendOutcome,
)
from kenning.core.streams import (
    WORKFLOW_ATTEMPT,
    StreamEntry,
    next_attempt,
    stream_closed_error,
    stream_event,
    stream_full_error,
)
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
    SuspendOnEvent,
    SuspendOnTimer,
    WaitChild,
    WriteStream,
)
from kenning.engine.history import StepRecord
from kenning.engine.outcomes import RunOutcome
from kenning.engine.run import WorkflowRun
from kenning.errors import CancelSeenBeforeWrite, LeaseLostError
from kenning.testing.memorystate import (
    MemoryInstance,
    MemoryStream,
    child_end_payload,
    family,
    settle_ends,
    stamp,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kenning.app import App


class MemoryStep:
    """A step scope without a database: outbox events are kept until the record commits."""

    def __init__(self, instance: MemoryInstance) -> None:
        self._instance = instance
        self._events: list[OutboxEvent] = []
        self._after_commit: list[Callable[[], Awaitable[None]]] = []

    @property
    def session(self) -> AsyncSession:
        raise RuntimeError("ctx.session needs a database; the in-memory port has none")

    @property
    def in_transaction(self) -> bool:
        return bool(self._events)

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._after_commit.append(callback)

    async def add_outbox_event(self, event: OutboxEvent) -> None:
        self._events.append(event)

    async def commit(self) -> None:
        self._instance.outbox.extend(self._events)
        self._events = []
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            await callback()

    async def rollback(self) -> None:
        self._events, self._after_commit = [], []

    async def close(self) -> None:
        self._events = []


class MemoryPort:
    """One run's lease on a ``MemoryInstance``; a deferred step record is held back until
    the next write, every write lands at once."""

    def __init__(self, instance: MemoryInstance, token: str, *, clock: Callable[[], float] | None = None) -> None:
        self.instance = instance
        self.token = token
        self._cancel = instance.cancel_requested
        self._pending: StepRecord | None = None  # a deferred step record, held back
        self._unsaved: list[CompensationRecord] = []
        self._clock = clock or time.time  # epoch seconds: wait_until's due times are on it
        self.first_failure: dict[str, float] = {}

    @property
    def cancel_requested(self) -> bool:
        return self._cancel

    def _fence(self, what: str) -> None:
        """The lease check every write makes; also reads the cancellation flag."""
        if self.instance.lease_token != self.token:
            raise LeaseLostError(f"lease on {self.instance.id} was lost before {what}")
        self._cancel = self._cancel or self.instance.cancel_requested
        self.instance.writes.append(what)

    def _save_compensations(self) -> None:
        known = {c.comp_id for c in self.instance.compensations}
        self.instance.compensations.extend(c for c in self._unsaved if c.comp_id not in known)
        self._unsaved = []

    def _append(self, record: StepRecord) -> None:
        self.instance.append(record.step_id, record.kind, record.step_name, record.payload, record.payload_bytes)
        if record.clear_attempts:
            self.instance.attempts.pop(record.step_id, None)

    def _write(self, what: str) -> None:
        """A fenced write, with what is held back going first, as the worker's port folds
        it into the same statement or transaction (written even when the write then answers
        that cancellation was requested: the fence alone guards it)."""
        self._fence(what)
        self._fold()

    def _write_step(self, what: str) -> None:
        """``_write`` for a step whose rows commit with its record (a message, a reply, a
        value, a stream entry): a held-back record whose fence sees a cancel is written
        alone and ``CancelSeenBeforeWrite`` raised, the step's rows unwritten."""
        self._fence(what)
        self._cancel_seen_by_held_back(what)
        self._fold()

    def _cancel_seen_by_held_back(self, what: str) -> None:
        if self._pending is not None and self._cancel:
            self._fold()
            raise CancelSeenBeforeWrite(f"instance {self.instance.id} was cancelled before {what}")

    def _fold(self) -> None:
        """What is held back, written (after the fence): the deferred record, then the
        compensations registered since the last write."""
        record, self._pending = self._pending, None
        if record is not None:
            self._append(record)
        self._save_compensations()

    def open_step(self) -> MemoryStep:
        return MemoryStep(self.instance)

    async def record_step(self, command: RecordStep, step: StepScope | None = None) -> None:
        record = command.record
        if command.defer and not (step is not None and step.in_transaction):
            # held back until the next write (the one before it written now), as the
            # worker's port holds it: a run abandoned meanwhile drops it (``discard``)
            if self._pending is not None:
                await self.flush()
            self._pending = record
            if step is not None:
                await step.close()
            return
        self._write(f"record {record.step_id}")
        self._append(record)
        if isinstance(step, MemoryStep):
            await step.commit()

    def save_compensation(self, command: SaveCompensation) -> None:
        self._unsaved.append(command.record)

    async def flush(self) -> None:
        if self._pending is not None:
            self._write(f"record {self._pending.step_id}")

    def _write_after_flush(self, what: str) -> None:
        """A fenced write of its own after ``flush``: unsaved compensations go only with a
        held-back record, else they wait for a write that carries them (as on PostgreSQL)."""
        self._fence(what)
        if self._pending is not None:
            self._fold()

    def discard(self) -> None:
        self._pending = None

    async def count_attempt(self, command: CountAttempt) -> AttemptCounted:
        self._write_after_flush(f"count attempt {command.attempt} of {command.step_id}")
        now = self._clock()
        # an entry its heartbeat details made has no failure yet
        first = self.instance.attempts.setdefault(command.step_id, {}).setdefault("first_failure_at", now)
        self.instance.attempts[command.step_id].update(attempts=command.attempt, last_error=command.error)
        return AttemptCounted(now - float(first), self._cancel)

    async def record_heartbeat(self, command: RecordHeartbeat) -> bool:
        if self.instance.lease_token != self.token:
            return False
        self.instance.attempts.setdefault(command.step_id, {})["heartbeat_details"] = command.details
        return True

    async def deadline_passed(self) -> datetime | None:
        deadline = self.instance.deadline_at
        return None if deadline is None or deadline > self._clock() else datetime.fromtimestamp(deadline, UTC)

    async def release(self, command: ReleaseWithDelay) -> None:
        self._write_after_flush(f"release after {command.delay:g} s")
        if self.instance.status == "running":
            self.instance.status = "pending"
        self.instance.lease_token = None
        self.instance.available_after = command.delay
        self.instance.available_at = self._clock() + command.delay

    async def continue_as_new(self, command: ContinueAsNew) -> int | None:
        """What ``kenning.storage.runs.run_continue`` does: the lease is kept, the next run
        goes on with it (``run_once`` gives it back, so its callers claim the next run)."""
        self._write_after_flush("continue as new")
        if self._cancel:
            return None
        instance, now = self.instance, self._clock()
        instance.runs.append(
            {
                "run": instance.run,
                "input": instance.input,
                "started_at": instance.run_started_at,
                "ended_at": now,
                "steps": len(instance.history),
                "ended": "continued_as_new",
            }
        )
        instance.history, instance.compensations, instance.attempts, self._unsaved = [], [], {}, []
        for child in instance.children:  # unfinished ones: as at the parent's end, then detached
            if child.status not in ("completed", "failed", "cancelled") and child.parent_id == instance.id:
                if child.on_parent_cancel == "cancel" and not child.cancel_requested:
                    child.cancel_requested = True
                    if child.waiting_for is not None:
                        child.waiting_for, child.status = None, "pending"
                child.parent_id, child.parent_step, child.on_parent_cancel = None, None, None
        instance.input, instance.run, instance.run_started_at = dict(command.input), instance.run + 1, now
        instance.status = "running"
        return instance.run

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        self._write(f"suspend at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        now = self._clock()
        instance = self.instance
        instance.waiting_for, instance.waited_at, instance.since_at = command, stamp(now), None
        if isinstance(command, SuspendOnTimer):
            instance.status = "waiting_for_timer"
            delay = command.delay_seconds or 0.0
            instance.due_at = command.due_at.timestamp() if command.due_at is not None else now + delay
        else:
            instance.status = "waiting_for_event"
            instance.due_at = None if command.timeout_seconds is None else now + command.timeout_seconds
            if command.since_at is not None:
                instance.since_at = command.since_at.timestamp()
            elif command.since_seconds is not None:
                instance.since_at = now - command.since_seconds
        instance.lease_token = None
        return SuspendOutcome.SUSPENDED

    async def start_child(self, command: StartChild) -> ChildStarted:
        self._write(f"start child {command.child_id} at {command.step_id}")
        if self._cancel:
            return ChildStarted(recorded=False, cancel_requested=True)
        if not any(c.id == command.child_id for c in self.instance.children):
            child = MemoryInstance(
                command.child_id,
                command.workflow_name,
                dict(command.input),
                parent_id=self.instance.id,
                parent_step=command.step_id,
                on_parent_cancel=command.on_parent_cancel,
            )
            if command.timeout_seconds is not None:
                child.deadline_at = self._clock() + command.timeout_seconds
            child.set_search_attributes(command.search_attributes)
            self.instance.children.append(child)
        payload = {"child_id": command.child_id, "workflow": command.workflow_name}
        self.instance.append(command.step_id, CHILD_STARTED, command.step_name, payload)
        return ChildStarted(recorded=True, cancel_requested=False)

    async def wait_child(self, command: WaitChild) -> HistoryRecord | SuspendOutcome:
        self._write(f"wait for child {command.child_id} at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        child = next(c for c in self.instance.children if c.id == command.child_id)
        if child.status in ("completed", "failed", "cancelled"):
            self.instance.append(command.step_id, EVENT_RECEIVED, command.step_name, child_end_payload(child))
            return self.instance.history[-1]
        self.instance.waiting_for, self.instance.due_at = command, None
        self.instance.status = "waiting_for_event"
        self.instance.lease_token = None
        return SuspendOutcome.SUSPENDED

    async def complete(self, command: Complete) -> bool:
        self._write("complete")
        if self._cancel:
            return False
        self.instance.status, self.instance.result, self.instance.lease_token = "completed", command.result, None
        return True

    async def begin_compensating(self, command: BeginCompensating) -> list[DroppedCompensation]:
        self._write("begin compensating")
        self.instance.status = "compensating"
        self.instance.error = command.error if command.error is not None else self.instance.error
        return []

    async def finish(self, command: Finish | FailSaga) -> None:
        self._write_after_flush("finish")
        if isinstance(command, FailSaga):
            self.instance.status = "failed"
            self.instance.error = {**command.error, "workflow_error": self.instance.error}
        else:
            self.instance.status = command.status.value
            self.instance.error = command.error if command.error is not None else self.instance.error
        self.instance.lease_token = None

    async def send_message(self, command: SendMessage) -> MessageSent:
        self._write_step(f"send message at {command.record.step_id}")
        recipient = self.instance.peers.get(command.instance_id)
        if recipient is None and command.instance_id == self.instance.id:
            recipient = self.instance
        if recipient is None:
            return MessageSent(Undelivered.UNKNOWN_INSTANCE)
        refused = recipient.send_message(
            command.topic, command.data, message_id=command.message_id, sender=self.instance.id
        )
        if refused is not None:
            return MessageSent(refused, recipient.status)
        self._append(command.record)
        return MessageSent(None, recipient.status)

    async def subscribe(self, command: Subscribe) -> None:
        self._write_step(f"subscribe at {command.record.step_id}")
        self.instance.channels.add(command.channel)
        self._append(command.record)

    async def publish(self, command: Publish) -> int:
        self._write_step(f"publish at {command.record.step_id}")
        peers = {self.instance.id: self.instance, **self.instance.peers}
        reached = 0
        for peer in sorted(peers.values(), key=lambda i: i.id):
            if command.channel in peer.channels:
                sent = peer.send_message(
                    command.channel, command.data, message_id=command.message_id, sender=self.instance.id
                )
                reached += sent is None
        record = command.record
        self._append(replace(record, payload={**record.payload, "subscribers": reached}))
        return reached

    async def reply_message(self, command: ReplyMessage) -> bool:
        self._write_step(f"reply at {command.record.step_id}")
        if command.message_id in self.instance.replies:
            return False
        self.instance.replies[command.message_id] = (command.value, command.error)
        self._append(command.record)
        return True

    async def publish_value(self, command: PublishValue) -> None:
        self._write_step(f"publish value at {command.record.step_id}")
        self.instance.values[command.key] = command.value
        if command.search_value is not None:
            self.instance.search_attributes[command.key] = command.search_value
        elif command.searchable:
            self.instance.search_attributes.pop(command.key, None)
        self._append(command.record)

    async def write_stream(self, command: WriteStream) -> StreamEntry:
        self._fence(f"write stream {command.key}")
        if command.record is not None:
            self._cancel_seen_by_held_back(f"write stream {command.key}")
        if self.instance.stream_closed(command.key):
            raise stream_closed_error(self.instance.id, command.key)
        stream = self.instance.streams.setdefault(command.key, MemoryStream())
        if len(stream.entries) >= MAX_STREAM_ENTRIES:
            raise stream_full_error(self.instance.id, command.key)
        if command.record is not None:
            self._fold()  # from workflow code, after what is held back; from an activity, at once
        attempt, step = WORKFLOW_ATTEMPT, command.step_id
        if step is not None:
            step = step if self.instance.run == 1 else f"{step}@{self.instance.run}"  # storage.streams' label
            attempt = next_attempt(stream.writers, step, f"{self.token}:{command.attempt}", command.attempt)
        written = datetime.fromtimestamp(self._clock(), UTC)  # the port's clock: it skips with the test's
        entry = StreamEntry(len(stream.entries), attempt, command.value, written, step)
        stream.entries.append(entry)
        if command.publish:
            event = stream_event(self.instance.id, command.key, entry)
            self.instance.outbox.append(
                OutboxEvent(
                    event.event_id,
                    self.instance.id,
                    event.event_type,
                    event.source,
                    event.subject,
                    "application/json",
                    event.data_json,
                    None,
                    {},
                )
            )
        if command.record is not None:
            record = replace(command.record, payload={**command.record.payload, "offset": entry.offset})
            self._append(record)
        return entry

    async def close_stream(self, command: CloseStream) -> None:
        self._fence(f"close stream {command.key}")
        if command.record is not None:
            self._cancel_seen_by_held_back(f"close stream {command.key}")
            self._fold()
        self.instance.streams.setdefault(command.key, MemoryStream()).closed = True
        if command.record is not None:
            self._append(command.record)

    async def receive_message(self, command: ReceiveMessage) -> HistoryRecord | SuspendOutcome:
        self._write(f"receive at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        message = next(
            (m for m in self.instance.mailbox if m.topic == command.topic and m.consumed_step_id is None), None
        )
        if message is not None:
            message.consumed_step_id = command.step_id
            payload = {
                "seq": message.seq,
                "message_id": message.message_id,
                "topic": message.topic,
                "data": message.data,
                "sender": message.sender,
            }
            self.instance.append(command.step_id, MESSAGE_RECEIVED, command.step_name, payload)
            return self.instance.history[-1]
        self.instance.receiving = command
        self.instance.status = "waiting_for_message"
        now = self._clock()
        self.instance.due_at = None if command.timeout_seconds is None else now + command.timeout_seconds
        self.instance.waited_at = stamp(now)
        self.instance.lease_token = None
        return SuspendOutcome.SUSPENDED


async def run_once(
    app: App,
    instance: MemoryInstance,
    *,
    inline_retry_seconds: float = 5.0,
    clock: Callable[[], float] | None = None,
    activity_timeout: float | None = None,
) -> RunOutcome:
    """Claim ``instance`` and run it once, as a worker would (``clock``: the port's).

    A run that continued as new kept the lease; a worker goes on with the next run at
    once, here the lease is given back (as a stopping worker gives it back), so the
    caller claims the next run as any other and sees each run's outcome."""
    claimed = instance.claim()
    run = WorkflowRun(
        app=app,
        workflow=app.registry.workflow(instance.workflow_name),
        claimed=claimed,
        history=list(instance.history),
        compensations=list(instance.compensations),
        port=MemoryPort(instance, claimed.lease_token, clock=clock),
        inline_retry_seconds=inline_retry_seconds,
        activity_timeout=activity_timeout,
    )
    outcome = await run.run()
    if outcome is RunOutcome.CONTINUED:
        instance.status, instance.lease_token = "pending", None
    return outcome


async def run_until_rest(
    app: App, instance: MemoryInstance, *, inline_retry_seconds: float = 5.0, max_runs: int = 50
) -> list[RunOutcome]:
    """Run ``instance`` again after each timer and retry back-off (no waiting: time is
    not simulated) until it ends or waits for an event; the outcome of every run."""
    outcomes: list[RunOutcome] = []
    for _ in range(max_runs):
        outcome = await run_once(app, instance, inline_retry_seconds=inline_retry_seconds)
        outcomes.append(outcome)
        if instance.receiving is not None:
            return outcomes  # waits for a message: a send or its timeout moves it on
        if isinstance(instance.waiting_for, SuspendOnTimer):
            instance.fire_timer()
        elif outcome is RunOutcome.CONTINUED:
            continue  # the next run of the chain
        elif outcome is not RunOutcome.SUSPENDED or isinstance(instance.waiting_for, SuspendOnEvent):
            return outcomes
    raise AssertionError(f"{instance.id} did not come to rest in {max_runs} runs")


async def run_family(app: App, root: MemoryInstance, *, max_rounds: int = 200) -> None:
    """Run ``root`` and the children it starts, as workers, the inbox and the scheduler
    would, until every one of them ended or waits for an event (timers fire at once)."""
    for _ in range(max_rounds):
        settle_ends(root)
        runnable = [
            i for i in family(root) if i.status in ("pending", "running", "compensating") and i.lease_token is None
        ]
        if not runnable:
            return
        for instance in runnable:
            await run_once(app, instance)
            if isinstance(instance.waiting_for, SuspendOnTimer):
                instance.fire_timer()
    raise AssertionError(f"{root.id} and its children did not come to rest in {max_rounds} rounds")


__all__ = [
    "MemoryPort",
    "MemoryStep",
    "run_family",
    "run_once",
    "run_until_rest",
]
