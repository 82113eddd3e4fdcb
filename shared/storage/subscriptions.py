"""SQL for event subscriptions: an instance waiting in ``wait_event``.

Registering a subscription and releasing the lease are one fenced statement (design
invariant 3). Delivery and timeouts both lock the subscription row and delete it in the
transaction that records the outcome, so exactly one of them wins.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from kenning.storage.records import SuspendOutcome

_SUBSCRIPTION_REGISTER_AND_SUSPEND = text(
    """
    WITH fence AS (
        SELECT id, cancel_requested FROM kenning_instances
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    ), suspended AS (
        UPDATE kenning_instances AS i
        SET status = 'waiting_for_event', lease_token = NULL, lease_owner = NULL, available_at = NULL,
            updated_at = now()
        FROM fence
        WHERE i.id = fence.id AND NOT fence.cancel_requested
        RETURNING i.id
    ), registered AS (
        INSERT INTO kenning_event_subscriptions
            (instance_id, step_id, step_name, event_type, match, since, timeout_at)
        SELECT id, :step_id, :step_name, :event_type, CAST(:match AS jsonb),
               coalesce(CAST(:since_at AS timestamptz),
                        now() - make_interval(secs => CAST(:since_seconds AS float8))),
               now() + make_interval(secs => CAST(:timeout_seconds AS float8))
        FROM suspended
        RETURNING timeout_at
    )
    SELECT fence.cancel_requested,
           (SELECT pg_notify('kenning_timers', '') IS NULL FROM registered WHERE timeout_at IS NOT NULL),
           (SELECT pg_notify('kenning_subscriptions', '') IS NULL FROM registered)
    FROM fence
    """
)


async def subscription_register_and_suspend(
    conn: AsyncConnection,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    event_type: str,
    match: dict[str, Any] | None,
    since_at: datetime | None,
    since_seconds: float | None,
    timeout_seconds: float | None,
) -> SuspendOutcome:
    """Subscribe to ``event_type`` (optionally only events whose data matches ``match``,
    and also those received since ``since_*``), time out after ``timeout_seconds`` on the
    database clock, and release the lease, in one fenced statement."""
    row = (
        await conn.execute(
            _SUBSCRIPTION_REGISTER_AND_SUSPEND,
            {
                "id": instance_id,
                "token": token,
                "step_id": step_id,
                "step_name": step_name,
                "event_type": event_type,
                "match": json.dumps(match) if match is not None else None,
                "since_at": since_at,
                "since_seconds": since_seconds,
                "timeout_seconds": timeout_seconds,
            },
        )
    ).first()
    if row is None:
        return SuspendOutcome.LEASE_LOST
    return SuspendOutcome.CANCELLED if row[0] else SuspendOutcome.SUSPENDED
