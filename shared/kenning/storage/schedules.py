"""SQL for scheduled (cron) workflows: starting the instance of one tick.

Exactly once per tick comes from the instances' unique ``(workflow_name,
idempotency_key)`` index: every scheduler inserts the same key for the same tick and all
but one insert do nothing. No table of its own.
"""

from __future__ import annotations

import enum
from datetime import datetime

from kenning.db import Connection, executor, statement
from kenning.storage.names import CHANNEL_INSTANCES, notify


class TickOutcome(enum.Enum):
    STARTED = "started"  # this call inserted the tick's instance
    EXISTS = "exists"  # another scheduler (or an earlier call) already had
    BEFORE_SCHEDULE = "before_schedule"  # the tick predates the workflow's first sighting


# A tick is started only if it is not older than the workflow's first definition row:
# a schedule deployed at 15:00 does not start the 00:00 tick of that day, while a tick
# missed because every scheduler was down is started when one comes back.
_SCHEDULE_START_TICK = statement(
    f"""
    WITH first_seen AS (
        SELECT min(created_at) AS at FROM kenning_workflow_definitions WHERE workflow_name = :name
    ), inserted AS (
        INSERT INTO kenning_instances (id, workflow_name, source_hash, input, idempotency_key, available_at)
        SELECT :id, :name, :hash, '{{}}', :key, now()
        FROM first_seen
        WHERE first_seen.at <= CAST(:tick AS timestamptz)
        ON CONFLICT DO NOTHING
        RETURNING id
    )
    SELECT (SELECT count(*) FROM inserted) > 0 AS started,
           coalesce(first_seen.at <= CAST(:tick AS timestamptz), false) AS in_schedule,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM inserted) AS notified
    FROM first_seen
    """
)


async def schedule_start_tick(
    conn: Connection,
    *,
    instance_id: str,
    workflow_name: str,
    source_hash: str,
    tick: datetime,
    idempotency_key: str,
) -> TickOutcome:
    """Insert the runnable instance of ``tick`` unless it exists, and wake the workers.

    The workflow's definition must have been recorded (``definitions.definitions_register``) first: its
    earliest ``created_at`` is when the schedule was first seen.
    """
    conn = executor(conn)
    row = (
        await conn.execute(
            _SCHEDULE_START_TICK,
            {"id": instance_id, "name": workflow_name, "hash": source_hash, "tick": tick, "key": idempotency_key},
        )
    ).one()
    if row.started:
        return TickOutcome.STARTED
    return TickOutcome.EXISTS if row.in_schedule else TickOutcome.BEFORE_SCHEDULE
