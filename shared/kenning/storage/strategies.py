"""SQL for a queue's partition strategy, applied when a start is made (kenning/queues.py).

A start into a queue whose ``partition_strategy`` is not ``wait`` is decided in the start's
transaction, under a transaction-level advisory lock per (queue, partition key): starts of
one key are decided one at a time, each counting what the ones before it committed (a
statement after the lock takes its snapshot after it), so a key's limit holds under any
number of concurrent starters. Keys are locked in one order (their hash), so two batches
sharing keys cannot deadlock. Starts into ``wait`` queues take no lock.

"Open" instances hold a key: unfinished ones (waiting for an event or a timer too) not
already asked to cancel (one being cancelled by ``cancel_in_progress`` holds it no more).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from kenning.db import Executor, statement
from kenning.storage.names import notify_results

STRATEGY_CANCELLED_TYPE = "kenning.queues.PartitionLimitCancelled"

_KEYS_LOCK = statement(
    """
    WITH pairs AS MATERIALIZED (
        SELECT DISTINCT p.queue, p.key, q.partition_strategy AS strategy,
               coalesce(q.partition_concurrency, 1) AS key_limit,
               hashtextextended(p.key, hashtextextended(p.queue, 35)) AS lock_key
        FROM jsonb_to_recordset(CAST(:pairs AS jsonb)) AS p(queue text, key text)
        JOIN kenning_queues AS q ON q.name = p.queue AND q.partition_strategy <> 'wait'
        ORDER BY lock_key
    )
    -- one order of locking for every batch: no two can wait for each other
    SELECT queue, key, strategy, key_limit, pg_advisory_xact_lock(lock_key) IS NULL AS locked
    FROM pairs ORDER BY lock_key
    """
)


@dataclass(frozen=True)
class KeyStrategy:
    queue: str
    key: str
    strategy: str
    limit: int


async def keys_lock(conn: Executor, pairs: Sequence[tuple[str, str]]) -> list[KeyStrategy]:
    """Lock (to the transaction's end) the keys among ``pairs`` whose queue has a strategy
    other than ``wait``, and say each one's strategy and limit."""
    payload = json.dumps([{"queue": q, "key": k} for q, k in sorted(set(pairs))])
    return [
        KeyStrategy(row.queue, row.key, row.strategy, int(row.key_limit))
        for row in await conn.execute(_KEYS_LOCK, {"pairs": payload})
    ]


_KEYS_OPEN = statement(
    """
    SELECT p.queue, p.key, i.id
    FROM jsonb_to_recordset(CAST(:pairs AS jsonb)) AS p(queue text, key text)
    JOIN kenning_instances AS i
      ON i.queue_name = p.queue AND i.partition_key = p.key AND i.queue_name IS NOT NULL
     AND i.status NOT IN ('completed', 'failed', 'cancelled') AND NOT i.cancel_requested
    ORDER BY p.queue, p.key, i.created_at, i.id
    """
)


async def keys_open(conn: Executor, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """Each key's open instances, oldest first (read after ``keys_lock``)."""
    payload = json.dumps([{"queue": q, "key": k} for q, k in sorted(set(pairs))])
    found: dict[tuple[str, str], list[str]] = {pair: [] for pair in pairs}
    for row in await conn.execute(_KEYS_OPEN, {"pairs": payload}):
        found[(row.queue, row.key)].append(str(row.id))
    return found


_CANCEL_AT_START = statement(
    f"""
    WITH ended AS (
        UPDATE kenning_instances
        SET status = 'cancelled', available_at = NULL, finished_at = now(), updated_at = now(),
            error = jsonb_build_object(
                'type', '{STRATEGY_CANCELLED_TYPE}', 'reason', 'cancel_newest',
                'message', format('cancelled at start: partition key %1$L of queue %2$L is at its limit '
                                  '(partition_strategy cancel_newest)', partition_key, queue_name))
        WHERE id = ANY(CAST(:ids AS text[])) AND status = 'pending' AND started_at IS NULL
        RETURNING id
    )
    SELECT count(*) AS ended, {notify_results("ended")} AS notified FROM ended
    """
)


async def instances_cancel_at_start(conn: Executor, ids: Sequence[str]) -> int:
    """End instances just inserted over their key's limit as cancelled (``cancel_newest``),
    telling the clients awaiting them."""
    if not ids:
        return 0
    return int((await conn.execute(_CANCEL_AT_START, {"ids": list(ids)})).one().ended)


_KEY_OPEN_INSTANCE = statement(
    """
    SELECT id FROM kenning_instances
    WHERE queue_name = :queue AND partition_key = :key AND queue_name IS NOT NULL
    ORDER BY status IN ('completed', 'failed', 'cancelled'), cancel_requested, created_at DESC
    LIMIT 1
    """
)


async def key_open_instance(conn: Executor, queue: str, key: str) -> str | None:
    """The instance a singleton start joined: the key's open one (else, if it ended since,
    its latest)."""
    row = (await conn.execute(_KEY_OPEN_INSTANCE, {"queue": queue, "key": key})).first()
    return None if row is None else str(row.id)
