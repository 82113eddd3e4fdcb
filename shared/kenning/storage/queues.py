"""SQL for queues with limits: their declarations, their claim, the operator's view.

The queued claim takes a queue's instances under its limits in one statement, so limits
hold across any number of workers and survive crashes (nothing lives in worker memory):

- it locks the queue's row (``FOR UPDATE SKIP LOCKED``): one claim per queue at a time;
  a worker finding it locked leaves the queue to the claim in progress;
- it admits nothing if its snapshot is older than the last admitting claim: a READ
  COMMITTED statement's snapshot is taken before it acquires the row lock, so a claim
  that committed in between would be invisible to its counts. Every admitting claim
  bumps ``claim_seq``; the lock returns the row's latest version, a plain read the
  snapshot's, and they differ exactly when such a claim committed in between;
- the counts come from the instance rows themselves: leased instances of the queue
  (``lease_token`` set and the lease not expired: a crashed worker's slot frees when its
  lease expires), those leased by this worker, those of each partition key, and the starts
  (``started_at``, set by the first claim) within the rate limit's window;
- partitions are served round-robin: a walk over the queue's partition keys (one index
  probe per key) from the key after the last one served (``partition_cursor``), taking
  each key's first instances by priority and age, at most the key's free slots, the first
  of every key before the second of any; the cursor moves to the last key served. A claim
  serving none moves it past keys that were full or had nothing due, never past one whose
  due instance it could not take (a worker knowing none of the key's workflows): a claim
  that cannot serve a key does not cost the key its turn.

The plain claim (``instances.instance_claim``) never sees queued instances: the claimable
index leaves them out (migration 0005), so a queue's backlog costs it nothing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kenning.core.names import CHANNEL_INSTANCES
from kenning.db import Executor, Statement, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.instances import DEFAULT_MAX_RUNS, Claim, claim_parts, claimed_row, takeover_columns
from kenning.storage.names import notify

# A queue's runnable instances: kenning_instances_queued's rows of :queue.
_QUEUED = "i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.status IN ('pending', 'running', 'compensating')"


@functools.cache
def _queue_claim_statement(max_runs: int, take_suspect: bool) -> Statement:
    parts = claim_parts(max_runs, take_suspect)
    next_key = f"""(SELECT i.partition_key FROM kenning_instances AS i
                    WHERE {_QUEUED} AND i.partition_key > {{after}}
                    ORDER BY i.partition_key LIMIT 1)"""
    first_key = f"""(SELECT i.partition_key FROM kenning_instances AS i
                     WHERE {_QUEUED} ORDER BY i.partition_key LIMIT 1)"""
    return statement(
        f"""
    WITH RECURSIVE locked AS MATERIALIZED (
        SELECT name, concurrency, worker_concurrency, rate_limit, rate_period_seconds, partition_concurrency,
               claim_seq, partition_cursor
        FROM kenning_queues
        WHERE name = :queue AND NOT paused
        FOR UPDATE SKIP LOCKED
    ), queue AS MATERIALIZED (
        -- the lock returns the row's latest version; equal to the snapshot's, no claim of
        -- this queue committed since this statement's snapshot, so its counts are current
        SELECT l.* FROM locked AS l
        WHERE l.claim_seq = (SELECT s.claim_seq FROM kenning_queues AS s WHERE s.name = l.name)
    ), leased AS MATERIALIZED (
        SELECT i.partition_key, i.lease_owner
        FROM kenning_instances AS i
        WHERE i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.lease_token IS NOT NULL
          AND i.available_at > {NOW}
          AND EXISTS (SELECT FROM queue)
    ), budget AS MATERIALIZED (
        SELECT q.partition_concurrency AS per_key, q.partition_cursor AS cursor,
               -- least() skips NULLs: a limit the queue does not have
               greatest(0, least(
                   CAST(:limit AS integer),
                   q.concurrency - (SELECT count(*) FROM leased),
                   q.worker_concurrency - (SELECT count(*) FROM leased AS l WHERE l.lease_owner = :owner),
                   q.rate_limit - r.started)) AS n,
               CASE WHEN r.started >= q.rate_limit
                    THEN CAST(extract(epoch FROM r.oldest + make_interval(secs => q.rate_period_seconds) - {NOW})
                              AS float8) END AS rate_wait
        FROM queue AS q
        LEFT JOIN LATERAL (
            SELECT count(*) AS started, min(i.started_at) AS oldest
            FROM kenning_instances AS i
            WHERE i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.started_at IS NOT NULL
              AND i.started_at > {NOW} - make_interval(secs => q.rate_period_seconds)
        ) AS r ON q.rate_limit IS NOT NULL
    ), walk (key, depth, lapped) AS (
        -- the queue's partition keys from the one after the cursor, wrapping around once
        SELECT k.key, 1, k.key <= b.cursor
        FROM budget AS b
        -- OFFSET 0: evaluated once per row, not copied into every condition naming it
        CROSS JOIN LATERAL (SELECT coalesce({next_key.format(after="b.cursor")}, {first_key}) AS key OFFSET 0) AS k
        WHERE b.n > 0 AND k.key IS NOT NULL
        UNION ALL
        SELECT k.key, w.depth + 1, w.lapped OR k.key <= w.key
        FROM walk AS w
        CROSS JOIN budget AS b
        CROSS JOIN LATERAL (
            SELECT coalesce({next_key.format(after="w.key")}, CASE WHEN NOT w.lapped THEN {first_key} END) AS key
            OFFSET 0
        ) AS k
        WHERE w.depth < :walk_limit AND k.key IS NOT NULL
          AND NOT ((w.lapped OR k.key <= w.key) AND k.key > b.cursor)
    ), offered AS (
        -- each key's first instances, as many as its free slots (and the claim's budget)
        SELECT o.*, w.depth,
               row_number() OVER (PARTITION BY w.key ORDER BY o.priority, o.available_at, o.id) AS turn
        FROM walk AS w
        CROSS JOIN budget AS b
        CROSS JOIN LATERAL (
            SELECT i.id, i.partition_key, i.priority, {takeover_columns("i")},
                   i.runs_without_progress, i.claimed_at, i.available_at
            FROM kenning_instances AS i
            WHERE {_QUEUED} AND i.partition_key = w.key AND i.available_at <= {NOW}
              AND i.workflow_name = ANY(:names)
              {parts.lease_filter}
            ORDER BY i.priority, i.available_at
            LIMIT greatest(0, least(b.n, b.per_key - (SELECT count(*) FROM leased AS l
                                                        WHERE l.partition_key = w.key)))
            FOR UPDATE OF i SKIP LOCKED
        ) AS o
    ), candidates AS MATERIALIZED (
        -- round-robin: every key's first before any key's second
        SELECT * FROM offered ORDER BY turn, priority, depth LIMIT (SELECT n FROM budget)
    ), chosen AS MATERIALIZED (
        {parts.chosen}
    ), claimed AS (
        UPDATE kenning_instances AS i
        SET {parts.set_clause}
        FROM chosen AS c
        -- the ids as an array too: the planner cannot tell how few rows the budget leaves
        -- and would hash-join the whole table; this keeps it to primary-key lookups
        WHERE i.id = c.id AND i.id = ANY(ARRAY(SELECT id FROM chosen))
        RETURNING {parts.returning}
    ), advanced AS (
        UPDATE kenning_queues AS q
        SET claim_seq = q.claim_seq + CASE WHEN EXISTS (SELECT FROM candidates) THEN 1 ELSE 0 END,
            -- the last key served, or the last one looked at if none could be
            partition_cursor = coalesce((SELECT c.partition_key FROM candidates AS c ORDER BY c.depth DESC LIMIT 1),
                                        (SELECT w.key FROM walk AS w ORDER BY w.depth DESC LIMIT 1))
        FROM queue
        WHERE q.name = queue.name
          AND CASE WHEN EXISTS (SELECT FROM candidates) THEN true
                   WHEN NOT EXISTS (SELECT FROM walk) THEN false
                   -- nothing served: the walk moves on past keys that were full or had nothing
                   -- due, not past a key with a free slot and a due instance this claim could
                   -- not take (another worker's workflow, a row locked): that key keeps its turn
                   ELSE NOT EXISTS (
                       SELECT FROM walk AS w CROSS JOIN budget AS b
                       WHERE (b.per_key IS NULL
                              OR (SELECT count(*) FROM leased AS l WHERE l.partition_key = w.key) < b.per_key)
                         AND EXISTS (SELECT FROM kenning_instances AS i
                                     WHERE {_QUEUED} AND i.partition_key = w.key AND i.available_at <= {NOW}
                                       {parts.lease_filter}))
              END
        RETURNING q.name
    )
    SELECT id, workflow_name, status, input, cancel_requested, lease_token, run_count, attempts,
           suspect, taken_over, park, runs_without_progress, trace_context,
           CAST(NULL AS boolean) AS busy, CAST(NULL AS float8) AS seconds_until_next
    FROM claimed
    UNION ALL
    -- nothing claimed: whether another claim holds the queue (try again soon), and when a
    -- rate limit that stopped this one lets the next start through
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NOT EXISTS (SELECT FROM queue)
               AND EXISTS (SELECT FROM kenning_queues AS s WHERE s.name = :queue AND NOT s.paused),
           (SELECT b.rate_wait FROM budget AS b)
    WHERE NOT EXISTS (SELECT FROM claimed)
    """
    )


@dataclass(frozen=True)
class QueueClaim(Claim):
    # nothing claimed because another worker's claim held the queue: worth trying again soon
    busy: bool = False


async def queue_claim(
    conn: Executor,
    *,
    queue: str,
    owner: str,
    workflow_names: Sequence[str],
    limit: int,
    lease_seconds: float,
    max_runs: int = DEFAULT_MAX_RUNS,
    take_suspect: bool = True,
    now: datetime | None = None,
) -> QueueClaim:
    """Claim up to ``limit`` instances of ``queue`` under its limits, in one round trip;
    ``seconds_until_next`` is set when a rate limit stopped it (when the next start may)."""
    if max_runs < 1:
        raise ValueError("max_runs must be at least 1")
    params = {
        "queue": queue,
        "owner": owner,
        "names": list(workflow_names),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "now": now,
        # keys looked at per claim: enough to fill it when most keys are full, bounded for
        # queues with many keys (the cursor carries the walk on in the next claim)
        "walk_limit": limit * 4 + 16,
    }
    claim = QueueClaim([], None)
    for row in await conn.execute(_queue_claim_statement(max_runs, take_suspect), params):
        if row.id is None:
            claim = QueueClaim(claim.instances, seconds_or_none(row.seconds_until_next), claim.parked, bool(row.busy))
        else:
            claimed_row(claim, row)
    return claim


_QUEUES_DECLARE = statement(
    """
    INSERT INTO kenning_queues AS q (name, concurrency, worker_concurrency, rate_limit, rate_period_seconds,
                                     partition_concurrency, declared_at)
    SELECT d.name, d.concurrency, d.worker_concurrency, d.rate_limit, d.rate_period_seconds,
           d.partition_concurrency, now()
    FROM jsonb_to_recordset(CAST(:queues AS jsonb)) AS d(
        name text, concurrency integer, worker_concurrency integer, rate_limit integer,
        rate_period_seconds double precision, partition_concurrency integer)
    -- the last worker to start says which limits apply (a deploy changing them); a row
    -- already saying so is not written, and an operator's pause stays
    ON CONFLICT (name) DO UPDATE SET
        concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency,
        rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        partition_concurrency = EXCLUDED.partition_concurrency, declared_at = now()
    WHERE (q.concurrency, q.worker_concurrency, q.rate_limit, q.rate_period_seconds, q.partition_concurrency)
          IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.worker_concurrency, EXCLUDED.rate_limit,
                            EXCLUDED.rate_period_seconds, EXCLUDED.partition_concurrency)
       OR q.declared_at IS NULL
    """
)


@dataclass(frozen=True)
class QueueLimits:
    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: float | None = None
    partition_concurrency: int | None = None


async def queues_declare(conn: Executor, queues: Sequence[QueueLimits]) -> None:
    """Write the limits of the queues a worker's code declares (at its start)."""
    if queues:
        await conn.execute(_QUEUES_DECLARE, {"queues": json.dumps([q.__dict__ for q in queues])})


