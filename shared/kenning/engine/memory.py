"""An in-memory ``InstancePort``: the engine without a database, for unit tests.

``MemoryInstance`` is one instance's stored state (what the tables would hold);
``MemoryPort`` is one run's lease on it, writing at once (no folding, no group commit).
``run_until_rest`` claims and runs an instance the way a worker would, resuming it after
timers and retry back-offs, until it waits for an event or ends.

Waits keep what the database keeps of them, on the port's clock (epoch seconds; a
virtual one in ``kenning.testing``): a timer's due time, an event's or a receive's
timeout, a back-off's end, a subscription's ``match`` and ``since`` window. ``takes``
applies the delivery statement's rules (``kenning.storage.subscriptions``) and
``fire_due`` the scheduler's, so the harness built on this port delivers and times out
exactly as production does.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kenning.context import StepScope
from kenning.core.limits import MAX_STREAM_ENTRIES
from kenning.core.mailbox import Undelivered
from kenning.core.names import (
    CHILD_STARTED,
    EVENT_RECEIVED,
    EVENT_TIMEOUT,
    MESSAGE_RECEIVED,
    MESSAGE_TIMEOUT,
    TIMER_EXPIRED,
)
from kenning.core.published import search_text
from kenning.core.records import (
    TERMINAL_STATUSES,
    ClaimedInstance,
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
from kenning.engine.outcomes import RunOutcome
from kenning.errors import LeaseLostError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kenning.app import App

# Orders what happened at one instant of a clock that does not move during a run (a
# virtual one): an event received after a subscription is taken by it, one received
# before is not, as the database's timestamps order them.
_sequence = itertools.count(1)


def stamp(now: float) -> tuple[float, int]:
    """``now`` and a sequence number: the order of two things at the same instant."""
    return (now, next(_sequence))


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def contains(data: Any, match: Any, *, top: bool = True) -> bool:
    """PostgreSQL's ``jsonb @>``: an object contains a subset of the other's keys, each
    value contained; an array contains every element of the other, each in some element;
    scalars are equal (``true`` is not ``1``); at the top level only, an array contains a
    scalar it has."""
    if isinstance(match, dict):
        return isinstance(data, dict) and all(k in data and contains(data[k], v, top=False) for k, v in match.items())
    if isinstance(match, list):
        return isinstance(data, list) and all(any(contains(d, m, top=False) for d in data) for m in match)
    if isinstance(data, list):
        return top and any(_same_scalar(d, match) for d in data)
    return _same_scalar(data, match)


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


@dataclass(frozen=True)
class MemoryEvent:
    """One inbox row: a CloudEvent as the worker reads it."""

    event_type: str
    source: str
    event_id: str
    data: Any
    received: tuple[float, int]  # received_at, on the port's clock
    target: str | None = None  # the kenninginstanceid extension
    payload: dict[str, Any] = field(default_factory=dict)  # its EventReceived record's
    payload_bytes: bytes | None = None


@dataclass
class MemoryStream:
    """One stream as its header and entry rows would hold it."""

    entries: list[StreamEntry] = field(default_factory=list)
    closed: bool = False
    writers: dict[str, tuple[str, int]] = field(default_factory=dict)  # step -> (attempt's identity, number)


@dataclass
class MemoryInstance:
    """One instance as storage would hold it."""

    id: str
    workflow_name: str
    input: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"
    result: Any = None
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    lease_token: str | None = None
    run_count: int = 0
    history: list[HistoryRecord] = field(default_factory=list)
    compensations: list[CompensationRecord] = field(default_factory=list)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    deadline_at: float | None = None  # its workflow timeout's deadline, on the port's clock
    # continue_as_new: the run in progress (1 for the first), when it began on the port's
    # clock, and the chain's earlier runs (kenning_instance_runs rows, oldest first)
    run: int = 1
    run_started_at: float | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    # messages: this instance's mailboxes (every topic, in sending order), the receive it
    # waits in (status waiting_for_message), and the instances it may send to by id
    mailbox: list[MemoryMessage] = field(default_factory=list)
    receiving: ReceiveMessage | None = None
    channels: set[str] = field(default_factory=set)  # subscribed to (publish reaches it)
    # the kenning_replies rows: message id -> (value, error) of a reply to a request
    replies: dict[str, tuple[Any, str | None]] = field(default_factory=dict)
    peers: dict[str, MemoryInstance] = field(default_factory=dict)
    outbox: list[OutboxEvent] = field(default_factory=list)
    waiting_for: Suspend | WaitChild | None = None
    available_after: float = 0.0  # seconds of back-off asked for by the last release
    available_at: float = 0.0  # when that back-off ends, on the port's clock
    # the wait's row: when it is due (a timer, an event's or a receive's timeout), when it
    # was registered, and an event subscription's since window (None: since registered)
    due_at: float | None = None
    waited_at: tuple[float, int] = (0.0, 0)
    since_at: float | None = None
    # every write in order, for tests that check what was written and when
    writes: list[str] = field(default_factory=list)
    # child workflows (start_child): the children this instance started, and its own parent
    children: list[MemoryInstance] = field(default_factory=list)
    parent_id: str | None = None
    parent_step: str | None = None
    on_parent_cancel: str | None = None
    # published values (publish_value, set_status), the latest per key, and the declared
    # keys' search texts (kenning.storage.published)
    values: dict[str, Any] = field(default_factory=dict)
    search_attributes: dict[str, str] = field(default_factory=dict)
    # durable streams (write_stream), by key (kenning.storage.streams)
    streams: dict[str, MemoryStream] = field(default_factory=dict)

    def stream_closed(self, key: str) -> bool:
        """As a reader judges it: closed by ``close_stream``, or the instance has ended."""
        stream = self.streams.get(key)
        return self.status in TERMINAL_STATUSES or (stream is not None and stream.closed)

    def claim(self) -> ClaimedInstance:
        self.lease_token = str(uuid.uuid4())
        self.run_count += 1
        if self.status in ("pending", "waiting_for_event", "waiting_for_timer", "waiting_for_message"):
            self.status = "running"
        return ClaimedInstance(
            id=self.id,
            workflow_name=self.workflow_name,
            status=self.status,
            input=self.input,
            cancel_requested=self.cancel_requested,
            lease_token=self.lease_token,
            run_count=self.run_count,
            attempts={k: dict(v) for k, v in self.attempts.items()},
        )

    def append(self, step_id: str, kind: str, step_name: str, payload: Any, payload_bytes: bytes | None = None) -> None:
        self.history.append(HistoryRecord(step_id, kind, step_name, payload, payload_bytes))

    def set_search_attributes(self, attributes: dict[str, Any] | None) -> None:
        """A start's search attributes, as its insert writes them: each a value, and its text
        in the search."""
        for key, value in (attributes or {}).items():
            self.values[key] = value
            text = search_text(key, value)
            if text is not None:
                self.search_attributes[key] = text

    def takes(self, event: MemoryEvent) -> bool:
        """The delivery statement's rules: waiting for the event's type, the data contains
        ``match``, addressed to no instance or to this one, received at or after the
        ``since`` point (else after the subscription), and not recorded here already."""
        waiting = self.waiting_for
        if self.status != "waiting_for_event" or not isinstance(waiting, SuspendOnEvent):
            return False
        if waiting.event_type != event.event_type or event.target not in (None, self.id):
            return False
        if waiting.match is not None and (event.payload_bytes is not None or not contains(event.data, waiting.match)):
            return False
        if self.since_at is not None:
            if event.received[0] < self.since_at:
                return False
        elif event.received < self.waited_at:
            return False
        return not any(
            r.kind == EVENT_RECEIVED
            and (r.payload or {}).get("source") == event.source
            and (r.payload or {}).get("id") == event.event_id
            for r in self.history
        )

    def deliver_event(self, payload: dict[str, Any], payload_bytes: bytes | None = None) -> None:
        """What the inbox does for a waiting instance: record the event, make it runnable.
        An event the wait does not take (another type, data outside its ``match``) is refused."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnEvent), f"{self.id} is not waiting for an event"
        event = MemoryEvent(
            payload.get("type", ""),
            payload.get("source", ""),
            payload.get("id", ""),
            payload.get("data"),
            (float("inf"), 0),  # received now: after any subscription
            payload_bytes=payload_bytes,
        )
        assert self.takes(event), f"{self.id}'s wait {waiting.step_id} does not take this event: {payload!r}"
        self.record_event(payload, payload_bytes)

    def record_event(self, payload: dict[str, Any], payload_bytes: bytes | None = None) -> None:
        """The delivery's write: ``EventReceived`` at the wait's step, the wait removed."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnEvent), f"{self.id} is not waiting for an event"
        self.append(waiting.step_id, EVENT_RECEIVED, waiting.step_name, payload, payload_bytes)
        self.waiting_for, self.status, self.due_at = None, "pending", None

    def fire_timer(self) -> None:
        """What the scheduler does when the timer is due."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnTimer), f"{self.id} is not waiting for a timer"
        due = self.due_at if self.due_at is not None else time.time()
        self.append(waiting.step_id, TIMER_EXPIRED, waiting.step_name, {"due_at": iso(due), "fired_at": iso(due)})
        self.waiting_for, self.status, self.due_at = None, "pending", None

    def time_out_event(self, now: float) -> None:
        """What the scheduler does when a ``wait_event``'s timeout is due."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnEvent), f"{self.id} is not waiting for an event"
        due = self.due_at if self.due_at is not None else now
        payload = {"event_type": waiting.event_type, "timeout_at": iso(due), "fired_at": iso(now)}
        self.append(waiting.step_id, EVENT_TIMEOUT, waiting.step_name, payload)
        self.waiting_for, self.status, self.due_at = None, "pending", None

    def fire_due(self, now: float) -> bool:
        """The scheduler's pass for this instance: the timer, event timeout or receive
        timeout due at ``now`` fired (True), or nothing was due."""
        if self.due_at is None or self.due_at > now:
            return False
        if self.status == "waiting_for_timer" and isinstance(self.waiting_for, SuspendOnTimer):
            self.fire_timer()
        elif self.status == "waiting_for_event" and isinstance(self.waiting_for, SuspendOnEvent):
            self.time_out_event(now)
        elif self.status == "waiting_for_message" and self.receiving is not None:
            self.time_out_receive(now)
        else:
            return False
        return True

    def send_message(
        self, topic: str, data: Any, *, message_id: str | None = None, sender: str | None = None
    ) -> Undelivered | None:
        """What ``kenning.storage.messages.message_send`` does: the message into the
        ``topic`` mailbox (once per id), waking the instance if it waits for that topic."""
        if self.status in ("completed", "failed", "cancelled"):
            return Undelivered.FINISHED
        message_id = message_id or str(uuid.uuid4())
        if any(m.message_id == message_id for m in self.mailbox):
            return None
        self.mailbox.append(MemoryMessage(len(self.mailbox) + 1, topic, message_id, data, sender))
        if self.receiving is not None and self.receiving.topic == topic:
            self.receiving, self.status, self.due_at = None, "pending", None
        return None

    def time_out_receive(self, now: float | None = None) -> None:
        """What the scheduler does when a receive's timeout is due."""
        waiting = self.receiving
        assert waiting is not None, f"{self.id} is not waiting for a message"
        payload: dict[str, Any] = {"topic": waiting.topic}
        if now is not None:
            payload.update(timeout_at=iso(self.due_at if self.due_at is not None else now), fired_at=iso(now))
        self.append(waiting.step_id, MESSAGE_TIMEOUT, waiting.step_name, payload)
        self.receiving, self.status, self.due_at = None, "pending", None


