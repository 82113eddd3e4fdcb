"""The commands the engine issues to its ``InstancePort``: what to make durable, never how.

Each is a frozen record; the port decides how it reaches storage (which statement, what
it folds together, whether it is group-committed). Step records and compensations may
be held back and folded into the next write; every other command is a resting point or
a decision that is written before the engine goes on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.mailbox import Undelivered
from kenning.core.records import CompensationRecord
from kenning.engine.history import StepRecord


@dataclass(frozen=True)
class RecordStep:
    """Record a finished step. ``defer``: the port may hold it back and write it with the
    next write (a completion or a suspend folds it into its own statement)."""

    record: StepRecord
    defer: bool = True
    what: str = ""  # names the value in an UnstorableValueError


@dataclass(frozen=True)
class SaveCompensation:
    """Keep a compensation registered by the workflow; saved with the next write."""

    record: CompensationRecord


@dataclass(frozen=True)
class CountAttempt:
    """Count a failed attempt of ``step_id`` on the instance (durable across runs)."""

    step_id: str
    attempt: int
    error: Any  # the error's text, sealed (kenning.codecs): an envelope when keys are set


@dataclass(frozen=True)
class RecordHeartbeat:
    """Keep an activity attempt's last heartbeat details on the instance (beside its
    counted attempts), for the step's next attempt; not a step, never folded."""

    step_id: str
    details: Any  # JSON values, checked storable


@dataclass(frozen=True)
class AttemptCounted:
    """The port's answer to ``CountAttempt``."""

    seconds_since_first_failure: float
    cancel_requested: bool


@dataclass(frozen=True)
class ReleaseWithDelay:
    """Give the lease back; the instance is claimable again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class SuspendOnTimer:
    """Register a timer (``due_at``, or ``delay_seconds`` on the database clock) and give
    the lease back, unless cancellation was requested."""

    step_id: str
    step_name: str
    due_at: datetime | None
    delay_seconds: float | None


@dataclass(frozen=True)
class SuspendOnEvent:
    """Subscribe to an event type and give the lease back, unless cancellation was requested."""

    step_id: str
    step_name: str
    event_type: str
    match: Any  # JSON containment filter on the event's data, or None
    since_at: datetime | None
    since_seconds: float | None
    timeout_seconds: float | None


Suspend = SuspendOnTimer | SuspendOnEvent


@dataclass(frozen=True)
class StartChild:
    """Start a child instance and record the parent's step naming it, in one transaction
    (with what is held back), unless cancellation was requested."""

    step_id: str
    step_name: str
    child_id: str
    workflow_name: str
    source_hash: str
    input: dict[str, Any]
    on_parent_cancel: str  # 'cancel' or 'abandon'
    trace_context: dict[str, str] | None = None
    # the queue its claim takes it from (kenning/queues.py), as prepare_start chose them
    queue_name: str | None = None
    partition_key: str | None = None
    priority: int = 0
    timeout_seconds: float | None = None  # its workflow timeout: the child's deadline, from its insert
    search_attributes: dict[str, Any] | None = None  # declared keys set with the child's row
    # its workflow is @workflow(versioning="pinned"): it starts on its parent's pinned version
    pinned: bool = False


@dataclass(frozen=True)
class ChildStarted:
    """The port's answer to ``StartChild``."""

    recorded: bool  # the step names the child (started now, or this parent's already)
    cancel_requested: bool  # nothing was written
    taken_by: str | None = None  # not recorded: the explicit id is another parent's ('' : no parent's)


@dataclass(frozen=True)
class WaitChild:
    """Take the child's end if it has ended (recorded at ``step_id``, lease kept); else
    wait for it and give the lease back, unless cancellation was requested."""

    step_id: str
    step_name: str
    child_id: str


@dataclass(frozen=True)
class Complete:
    """End the instance ``completed`` with its result (``{"result": ...}``)."""

    result: dict[str, Any]
    what: str = ""


@dataclass(frozen=True)
class BeginCompensating:
    """Make the instance ``compensating``, keeping the workflow's error (None: resume)."""

    error: dict[str, Any] | None


