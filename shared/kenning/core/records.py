"""Plain records the storage functions return (no ORM objects leave the storage package)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ClaimedInstance:
    id: str
    workflow_name: str
    status: str
    input: dict[str, Any]
    cancel_requested: bool
    lease_token: str
    run_count: int
    attempts: dict[str, Any]
    # its previous run did not end cleanly (the lease expired, the run raised): taken over
    taken_over: bool = False
    # taken over, and an earlier run died so too: the worker runs it apart from other such
    # instances, so one that kills its process takes no other down with it
    suspect: bool = False
    # the trace it continues (kenning.observability.tracing): its start's, or the delivery's that woke it
    trace_context: dict[str, str] | None = None
    # its input could not be opened here (kenning.codecs: a key this worker lacks): the
    # one-line reason; the run does not start, and the instance is released, not failed
    unreadable: str | None = None


@dataclass(frozen=True)
class ParkedInstance:
    """An instance the claim parked as failed (``crash_loop``) instead of handing it out."""

    id: str
    workflow_name: str
    run_count: int
    runs_without_progress: int


@dataclass(frozen=True)
class HistoryRecord:
    step_id: str
    kind: str
    step_name: str
    payload: Any
    payload_bytes: bytes | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class CompensationRecord:
    comp_id: str
    position: int
    function_name: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    retry_policy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "comp_id": self.comp_id,
            "position": self.position,
            "function_name": self.function_name,
            "args": self.args,
            "kwargs": self.kwargs,
            "retry_policy": self.retry_policy,
        }


@dataclass(frozen=True)
class InstanceRow:
    id: str
    workflow_name: str
    status: str
    input: dict[str, Any]
    result: Any
    error: dict[str, Any] | None
    cancel_requested: bool
    lease_owner: str | None
    available_at: datetime | None
    run_count: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    source_hash: str = ""
    idempotency_key: str | None = None
    runs_without_progress: int = 0  # consecutive runs that died without a step (crash loop)
    run: int = 1  # continue_as_new: the run of its chain in progress (or the last)
    forked_from: str | None = None  # a fork's original (kenning instances fork)
    forked_from_step: int | None = None  # the original's step it was forked at, numbered from 1
    # @workflow(versioning="pinned"): the code version it runs on (None: any, or not claimed yet)
    pinned_version: str | None = None


# Every status an instance can have (the table's CHECK, migrations 0001 and 0005), in
# the order of a run: what the CLI offers and the console lists and counts.
INSTANCE_STATUSES = (
    "pending",
    "running",
    "waiting_for_event",
    "waiting_for_timer",
    "waiting_for_message",
    "compensating",
    "completed",
    "failed",
    "cancelled",
)
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
WAITING_STATUSES = frozenset({"waiting_for_event", "waiting_for_timer", "waiting_for_message"})


class SuspendOutcome(enum.Enum):
    """What a fenced suspend statement did."""

    SUSPENDED = "suspended"  # registered what it waits for and released the lease
    CANCELLED = "cancelled"  # cancellation was requested: nothing registered, lease kept
    LEASE_LOST = "lease_lost"  # another worker holds the instance: nothing written


@dataclass(frozen=True)
class FoldedWrites:
    """What a fenced statement writes on the side: the step recorded just before it (a
    suspend or completion after an activity) and compensations registered since."""

    pending_steps: list[dict[str, Any]] = field(default_factory=list)
    compensations: list[dict[str, Any]] = field(default_factory=list)

    def params(self) -> dict[str, str]:
        return {"pending_step": json.dumps(self.pending_steps), "compensations": json.dumps(self.compensations)}


@dataclass(frozen=True)
class NewInstance:
    instance_id: str
    workflow_name: str
    source_hash: str
    input_json: dict[str, Any]
    idempotency_key: str | None = None
    # only if the workflow's first definition row is not younger (a cron tick: schedules.py)
    not_before: datetime | None = None
    trace_context: dict[str, str] | None = None  # the starter's (kenning.observability.tracing)
    # the queue it is claimed from under that queue's limits (kenning/queues.py), if any
    queue_name: str | None = None
    partition_key: str | None = None
    priority: int = 0
    # its workflow timeout: the deadline is this many seconds after the insert (database clock)
    timeout_seconds: float | None = None
    # declared search attributes set by the start (key -> str, int, float or bool), written
    # with the row as a publish_value of each would write them
    search_attributes: dict[str, Any] | None = None
    # seconds from the insert until it may be claimed (a debounced burst's or a batch's due time)
    delay_seconds: float | None = None


class StartOutcome(enum.Enum):
    STARTED = "started"  # this insert made the instance
    EXISTS = "exists"  # its id, or its workflow and idempotency key, exist already
    BEFORE_SCHEDULE = "before_schedule"  # not_before predates the workflow's first sighting
    # a queue's partition strategy decided it (kenning/storage/strategies.py):
    CANCELLED = "cancelled"  # inserted and ended at once, its key at its limit (cancel_newest)
    JOINED = "joined"  # not inserted: its singleton key's open instance is the start's


@dataclass(frozen=True)
class Definition:
    workflow_name: str
    source_hash: str
    source: str
    # @workflow(retention=...): finished instances are deleted this long after they end
    # (kenning/storage/retention.py); None: the scheduler's default
    retention_seconds: float | None = None


@dataclass(frozen=True)
class StoredEvent:
    """An inbox row's CloudEvent as a worker reads it."""

    inbox_id: int
    source: str
    event_id: str
    event_type: str
    instance_id: str | None
    attributes: dict[str, Any]
    data: Any
    data_bytes: bytes | None
    received_at: datetime


@dataclass(frozen=True)
class MetricsRow:
    """One group of the snapshot (see ``_METRICS_SNAPSHOT``)."""

    area: str
    workflow: str
    status: str
    total: int
    due: int
    oldest_seconds: float | None
    retrying: int
    leased: int


@dataclass(frozen=True)
class OutboxEvent:
    """An event ``send_event_transactional`` writes in a step's transaction."""

    event_id: str
    instance_id: str
    event_type: str
    source: str
    subject: str | None
    content_type: str | None
    data_json: str | None
    data_bytes: bytes | None
    extensions: dict[str, Any]