@dataclass
class MemoryMessage:
    """One ``kenning_messages`` row."""

    seq: int
    topic: str
    message_id: str
    data: Any
    sender: str | None
    consumed_step_id: str | None = None


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
    """One run's lease on a ``MemoryInstance``; writes land at once."""

    def __init__(self, instance: MemoryInstance, token: str, *, clock: Callable[[], float] | None = None) -> None:
        self.instance = instance
        self.token = token
        self._cancel = instance.cancel_requested
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

    def open_step(self) -> MemoryStep:
        return MemoryStep(self.instance)

    async def record_step(self, command: RecordStep, step: StepScope | None = None) -> None:
        record = command.record
        self._fence(f"record {record.step_id}")
        self.instance.append(record.step_id, record.kind, record.step_name, record.payload, record.payload_bytes)
        self._save_compensations()
        if record.clear_attempts:
            self.instance.attempts.pop(record.step_id, None)
        if isinstance(step, MemoryStep):
            await step.commit()

    def save_compensation(self, command: SaveCompensation) -> None:
        self._unsaved.append(command.record)

    async def flush(self) -> None:
        if self._unsaved:
            self._fence("save compensations")
            self._save_compensations()

    def discard(self) -> None:
        pass  # nothing is held back

    async def count_attempt(self, command: CountAttempt) -> AttemptCounted:
        self._fence(f"count attempt {command.attempt} of {command.step_id}")
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
        self._fence(f"release after {command.delay:g} s")
        if self.instance.status == "running":
            self.instance.status = "pending"
        self.instance.lease_token = None
        self.instance.available_after = command.delay
        self.instance.available_at = self._clock() + command.delay

    async def continue_as_new(self, command: ContinueAsNew) -> int | None:
        """What ``kenning.storage.runs.run_continue`` does, releasing the lease too (a
        worker keeps it and goes on; here the harness claims the next run)."""
        self._fence("continue as new")
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
        instance.status, instance.lease_token = "pending", None
        return instance.run

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        self._fence(f"suspend at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        self._save_compensations()
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
        self._fence(f"start child {command.child_id} at {command.step_id}")
        if self._cancel:
            return ChildStarted(recorded=False, cancel_requested=True)
        self._save_compensations()
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
        self._fence(f"wait for child {command.child_id} at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        self._save_compensations()
        child = next(c for c in self.instance.children if c.id == command.child_id)
        if child.status in ("completed", "failed", "cancelled"):
            self.instance.append(command.step_id, EVENT_RECEIVED, command.step_name, child_end_payload(child))
            return self.instance.history[-1]
        self.instance.waiting_for, self.instance.due_at = command, None
        self.instance.status = "waiting_for_event"
        self.instance.lease_token = None
        return SuspendOutcome.SUSPENDED

    async def complete(self, command: Complete) -> bool:
        self._fence("complete")
        self._save_compensations()
        if self._cancel:
            return False
        self.instance.status, self.instance.result, self.instance.lease_token = "completed", command.result, None
        return True

    async def begin_compensating(self, command: BeginCompensating) -> list[DroppedCompensation]:
        self._fence("begin compensating")
        self._save_compensations()
        self.instance.status = "compensating"
        self.instance.error = command.error if command.error is not None else self.instance.error
        return []

    async def finish(self, command: Finish | FailSaga) -> None:
        self._fence("finish")
        if isinstance(command, FailSaga):
            self.instance.status = "failed"
            self.instance.error = {**command.error, "workflow_error": self.instance.error}
        else:
            self.instance.status = command.status.value
            self.instance.error = command.error if command.error is not None else self.instance.error
        self.instance.lease_token = None

    async def send_message(self, command: SendMessage) -> MessageSent:
        self._fence(f"send message at {command.record.step_id}")
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
        await self.record_step(RecordStep(command.record))
        return MessageSent(None, recipient.status)

    async def subscribe(self, command: Subscribe) -> None:
        self._fence(f"subscribe at {command.record.step_id}")
        self.instance.channels.add(command.channel)
        await self.record_step(RecordStep(command.record))

    async def publish(self, command: Publish) -> int:
        self._fence(f"publish at {command.record.step_id}")
        peers = {self.instance.id: self.instance, **self.instance.peers}
        reached = 0
        for peer in sorted(peers.values(), key=lambda i: i.id):
            if command.channel in peer.channels:
                sent = peer.send_message(
                    command.channel, command.data, message_id=command.message_id, sender=self.instance.id
                )
                reached += sent is None
        record = command.record
        await self.record_step(RecordStep(replace(record, payload={**record.payload, "subscribers": reached})))
        return reached

    async def reply_message(self, command: ReplyMessage) -> bool:
        self._fence(f"reply at {command.record.step_id}")
        if command.message_id in self.instance.replies:
            return False
        self.instance.replies[command.message_id] = (command.value, command.error)
        await self.record_step(RecordStep(command.record))
        return True

    async def publish_value(self, command: PublishValue) -> None:
        self._fence(f"publish value at {command.record.step_id}")
        self.instance.values[command.key] = command.value
        if command.search_value is not None:
            self.instance.search_attributes[command.key] = command.search_value
        elif command.searchable:
            self.instance.search_attributes.pop(command.key, None)
        await self.record_step(RecordStep(command.record))

    async def write_stream(self, command: WriteStream) -> StreamEntry:
        self._fence(f"write stream {command.key}")
        if self.instance.stream_closed(command.key):
            raise stream_closed_error(self.instance.id, command.key)
        stream = self.instance.streams.setdefault(command.key, MemoryStream())
        if len(stream.entries) >= MAX_STREAM_ENTRIES:
            raise stream_full_error(self.instance.id, command.key)
        attempt = WORKFLOW_ATTEMPT
        if command.step_id is not None:
            attempt = next_attempt(stream.writers, command.step_id, f"{self.token}:{command.attempt}", command.attempt)
        written = datetime.fromtimestamp(self._clock(), UTC)  # the port's clock: it skips with the test's
        entry = StreamEntry(len(stream.entries), attempt, command.value, written, command.step_id)
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
            await self.record_step(RecordStep(record))
        return entry

    async def close_stream(self, command: CloseStream) -> None:
        self._fence(f"close stream {command.key}")
        self.instance.streams.setdefault(command.key, MemoryStream()).closed = True
        if command.record is not None:
            await self.record_step(RecordStep(command.record))

    async def receive_message(self, command: ReceiveMessage) -> HistoryRecord | SuspendOutcome:
        self._fence(f"receive at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        self._save_compensations()
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
    """Claim ``instance`` and run it once, as a worker would (``clock``: the port's)."""
    from kenning.engine.run import WorkflowRun

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
    return await run.run()


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


def child_end_payload(child: MemoryInstance) -> dict[str, Any]:
    """The ``EventReceived`` payload of a child's end, as kenning.storage.children writes it."""
    data = {
        "child_id": child.id,
        "status": child.status,
        "result": (child.result or {}).get("result"),
        "error": child.error,
    }
    return {"type": "kenning.child.finished", "source": "kenning.children", "id": child.id, "data": data}


def _family(root: MemoryInstance) -> list[MemoryInstance]:
    """``root`` and its descendants, parents before their children."""
    found = [root]
    for instance in found:
        found.extend(instance.children)
    return found


def _settle_ends(root: MemoryInstance) -> None:
    """What the finishing statements' ``tell_parents`` and the inbox do: an ended child
    wakes its waiting parent; an ended parent asks its unfinished ``cancel`` children to cancel."""
    ended = ("completed", "failed", "cancelled")
    for parent in _family(root):
        waiting = parent.waiting_for
        if isinstance(waiting, WaitChild):
            child = next(c for c in parent.children if c.id == waiting.child_id)
            if child.status in ended:
                parent.append(waiting.step_id, EVENT_RECEIVED, waiting.step_name, child_end_payload(child))
                parent.waiting_for, parent.status = None, "pending"
        if parent.status in ended:
            for child in parent.children:
                if child.on_parent_cancel == "cancel" and child.status not in ended and not child.cancel_requested:
                    child.cancel_requested = True
                    if child.waiting_for is not None:
                        child.waiting_for, child.status = None, "pending"


async def run_family(app: App, root: MemoryInstance, *, max_rounds: int = 200) -> None:
    """Run ``root`` and the children it starts, as workers, the inbox and the scheduler
    would, until every one of them ended or waits for an event (timers fire at once)."""
    for _ in range(max_rounds):
        _settle_ends(root)
        runnable = [
            i for i in _family(root) if i.status in ("pending", "running", "compensating") and i.lease_token is None
        ]
        if not runnable:
            return
        for instance in runnable:
            await run_once(app, instance)
            if isinstance(instance.waiting_for, SuspendOnTimer):
                instance.fire_timer()
    raise AssertionError(f"{root.id} and its children did not come to rest in {max_rounds} rounds")


__all__ = [
    "MemoryEvent",
    "MemoryInstance",
    "MemoryPort",
    "MemoryStep",
    "child_end_payload",
    "contains",
    "run_family",
    "run_once",
    "run_until_rest",
]
