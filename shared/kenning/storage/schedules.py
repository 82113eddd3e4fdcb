"""SQL for cron schedules: their rows (``kenning_schedules``), a tick's decision, the
operator's pause, resume, trigger and backfill.

Every scheduler declares the schedules of its workflows (expression, time zone, overlap
policy); an operator's pause stays across declarations. A tick is decided in one short
transaction per schedule: the schedule's row is locked (``schedule_lock``), so schedulers
decide its ticks one at a time, and ``last_tick`` says which ticks are decided (started,
or skipped: paused, overlapping, before the schedule was first seen). Exactly once per
tick still rests on the instances' unique ``(workflow_name, idempotency_key)`` index: the
tick's instance has the same key whoever inserts it. ``last_instance_id`` names the
instance the schedule started last: the overlap policy reads that one row by its key.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kenning.core.records import TERMINAL_STATUSES
from kenning.db import Executor, statement
from kenning.storage.clock import NOW


class TickOutcome(enum.Enum):
    """What a scheduler did with a tick (``cron.tick_started`` or ``cron.tick_skipped``'s
    ``reason``)."""

    STARTED = "started"  # this scheduler started its instance
    EXISTS = "exists"  # its instance exists: another scheduler, or an earlier call, started it
    BEFORE_SCHEDULE = "before_schedule"  # the tick predates the workflow's first sighting
    DECIDED = "resolved"  # another scheduler skipped it already
    PAUSED = "paused"  # the schedule is paused: the tick is skipped
    OVERLAP_SKIPPED = "overlap_skipped"  # overlap="skip" and the last instance runs
    BUFFERED = "buffered"  # overlap="buffer_one": starts once the last instance finished


@dataclass(frozen=True)
class ScheduleDeclaration:
    workflow_name: str
    expression: str
    timezone: str
    overlap: str


_SCHEDULES_DECLARE = statement(
    """
    INSERT INTO kenning_schedules AS s (workflow_name, expression, timezone, overlap)
    SELECT d.name, d.expression, d.timezone, d.overlap
    FROM jsonb_to_recordset(CAST(:schedules AS jsonb)) AS d(name text, expression text, timezone text, overlap text)
    ORDER BY d.name
    -- the last scheduler to start says what applies (a deploy changing it); a row already
    -- saying so is not written, and an operator's pause and the ticks decided stay
    ON CONFLICT (workflow_name) DO UPDATE SET
        expression = EXCLUDED.expression, timezone = EXCLUDED.timezone, overlap = EXCLUDED.overlap,
        updated_at = now()
    WHERE (s.expression, s.timezone, s.overlap) IS DISTINCT FROM (EXCLUDED.expression, EXCLUDED.timezone,
                                                                  EXCLUDED.overlap)
    """
)


async def schedules_declare(conn: Executor, schedules: Sequence[ScheduleDeclaration]) -> None:
    """Write the schedules a scheduler's workflows declare (at its start)."""
    if schedules:
        payload = [
            {"name": s.workflow_name, "expression": s.expression, "timezone": s.timezone, "overlap": s.overlap}
            for s in sorted(schedules, key=lambda s: s.workflow_name)
        ]
        await conn.execute(_SCHEDULES_DECLARE, {"schedules": json.dumps(payload)})


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's row as a tick's decision reads it, locked."""

    workflow_name: str
    paused: bool
    overlap: str
    last_tick: datetime | None
    last_instance_id: str | None
    last_instance_running: bool  # the instance it started last exists and has not finished


_SCHEDULE_LOCK = statement(
    """
    SELECT s.workflow_name, s.paused, s.overlap, s.last_tick, s.last_instance_id, i.status AS last_status
    FROM kenning_schedules AS s
    LEFT JOIN kenning_instances AS i ON i.id = s.last_instance_id
    WHERE s.workflow_name = :name
    FOR UPDATE OF s
    """
)


async def schedule_lock(conn: Executor, workflow_name: str) -> ScheduleState | None:
    """Lock the schedule's row until the transaction ends (one scheduler decides its tick
    at a time); None if there is no such schedule."""
    row = (await conn.execute(_SCHEDULE_LOCK, {"name": workflow_name})).first()
    if row is None:
        return None
    return ScheduleState(
        workflow_name=row.workflow_name,
        paused=bool(row.paused),
        overlap=row.overlap,
        last_tick=row.last_tick,
        last_instance_id=row.last_instance_id,
        last_instance_running=row.last_status is not None and row.last_status not in TERMINAL_STATUSES,
    )


_SCHEDULE_RECORD = statement(
    """
    UPDATE kenning_schedules
    SET last_tick = greatest(last_tick, CAST(:tick AS timestamptz)),
        last_instance_id = coalesce(CAST(:instance_id AS text), last_instance_id),
        next_tick = coalesce(CAST(:next_tick AS timestamptz), next_tick)
    WHERE workflow_name = :name
    """
)


async def schedule_record(
    conn: Executor,
    workflow_name: str,
    *,
    tick: datetime | None = None,
    instance_id: str | None = None,
    next_tick: datetime | None = None,
) -> None:
    """Record a decision: ``tick`` decided (never moving ``last_tick`` back), the
    instance started (a tick's or a trigger's), the next tick due; None: unchanged."""
    params = {"name": workflow_name, "tick": tick, "instance_id": instance_id, "next_tick": next_tick}
    await conn.execute(_SCHEDULE_RECORD, params)


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as the operator sees it (``kenning schedules list``, the console)."""

    workflow_name: str
    expression: str
    timezone: str
    paused: bool
    paused_reason: str | None
    overlap: str
    last_tick: datetime | None
    next_tick: datetime | None  # as the last scheduler to decide a tick computed it
    last_instance_id: str | None
    last_instance_status: str | None  # None: it started none yet, or that one expired
    updated_at: datetime
    now: datetime  # the database clock


