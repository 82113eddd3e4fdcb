"""SQL for continue-as-new (``kenning.continue_as_new``, migration 0011): one statement
ends run N of an instance and makes run N+1, and the chain of earlier runs is read back.

``run_continue`` is fenced by the lease and does nothing when cancellation was requested
(a cancel wins). Otherwise, in one statement (one commit, no gap, nothing duplicated):

- a summary of run N goes into ``kenning_instance_runs`` (its input, when it began and
  ended, how many steps it recorded, how it ended);
- run N's history rows are deleted: the next run replays nothing of it, which is what
  keeps the cost of a resume flat over a long chain;
- its registered compensations are dropped: the run ended well, nothing is left to undo;
- its unfinished children are treated as at a parent's end (those started with
  ``on_parent_cancel='cancel'`` get a cancellation request), then detached
  (``parent_id`` NULL): a child's end can never be written into run N+1's history;
- the instance gets the new input, ``run`` + 1 and empty step bookkeeping (counted
  attempts, heartbeat details, the crash-loop counter), keeps its lease (the worker goes
  on with run N+1 at once), its ``deadline_at`` (the workflow timeout bounds the chain),
  its mailboxes, subscriptions and queue slot (all keyed by the instance id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.names import CHANNEL_INBOX
from kenning.db import Executor, statement
from kenning.storage.children import TERMINAL, parent_end_cancels, sealed_input
from kenning.storage.names import notify

# how an earlier run of a chain ended (kenning_instance_runs.ended)
CONTINUED_AS_NEW = "continued_as_new"

_RUN_CONTINUE = statement(
    f"""
    WITH fence AS (
        SELECT id, cancel_requested, run, input, started_at FROM kenning_instances
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    ), go AS (
        SELECT * FROM fence WHERE NOT cancel_requested
    ), dropped AS (
        DELETE FROM kenning_history AS h USING go WHERE h.instance_id = go.id RETURNING 1
    ), uncompensated AS (
        DELETE FROM kenning_compensations AS c USING go WHERE c.instance_id = go.id RETURNING 1
    ), kids AS (
        SELECT c.id, c.on_parent_cancel, c.status FROM kenning_instances AS c JOIN go ON c.parent_id = go.id
        WHERE c.status NOT IN {TERMINAL}
    ), detached AS (
        UPDATE kenning_instances AS c SET parent_id = NULL, parent_step = NULL, updated_at = now()
        FROM kids WHERE c.id = kids.id
        RETURNING c.id
    ), orphans_cancelled AS (
        -- as at a parent's end (storage/children.py)
        {parent_end_cancels("kids AS c")}
        RETURNING 1
    ), summary AS (
        INSERT INTO kenning_instance_runs (instance_id, run, input, started_at, ended_at, steps, ended)
        SELECT go.id, go.run, go.input,
               coalesce((SELECT max(r.ended_at) FROM kenning_instance_runs AS r WHERE r.instance_id = go.id),
                        go.started_at),
               now(), (SELECT count(*) FROM dropped) + :pending, '{CONTINUED_AS_NEW}'
        FROM go
        RETURNING 1
    ), continued AS (
        UPDATE kenning_instances AS i
        SET input = CAST(:input AS jsonb), run = i.run + 1, attempts = '{{}}', runs_without_progress = 0,
            updated_at = now()
        FROM go
        WHERE i.id = go.id AND (SELECT count(*) FROM summary) = 1
        RETURNING i.run
    )
    SELECT fence.cancel_requested, (SELECT run FROM continued) AS run,
           (SELECT count(*) FROM uncompensated) AS uncompensated,
           (SELECT count(*) FROM detached) AS detached,
           (SELECT {notify(CHANNEL_INBOX)} FROM orphans_cancelled LIMIT 1) AS inbox_notified
    FROM fence
    """
)


@dataclass(frozen=True)
class Continued:
    """What ``run_continue`` did; None from it: the lease was lost."""

    run: int | None  # the new run's number; None: cancellation was requested, nothing written
    detached_children: int = 0


async def run_continue(
    conn: Executor, instance_id: str, token: str, new_input: dict[str, Any], *, pending_steps: int = 0
) -> Continued | None:
    """End the leased run of ``instance_id`` and make the next one with ``new_input``
    (module docstring); ``pending_steps``: steps the run recorded that were never written
    (a held-back record), counted in the summary."""
    params = {
        "id": instance_id,
        "token": token,
        "input": json.dumps(sealed_input(instance_id, new_input)),
        "pending": pending_steps,
    }
    row = (await conn.execute(_RUN_CONTINUE, params)).first()
    if row is None:
        return None
    if row.cancel_requested:
        return Continued(None)
    return Continued(int(row.run), int(row.detached))


@dataclass(frozen=True)
class RunRow:
    """One run of an instance's chain: an earlier one (``kenning_instance_runs``), or the
    one in progress or last (``ended_at`` its finish, ``ended`` its status)."""

    run: int
    started_at: datetime | None
    ended_at: datetime | None
    steps: int
    ended: str


_RUNS_LIST = statement(
    """
    SELECT run, started_at, ended_at, steps, ended FROM (
        SELECT r.run, r.started_at, r.ended_at, r.steps, r.ended
        FROM kenning_instance_runs AS r WHERE r.instance_id = :id
        UNION ALL
        SELECT i.run,
               coalesce((SELECT max(p.ended_at) FROM kenning_instance_runs AS p WHERE p.instance_id = i.id),
                        i.started_at),
               i.finished_at, (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id = i.id), i.status
        FROM kenning_instances AS i WHERE i.id = :id
    ) AS chain
    ORDER BY run DESC
    LIMIT :limit
    """
)


async def runs_list(conn: Executor, instance_id: str, *, limit: int | None = None) -> list[RunRow]:
    """The chain of runs of ``instance_id``, oldest first, the current one last (one row
    for an instance that never continued; none for an unknown id); ``limit``: the newest
    so many only."""
    result = await conn.execute(_RUNS_LIST, {"id": instance_id, "limit": limit})
    rows = [RunRow(r.run, r.started_at, r.ended_at, int(r.steps), r.ended) for r in result]
    return rows[::-1]