@dataclass(frozen=True)
class DroppedCompensation:
    """A compensation the database refused to store: never run, named in the saga's error."""

    record: CompensationRecord
    reason: str


class FinalStatus(enum.Enum):
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Finish:
    """End the instance ``failed`` or ``cancelled``; ``error`` None keeps the stored one."""

    status: FinalStatus
    error: dict[str, Any] | None


@dataclass(frozen=True)
class FailSaga:
    """End the instance ``failed`` because compensations failed (the workflow's own error
    is kept inside ``error``)."""

    error: dict[str, Any]


@dataclass(frozen=True)
class SendMessage:
    """Put a message into ``instance_id``'s ``topic`` mailbox and write ``record`` (the
    sending step), in one transaction: both or neither (kenning/messages.py)."""

    record: StepRecord
    instance_id: str  # the recipient
    topic: str
    message_id: str  # a message id sent to this recipient before is not sent again
    data: Any  # JSON already


@dataclass(frozen=True)
class MessageSent:
    """The port's answer to ``SendMessage``: ``refused`` None means in the mailbox (now,
    or before with the same id) and the step recorded; else nothing was written."""

    refused: Undelivered | None
    recipient_status: str | None = None


@dataclass(frozen=True)
class ReceiveMessage:
    """Take the oldest message of the instance's ``topic`` mailbox, recorded at ``step_id``
    in the same transaction (lease kept); with none there, wait for one (a
    ``MessageTimeout`` after ``timeout_seconds``) and give the lease back, unless
    cancellation was requested."""

    step_id: str
    step_name: str
    topic: str
    timeout_seconds: float | None


@dataclass(frozen=True)
class Subscribe:
    """Subscribe the instance to ``channel`` and write ``record``, in one transaction."""

    record: StepRecord
    channel: str


@dataclass(frozen=True)
class Publish:
    """Put the message into the ``channel`` mailbox of every instance subscribed to it and
    write ``record`` with ``subscribers`` (how many it reached) added to its payload, in one
    transaction; the port answers that count."""

    record: StepRecord
    channel: str
    message_id: str  # the same id in every copy: each recipient gets it once
    data: Any  # JSON already


@dataclass(frozen=True)
class ReplyMessage:
    """Store the reply to the instance's message ``message_id`` (a ``Client.request``) and
    write ``record`` (the replying step), in one transaction; a message replied to before
    keeps its first reply and nothing is written (the port answers False)."""

    record: StepRecord
    message_id: str
    value: Any  # JSON already; None with an error
    error: str | None  # the workflow's reason for refusing (reply_error), else None


@dataclass(frozen=True)
class PublishValue:
    """Write ``value`` as the instance's latest of ``key`` (and, ``searchable``, its
    search text ``search_value``; None removes it) and ``record``, in one transaction."""

    record: StepRecord
    key: str
    value: Any  # JSON already
    searchable: bool
    search_value: str | None


@dataclass(frozen=True)
class WriteStream:
    """Append ``value`` to the instance's stream ``key``. From workflow code ``record`` is
    the step's record, written in the entry's transaction (its payload gets the offset:
    replay returns it and writes nothing); from an activity or compensation ``record`` is
    None and the entry commits at once on its own, carrying ``attempt`` of ``step_id``.
    ``publish``: the entry also goes out through the outbox, in the same transaction."""

    key: str
    value: Any  # JSON already
    record: StepRecord | None
    step_id: str | None = None
    attempt: int = 0
    publish: bool = False


@dataclass(frozen=True)
class CloseStream:
    """Close the instance's stream ``key``; from workflow code with ``record``, in one
    transaction, from an activity (``record`` None) at once."""

    key: str
    record: StepRecord | None


@dataclass(frozen=True)
class ContinueAsNew:
    """End this run and make the next one of the same instance, in one transaction: a
    summary of the run kept in the chain, its history and compensations dropped, the
    step bookkeeping reset, ``input`` (JSON, checked) the new run's; the instance stays
    runnable, its lease kept. Nothing is written when cancellation was requested."""

    input: dict[str, Any]
