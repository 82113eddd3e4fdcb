"""SQL for the operator's escape hatches: terminate an instance, skip one compensation.

Both take the instance's row lock and revoke any lease in the same statement, so a worker
running the instance finds its next fenced write matching no row and stops
(``instance.lease_lost``): what it did after the escape is never recorded.

- ``instances_terminate`` ends instances now, ``failed`` with the reason ``terminated``,
  without running their compensations (Temporal's terminate): what they wait for is
  deleted, a parent waiting for one is told, its children are cancelled as its end
  cancels them (``on_parent_cancel``). A workflow's own error is kept in the new error.
- ``compensation_skip`` records one compensation as skipped (``CompensationSkipped``: done,
  never run) with the operator's reason, so the saga goes on to the next one and can end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kenning.core.names import (
    CHANNEL_INSTANCES,
    COMPENSATION_EXECUTED,
    COMPENSATION_FAILED,
    COMPENSATION_SKIPPED,
)
from kenning.db import Executor, statement
from kenning.storage.children import TOLD, tell_parents
from kenning.storage.names import notify, notify_results

TERMINATED = "terminated"  # the error's ``reason`` of a terminated instance
TERMINATED_TYPE = "kenning.errors.TerminatedError"  # no such class: decoded as ReplayedActivityError
_LIVE = "('pending', 'running', 'waiting_for_event', 'waiting_for_timer', 'waiting_for_message', 'compensating')"

_INSTANCES_TERMINATE = statement(
    f"""
    WITH target AS (
        SELECT id FROM kenning_instances
        WHERE id = ANY(CAST(:ids AS text[])) AND status IN {_LIVE}
        ORDER BY id
        FOR UPDATE
    ), terminated AS (
        UPDATE kenning_instances AS i
        SET status = 'failed',
            error = jsonb_build_object(
                'type', '{TERMINATED_TYPE}', 'message', CAST(:message AS text), 'reason', '{TERMINATED}',
                'terminated_reason', CAST(:reason AS text), 'terminated_status', i.status,
                'workflow_error', i.error),
            lease_token = NULL, lease_owner = NULL, available_at = NULL, stuck_reason = NULL, stuck_at = NULL,
            finished_at = now(), updated_at = now()
        FROM target
        WHERE i.id = target.id
        RETURNING i.id, i.parent_id, i.status, i.result, i.error
    ), unsubscribed AS (
        DELETE FROM kenning_event_subscriptions WHERE instance_id IN (SELECT id FROM terminated) RETURNING 1
    ), untimed AS (
        DELETE FROM kenning_timers WHERE instance_id IN (SELECT id FROM terminated) RETURNING 1
    ), unwaited AS (
        DELETE FROM kenning_message_waits WHERE instance_id IN (SELECT id FROM terminated) RETURNING 1
    ), {tell_parents("terminated")}
    SELECT (SELECT array_agg(id ORDER BY id) FROM terminated) AS terminated_ids,
           (SELECT count(*) FROM unsubscribed) + (SELECT count(*) FROM untimed)
               + (SELECT count(*) FROM unwaited) AS waits_deleted,
           {notify_results("terminated")} AS results_notified, {TOLD}
    """
)


async def instances_terminate(conn: Executor, instance_ids: list[str], reason: str) -> list[str]:
    """End the live instances among ``instance_ids`` now, without compensating; the ids
    it ended (an instance already ended is left as it is)."""
    if not instance_ids:
        return []
    message = f"terminated by an operator: {reason}" if reason else "terminated by an operator"
    params = {"ids": list(instance_ids), "reason": reason, "message": message}
    row = (await conn.execute(_INSTANCES_TERMINATE, params)).first()
    return [] if row is None or row.terminated_ids is None else list(row.terminated_ids)


@dataclass(frozen=True)
class FailingCompensation:
    """A compensation not yet done: failing now (attempts counted), failed for good, or
    waiting for its turn."""

    comp_id: str
    position: int
    function_name: str
    failed: bool  # recorded CompensationFailed: the saga ended failed at it
    attempts: int  # attempts counted on the instance since its last record
    last_error: Any  # as stored: sealed when payloads are encrypted (``kenning.codecs.shown``)


_COMPENSATIONS_OPEN = statement(
    f"""
    SELECT c.comp_id, c.position, c.function_name,
           coalesce(h.kind = '{COMPENSATION_FAILED}', false) AS failed,
           coalesce(CAST(i.attempts -> ('compensation:' || c.comp_id) ->> 'attempts' AS integer), 0) AS attempts,
           -- JSON, not text: a sealed error is an envelope the reader opens (kenning.codecs)
           coalesce(i.attempts -> ('compensation:' || c.comp_id) -> 'last_error', h.payload -> 'message')
               AS last_error
    FROM kenning_instances AS i
    JOIN kenning_compensations AS c ON c.instance_id = i.id
    LEFT JOIN kenning_history AS h ON h.instance_id = i.id AND h.step_id = 'compensation:' || c.comp_id
    WHERE i.id = :id AND coalesce(h.kind, '') NOT IN ('{COMPENSATION_EXECUTED}', '{COMPENSATION_SKIPPED}')
    ORDER BY c.position DESC
    """
)


async def compensations_open(conn: Executor, instance_id: str) -> list[FailingCompensation]:
    """The instance's compensations not done yet, in the order they run (newest first)."""
    rows = await conn.execute(_COMPENSATIONS_OPEN, {"id": instance_id})
    return [FailingCompensation(**row._asdict()) for row in rows]


