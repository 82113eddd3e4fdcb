"""SQL for forks (migration 0023, ``kenning instances fork``): a new instance whose history
is its original's up to a step, which then runs today's code from there.

One statement makes the fork: the new row (``pending``, linked to its original by
``forked_from`` and ``forked_from_step``), the copy of the history before the step, the
compensations those kept steps registered, the stream entries they wrote, and the
``NOTIFY`` that wakes a worker, so a fork is there whole or not at all. What it keeps and
drops is documented in docs/operations.md ("Forking an instance"); in short it keeps the
workflow body's records before the step (a replay returns them, so those steps do not run
again) and drops everything that belongs to the original's run rather than to its
history: its waits, its mailbox, its published values, its compensation records. A kept
``subscribe`` step subscribes the fork to its channel too. A kept ``start_child`` whose
child is still running is refused before this statement (``fork_points`` names the child,
``kenning.client.forks.resolve_step`` refuses): the child tells only its parent of its
end, so the fork would wait for ever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import (
    CHANNEL_INSTANCES,
    CHANNEL_SUBSCRIBED,
    CHILD_STARTED,
    COMPENSATION_EXECUTED,
    COMPENSATION_FAILED,
    COMPENSATION_SKIPPED,
    ON_FAILURE_PREFIX,
)
from kenning.db import Executor, statement
from kenning.storage.children import TERMINAL
from kenning.storage.names import notify

# history kinds a fork never keeps: the original's rollback is not the fork's (a fork that
# fails runs its compensations itself)
_DROPPED_KINDS = f"'{COMPENSATION_EXECUTED}', '{COMPENSATION_FAILED}', '{COMPENSATION_SKIPPED}'"

_INSTANCE_FORK = statement(
    f"""
    WITH original AS (
        -- FOR SHARE: retention cannot delete it under the copy; its own steps go on
        SELECT * FROM kenning_instances WHERE id = :id FOR SHARE
    ), numbered AS (
        -- the step numbers kenning instances show prints: the history in seq order, from 1
        SELECT h.*, row_number() OVER (ORDER BY h.seq) AS n
        FROM kenning_history AS h JOIN original AS o ON h.instance_id = o.id
    ), kept AS (
        SELECT * FROM numbered WHERE n < :step AND kind NOT IN ({_DROPPED_KINDS})
    ), inserted AS (
        INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, queue_name,
                                       partition_key, priority, deadline_at, forked_from, forked_from_step,
                                       run_count)
        -- a workflow timeout counts from the fork's start, as long as the original's was;
        -- run_count 1 when it has history: a worker loads the history of an instance
        -- claimed before, and skips the load for a fresh one (run_count 0)
        SELECT :fork_id, o.workflow_name, coalesce(CAST(:source_hash AS text), o.source_hash),
               coalesce(CAST(:input AS jsonb), o.input), now(), o.queue_name, o.partition_key, o.priority,
               now() + (o.deadline_at - o.created_at), o.id, :step,
               CASE WHEN EXISTS (SELECT FROM kept) THEN 1 ELSE 0 END
        FROM original AS o
        RETURNING id
    ), copied AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload, payload_bytes, created_at,
                                     attempts, started_at, run_seconds)
        SELECT f.id, k.step_id, k.kind, k.step_name, k.payload, k.payload_bytes, k.created_at,
               k.attempts, k.started_at, k.run_seconds
        FROM kept AS k CROSS JOIN inserted AS f
        ORDER BY k.seq
        RETURNING step_id
    ), compensations AS (
        -- those registered by a kept activity (its step id, or @on_failure's prefix and it);
        -- one registered in workflow code has no step: the replay registers it again
        INSERT INTO kenning_compensations (instance_id, comp_id, position, function_name, args, kwargs,
                                           retry_policy, created_at)
        SELECT f.id, c.comp_id, c.position, c.function_name, c.args, c.kwargs, c.retry_policy, c.created_at
        FROM kenning_compensations AS c CROSS JOIN inserted AS f
        WHERE c.instance_id = :id
          AND (CASE WHEN starts_with(c.comp_id, :on_failure) THEN substr(c.comp_id, length(:on_failure) + 1)
                    ELSE c.comp_id END) IN (SELECT step_id FROM kept)
        RETURNING comp_id
    ), subscribed AS (
        -- a kept subscribe is not run again: the fork is subscribed as it would have been;
        -- the channel is a framework field, plain with payload encryption on (only the
        -- user's values in a record are sealed: docs/operations.md, "What stays plain")
        INSERT INTO kenning_channel_subscriptions (channel, instance_id)
        SELECT DISTINCT k.payload ->> 'channel', f.id
        FROM kept AS k CROSS JOIN inserted AS f
        WHERE k.kind = '{CHANNEL_SUBSCRIBED}' AND k.payload ->> 'channel' IS NOT NULL
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), cut AS (
        -- when the first record not kept was written: an entry or a close from workflow
        -- code (no step id) committed in an earlier transaction than it, so before it on
        -- the database clock, and one of a later step at or after it
        SELECT min(created_at) AS at FROM numbered WHERE n >= :step
    ), entries AS (
        -- the entries kept steps wrote (an activity's carry its step id), numbered again
        -- from 0: a stream has no gaps
        INSERT INTO kenning_stream_entries (instance_id, key, "offset", attempt, step_id, value, written_at)
        SELECT f.id, e.key, row_number() OVER (PARTITION BY e.key ORDER BY e."offset") - 1, e.attempt, e.step_id,
               e.value, e.written_at
        FROM kenning_stream_entries AS e CROSS JOIN inserted AS f
        WHERE e.instance_id = :id
          AND (e.step_id IN (SELECT step_id FROM kept)
               OR (e.step_id IS NULL AND e.written_at < coalesce((SELECT at FROM cut), 'infinity')))
        RETURNING key
    ), streams AS (
        -- closed by close_stream before the step (not by the original's end: ended)
        INSERT INTO kenning_streams (instance_id, key, length, closed_at)
        SELECT f.id, s.key, (SELECT count(*) FROM entries AS e WHERE e.key = s.key),
               CASE WHEN NOT s.ended AND s.closed_at < coalesce((SELECT at FROM cut), 'infinity') THEN s.closed_at END
        FROM kenning_streams AS s CROSS JOIN inserted AS f
        WHERE s.instance_id = :id AND s.key IN (SELECT key FROM entries)
        RETURNING key
    )
    SELECT f.id,
           (SELECT count(*) FROM copied) AS steps,
           (SELECT count(*) FROM compensations) AS compensations,
           (SELECT count(*) FROM entries) AS entries,
           {notify(CHANNEL_INSTANCES)} AS notified
    FROM inserted AS f
    """
)


@dataclass(frozen=True)
class Forked:
    """What a fork kept of its original: history records, compensations, stream entries."""

    fork_id: str
    steps: int
    compensations: int
    stream_entries: int


async def instance_fork(
    conn: Executor,
    instance_id: str,
    fork_id: str,
    step: int,
    *,
    input_json: Any = None,
    source_hash: str | None = None,
) -> Forked | None:
    """Make ``fork_id`` a fork of ``instance_id`` at ``step`` (its history's records
    numbered from 1 in order; those before it are kept), runnable now; ``input_json``
    (JSON already) replaces the input its replay sees. None when the original does not
    exist."""
    params = {
        "id": instance_id,
        "fork_id": fork_id,
        "step": step,
        "input": None if input_json is None else json.dumps(codecs.seal(input_json)),  # sealed as a start's
        "source_hash": source_hash,
        "on_failure": ON_FAILURE_PREFIX,
    }
    row = (await conn.execute(_INSTANCE_FORK, params)).first()
    if row is None:
        return None
    return Forked(str(row.id), int(row.steps), int(row.compensations), int(row.entries))


@dataclass(frozen=True)
class ForkRow:
    id: str
    step: int
    status: str
    created_at: datetime


_FORKS_OF = statement(
    """
    SELECT id, forked_from_step AS step, status, created_at
    FROM kenning_instances
    WHERE forked_from = :id
    ORDER BY created_at, id
    LIMIT :limit
    """
)


async def forks_of(conn: Executor, instance_id: str, *, limit: int = 100) -> list[ForkRow]:
    """The forks made of an instance, oldest first (index ``kenning_instances_forked_from``)."""
    return [ForkRow(**row._asdict()) for row in await conn.execute(_FORKS_OF, {"id": instance_id, "limit": limit})]


@dataclass(frozen=True)
class ForkPoint:
    """A record of an instance's history, numbered as ``kenning instances show`` numbers it;
    ``running_child`` the child a ``start_child`` record names while that child has not
    ended (a fork keeping the record would wait for its end for ever: only the child's
    parent, the original, is told of it)."""

    number: int
    step_id: str
    kind: str
    step_name: str
    running_child: str | None = None


_FORK_POINTS = statement(
    f"""
    SELECT row_number() OVER (ORDER BY h.seq) AS number, h.step_id, h.kind, h.step_name, c.id AS running_child
    FROM kenning_history AS h
    -- the child by the id its start record names (plain: a framework field): a fork's kept
    -- record names its original's child; a primary-key probe for start records only
    LEFT JOIN kenning_instances AS c
        ON h.kind = '{CHILD_STARTED}' AND c.id = h.payload ->> 'child_id' AND c.status NOT IN {TERMINAL}
    WHERE h.instance_id = :id
    ORDER BY h.seq
    LIMIT :limit
    """
)


async def fork_points(conn: Executor, instance_id: str, *, limit: int | None = None) -> list[ForkPoint]:
    """The first ``limit`` records (None: all) of an instance's history with their
    numbers, without their payloads (a start_child's child id aside): what a fork's step
    is resolved against, and what the console's fork form offers."""
    rows = await conn.execute(_FORK_POINTS, {"id": instance_id, "limit": limit})
    return [ForkPoint(int(r.number), r.step_id, r.kind, r.step_name, r.running_child) for r in rows]
