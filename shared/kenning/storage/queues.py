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

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kenning.core.names import CHANNEL_INSTANCES
from kenning.db import Executor, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.names import notify

_QUEUES_DECLARE = statement(
    """
    INSERT INTO kenning_queues AS q (name, concurrency, worker_concurrency, rate_limit, rate_period_seconds,
                                     partition_concurrency, partition_strategy, key_rate_limit,
                                     key_rate_period_seconds, declared_at)
    SELECT d.name, d.concurrency, d.worker_concurrency, d.rate_limit, d.rate_period_seconds,
           d.partition_concurrency, d.partition_strategy, d.key_rate_limit, d.key_rate_period_seconds, now()
    FROM jsonb_to_recordset(CAST(:queues AS jsonb)) AS d(
        name text, concurrency integer, worker_concurrency integer, rate_limit integer,
        rate_period_seconds double precision, partition_concurrency integer, partition_strategy text,
        key_rate_limit integer, key_rate_period_seconds double precision)
    -- the last worker to start says which limits apply (a deploy changing them); a row
    -- already saying so is not written, and an operator's pause stays
    ON CONFLICT (name) DO UPDATE SET
        concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency,
        rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        partition_concurrency = EXCLUDED.partition_concurrency, partition_strategy = EXCLUDED.partition_strategy,
        key_rate_limit = EXCLUDED.key_rate_limit, key_rate_period_seconds = EXCLUDED.key_rate_period_seconds,
        declared_at = now()
    WHERE (q.concurrency, q.worker_concurrency, q.rate_limit, q.rate_period_seconds, q.partition_concurrency,
           q.partition_strategy, q.key_rate_limit, q.key_rate_period_seconds)
          IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.worker_concurrency, EXCLUDED.rate_limit,
                            EXCLUDED.rate_period_seconds, EXCLUDED.partition_concurrency,
                            EXCLUDED.partition_strategy, EXCLUDED.key_rate_limit, EXCLUDED.key_rate_period_seconds)
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
    partition_strategy: str = "wait"
    key_rate_limit: int | None = None  # starts per key_rate_period_seconds for each partition key
    key_rate_period_seconds: float | None = None


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
           q.partition_concurrency, q.paused, q.partition_strategy, q.key_rate_limit, q.key_rate_period_seconds,
           s.depth, s.running, s.oldest_seconds, h.held, h.held_keys
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
    -- never started, not leased and not due: held back by a key's rate window (the claim
    -- moved them to when it frees); the keys soonest to free first, with that time
    LEFT JOIN LATERAL (
        SELECT sum(k.held) AS held,
               (array_agg(jsonb_build_object('key', k.partition_key, 'held', k.held, 'until', k.until)
                          ORDER BY k.until, k.partition_key))[1:5] AS held_keys
        FROM (SELECT i.partition_key, count(*) AS held, min(i.available_at) AS until
              FROM kenning_instances AS i
              WHERE i.queue_name = q.name AND i.queue_name IS NOT NULL AND i.status = 'pending'
                AND i.started_at IS NULL AND i.lease_token IS NULL AND i.available_at > {NOW}
              GROUP BY i.partition_key) AS k
    ) AS h ON q.key_rate_limit IS NOT NULL
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
    partition_strategy: str = "wait"
    key_rate_limit: int | None = None
    key_rate_period_seconds: float | None = None
    rate_held: int = 0  # held back by their key's rate window
    # the keys held back soonest to free (at most 5): key, instances held, until when
    rate_held_keys: tuple[tuple[str, int, datetime], ...] = ()


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
            partition_strategy=row.partition_strategy,
            key_rate_limit=row.key_rate_limit,
            key_rate_period_seconds=row.key_rate_period_seconds,
            rate_held=int(row.held or 0),
            rate_held_keys=tuple(
                (str(k["key"]), int(k["held"]), datetime.fromisoformat(k["until"])) for k in row.held_keys or ()
            ),
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


_INSTANCE_KEY_STATE = statement(
    f"""
    SELECT i.queue_name, i.partition_key, q.paused, q.partition_strategy, q.partition_concurrency,
           q.key_rate_limit, q.key_rate_period_seconds,
           (SELECT count(*) FROM kenning_instances AS l
            WHERE l.queue_name = i.queue_name AND l.queue_name IS NOT NULL AND l.lease_token IS NOT NULL
              AND l.available_at > {NOW} AND l.partition_key = i.partition_key) AS key_leased,
           r.started AS key_started, r.frees_at AS key_frees_at,
           {NOW} AS db_now
    FROM kenning_instances AS i
    JOIN kenning_queues AS q ON q.name = i.queue_name
    LEFT JOIN LATERAL (
        SELECT count(*) AS started,
               (SELECT s.started_at + make_interval(secs => q.key_rate_period_seconds)
                FROM kenning_instances AS s
                WHERE s.queue_name = i.queue_name AND s.queue_name IS NOT NULL AND s.partition_key = i.partition_key
                  AND s.started_at > {NOW} - make_interval(secs => q.key_rate_period_seconds)
                ORDER BY s.started_at DESC OFFSET q.key_rate_limit - 1 LIMIT 1) AS frees_at
        FROM kenning_instances AS w
        WHERE w.queue_name = i.queue_name AND w.queue_name IS NOT NULL AND w.partition_key = i.partition_key
          AND w.started_at > {NOW} - make_interval(secs => q.key_rate_period_seconds)
    ) AS r ON q.key_rate_limit IS NOT NULL
    WHERE i.id = :id AND i.queue_name IS NOT NULL
    """
)


@dataclass(frozen=True)
class KeyState:
    """Where a queued instance's partition key stands against its queue's limits: what
    ``kenning why`` and the console say a queued instance waits for, and until when."""

    queue_name: str
    partition_key: str
    paused: bool
    partition_strategy: str
    partition_concurrency: int | None
    key_leased: int  # the key's instances leased now (its slots held)
    key_rate_limit: int | None
    key_rate_period_seconds: float | None
    key_started: int | None  # the key's starts in its rate window (None: no per-key rate limit)
    key_frees_at: datetime | None  # when the window lets the key's next start through, if full
    db_now: datetime

    @property
    def rate_full(self) -> bool:
        return self.key_rate_limit is not None and (self.key_started or 0) >= self.key_rate_limit

    @property
    def slots_full(self) -> bool:
        return self.partition_concurrency is not None and self.key_leased >= self.partition_concurrency


async def instance_key_state(conn: Executor, instance_id: str, now: datetime | None = None) -> KeyState | None:
    """A queued instance's key against its queue's limits; None for one in no queue."""
    row = (await conn.execute(_INSTANCE_KEY_STATE, {"id": instance_id, "now": now})).first()
    if row is None:
        return None
    return KeyState(
        queue_name=row.queue_name,
        partition_key=row.partition_key,
        paused=bool(row.paused),
        partition_strategy=row.partition_strategy,
        partition_concurrency=row.partition_concurrency,
        key_leased=int(row.key_leased),
        key_rate_limit=row.key_rate_limit,
        key_rate_period_seconds=row.key_rate_period_seconds,
        key_started=None if row.key_started is None else int(row.key_started),
        key_frees_at=row.key_frees_at,
        db_now=row.db_now,
    )
