"""SQL for durable timers: registering one as an instance suspends.

The scheduler's side (firing due timers and event timeouts) lives here too: the timers
family covers every "wake this instance at time T".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.names import CHANNEL_INSTANCES, CHANNEL_TIMERS, EVENT_TIMEOUT, TIMER_EXPIRED
from kenning.core.records import FoldedWrites, SuspendOutcome
from kenning.db import Executor, Statement, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS, suspend_as
from kenning.storage.names import notify

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


def fired_waits(rows: Any) -> list[FiredWait]:
    """The rows of a ``fire_due_statement``."""
    return [
        FiredWait(
            instance_id=row.instance_id,
            workflow_name=row.workflow_name,
            step_id=row.step_id,
            due_at=row.due_at,
            fired_at=row.fired_at,
        )
        for row in rows
    ]


def fire_due_statement(
    *, waits: str, due: str, status: str, kind: str, detail: str | None = None, nullable: bool = False, also: str = ""
) -> Statement:
    """The scheduler's statement ending the due waits of the table ``waits`` (its rows
    keyed by instance and step, due at ``due``) of instances in ``status``: timers, event
    timeouts, receive timeouts. ``kind`` is the history record appended, its payload the
    ``detail`` column (what was waited for), ``due`` and ``fired_at``; ``nullable``: a
    wait may have no due time (the column's partial index leaves those out); ``also``:
    more conditions on the wait row ``w``.

    Due waits are claimed oldest first, skipping those whose wait or instance row another
    transaction holds (a cancel, another scheduler, the sender or event delivery that
    deletes the wait as this does): the scheduler never waits on a lock, so it cannot
    deadlock with them, and exactly one of them ends the wait. Only an instance still in
    ``status`` gets the record and is woken; any other wait row is an orphan and is just
    deleted. ``:now`` replaces the database clock (and ``fired_at``) in tests."""
    detail_column = f"w.{detail}, " if detail else ""
    detail_field = f"'{detail}', {detail}, " if detail else ""
    is_due = f"w.{due} IS NOT NULL AND w.{due} <= {NOW}" if nullable else f"w.{due} <= {NOW}"
    return statement(
        f"""
    WITH due AS (
        SELECT w.instance_id, w.step_id, w.step_name, {detail_column}w.{due}, i.workflow_name,
               i.status = '{status}' AS waiting
        FROM {waits} AS w
        JOIN kenning_instances AS i ON i.id = w.instance_id
        WHERE {is_due}{also}
        ORDER BY w.{due}, w.instance_id, w.step_id
        LIMIT :limit
        FOR UPDATE OF w, i SKIP LOCKED
    ), deleted AS (
        DELETE FROM {waits} AS w
        USING due
        WHERE w.instance_id = due.instance_id AND w.step_id = due.step_id
        RETURNING w.instance_id
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT instance_id, step_id, '{kind}', step_name,
               jsonb_build_object({detail_field}'{due}', {due},
                                  'fired_at', coalesce(CAST(:now AS timestamptz), clock_timestamp()))
        FROM (SELECT * FROM due WHERE waiting ORDER BY {due}, instance_id, step_id) AS ordered
        ON CONFLICT (instance_id, step_id) DO NOTHING
        RETURNING instance_id, step_id, CAST(payload ->> 'fired_at' AS timestamptz) AS fired_at
    ), woken AS (
        UPDATE kenning_instances AS i
        SET status = 'pending', available_at = now(), updated_at = now()
        WHERE i.id IN (SELECT instance_id FROM due WHERE waiting) AND i.status = '{status}'
        RETURNING i.id
    )
    SELECT due.instance_id, due.workflow_name, due.step_id, due.{due} AS due_at, recorded.fired_at,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM woken LIMIT 1) AS notified
    FROM due
    LEFT JOIN recorded ON recorded.instance_id = due.instance_id AND recorded.step_id = due.step_id
    ORDER BY due.{due}, due.instance_id, due.step_id
    """
    )


_TIMER_FIRE_DUE = fire_due_statement(
    waits="kenning_timers", due="due_at", status="waiting_for_timer", kind=TIMER_EXPIRED
)


async def timer_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredWait]:
    """Fire up to ``limit`` due timers, oldest first, in one statement: append
    ``TimerExpired`` (with ``due_at``, and ``fired_at`` = ``clock_timestamp()``) to
    history, delete the timers, make their instances runnable and wake the workers. Due
    means ``due_at`` at or before the database clock, so a timer never fires early.
    ``now`` replaces the clock (and ``fired_at``) in tests."""
    return fired_waits(await conn.execute(_TIMER_FIRE_DUE, {"limit": limit, "now": now}))


# wait_event timeouts: event delivery locks and deletes the subscription row as this does
_SUBSCRIPTION_TIMEOUT_FIRE_DUE = fire_due_statement(
    waits="kenning_event_subscriptions",
    due="timeout_at",
    nullable=True,
    status="waiting_for_event",
    kind=EVENT_TIMEOUT,
    detail="event_type",
    # with since=, an event already in the inbox beats the timeout: wait for the worker's
    # one-time catch-up check before timing the subscription out
    also=" AND (w.since IS NULL OR w.checked_at IS NOT NULL)",
)


async def subscription_timeout_fire_due(conn: Executor, *, limit: int, now: datetime | None = None) -> list[FiredWait]:
    """Time out up to ``limit`` ``wait_event`` subscriptions whose ``timeout_at`` has
    passed, oldest first: append ``EventTimeout``, delete the subscription, make the
    instance runnable and wake the workers, in one statement."""
    return fired_waits(await conn.execute(_SUBSCRIPTION_TIMEOUT_FIRE_DUE, {"limit": limit, "now": now}))


@dataclass(frozen=True)
class NextDue:
    now: datetime  # the database clock
    seconds: float | None  # until the earliest timer or event timeout; <= 0: one is due


_TIMER_NEXT_DUE = statement(
    f"""
    SELECT clock.now,
           extract(epoch FROM least(
               (SELECT min(due_at) FROM kenning_timers),
               (SELECT min(timeout_at) FROM kenning_event_subscriptions WHERE timeout_at IS NOT NULL),
               (SELECT min(timeout_at) FROM kenning_message_waits WHERE timeout_at IS NOT NULL)
           ) - clock.now) AS seconds_until_next
    FROM (SELECT {NOW} AS now) AS clock
    """
)


async def timer_next_due(conn: Executor, now: datetime | None = None) -> NextDue:
    """The database clock and the seconds until the next timer, event timeout or receive
    timeout is due."""
    row = (await conn.execute(_TIMER_NEXT_DUE, {"now": now})).one()
    return NextDue(now=row.now, seconds=seconds_or_none(row.seconds_until_next))
