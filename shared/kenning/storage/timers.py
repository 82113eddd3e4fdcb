"""SQL for durable timers: registering one as an instance suspends.

The scheduler's side (firing due timers and event timeouts) lives here too: the timers
family covers every "wake this instance at time T".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.db import Executor, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS, suspend_as
from kenning.storage.names import CHANNEL_INSTANCES, CHANNEL_TIMERS, EVENT_TIMEOUT, TIMER_EXPIRED, notify
from kenning.storage.records import FoldedWrites, SuspendOutcome

_TIMER_REGISTER_AND_SUSPEND = statement(
    f"""
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, {suspend_as("waiting_for_timer")}, registered AS (
        INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at)
        SELECT id, :step_id, :step_name,
               coalesce(CAST(:due_at AS timestamptz), now() + make_interval(secs => CAST(:delay AS float8)))
        FROM suspended
        RETURNING due_at
    )
    SELECT fence.cancel_requested,
           (SELECT {notify(CHANNEL_TIMERS)} FROM registered) AS notified
    FROM fence
    """
)


async def timer_register_and_suspend(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    due_at: datetime | None = None,
    delay_seconds: float | None = None,
    folded: FoldedWrites | None = None,
) -> SuspendOutcome:
    """Register a timer due at ``due_at``, or ``delay_seconds`` from now on the database
    clock, and release the lease, in one fenced statement; wakes the scheduler."""
    row = (
        await conn.execute(
            _TIMER_REGISTER_AND_SUSPEND,
            {
                "id": instance_id,
                "token": token,
                "step_id": step_id,
                "step_name": step_name,
                "due_at": due_at,
                "delay": delay_seconds,
                **(folded or FoldedWrites()).params(),
            },
        )
    ).first()
    if row is None:
        return SuspendOutcome.LEASE_LOST
    return SuspendOutcome.CANCELLED if row.cancel_requested else SuspendOutcome.SUSPENDED


# ---------------------------------------------------------------------- the scheduler's side


@dataclass(frozen=True)
class FiredWait:
    """One timer or event timeout the scheduler fired (or discarded)."""

    instance_id: str
    workflow_name: str
    step_id: str
    due_at: datetime
    fired_at: datetime | None  # None: discarded, the instance was no longer waiting for it


def _fired_wait(row: Any) -> FiredWait:
    return FiredWait(
        instance_id=row.instance_id,
        workflow_name=row.workflow_name,
        step_id=row.step_id,
        due_at=row.due_at,
        fired_at=row.fired_at,
    )


# Claim due timers oldest first, skipping those whose timer or instance row another
# transaction holds (a cancel, another scheduler): the scheduler never waits on a lock,
# so it cannot deadlock with them. Only an instance still waiting for its timer gets
# TimerExpired and is woken; any other timer row is an orphan and is just deleted.
_TIMER_FIRE_DUE = statement(
    f"""
    WITH due AS (
        SELECT t.instance_id, t.step_id, t.step_name, t.due_at, i.workflow_name,
               i.status = 'waiting_for_timer' AS waiting
        FROM kenning_timers AS t
        JOIN kenning_instances AS i ON i.id = t.instance_id
        WHERE t.due_at <= {NOW}
        ORDER BY t.due_at, t.instance_id, t.step_id
        LIMIT :limit
        FOR UPDATE OF t, i SKIP LOCKED
    ), deleted AS (
        DELETE FROM kenning_timers AS t
        USING due
        WHERE t.instance_id = due.instance_id AND t.step_id = due.step_id
        RETURNING t.instance_id
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT instance_id, step_id, '{TIMER_EXPIRED}', step_name,
               jsonb_build_object('due_at', due_at, 'fired_at', coalesce(CAST(:now AS timestamptz), clock_timestamp()))
        FROM (SELECT * FROM due WHERE waiting ORDER BY due_at, instance_id, step_id) AS ordered
        ON CONFLICT (instance_id, step_id) DO NOTHING
        RETURNING instance_id, step_id, CAST(payload ->> 'fired_at' AS timestamptz) AS fired_at
    ), woken AS (
        UPDATE kenning_instances AS i
        SET status = 'pending', available_at = now(), updated_at = now()
        WHERE i.id IN (SELECT instance_id FROM due WHERE waiting) AND i.status = 'waiting_for_timer'
        RETURNING i.id
    )
    SELECT due.instance_id, due.workflow_name, due.step_id, due.due_at, recorded.fired_at,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM woken LIMIT 1) AS notified
    FROM due
    LEFT JOIN recorded ON recorded.instance_id = due.instance_id AND recorded.step_id = due.step_id
    ORDER BY due.due_at, due.instance_id, due.step_id
    """
)


async def timer_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredWait]:
    """Fire up to ``limit`` due timers, oldest first, in one statement: append
    ``TimerExpired`` (with ``due_at``, and ``fired_at`` = ``clock_timestamp()``) to
    history, delete the timers, make their instances runnable and wake the workers. Due
    means ``due_at`` at or before the database clock, so a timer never fires early.
    ``now`` replaces the clock (and ``fired_at``) in tests."""
    result = await conn.execute(_TIMER_FIRE_DUE, {"limit": limit, "now": now})
    return [_fired_wait(row) for row in result]


# The same for wait_event timeouts. The subscription row is locked (SKIP LOCKED) and
# deleted here as event delivery locks and deletes it, so exactly one of them wins.
_SUBSCRIPTION_TIMEOUT_FIRE_DUE = statement(
    f"""
    WITH due AS (
        SELECT s.instance_id, s.step_id, s.step_name, s.event_type, s.timeout_at, i.workflow_name,
               i.status = 'waiting_for_event' AS waiting
        FROM kenning_event_subscriptions AS s
        JOIN kenning_instances AS i ON i.id = s.instance_id
        WHERE s.timeout_at IS NOT NULL AND s.timeout_at <= {NOW}
          -- with since=, an event already in the inbox beats the timeout: wait for the
          -- worker's one-time catch-up check before timing the subscription out
          AND (s.since IS NULL OR s.checked_at IS NOT NULL)
        ORDER BY s.timeout_at, s.instance_id, s.step_id
        LIMIT :limit
        FOR UPDATE OF s, i SKIP LOCKED
    ), deleted AS (
        DELETE FROM kenning_event_subscriptions AS s
        USING due
        WHERE s.instance_id = due.instance_id AND s.step_id = due.step_id
        RETURNING s.instance_id
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT instance_id, step_id, '{EVENT_TIMEOUT}', step_name,
               jsonb_build_object('event_type', event_type, 'timeout_at', timeout_at,
                                  'fired_at', coalesce(CAST(:now AS timestamptz), clock_timestamp()))
        FROM (SELECT * FROM due WHERE waiting ORDER BY timeout_at, instance_id, step_id) AS ordered
        ON CONFLICT (instance_id, step_id) DO NOTHING
        RETURNING instance_id, step_id, CAST(payload ->> 'fired_at' AS timestamptz) AS fired_at
    ), woken AS (
        UPDATE kenning_instances AS i
        SET status = 'pending', available_at = now(), updated_at = now()
        WHERE i.id IN (SELECT instance_id FROM due WHERE waiting) AND i.status = 'waiting_for_event'
        RETURNING i.id
    )
    SELECT due.instance_id, due.workflow_name, due.step_id, due.timeout_at AS due_at, recorded.fired_at,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM woken LIMIT 1) AS notified
    FROM due
    LEFT JOIN recorded ON recorded.instance_id = due.instance_id AND recorded.step_id = due.step_id
    ORDER BY due.timeout_at, due.instance_id, due.step_id
    """
)


async def subscription_timeout_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredWait]:
    """Time out up to ``limit`` ``wait_event`` subscriptions whose ``timeout_at`` has
    passed, oldest first: append ``EventTimeout``, delete the subscription, make the
    instance runnable and wake the workers, in one statement."""
    result = await conn.execute(_SUBSCRIPTION_TIMEOUT_FIRE_DUE, {"limit": limit, "now": now})
    return [_fired_wait(row) for row in result]


@dataclass(frozen=True)
class NextDue:
    now: datetime  # the database clock
    seconds: float | None  # until the earliest timer or event timeout; <= 0: one is due


_TIMER_NEXT_DUE = statement(
    f"""
    SELECT clock.now,
           extract(epoch FROM least(
               (SELECT min(due_at) FROM kenning_timers),
               (SELECT min(timeout_at) FROM kenning_event_subscriptions WHERE timeout_at IS NOT NULL)
           ) - clock.now) AS seconds_until_next
    FROM (SELECT {NOW} AS now) AS clock
    """
)


async def timer_next_due(conn: Executor, now: datetime | None = None) -> NextDue:
    """The database clock and the seconds until the next timer or event timeout is due."""
    row = (await conn.execute(_TIMER_NEXT_DUE, {"now": now})).one()
    return NextDue(now=row.now, seconds=seconds_or_none(row.seconds_until_next))