_COMPENSATION_SKIP = statement(
    f"""
    WITH target AS (
        SELECT i.id, i.status FROM kenning_instances AS i
        WHERE i.id = :id
          AND (i.status = 'compensating'
               OR (i.status = 'failed' AND EXISTS (
                   SELECT FROM kenning_history AS f WHERE f.instance_id = i.id AND f.kind = '{COMPENSATION_FAILED}')))
        FOR UPDATE
    ), comp AS (
        SELECT c.comp_id, c.function_name, c.args, c.kwargs FROM kenning_compensations AS c JOIN target ON true
        WHERE c.instance_id = target.id AND c.comp_id = :comp_id
          AND NOT EXISTS (
              SELECT FROM kenning_history AS h
              WHERE h.instance_id = c.instance_id AND h.step_id = 'compensation:' || c.comp_id
                AND h.kind IN ('{COMPENSATION_EXECUTED}', '{COMPENSATION_SKIPPED}'))
    ), skipped_payload AS (
        SELECT comp.comp_id, comp.function_name,
               jsonb_build_object('reason', CAST(:reason AS text), 'args', comp.args, 'kwargs', comp.kwargs) AS payload
        FROM comp
    ), replaced AS (
        -- the saga ended failed at it: its failure record becomes the skip
        UPDATE kenning_history AS h
        SET kind = '{COMPENSATION_SKIPPED}', payload = s.payload || jsonb_build_object('failure', h.payload),
            created_at = now()
        FROM skipped_payload AS s
        WHERE h.instance_id = :id AND h.step_id = 'compensation:' || s.comp_id AND h.kind = '{COMPENSATION_FAILED}'
        RETURNING h.step_id
    ), inserted AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT :id, 'compensation:' || s.comp_id, '{COMPENSATION_SKIPPED}', s.function_name, s.payload
        FROM skipped_payload AS s
        WHERE NOT EXISTS (SELECT FROM replaced)
        RETURNING step_id
    ), others_failed AS (
        SELECT count(*) AS n FROM kenning_history AS h, comp
        WHERE h.instance_id = :id AND h.kind = '{COMPENSATION_FAILED}' AND h.step_id <> 'compensation:' || comp.comp_id
    ), resumed AS (
        -- compensating: the lease is revoked and it is due now, so a worker resumes the saga
        -- past the skipped one; failed at it: compensating again (as kenning instances retry
        -- resumes a saga) unless another compensation failed too (that one is still to decide)
        UPDATE kenning_instances AS i
        SET status = CASE WHEN target.status = 'failed' AND others_failed.n > 0 THEN i.status ELSE 'compensating' END,
            error = CASE WHEN target.status = 'failed' AND others_failed.n = 0
                         THEN CASE WHEN i.error -> 'workflow_error' IS NULL THEN i.error
                                   ELSE nullif(i.error -> 'workflow_error', CAST('null' AS jsonb)) END
                         ELSE i.error END,
            finished_at = CASE WHEN target.status = 'failed' AND others_failed.n > 0 THEN i.finished_at END,
            available_at = CASE WHEN target.status = 'failed' AND others_failed.n > 0 THEN i.available_at
                                ELSE now() END,
            attempts = i.attempts - ('compensation:' || comp.comp_id),
            lease_token = NULL, lease_owner = NULL, updated_at = now()
        FROM target, comp, others_failed
        WHERE i.id = target.id
        RETURNING i.status, i.available_at IS NOT NULL AND i.available_at <= now() AS due
    )
    SELECT (SELECT status FROM target) AS previous_status,
           (SELECT status FROM resumed) AS status,
           (SELECT count(*) FROM comp) AS skipped,
           (SELECT n FROM others_failed) AS others_failed,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM resumed WHERE due) AS notified,
           (SELECT count(*) FROM replaced) + (SELECT count(*) FROM inserted) AS recorded
    """
)


@dataclass(frozen=True)
class SkipOutcome:
    previous_status: str | None  # None: no compensating or failed instance of this id
    status: str | None  # its status now; None when nothing was skipped
    skipped: bool
    others_failed: int  # other compensations that failed for good and still stop the saga


async def compensation_skip(conn: Executor, instance_id: str, comp_id: str, reason: str) -> SkipOutcome:
    """Record compensation ``comp_id`` of a compensating (or failed-at-it) instance as
    skipped and let the saga go on past it."""
    params: dict[str, Any] = {"id": instance_id, "comp_id": comp_id, "reason": reason}
    row = (await conn.execute(_COMPENSATION_SKIP, params)).first()
    assert row is not None  # a SELECT of scalar subqueries: always one row
    return SkipOutcome(
        previous_status=row.previous_status,
        status=row.status,
        skipped=bool(row.skipped),
        others_failed=int(row.others_failed or 0),
    )


def error_of_terminated(error: dict[str, Any] | None) -> bool:
    """Whether a stored error is a terminate's."""
    return isinstance(error, dict) and error.get("reason") == TERMINATED