_QUEUE_NAMES = statement("SELECT name FROM kenning_queues WHERE workflow_names && CAST(:names AS text[]) ORDER BY name")


async def queue_names(conn: Executor, workflow_names: Sequence[str]) -> list[str]:
    """The queues any of these workflows was ever started into (``workflow_names``, kept
    by every start), paused ones included (their claim takes nothing)."""
    return [str(row.name) for row in await conn.execute(_QUEUE_NAMES, {"names": list(workflow_names)})]


_QUEUES_OVERVIEW = statement(
    f"""
    SELECT q.name, q.concurrency, q.worker_concurrency, q.rate_limit, q.rate_period_seconds,
           q.partition_concurrency, q.paused,
           s.depth, s.running, s.oldest_seconds
    FROM kenning_queues AS q
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE i.lease_token IS NULL OR i.available_at <= {NOW}) AS depth,
               count(*) FILTER (WHERE i.lease_token IS NOT NULL AND i.available_at > {NOW}) AS running,
               CAST(extract(epoch FROM {NOW} - min(i.available_at)
                    FILTER (WHERE i.available_at <= {NOW})) AS float8) AS oldest_seconds
        FROM kenning_instances AS i
        WHERE i.queue_name = q.name AND i.queue_name IS NOT NULL
          AND i.status IN ('pending', 'running', 'compensating')
    ) AS s
    WHERE CAST(:name AS text) IS NULL OR q.name = :name
    ORDER BY q.name
    """
)


