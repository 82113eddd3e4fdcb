"""SQL for what moves an instance on: the scheduler's stuck check and ``kenning why``.

Every unfinished instance has a way forward (docs/architecture.md invariant 7): ``pending``,
``running`` and ``compensating`` ones a due or future ``available_at`` (a lease's expiry
while leased, a compensation's next attempt while released), ``waiting_for_timer`` ones a
timer, ``waiting_for_event`` ones a subscription, ``waiting_for_message`` ones a receive
wait with an empty mailbox (a message for them must have woken them: kenning.storage.
messages). Kenning keeps it by construction; the
stuck check is the net under that: one statement finds instances without any (a bug, a
hand-edited row, a restore of part of the tables) and repairs them, making them runnable
now (a waiting one replays and registers its wait again), or marks them with the reason
a repair cannot help: their workflow is one no process registered, or repairs were made
``max_repairs`` times and it lost its way forward again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.names import CHANNEL_INSTANCES, CHILD_EVENT_SOURCE, CHILD_EVENT_TYPE
from kenning.db import Executor, statement
from kenning.storage.names import notify
from kenning.storage.processes import LIVE_VERSIONS

UNKNOWN_WORKFLOW = "unknown_workflow"
REPAIR_FAILED = "repair_failed"

# Non-terminal states whose way forward is the instance row's own available_at.
_RUNNABLE = "('pending', 'running', 'compensating')"
_WAITING = "('waiting_for_timer', 'waiting_for_event', 'waiting_for_message')"
# a receive waiting while its mailbox holds a message (kenning.storage.messages): never
# committed by the mailbox's lock; if it were, the message would wait for nothing
_MESSAGE_WAITING_FOR_NOTHING = """EXISTS (
    SELECT FROM kenning_message_waits AS w
    JOIN kenning_messages AS m ON m.instance_id = w.instance_id AND m.topic = w.topic AND m.consumed_step_id IS NULL
    WHERE w.instance_id = i.id)"""

_CHILD_ENDED_UNTOLD = f"""SELECT s.instance_id AS id FROM kenning_event_subscriptions AS s
        JOIN kenning_instances AS c ON c.id = s.match ->> 'child_id'
        WHERE s.event_type = '{CHILD_EVENT_TYPE}' AND s.checked_at IS NOT NULL
          AND c.status IN ('completed', 'failed', 'cancelled')
          AND NOT EXISTS (SELECT FROM kenning_inbox AS x
                          WHERE x.kind = 'event' AND x.source = '{CHILD_EVENT_SOURCE}' AND x.event_id = c.id
                            AND x.status = 'pending')"""

_STUCK_REPAIR = statement(
    f"""
    WITH candidates AS (
        -- no due time: the claimable index's NULL entries
        SELECT id FROM kenning_instances WHERE status IN {_RUNNABLE} AND available_at IS NULL AND queue_name IS NULL
        UNION ALL  -- queued ones: kenning_instances_queued_undue (empty unless something is wrong)
        SELECT id FROM kenning_instances
        WHERE status IN {_RUNNABLE} AND available_at IS NULL AND queue_name IS NOT NULL
        UNION ALL
        -- waiting with nothing to wake it: the waiting index against the waits' keys
        SELECT i.id FROM kenning_instances AS i
        WHERE i.status = 'waiting_for_timer'
          AND NOT EXISTS (SELECT FROM kenning_timers AS t WHERE t.instance_id = i.id)
        UNION ALL
        SELECT i.id FROM kenning_instances AS i
        WHERE i.status = 'waiting_for_event'
          AND NOT EXISTS (SELECT FROM kenning_event_subscriptions AS s WHERE s.instance_id = i.id)
        UNION ALL
        -- a parent waiting for a child that ended with no event on its way to wake it (the
        -- claim parks a crash-looping child without telling its parent): made runnable, it
        -- takes the child's end itself (kenning.storage.children.child_wait_or_suspend)
        {_CHILD_ENDED_UNTOLD}
        UNION ALL
        SELECT i.id FROM kenning_instances AS i
        WHERE i.status = 'waiting_for_message'
          AND (NOT EXISTS (SELECT FROM kenning_message_waits AS w WHERE w.instance_id = i.id)
               OR {_MESSAGE_WAITING_FOR_NOTHING})
    ), stuck AS (
        -- only those a pass would change: a marked instance stays as it is until its
        -- workflow is registered (or an operator moves it), so marked ones never crowd
        -- the batch; the row's own conditions are re-checked on its latest version
        SELECT i.id, i.workflow_name, i.status, i.stuck_repairs,
               EXISTS (SELECT FROM kenning_workflow_definitions AS d WHERE d.workflow_name = i.workflow_name)
                   AS known,
               CASE WHEN {_MESSAGE_WAITING_FOR_NOTHING}
                    THEN 'waiting_for_message with a message for it in its mailbox'
                    ELSE 'waiting_for_message without a receive wait' END AS message_missing
        FROM kenning_instances AS i
        -- = ANY(ARRAY(...)): one primary-key probe per candidate (they are few), never a
        -- join the planner might run along the whole primary key
        WHERE i.id = ANY(ARRAY(SELECT id FROM candidates))
          AND ((i.status IN {_RUNNABLE} AND i.available_at IS NULL) OR i.status IN {_WAITING})
          AND (i.stuck_reason IS NULL
               OR (i.stuck_repairs < :max_repairs
                   AND EXISTS (SELECT FROM kenning_workflow_definitions AS d
                               WHERE d.workflow_name = i.workflow_name)))
        ORDER BY i.id
        LIMIT :limit
        FOR UPDATE OF i SKIP LOCKED
    ), verdict AS (
        SELECT s.id, s.workflow_name, s.status, s.stuck_repairs,
               CASE s.status WHEN 'waiting_for_timer' THEN 'waiting_for_timer without a timer'
                             WHEN 'waiting_for_event' THEN CASE
                                 WHEN EXISTS (SELECT FROM kenning_event_subscriptions AS w WHERE w.instance_id = s.id)
                                 THEN 'waiting_for_event for a child that ended, not woken'
                                 ELSE 'waiting_for_event without a subscription' END
                             WHEN 'waiting_for_message' THEN s.message_missing
                             ELSE s.status || ' without a due time or a lease' END AS missing,
               CASE WHEN NOT s.known THEN '{UNKNOWN_WORKFLOW}'
                    WHEN s.stuck_repairs >= :max_repairs THEN '{REPAIR_FAILED}' END AS cause
        FROM stuck AS s
    ), changed AS (
        UPDATE kenning_instances AS i
        SET status = CASE WHEN v.cause IS NULL AND i.status IN {_WAITING} THEN 'pending' ELSE i.status END,
            available_at = CASE WHEN v.cause IS NULL THEN now() ELSE i.available_at END,
            stuck_reason = CASE v.cause
                WHEN '{UNKNOWN_WORKFLOW}' THEN format(
                    '%s, and no process ever registered workflow %L: start a worker with its code',
                    v.missing, i.workflow_name)
                WHEN '{REPAIR_FAILED}' THEN format(
                    '%s again after %s repairs: repairing it does not help; cancel it or look at kenning why',
                    v.missing, i.stuck_repairs)
                END,
            stuck_repairs = i.stuck_repairs + CASE WHEN v.cause IS NULL THEN 1 ELSE 0 END,
            stuck_at = now(),
            updated_at = now()
        FROM verdict AS v
        WHERE i.id = v.id
        RETURNING i.id, i.workflow_name, v.status AS found_status, v.missing, v.cause, i.stuck_reason,
                  i.stuck_repairs
    ), unwaited AS (
        -- a repaired receive registers its wait again when it replays
        DELETE FROM kenning_message_waits AS w
        USING changed AS c
        WHERE w.instance_id = c.id AND c.cause IS NULL
        RETURNING w.instance_id
    ), settled AS (
        -- a marked instance that moved on since (cancelled, its workflow registered and
        -- repaired by another pass...) loses its reason: the tiny stuck index finds them
        UPDATE kenning_instances AS i SET stuck_reason = NULL
        WHERE i.stuck_reason IS NOT NULL AND i.id NOT IN (SELECT id FROM candidates)
        RETURNING i.id
    )
    SELECT c.id, c.workflow_name, c.found_status, c.missing, c.cause, c.stuck_reason, c.stuck_repairs,
           CASE WHEN c.cause IS NULL THEN {notify(CHANNEL_INSTANCES)} END AS notified,
           (SELECT count(*) FROM settled) AS settled_count
    FROM changed AS c
    ORDER BY c.id
    """
)


@dataclass(frozen=True)
class StuckInstance:
    """An instance the check found with no way forward, and what it did."""

    instance_id: str
    workflow_name: str
    status: str  # as found
    missing: str  # what its status calls for and it lacked
    cause: str | None  # None: repaired (runnable now); else why it was only marked
    reason: str | None  # the sentence stored in stuck_reason (None when repaired)
    repairs: int  # repairs made so far, this one included


async def stuck_repair(conn: Executor, *, limit: int, max_repairs: int) -> list[StuckInstance]:
    """Find up to ``limit`` unfinished instances with no way forward; make each runnable
    now, or mark it with the reason it cannot be (``UNKNOWN_WORKFLOW``, ``REPAIR_FAILED``
    once it was repaired ``max_repairs`` times). One statement; marked instances found
    again are left alone, so each is reported once."""
    rows = await conn.execute(_STUCK_REPAIR, {"limit": limit, "max_repairs": max_repairs})
    return [
        StuckInstance(
            instance_id=str(row.id),
            workflow_name=str(row.workflow_name),
            status=str(row.found_status),
            missing=str(row.missing),
            cause=row.cause,
            reason=row.stuck_reason,
            repairs=int(row.stuck_repairs),
        )
        for row in rows
    ]


_INSTANCE_STUCK = statement(
    """
    SELECT stuck_reason, stuck_at, stuck_repairs FROM kenning_instances WHERE id = :id
    """
)


@dataclass(frozen=True)
class StuckMark:
    reason: str | None  # why the stuck check could not repair it (None: nothing stuck now)
    at: datetime | None  # when the check last found it without a way forward
    repairs: int


async def instance_stuck(conn: Executor, instance_id: str) -> StuckMark | None:
    """What the stuck check recorded of an instance (None: no such instance)."""
    row = (await conn.execute(_INSTANCE_STUCK, {"id": instance_id})).first()
    return None if row is None else StuckMark(row.stuck_reason, row.stuck_at, int(row.stuck_repairs))


_INSTANCE_EXPLAIN = statement(
    """
    SELECT i.id, i.workflow_name, i.source_hash, i.status, i.cancel_requested, i.lease_owner,
           i.lease_token IS NOT NULL AS leased, i.available_at, i.attempts, i.error, i.run_count,
           i.runs_without_progress, i.claimed_at, i.created_at, i.updated_at, i.started_at,
           i.finished_at, i.stuck_reason, i.stuck_at, i.stuck_repairs, i.pinned_version, now() AS db_now,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'step_id', t.step_id, 'step_name', t.step_name, 'due_at', t.due_at,
                       'since', t.created_at) ORDER BY t.due_at), '[]')
            FROM kenning_timers AS t WHERE t.instance_id = i.id) AS timers,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'step_id', s.step_id, 'step_name', s.step_name, 'event_type', s.event_type,
                       -- a child's end is taken whenever it came (since -infinity): the wait's start
                       'match', s.match,
                       'since', CASE WHEN isfinite(s.since) THEN s.since ELSE s.created_at END,
                       'timeout_at', s.timeout_at) ORDER BY s.created_at), '[]')
            FROM kenning_event_subscriptions AS s WHERE s.instance_id = i.id) AS subscriptions,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'step_id', w.step_id, 'topic', w.topic, 'since', w.created_at,
                       'timeout_at', w.timeout_at) ORDER BY w.created_at), '[]')
            FROM kenning_message_waits AS w WHERE w.instance_id = i.id) AS message_waits,
           (SELECT count(*) FROM kenning_messages AS m
            WHERE m.instance_id = i.id AND m.consumed_step_id IS NULL) AS unreceived_messages,
           (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id = i.id) AS steps,
           (SELECT jsonb_build_object('kind', h.kind, 'step_id', h.step_id, 'step_name', h.step_name,
                                      'at', h.created_at)
            FROM kenning_history AS h WHERE h.instance_id = i.id ORDER BY h.seq DESC LIMIT 1) AS last_step,
           (SELECT count(*) FROM kenning_compensations AS c WHERE c.instance_id = i.id) AS compensations,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'source_hash', d.source_hash, 'first_seen', d.created_at,
                       'retention_seconds', d.retention_seconds) ORDER BY d.created_at), '[]')
            FROM kenning_workflow_definitions AS d WHERE d.workflow_name = i.workflow_name) AS definitions,
           -- a debounced burst or an event batch (kenning/storage/flow.py): its key and what it folded
           (SELECT jsonb_build_object('kind', b.kind, 'key', b.flow_key, 'folded', b.folded,
                                      'opened_at', b.opened_at, 'last_at', b.last_at,
                                      'period_seconds', b.period_seconds,
                                      'max_wait_seconds', b.max_wait_seconds, 'max_size', b.max_size)
            FROM kenning_bursts AS b WHERE b.instance_id = i.id) AS burst
    FROM kenning_instances AS i
    WHERE i.id = :id
    """
)


async def instance_explain(conn: Executor, instance_id: str) -> dict[str, Any] | None:
    """Everything ``kenning why`` says of one instance, read in one statement: its row, its
    timers, subscriptions, receive waits and unreceived messages, its history's length and
    last step, its saga's size, the definition rows of its workflow, its debounced burst
    or event batch if it is one, and the database's clock. None: no such instance."""
    row = (await conn.execute(_INSTANCE_EXPLAIN, {"id": instance_id})).first()
    return None if row is None else dict(row._asdict())


