"""What an in-memory instance stores, and the rules other processes apply to it.

``MemoryInstance`` is one instance as the tables would hold it (its history, waits,
mailbox, streams, children); ``kenning.testing.memoryport`` leases it to a run.

Waits keep what the database keeps of them, on the port's clock (epoch seconds; a
virtual one in ``kenning.testing``): a timer's due time, an event's or a receive's
timeout, a back-off's end, a subscription's ``match`` and ``since`` window. ``takes``
applies the delivery statement's rules (``kenning.storage.subscriptions``) and
``fire_due`` the scheduler's, so the harness built on it delivers and times out
exactly as production does.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kenning.core.mailbox import Undelivered
from kenning.core.names import (
    EVENT_RECEIVED,
    EVENT_TIMEOUT,
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
)
from kenning.core.streams import (
    StreamEntry,
)
from kenning.engine.commands import (
    ReceiveMessage,
    Suspend,
    SuspendOnEvent,
    SuspendOnTimer,
    WaitChild,
)

if TYPE_CHECKING:
    pass

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


def child_end_payload(child: MemoryInstance) -> dict[str, Any]:
    """The ``EventReceived`` payload of a child's end, as kenning.storage.children writes it."""
    data = {
        "child_id": child.id,
        "status": child.status,
        "result": (child.result or {}).get("result"),
        "error": child.error,
    }
    return {"type": "kenning.child.finished", "source": "kenning.children", "id": child.id, "data": data}


def family(root: MemoryInstance) -> list[MemoryInstance]:
    """``root`` and its descendants, parents before their children."""
    found = [root]
    for instance in found:
        found.extend(instance.children)
    return found


def settle_ends(root: MemoryInstance) -> None:
    """What the finishing statements' ``tell_parents`` and the inbox do: an ended child
    wakes its waiting parent; an ended parent asks its unfinished ``cancel`` children to cancel."""
    ended = ("completed", "failed", "cancelled")
    for parent in family(root):
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


__all__ = [
    "MemoryEvent",
    "MemoryInstance",
    "MemoryMessage",
    "MemoryStream",
    "child_end_payload",
    "contains",
    "family",
    "iso",
    "settle_ends",
    "stamp",
]