@dataclass(frozen=True)
class QueueOverview:
    name: str
    concurrency: int | None
    worker_concurrency: int | None
    rate_limit: int | None
    rate_period_seconds: float | None
    partition_concurrency: int | None
    paused: bool
    depth: int  # runnable and not leased: waiting for a slot, due or backing off
    running: int  # leased now
    oldest_seconds: float | None  # how long the oldest due one has been due


async def queues_overview(conn: Executor, name: str | None = None, now: datetime | None = None) -> list[QueueOverview]:
    """Each queue's limits, pause, depth, running count and oldest due instance's age:
    one pass over the queue's runnable rows (``kenning_instances_queued``)."""
    return [
        QueueOverview(
            name=row.name,
            concurrency=row.concurrency,
            worker_concurrency=row.worker_concurrency,
            rate_limit=row.rate_limit,
            rate_period_seconds=row.rate_period_seconds,
            partition_concurrency=row.partition_concurrency,
            paused=bool(row.paused),
            depth=int(row.depth),
            running=int(row.running),
            oldest_seconds=seconds_or_none(row.oldest_seconds),
        )
        for row in await conn.execute(_QUEUES_OVERVIEW, {"name": name, "now": now})
    ]


_QUEUE_SET_PAUSED = statement(
    f"""
    WITH changed AS (
        UPDATE kenning_queues SET paused = CAST(:paused AS boolean) WHERE name = :name RETURNING paused
    )
    -- a resumed queue's backlog is claimable now: wake the workers
    SELECT paused, CASE WHEN NOT paused THEN {notify(CHANNEL_INSTANCES)} END AS notified FROM changed
    """
)


async def queue_set_paused(conn: Executor, name: str, paused: bool) -> bool:
    """Pause (no claim takes the queue's instances; those running go on) or resume a
    queue; False if there is no such queue."""
    return (await conn.execute(_QUEUE_SET_PAUSED, {"name": name, "paused": paused})).first() is not None
