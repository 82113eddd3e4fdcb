"""SQL for durable timers: registering one as an instance suspends.

The scheduler's side (firing due timers and event timeouts) lives here too: the timers
family covers every "wake this instance at time T".
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from kenning.storage.records import SuspendOutcome

_TIMER_REGISTER_AND_SUSPEND = text(
    """
    WITH fence AS (
        SELECT id, cancel_requested FROM kenning_instances
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    ), suspended AS (
        UPDATE kenning_instances AS i
        SET status = 'waiting_for_timer', lease_token = NULL, lease_owner = NULL, available_at = NULL,
            updated_at = now()
        FROM fence
        WHERE i.id = fence.id AND NOT fence.cancel_requested
        RETURNING i.id
    ), registered AS (
        INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at)
        SELECT id, :step_id, :step_name,
               coalesce(CAST(:due_at AS timestamptz), now() + make_interval(secs => CAST(:delay AS float8)))
        FROM suspended
        RETURNING due_at
    )
    SELECT fence.cancel_requested,
           (SELECT pg_notify('kenning_timers', '') IS NULL FROM registered)
    FROM fence
    """
)


async def timer_register_and_suspend(
    conn: AsyncConnection,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    due_at: datetime | None = None,
    delay_seconds: float | None = None,
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
            },
        )
    ).first()
    if row is None:
        return SuspendOutcome.LEASE_LOST
    return SuspendOutcome.CANCELLED if row[0] else SuspendOutcome.SUSPENDED
