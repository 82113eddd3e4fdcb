"""Starting the instance of one cron tick.

Exactly once per tick comes from the instances' unique ``(workflow_name,
idempotency_key)`` index: every scheduler inserts the same key for the same tick and all
but one insert do nothing. No table of its own: the tick is an ordinary start
(``instances.instances_start``) with ``not_before`` set to it.
"""

from __future__ import annotations

from datetime import datetime

from kenning.core.records import NewInstance, StartOutcome
from kenning.db import Executor
from kenning.storage.instances import instances_start

# what schedule_start_tick did: STARTED, EXISTS (another scheduler, or an earlier call, had
# started it) or BEFORE_SCHEDULE (the tick predates the workflow's first sighting)
TickOutcome = StartOutcome


async def schedule_start_tick(
    conn: Executor,
    *,
    instance_id: str,
    workflow_name: str,
    source_hash: str,
    tick: datetime,
    idempotency_key: str,
) -> TickOutcome:
    """Insert the runnable instance of ``tick`` unless it exists, and wake the workers.

    A tick is started only if it is not older than the workflow's first definition row: a
    schedule deployed at 15:00 does not start the 00:00 tick of that day, while a tick
    missed because every scheduler was down is started when one comes back. The
    definition must therefore have been recorded (``definitions.definitions_register``)
    first.
    """
    start = NewInstance(instance_id, workflow_name, source_hash, {}, idempotency_key, not_before=tick)
    (outcome,) = await instances_start(conn, [start])
    return outcome
