"""SQL for a saga whose compensation failed for good: ending it, and retrying it.

The instance's ``error`` becomes the compensation failure, with the workflow's own error
kept inside it under ``workflow_error``; a retry puts that error back and makes the
instance ``compensating`` again, so a worker runs the compensations not yet executed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kenning.core.names import CHANNEL_INSTANCES, COMPENSATION_EXECUTED, COMPENSATION_FAILED, COMPENSATION_SKIPPED
from kenning.db import Executor, statement
from kenning.storage.children import TOLD, tell_parents
from kenning.storage.names import notify, notify_results
from kenning.storage.streams import reopen_ended_streams

_SAGA_FAIL = statement(
    f"""
    WITH failed AS (
        UPDATE kenning_instances
        SET status = 'failed', error = CAST(:error AS jsonb) || jsonb_build_object('workflow_error', error),
            lease_token = NULL, lease_owner = NULL, available_at = NULL, finished_at = now(), updated_at = now()
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        RETURNING id, parent_id, status, result, error
    ), {tell_parents("failed")}
    SELECT id, {notify_results("failed")} AS results_notified, {TOLD} FROM failed
    """
)


async def saga_fail(conn: Executor, instance_id: str, token: str, error: dict[str, Any]) -> bool:
    """End a leased instance ``failed`` because compensations failed; False if the lease
    was lost."""
    row = (await conn.execute(_SAGA_FAIL, {"id": instance_id, "token": token, "error": json.dumps(error)})).first()
    return row is not None


_SAGA_RETRY = statement(
    f"""
    WITH target AS (
        SELECT i.id FROM kenning_instances i
        WHERE i.id = :id AND i.status = 'failed'
          AND EXISTS (SELECT FROM kenning_history h WHERE h.instance_id = i.id AND h.kind = '{COMPENSATION_FAILED}')
        FOR UPDATE
    ), cleared AS (
        DELETE FROM kenning_history h USING target
        WHERE h.instance_id = target.id AND h.kind = '{COMPENSATION_FAILED}'
        RETURNING h.step_id
    ), retried AS (
        UPDATE kenning_instances AS i
        SET status = 'compensating',
            -- the workflow's own error again (an instance failed by an older version kept it as is)
            error = CASE WHEN i.error -> 'workflow_error' IS NULL THEN i.error
                         ELSE nullif(i.error -> 'workflow_error', CAST('null' AS jsonb)) END,
            available_at = now(), finished_at = NULL, updated_at = now()
        FROM target
        WHERE i.id = target.id
        RETURNING i.id
    ), {reopen_ended_streams("retried")}
    SELECT (SELECT count(*) FROM cleared) AS cleared_count,
           {notify(CHANNEL_INSTANCES)} AS notified
    FROM retried
    """
)


async def saga_retry(conn: Executor, instance_id: str) -> int | None:
    """Make a failed instance with failed compensations ``compensating`` again; returns how
    many compensations will run again, or None when it has none (not such an instance)."""
    row = (await conn.execute(_SAGA_RETRY, {"id": instance_id})).first()
    return None if row is None else int(row.cleared_count)


_SAGA_STATE = statement(
    f"""
    SELECT (SELECT count(*) FROM kenning_history AS h
            WHERE h.instance_id = :id AND h.kind = '{COMPENSATION_EXECUTED}') AS executed,
           (SELECT count(*) FROM kenning_history AS h
            WHERE h.instance_id = :id AND h.kind = '{COMPENSATION_FAILED}') AS failed,
           (SELECT count(*) FROM kenning_compensations AS c
            WHERE c.instance_id = :id AND NOT EXISTS (
                SELECT FROM kenning_history AS h
                WHERE h.instance_id = c.instance_id AND h.step_id = 'compensation:' || c.comp_id
                  AND h.kind IN ('{COMPENSATION_EXECUTED}', '{COMPENSATION_SKIPPED}'))) AS open
    """
)


@dataclass(frozen=True)
class SagaState:
    """How far an instance's saga went: what an operator's retry or skip depends on."""

    executed: int  # compensations that ran (CompensationExecuted): its steps were undone
    failed: int  # compensations that failed for good (CompensationFailed): the saga stopped at them
    open: int  # registered compensations neither executed nor skipped: still to run (or failing)


async def saga_state(conn: Executor, instance_id: str) -> SagaState:
    """The instance's compensations executed, failed for good and still to run."""
    row = (await conn.execute(_SAGA_STATE, {"id": instance_id})).first()
    assert row is not None  # a SELECT of scalar subqueries: always one row
    return SagaState(executed=int(row.executed), failed=int(row.failed), open=int(row.open))
