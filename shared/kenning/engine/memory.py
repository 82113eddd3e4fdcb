"""An in-memory ``InstancePort``: the engine without a database, for unit tests.

``MemoryInstance`` is one instance's stored state (what the tables would hold);
``MemoryPort`` is one run's lease on it, writing at once (no folding, no group commit).
``run_until_rest`` claims and runs an instance the way a worker would, resuming it after
timers and retry back-offs, until it waits for an event or ends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kenning.context import StepScope
from kenning.core.mailbox import Undelivered
from kenning.core.names import CHILD_STARTED, EVENT_RECEIVED, MESSAGE_RECEIVED, MESSAGE_TIMEOUT, TIMER_EXPIRED
from kenning.core.records import ClaimedInstance, CompensationRecord, HistoryRecord, OutboxEvent, SuspendOutcome
from kenning.engine.commands import (
    AttemptCounted,
    BeginCompensating,
    ChildStarted,
    Complete,
    CountAttempt,
    DroppedCompensation,
    FailSaga,
    Finish,
    MessageSent,
    Publish,
    ReceiveMessage,
    RecordHeartbeat,
    RecordStep,
    ReleaseWithDelay,
    SaveCompensation,
    SendMessage,
    StartChild,
    Subscribe,
    Suspend,
    SuspendOnEvent,
    SuspendOnTimer,
    WaitChild,
)
from kenning.engine.outcomes import RunOutcome
from kenning.errors import LeaseLostError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kenning.app import App


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
    # messages: this instance's mailboxes (every topic, in sending order), the receive it
    # waits in (status waiting_for_message), and the instances it may send to by id
    mailbox: list[MemoryMessage] = field(default_factory=list)
    receiving: ReceiveMessage | None = None
    channels: set[str] = field(default_factory=set)  # subscribed to (publish reaches it)
    peers: dict[str, MemoryInstance] = field(default_factory=dict)
    outbox: list[OutboxEvent] = field(default_factory=list)
    waiting_for: Suspend | WaitChild | None = None
    available_after: float = 0.0  # seconds of back-off asked for by the last release
    # every write in order, for tests that check what was written and when
    writes: list[str] = field(default_factory=list)
    # child workflows (start_child): the children this instance started, and its own parent
    children: list[MemoryInstance] = field(default_factory=list)
    parent_id: str | None = None
    parent_step: str | None = None
    on_parent_cancel: str | None = None

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

    def deliver_event(self, payload: dict[str, Any]) -> None:
        """What the inbox does for a waiting instance: record the event, make it runnable."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnEvent), f"{self.id} is not waiting for an event"
        self.append(waiting.step_id, EVENT_RECEIVED, waiting.step_name, payload)
        self.waiting_for, self.status = None, "pending"

    def fire_timer(self) -> None:
        """What the scheduler does when the timer is due."""
        waiting = self.waiting_for
        assert isinstance(waiting, SuspendOnTimer), f"{self.id} is not waiting for a timer"
        self.append(waiting.step_id, TIMER_EXPIRED, waiting.step_name, {})
        self.waiting_for, self.status = None, "pending"

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
            self.receiving, self.status = None, "pending"
        return None

    def time_out_receive(self) -> None:
        """What the scheduler does when a receive's timeout is due."""
        waiting = self.receiving
        assert waiting is not None, f"{self.id} is not waiting for a message"
        self.append(waiting.step_id, MESSAGE_TIMEOUT, waiting.step_name, {"topic": waiting.topic})
        self.receiving, self.status = None, "pending"


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
        self._clock = clock or asyncio.get_running_loop().time
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

    async def release(self, command: ReleaseWithDelay) -> None:
        self._fence(f"release after {command.delay:g} s")
        if self.instance.status == "running":
            self.instance.status = "pending"
        self.instance.lease_token = None
        self.instance.available_after = command.delay

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        self._fence(f"suspend at {command.step_id}")
        if self._cancel:
            return SuspendOutcome.CANCELLED
        self._save_compensations()
        self.instance.waiting_for = command
        self.instance.status = "waiting_for_timer" if isinstance(command, SuspendOnTimer) else "waiting_for_event"
        self.instance.lease_token = None
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
        self.instance.waiting_for = command
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
        self.instance.lease_token = None
        return SuspendOutcome.SUSPENDED


async def run_once(app: App, instance: MemoryInstance, *, inline_retry_seconds: float = 5.0) -> RunOutcome:
    """Claim ``instance`` and run it once, as a worker would."""
    from kenning.engine.run import WorkflowRun

    claimed = instance.claim()
    run = WorkflowRun(
        app=app,
        workflow=app.registry.workflow(instance.workflow_name),
        claimed=claimed,
        history=list(instance.history),
        compensations=list(instance.compensations),
        port=MemoryPort(instance, claimed.lease_token),
        inline_retry_seconds=inline_retry_seconds,
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
    "MemoryInstance",
    "MemoryPort",
    "MemoryStep",
    "child_end_payload",
    "run_family",
    "run_once",
    "run_until_rest",
]
