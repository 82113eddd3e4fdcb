"""SQL for history and compensations: the fenced step write and the batched loads.

``history_record_step`` is the hot path: one statement checks the lease (row lock on
the instance, so it serialises with a concurrent claim), inserts the history row, saves
any compensations registered since the last write, and returns the cancellation flag —
no read-before-write per step.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from kenning import codecs
from kenning.core.records import CompensationRecord, HistoryRecord
from kenning.db import Executor, statement
from kenning.storage.fencing import LEASE_FENCE, SAVE_COMPENSATIONS, insert_steps, step_json

_HISTORY_LOAD = statement(
    """
    SELECT instance_id, step_id, kind, step_name, payload, payload_bytes, created_at
    FROM kenning_history
    WHERE instance_id = ANY(:ids)
    ORDER BY instance_id, seq
    """
)


async def history_load(
    conn: Executor, instance_ids: Sequence[str], *, shown: bool = False
) -> dict[str, list[HistoryRecord]]:
    """History of many instances in one round trip, oldest step first, payloads opened
    (``shown``: for display, "encrypted" in place of a payload without its key)."""
    opened = codecs.shown if shown else codecs.unseal
    loaded: dict[str, list[HistoryRecord]] = defaultdict(list)
    if not instance_ids:
        return loaded
    for row in await conn.execute(_HISTORY_LOAD, {"ids": list(instance_ids)}):
        loaded[row.instance_id].append(
            HistoryRecord(
                step_id=row.step_id,
                kind=row.kind,
                step_name=row.step_name,
                payload=opened(row.payload),
                payload_bytes=row.payload_bytes,
                created_at=row.created_at,
            )
        )
    return loaded


_HISTORY_RECORD_STEP = statement(
    f"""
    WITH {LEASE_FENCE},
    {insert_steps("recorded", instance="fence.id", source="fence", steps="CAST(:steps AS jsonb)")},
    {SAVE_COMPENSATIONS}
    SELECT fence.cancel_requested FROM fence, recorded
    """
)
_INSTANCE_CLEAR_ATTEMPTS = statement(
    "UPDATE kenning_instances SET attempts = attempts - CAST(:step AS text) "
    "WHERE id = :id AND lease_token = CAST(:token AS uuid)"
)


async def history_record_step(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    kind: str,
    step_name: str,
    payload: Any,
    payload_bytes: bytes | None = None,
    compensations: Sequence[CompensationRecord] = (),
    clear_attempts: bool = False,
    timing: dict[str, Any] | None = None,
) -> bool | None:
    """Record a step if the lease is still ours. Returns the instance's cancellation flag,
    or None when the lease was lost (nothing was written)."""
    row = (
        await conn.execute(
            _HISTORY_RECORD_STEP,
            {
                "id": instance_id,
                "token": token,
                "steps": json.dumps([step_json(step_id, kind, step_name, payload, payload_bytes, timing=timing)]),
                "compensations": json.dumps([c.to_json() for c in compensations]) if compensations else "[]",
            },
        )
    ).first()
    if row is None:
        return None
    if clear_attempts:
        await conn.execute(_INSTANCE_CLEAR_ATTEMPTS, {"id": instance_id, "token": token, "step": step_id})
    return bool(row.cancel_requested)


_COMPENSATIONS_LOAD = statement(
    """
    SELECT instance_id, comp_id, position, function_name, args, kwargs, retry_policy
    FROM kenning_compensations
    WHERE instance_id = ANY(:ids)
    ORDER BY instance_id, position
    """
)


async def compensations_load(conn: Executor, instance_ids: Sequence[str]) -> dict[str, list[CompensationRecord]]:
    loaded: dict[str, list[CompensationRecord]] = defaultdict(list)
    if not instance_ids:
        return loaded
    for row in await conn.execute(_COMPENSATIONS_LOAD, {"ids": list(instance_ids)}):
        loaded[row.instance_id].append(
            CompensationRecord(
                comp_id=row.comp_id,
                position=row.position,
                function_name=row.function_name,
                args=row.args,
                kwargs=row.kwargs,
                retry_policy=row.retry_policy,
            )
        )
    return loaded


_HISTORY_SHOWN = statement(
    """
    SELECT step_id, kind, step_name, payload, payload_bytes, created_at, attempts, started_at, run_seconds
    FROM kenning_history
    WHERE instance_id = :id
    ORDER BY seq
    """
)


async def history_shown(conn: Executor, instance_id: str) -> list[dict[str, Any]]:
    """One instance's history for operators, oldest step first: what replay loads
    (``history_load``) and, for a step that ran, its ``attempts``, ``started_at`` and
    ``run_seconds`` (migration 0007; NULL otherwise), which replay never reads."""
    return [
        {
            "step_id": row.step_id,
            "kind": row.kind,
            "step_name": row.step_name,
            **_shown_payload(row.payload, row.payload_bytes),
            "created_at": row.created_at,
            "attempts": row.attempts,
            "started_at": row.started_at,
            "run_seconds": row.run_seconds,
        }
        for row in await conn.execute(_HISTORY_SHOWN, {"id": instance_id})
    ]


def _shown_payload(payload: Any, payload_bytes: bytes | None) -> dict[str, Any]:
    """A record's payload for operators ("encrypted" without the key); bytes sealed in its
    ``data`` beside an empty ``payload_bytes`` (``kenning.codecs.seal_bytes``) opened back
    into ``payload_bytes``, as if stored as they came (without the key: ``"data":
    "encrypted"`` and no bytes)."""
    shown = codecs.shown(payload)
    if payload_bytes is None or not isinstance(shown, dict) or shown.get("data") is None:
        return {"payload": shown, "payload_bytes": payload_bytes}
    if shown["data"] == codecs.ENCRYPTED:
        return {"payload": shown, "payload_bytes": None}
    opened = codecs.unseal_bytes(shown["data"])
    return {"payload": {k: v for k, v in shown.items() if k != "data"}, "payload_bytes": opened}
