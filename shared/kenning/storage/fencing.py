"""SQL fragments every fenced worker write starts from, kept in one place.

``LEASE_FENCE`` locks the instance row if and only if this worker's lease token still
holds it; the CTEs that follow write only ``FROM fence``, so a stale worker writes nothing
and sees zero rows. ``PENDING_STEP`` and ``SAVE_COMPENSATIONS`` fold the last step's
record and newly registered compensations into the same statement; ``insert_steps`` is
the one form of the history insert of recorded steps.
"""

from __future__ import annotations

import base64
from typing import Any

LEASE_FENCE = """fence AS (
        SELECT id, cancel_requested FROM kenning_instances
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    )"""


def insert_steps(cte: str, *, instance: str, source: str, steps: str, order_by: str = "") -> str:
    """The one form of the step insert: a CTE named ``cte`` inserting the history rows in
    ``steps`` (a jsonb array of ``step_json`` objects; ``n`` orders them when several
    arrive together) for ``instance`` once per row of ``source`` (the fence: nothing is
    inserted when the lease was lost). The fenced step write, the folded pending step
    and the group-committed writes all use it."""
    order = f"\n        ORDER BY {order_by}" if order_by else ""
    return f"""{cte} AS (
        INSERT INTO kenning_history
            (instance_id, step_id, kind, step_name, payload, payload_bytes, attempts, started_at, run_seconds)
        SELECT {instance}, s.step_id, s.kind, s.step_name, s.payload, decode(s.payload_bytes, 'base64'),
               s.attempts, to_timestamp(s.started_epoch), s.run_seconds
        FROM {source}, jsonb_to_recordset({steps}) AS s(
            n integer, step_id text, kind text, step_name text, payload jsonb, payload_bytes text,
            attempts integer, started_epoch double precision, run_seconds double precision){order}
        RETURNING 1
    )"""


def step_json(
    step_id: str,
    kind: str,
    step_name: str,
    payload: Any,
    payload_bytes: bytes | None = None,
    *,
    timing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One step as ``insert_steps`` reads it (bytes travel as base64 inside the JSON; the
    ``timing`` of a step that ran, ``StepTiming.as_json``: a key left out is NULL)."""
    step: dict[str, Any] = {"step_id": step_id, "kind": kind, "step_name": step_name, "payload": payload}
    if payload_bytes is not None:
        step["payload_bytes"] = base64.b64encode(payload_bytes).decode("ascii")
    if timing is not None:
        step.update(timing)
    return step


# The step recorded just before a suspend or completion, folded into its statement
PENDING_STEP = insert_steps("pending_step", instance="fence.id", source="fence", steps="CAST(:pending_step AS jsonb)")

SAVE_COMPENSATIONS = """saved AS (
        INSERT INTO kenning_compensations
            (instance_id, comp_id, position, function_name, args, kwargs, retry_policy)
        SELECT fence.id, c.comp_id, c.position, c.function_name, c.args, c.kwargs, c.retry_policy
        FROM fence, jsonb_to_recordset(CAST(:compensations AS jsonb)) AS c(
            comp_id text, position integer, function_name text, args jsonb, kwargs jsonb, retry_policy jsonb)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )"""


def suspend_as(status: str, *, unless: str | None = None) -> str:
    """Release the lease into ``status`` unless cancellation was requested, or the CTE
    ``unless`` has a row (what the instance would wait for is there already)."""
    also = f" AND NOT EXISTS (SELECT FROM {unless})" if unless else ""
    return f"""suspended AS (
        UPDATE kenning_instances AS i
        SET status = '{status}', lease_token = NULL, lease_owner = NULL, available_at = NULL,
            updated_at = now()
        FROM fence
        WHERE i.id = fence.id AND NOT fence.cancel_requested{also}
        RETURNING i.id
    )"""
