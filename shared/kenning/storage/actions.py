"""SQL for the operator action log (``kenning_operator_actions``, migration 0009): every
operator action, single or bulk, from the CLI or the console, recorded in the transaction
that does it (an action rolled back leaves no record; a record means it happened).
``kenning actions list`` and the console's actions page read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.db import Executor, statement

ORIGINS = ("cli", "console", "api")


@dataclass(frozen=True)
class OperatorAction:
    """What an operator asked for: ``target`` one instance or queue, or ``filter`` a bulk
    action's filter; ``affected`` how many rows it changed."""

    action: str
    origin: str
    actor: str = ""
    target: str | None = None
    filter: dict[str, Any] | None = None
    affected: int = 0
    reason: str | None = None
    details: dict[str, Any] | None = None


@dataclass(frozen=True)
class ActionRow:
    id: int
    at: datetime
    action: str
    origin: str
    actor: str
    target: str | None
    filter: dict[str, Any] | None
    affected: int
    reason: str | None
    details: dict[str, Any]


_ACTION_RECORD = statement(
    """
    INSERT INTO kenning_operator_actions (action, origin, actor, target, filter, affected, reason, details)
    VALUES (:action, :origin, :actor, :target, CAST(:filter AS jsonb), :affected, :reason, CAST(:details AS jsonb))
    RETURNING id
    """
)


async def action_record(conn: Executor, action: OperatorAction) -> int:
    """Record one operator action; its id."""
    params = {
        "action": action.action,
        "origin": action.origin,
        "actor": action.actor,
        "target": action.target,
        "filter": None if action.filter is None else json.dumps(action.filter, default=str),
        "affected": action.affected,
        "reason": action.reason,
        "details": json.dumps(action.details or {}, default=str),
    }
    row = (await conn.execute(_ACTION_RECORD, params)).first()
    assert row is not None  # an INSERT ... RETURNING of one row
    return int(row.id)


_ACTIONS_LIST = statement(
    """
    SELECT id, at, action, origin, actor, target, filter, affected, reason, details
    FROM kenning_operator_actions
    WHERE (CAST(:target AS text) IS NULL OR target = :target)
      AND (CAST(:action AS text) IS NULL OR action = :action)
      AND (CAST(:before AS bigint) IS NULL OR id < :before)
    ORDER BY id DESC
    LIMIT :limit
    """
)


async def actions_list(
    conn: Executor,
    *,
    target: str | None = None,
    action: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[ActionRow]:
    """Newest first; ``before`` an id: the page after the one that ended there."""
    params = {"target": target, "action": action, "before": before, "limit": limit}
    return [ActionRow(**row._asdict()) for row in await conn.execute(_ACTIONS_LIST, params)]


_ACTION_PROGRESS = statement(
    """
    UPDATE kenning_operator_actions
    SET affected = affected + :affected, details = details || CAST(:details AS jsonb)
    WHERE id = :id
    RETURNING affected
    """
)


async def action_progress(conn: Executor, action_id: int, affected: int, details: dict[str, Any]) -> int:
    """Add a bulk action's batch to its record (in the batch's transaction); the total."""
    params = {"id": action_id, "affected": affected, "details": json.dumps(details, default=str)}
    row = (await conn.execute(_ACTION_PROGRESS, params)).first()
    return 0 if row is None else int(row.affected)
