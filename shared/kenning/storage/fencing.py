"""SQL fragments every fenced worker write starts from, kept in one place.

``LEASE_FENCE`` locks the instance row if and only if this worker's lease token still
holds it; the CTEs that follow write only ``FROM fence``, so a stale worker writes nothing
and sees zero rows. ``PENDING_STEP`` and ``SAVE_COMPENSATIONS`` fold the last step's
record and newly registered compensations into the same statement.
"""

from __future__ import annotations

LEASE_FENCE = """fence AS (
        SELECT id, cancel_requested FROM kenning_instances
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    )"""

PENDING_STEP = """pending_step AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT fence.id, s.step_id, s.kind, s.step_name, s.payload
        FROM fence, jsonb_to_recordset(CAST(:pending_step AS jsonb)) AS s(
            step_id text, kind text, step_name text, payload jsonb)
        RETURNING 1
    )"""

SAVE_COMPENSATIONS = """saved AS (
        INSERT INTO kenning_compensations
            (instance_id, comp_id, position, function_name, args, kwargs, retry_policy)
        SELECT fence.id, c.comp_id, c.position, c.function_name, c.args, c.kwargs, c.retry_policy
        FROM fence, jsonb_to_recordset(CAST(:compensations AS jsonb)) AS c(
            comp_id text, position integer, function_name text, args jsonb, kwargs jsonb, retry_policy jsonb)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )"""


def suspend_as(status: str) -> str:
    """Release the lease into ``status`` unless cancellation was requested."""
    return f"""suspended AS (
        UPDATE kenning_instances AS i
        SET status = '{status}', lease_token = NULL, lease_owner = NULL, available_at = NULL,
            updated_at = now()
        FROM fence
        WHERE i.id = fence.id AND NOT fence.cancel_requested
        RETURNING i.id
    )"""