_INSTANCES_OVERDUE = statement(
    f"""
    -- due (or their lease expired) longer ago than :seconds and still not claimed: nothing
    -- is wrong with their rows, but no worker takes them (none runs their workflow, all
    -- are full or isolating a suspect, or their queue is paused or at its limit)
    SELECT workflow_name, count(*) AS overdue, (array_agg(id ORDER BY available_at, id))[1] AS oldest_id,
           CAST(extract(epoch FROM now() - min(available_at)) AS float8) AS oldest_seconds
    FROM kenning_instances
    WHERE status IN {_RUNNABLE} AND available_at <= now() - make_interval(secs => :seconds)
    GROUP BY workflow_name
    ORDER BY workflow_name
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class Overdue:
    """Instances of one workflow due for longer than the check's bound, not claimed."""

    workflow_name: str
    count: int
    oldest_id: str
    oldest_seconds: float


async def instances_overdue(conn: Executor, *, seconds: float, limit: int) -> list[Overdue]:
    """Per workflow (at most ``limit``), the runnable instances due more than ``seconds``
    ago: the stuck check's report of what has a way forward that nobody takes."""
    rows = await conn.execute(_INSTANCES_OVERDUE, {"seconds": seconds, "limit": limit})
    return [Overdue(row.workflow_name, int(row.overdue), str(row.oldest_id), float(row.oldest_seconds)) for row in rows]


_INSTANCES_PINNED_ORPHANED = statement(
    f"""
    -- runnable instances due longer ago than :seconds and pinned to a code version no live
    -- worker runs: nothing takes them until a worker of that version comes back (read on
    -- the claimable and queued indexes' rows, as the metrics' instances part is)
    SELECT workflow_name, pinned_version, count(*) AS waiting,
           (array_agg(id ORDER BY available_at, id))[1] AS oldest_id,
           {LIVE_VERSIONS} AS live_versions
    FROM (SELECT id, workflow_name, pinned_version, available_at FROM kenning_instances
          WHERE status IN {_RUNNABLE} AND queue_name IS NULL
          UNION ALL
          SELECT id, workflow_name, pinned_version, available_at FROM kenning_instances
          WHERE status IN {_RUNNABLE} AND queue_name IS NOT NULL) AS runnable
    WHERE pinned_version IS NOT NULL AND available_at <= now() - make_interval(secs => :seconds)
      AND pinned_version <> ALL(CAST({LIVE_VERSIONS} AS text[]))
    GROUP BY workflow_name, pinned_version
    ORDER BY workflow_name, pinned_version
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class PinnedOrphans:
    """Due instances of one workflow pinned to a code version no live worker runs."""

    workflow_name: str
    version: str
    count: int
    oldest_id: str
    live_versions: list[str]  # what the live workers run instead


async def instances_pinned_orphaned(conn: Executor, *, seconds: float, limit: int) -> list[PinnedOrphans]:
    """Per workflow and version (at most ``limit``), the instances due more than
    ``seconds`` ago and pinned to a code version no live worker runs: the stuck check's
    ``instances.version_gone``."""
    rows = await conn.execute(_INSTANCES_PINNED_ORPHANED, {"seconds": seconds, "limit": limit})
    return [
        PinnedOrphans(
            row.workflow_name, row.pinned_version, int(row.waiting), str(row.oldest_id), sorted(row.live_versions)
        )
        for row in rows
    ]
