"""SQL for what the workflow definitions table knows: which workflow names exist at all.

A definition row is written by every process that has a workflow's code (a worker at
start, a client or the inbox when it starts one), so a name without any row is a
workflow no process was ever given: the operator CLI refuses to start it and workers
report instances of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from kenning.core.records import Definition
from kenning.db import Executor, statement

_DEFINITIONS_REGISTER = statement(
    """
    INSERT INTO kenning_workflow_definitions AS w (workflow_name, source_hash, source, retention_seconds)
    SELECT d.name, d.hash, d.source, d.retention_seconds
    FROM jsonb_to_recordset(CAST(:definitions AS jsonb))
        AS d(name text, hash text, source text, retention_seconds double precision)
    -- the same source may name its retention apart from it (a module constant): the last
    -- process to register one says which applies; an unchanged row is not written, and a
    -- process that names none (an older client) leaves the row's as it is
    ON CONFLICT (workflow_name, source_hash) DO UPDATE SET retention_seconds = EXCLUDED.retention_seconds
        WHERE EXCLUDED.retention_seconds IS NOT NULL
          AND w.retention_seconds IS DISTINCT FROM EXCLUDED.retention_seconds
    """
)


async def definitions_register(conn: Executor, definitions: Sequence[Definition]) -> None:
    """Record definitions in one statement: a worker's or a scheduler's workflows at its
    start, the one a client or the inbox starts an instance of."""
    if not definitions:
        return
    payload = [
        {"name": d.workflow_name, "hash": d.source_hash, "source": d.source, "retention_seconds": d.retention_seconds}
        for d in definitions
    ]
    await conn.execute(_DEFINITIONS_REGISTER, {"definitions": json.dumps(payload)})


_DEFINITION_NAMES = statement(
    """
    SELECT DISTINCT workflow_name AS workflow_name
    FROM kenning_workflow_definitions
    ORDER BY workflow_name
    """
)


async def definition_names(conn: Executor) -> list[str]:
    """Every workflow name ever registered (the table holds one row per version)."""
    return [str(row.workflow_name) for row in await conn.execute(_DEFINITION_NAMES)]


_DEFINITION_KNOWN = statement(
    """
    SELECT EXISTS (SELECT FROM kenning_workflow_definitions WHERE workflow_name = :name) AS known
    """
)


async def definition_known(conn: Executor, workflow_name: str) -> bool:
    row = (await conn.execute(_DEFINITION_KNOWN, {"name": workflow_name})).one()
    return bool(row.known)


_UNKNOWN_WORKFLOWS_PENDING = statement(
    """
    -- A bounded sample, read in the claimable index's order: nobody claims instances of an
    -- unknown workflow, so they stay among the oldest due rows, where it looks first; the
    -- cost does not grow with the backlog.
    WITH sample AS (
        (SELECT workflow_name FROM kenning_instances
         WHERE status = 'pending' AND available_at IS NOT NULL AND queue_name IS NULL
         ORDER BY available_at
         LIMIT :sample)
        UNION ALL
        -- queued ones: the first of each queue's partitions in kenning_instances_queued's order
        (SELECT workflow_name FROM kenning_instances
         WHERE status = 'pending' AND available_at IS NOT NULL AND queue_name IS NOT NULL
         ORDER BY queue_name, partition_key, priority, available_at
         LIMIT :sample)
    )
    SELECT s.workflow_name AS workflow_name, count(*) AS instances
    FROM sample AS s
    WHERE NOT EXISTS (SELECT FROM kenning_workflow_definitions AS d WHERE d.workflow_name = s.workflow_name)
    GROUP BY s.workflow_name
    ORDER BY s.workflow_name
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class UnknownWorkflow:
    workflow_name: str
    instances: int  # its pending instances in the sample, which no worker will ever claim


async def unknown_workflows_pending(conn: Executor, limit: int = 100, sample: int = 1000) -> list[UnknownWorkflow]:
    """Workflow names that have no definition row at all, among the ``sample`` oldest
    pending instances: a backlog of claimable work queued before them hides them until
    it is claimed."""
    rows = await conn.execute(_UNKNOWN_WORKFLOWS_PENDING, {"limit": limit, "sample": sample})
    return [UnknownWorkflow(str(row.workflow_name), int(row.instances)) for row in rows]