_SCHEDULES_LIST = statement(
    f"""
    SELECT s.workflow_name, s.expression, s.timezone, s.paused, s.paused_reason, s.overlap, s.last_tick,
           s.next_tick, s.last_instance_id, i.status AS last_instance_status, s.updated_at, {NOW} AS now
    FROM kenning_schedules AS s
    LEFT JOIN kenning_instances AS i ON i.id = s.last_instance_id
    WHERE CAST(:name AS text) IS NULL OR s.workflow_name = :name
    ORDER BY s.workflow_name
    """
)


async def schedules_list(
    conn: Executor, workflow_name: str | None = None, now: datetime | None = None
) -> list[ScheduleRow]:
    """Every schedule (or the one named), with the status of the instance it started last."""
    return [
        ScheduleRow(
            workflow_name=row.workflow_name,
            expression=row.expression,
            timezone=row.timezone,
            paused=bool(row.paused),
            paused_reason=row.paused_reason,
            overlap=row.overlap,
            last_tick=row.last_tick,
            next_tick=row.next_tick,
            last_instance_id=row.last_instance_id,
            last_instance_status=row.last_instance_status,
            updated_at=row.updated_at,
            now=row.now,
        )
        for row in await conn.execute(_SCHEDULES_LIST, {"name": workflow_name, "now": now})
    ]


async def schedule_get(conn: Executor, workflow_name: str, now: datetime | None = None) -> ScheduleRow | None:
    """One schedule, or None."""
    found = await schedules_list(conn, workflow_name, now)
    return found[0] if found else None


_SCHEDULE_SET_PAUSED = statement(
    """
    UPDATE kenning_schedules
    SET paused = CAST(:paused AS boolean),
        paused_reason = CASE WHEN CAST(:paused AS boolean) THEN CAST(:reason AS text) END,
        -- a resume starts no tick that fell while paused: they count as decided
        last_tick = greatest(last_tick, CAST(:skip_through AS timestamptz))
    WHERE workflow_name = :name
    RETURNING workflow_name
    """
)


async def schedule_set_paused(
    conn: Executor, workflow_name: str, *, paused: bool, reason: str | None = None, skip_through: datetime | None = None
) -> bool:
    """Pause (no tick starts) or resume a schedule, its ticks up to ``skip_through`` then
    decided; False if there is no such schedule."""
    params = {"name": workflow_name, "paused": paused, "reason": reason, "skip_through": skip_through}
    return (await conn.execute(_SCHEDULE_SET_PAUSED, params)).first() is not None
