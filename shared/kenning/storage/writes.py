"""Group-committed worker writes: the fenced step records and completions of many
instances in one statement, one commit, and one NOTIFY of the completed ones' ids.

Each item is what one instance would otherwise write alone (``history_record_step`` or
``instance_complete``): its lease is checked by token and its row locked (locks taken in
id order, so two batches never deadlock), its steps and newly registered compensations
are inserted, and a completing instance is finished. An item whose lease was lost writes
nothing and reads back None, exactly as the single-instance statements do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kenning.db import Executor, statement
from kenning.storage.children import TOLD, tell_parents
from kenning.storage.fencing import insert_steps
from kenning.storage.names import notify_results


@dataclass(frozen=True)
class InstanceWrite:
    instance_id: str
    token: str
    steps: list[dict[str, Any]] = field(default_factory=list)  # PendingRecord.as_json() each
    compensations: list[dict[str, Any]] = field(default_factory=list)  # CompensationRecord.to_json() each
    complete: bool = False
    result: Any = None  # the completed workflow's {"result": ...}

    def as_json(self, position: int) -> dict[str, Any]:
        return {
            "position": position,
            "instance_id": self.instance_id,
            "token": self.token,
            "steps": [{"n": n, **step} for n, step in enumerate(self.steps)],
            "compensations": self.compensations,
            "complete": self.complete,
            "result": self.result,
        }


# each write's steps, in order, for the writes whose lease held
_RECORDED = insert_steps(
    "recorded",
    instance="w.instance_id",
    source="incoming AS w JOIN fence ON fence.position = w.position",
    steps="w.steps",
    order_by="w.position, s.n",
)
_WRITES_APPLY = statement(
    f"""
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:writes AS jsonb)) AS w(
            position integer, instance_id text, token uuid, steps jsonb, compensations jsonb,
            complete boolean, result jsonb)
    ), fence AS (
        SELECT w.position, i.cancel_requested
        FROM kenning_instances AS i JOIN incoming AS w ON i.id = w.instance_id AND i.lease_token = w.token
        ORDER BY i.id, w.position
        FOR UPDATE OF i
    ), {_RECORDED}, saved AS (
        INSERT INTO kenning_compensations
            (instance_id, comp_id, position, function_name, args, kwargs, retry_policy)
        SELECT w.instance_id, c.comp_id, c.position, c.function_name, c.args, c.kwargs, c.retry_policy
        FROM incoming AS w JOIN fence ON fence.position = w.position,
             jsonb_to_recordset(w.compensations) AS c(
                comp_id text, position integer, function_name text, args jsonb, kwargs jsonb, retry_policy jsonb)
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), completed AS (
        UPDATE kenning_instances AS i
        SET status = 'completed', result = w.result, lease_token = NULL, lease_owner = NULL,
            available_at = NULL, attempts = '{{}}', finished_at = now(), updated_at = now()
        FROM incoming AS w JOIN fence ON fence.position = w.position
        -- a cancel that committed first wins: the instance is compensated, not completed
        -- (its last step and compensations are written; the worker then undoes the saga)
        WHERE i.id = w.instance_id AND w.complete AND NOT fence.cancel_requested
        RETURNING i.id, i.parent_id, i.status, i.result, i.error
    ), {tell_parents("completed")}
    -- the batch's completions wake the clients awaiting them: one NOTIFY per batch
    SELECT w.position, fence.cancel_requested, {notify_results("completed")} AS results_notified, {TOLD}
    FROM incoming AS w JOIN fence ON fence.position = w.position
    """
)


async def writes_apply(conn: Executor, writes: Sequence[InstanceWrite]) -> list[bool | None]:
    """Apply ``writes`` in one statement. Per write: the instance's cancellation flag, or
    None when its lease was lost (nothing of it was written). A completion whose flag is
    set was not applied: only its steps and compensations were written."""
    if not writes:
        return []
    payload = json.dumps([w.as_json(position) for position, w in enumerate(writes)])
    flags: list[bool | None] = [None] * len(writes)
    for row in await conn.execute(_WRITES_APPLY, {"writes": payload}):
        flags[row.position] = bool(row.cancel_requested)
    return flags
