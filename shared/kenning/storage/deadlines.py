"""SQL for workflow timeouts (``@workflow(timeout=...)``, migration 0010): the scheduler
fires due deadlines, the engine asks whether a cancellation it saw was one.

Firing a deadline is a cancellation request with its reason on the row (the deadline has
passed): the same flag, wake and unregistered waits as ``kenning instances cancel``, so
the worker compensates it as it would a cancel, and then ends it ``failed`` with
``WorkflowTimeoutError`` instead of ``cancelled`` (``instance_deadline_passed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kenning.core.names import CHANNEL_INSTANCES
from kenning.db import Executor, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.names import notify

# The partial index kenning_instances_deadline's predicate, repeated so the planner uses it.
_UNFINISHED_WITH_DEADLINE = "deadline_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')"


@dataclass(frozen=True)
class FiredDeadline:
    instance_id: str
    workflow_name: str
    deadline_at: datetime
    lateness_seconds: float  # how long after its deadline it fired


_DEADLINE_FIRE_DUE = statement(
    f"""
    WITH due AS (
        -- never early; a saga already undoing (compensating) runs to its end undisturbed
        SELECT id FROM kenning_instances
        WHERE {_UNFINISHED_WITH_DEADLINE}
          AND deadline_at <= {NOW} AND status <> 'compensating' AND NOT cancel_requested
        ORDER BY deadline_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), flagged AS (
        -- as a cancel request: a waiting or pending instance becomes runnable now; a
        -- leased one sees the flag with its next fenced write
        UPDATE kenning_instances AS i
        SET cancel_requested = true,
            status = CASE WHEN i.status IN ('waiting_for_event', 'waiting_for_timer', 'waiting_for_message')
                              THEN 'pending'
                          ELSE i.status END,
            available_at = CASE WHEN i.lease_token IS NULL THEN now() ELSE i.available_at END,
            updated_at = now()
        FROM due
        WHERE i.id = due.id
        RETURNING i.id, i.workflow_name, i.deadline_at
    ), unsubscribed AS (
        DELETE FROM kenning_event_subscriptions WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    ), untimed AS (
        DELETE FROM kenning_timers WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    ), unwaited AS (
        DELETE FROM kenning_message_waits WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    )
    SELECT f.id, f.workflow_name, f.deadline_at,
           extract(epoch FROM {NOW} - f.deadline_at) AS lateness_seconds,
           (SELECT {notify(CHANNEL_INSTANCES)}) AS notified
    FROM flagged AS f
    """
)


async def deadline_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredDeadline]:
    """Request the cancellation of up to ``limit`` instances whose deadline has passed, in
    one statement, and wake the workers."""
    rows = await conn.execute(_DEADLINE_FIRE_DUE, {"limit": limit, "now": now})
    return [
        FiredDeadline(
            instance_id=row.id,
            workflow_name=row.workflow_name,
            deadline_at=row.deadline_at,
            lateness_seconds=max(float(row.lateness_seconds), 0.0),
        )
        for row in rows
    ]


_DEADLINE_NEXT_DUE = statement(
    f"""
    SELECT extract(epoch FROM min(deadline_at) - {NOW}) AS seconds_until_next
    FROM kenning_instances
    WHERE {_UNFINISHED_WITH_DEADLINE} AND status <> 'compensating' AND NOT cancel_requested
    """
)


async def deadline_next_due(conn: Executor, now: datetime | None = None) -> float | None:
    """Seconds until the earliest deadline that is still to fire (negative: overdue), or None."""
    row = (await conn.execute(_DEADLINE_NEXT_DUE, {"now": now})).one()
    return seconds_or_none(row.seconds_until_next)


_DEADLINE_PASSED = statement(
    """
    SELECT deadline_at FROM kenning_instances
    WHERE id = :id AND deadline_at <= now()
    """
)


async def instance_deadline_passed(conn: Executor, instance_id: str) -> datetime | None:
    """The instance's deadline if it has passed on the database clock, else None: read
    only when the engine sees a cancellation, to tell a timeout from an operator's cancel."""
    row = (await conn.execute(_DEADLINE_PASSED, {"id": instance_id})).first()
    return None if row is None else row.deadline_at
