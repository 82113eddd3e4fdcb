"""SQL for retention: finished instances expire with everything recorded of them.

A finished (``completed``, ``failed``, ``cancelled``) instance is kept for its workflow's
retention (``@workflow(retention=...)``, the ``retention_seconds`` of the workflow's newest
definition row) or, when it names none, the scheduler's default; then one short statement
per batch deletes a batch of them with their history, compensations, mailboxes (every
message sent to them), published values and search attributes, and any timer,
subscription or receive wait left behind. Rows are taken oldest first per workflow on
the finished index with ``FOR UPDATE SKIP LOCKED``: an operator's ``retry`` of one of
them (it locks the row) is never waited for, and no lock outlives the batch. An unfinished instance is never
taken: the status is part of the index's predicate and of the locked row's re-check.

Processed inbox rows and published outbox rows expire by their own statements
(``inbox.inbox_delete_processed``, ``outbox.outbox_delete_published``); this module counts
them for a dry run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kenning.db import Executor, statement

# A retention longer than this is treated as this (about 950 years): the cut-off
# timestamp stays inside PostgreSQL's range whatever timedelta a workflow names.
_LONGEST_SECONDS = 3e10

# Each workflow's retention: its newest definition row's, else the default (NULL: kept).
_POLICY = f"""
    policy AS (
        SELECT p.workflow_name, now() - make_interval(secs => least(p.keep_seconds, {_LONGEST_SECONDS})) AS cutoff
        FROM (SELECT DISTINCT ON (workflow_name) workflow_name,
                     coalesce(retention_seconds, CAST(:default_seconds AS double precision)) AS keep_seconds
              FROM kenning_workflow_definitions
              ORDER BY workflow_name, created_at DESC, source_hash) AS p
        WHERE p.keep_seconds IS NOT NULL
    )"""

_INSTANCES_EXPIRE = statement(
    f"""
    WITH {_POLICY}, doomed AS (
        SELECT x.id FROM policy AS p
        CROSS JOIN LATERAL (
            SELECT i.id FROM kenning_instances AS i
            WHERE i.workflow_name = p.workflow_name
              AND i.status IN ('completed', 'failed', 'cancelled')
              AND i.finished_at < p.cutoff
              -- a child is kept while its parent is unfinished (it may still read its end)
              AND (i.parent_id IS NULL OR NOT EXISTS (
                  SELECT FROM kenning_instances AS up
                  WHERE up.id = i.parent_id AND up.status NOT IN ('completed', 'failed', 'cancelled')))
            ORDER BY i.finished_at
            LIMIT :limit
            FOR UPDATE SKIP LOCKED
        ) AS x
        LIMIT :limit
    ), instances AS (
        DELETE FROM kenning_instances AS i USING doomed AS d WHERE i.id = d.id RETURNING i.id
    ), history AS (
        DELETE FROM kenning_history AS h USING instances AS g WHERE h.instance_id = g.id RETURNING 1
    ), compensations AS (
        DELETE FROM kenning_compensations AS c USING instances AS g WHERE c.instance_id = g.id RETURNING 1
    ), subscriptions AS (
        DELETE FROM kenning_event_subscriptions AS s USING instances AS g WHERE s.instance_id = g.id RETURNING 1
    ), timers AS (
        DELETE FROM kenning_timers AS t USING instances AS g WHERE t.instance_id = g.id RETURNING 1
    ), mailboxes AS (
        -- its mailboxes: what nobody received before it ended goes with it
        DELETE FROM kenning_messages AS m USING instances AS g WHERE m.instance_id = g.id RETURNING 1
    ), message_waits AS (
        DELETE FROM kenning_message_waits AS w USING instances AS g WHERE w.instance_id = g.id RETURNING 1
    ), channel_subscriptions AS (
        DELETE FROM kenning_channel_subscriptions AS c USING instances AS g WHERE c.instance_id = g.id RETURNING 1
    ), replies AS (
        -- its replies to requests (migration 0013): a client asking again finds no instance
        DELETE FROM kenning_replies AS r USING instances AS g WHERE r.instance_id = g.id RETURNING 1
    ), published_values AS (
        DELETE FROM kenning_values AS v USING instances AS g WHERE v.instance_id = g.id RETURNING 1
    ), search_attributes AS (
        DELETE FROM kenning_search_attributes AS a USING instances AS g WHERE a.instance_id = g.id RETURNING 1
    ), streams AS (
        -- its durable streams and their entries (migration 0019)
        DELETE FROM kenning_streams AS s USING instances AS g WHERE s.instance_id = g.id RETURNING 1
    ), stream_entries AS (
        DELETE FROM kenning_stream_entries AS e USING instances AS g WHERE e.instance_id = g.id RETURNING 1
    ), earlier_runs AS (
        -- a continue_as_new chain's earlier runs (migration 0011)
        DELETE FROM kenning_instance_runs AS r USING instances AS g WHERE r.instance_id = g.id RETURNING 1
    )
    SELECT (SELECT count(*) FROM instances) AS instances,
           (SELECT count(*) FROM history) AS history,
           (SELECT count(*) FROM compensations) AS compensations,
           (SELECT count(*) FROM subscriptions) + (SELECT count(*) FROM timers)
               + (SELECT count(*) FROM message_waits) + (SELECT count(*) FROM mailboxes)
               + (SELECT count(*) FROM replies) AS waits,
           -- whose large values the scheduler then deletes from the object store
           (SELECT coalesce(array_agg(id), '{{}}') FROM instances) AS ids
    """
)


@dataclass(frozen=True)
class Expired:
    """Rows a retention batch deleted (or a dry run would delete)."""

    instances: int = 0
    history: int = 0
    compensations: int = 0
    waits: int = 0  # timers, subscriptions, receive waits, mailboxes' messages and replies of finished instances
    ids: tuple[str, ...] = field(default=(), compare=False)  # the instances deleted (not counted by a dry run)

    def __add__(self, other: Expired) -> Expired:
        return Expired(
            self.instances + other.instances,
            self.history + other.history,
            self.compensations + other.compensations,
            self.waits + other.waits,
        )


def _expired(row: object) -> Expired:
    return Expired(
        instances=int(getattr(row, "instances", 0)),
        history=int(getattr(row, "history", 0)),
        compensations=int(getattr(row, "compensations", 0)),
        waits=int(getattr(row, "waits", 0)),
        ids=tuple(str(i) for i in getattr(row, "ids", None) or ()),
    )


async def instances_expire(conn: Executor, *, default_seconds: float | None, limit: int) -> Expired:
    """Delete up to ``limit`` instances finished longer ago than their workflow's retention
    (``default_seconds`` for a workflow that names none; None: those are kept), with their
    history, compensations and leftover waits."""
    row = (await conn.execute(_INSTANCES_EXPIRE, {"default_seconds": default_seconds, "limit": limit})).one()
    return _expired(row)


_INSTANCES_EXPIRED_COUNT = statement(
    f"""
    WITH {_POLICY}, doomed AS (
        SELECT i.id FROM policy AS p
        JOIN kenning_instances AS i ON i.workflow_name = p.workflow_name
        WHERE i.status IN ('completed', 'failed', 'cancelled') AND i.finished_at < p.cutoff
          AND (i.parent_id IS NULL OR NOT EXISTS (
              SELECT FROM kenning_instances AS up
              WHERE up.id = i.parent_id AND up.status NOT IN ('completed', 'failed', 'cancelled')))
    )
    SELECT (SELECT count(*) FROM doomed) AS instances,
           (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id IN (SELECT id FROM doomed)) AS history,
           (SELECT count(*) FROM kenning_compensations AS c WHERE c.instance_id IN (SELECT id FROM doomed))
               AS compensations,
           (SELECT count(*) FROM kenning_event_subscriptions AS s WHERE s.instance_id IN (SELECT id FROM doomed))
           + (SELECT count(*) FROM kenning_timers AS t WHERE t.instance_id IN (SELECT id FROM doomed))
           + (SELECT count(*) FROM kenning_message_waits AS w WHERE w.instance_id IN (SELECT id FROM doomed))
           + (SELECT count(*) FROM kenning_messages AS m WHERE m.instance_id IN (SELECT id FROM doomed))
           + (SELECT count(*) FROM kenning_replies AS r WHERE r.instance_id IN (SELECT id FROM doomed)) AS waits
    """
)


async def instances_expired_count(conn: Executor, *, default_seconds: float | None) -> Expired:
    """What ``instances_expire`` would delete, every batch together (``kenning gc --dry-run``)."""
    return _expired((await conn.execute(_INSTANCES_EXPIRED_COUNT, {"default_seconds": default_seconds})).one())


_INBOX_PROCESSED_EXPIRED_COUNT = statement(
    """
    SELECT count(*) AS expired FROM kenning_inbox
    WHERE status = 'processed' AND processed_at < now() - make_interval(secs => :retention_seconds)
    """
)


async def inbox_processed_expired_count(conn: Executor, *, retention_seconds: float) -> int:
    """Processed inbox rows ``inbox.inbox_delete_processed`` would delete (dry run)."""
    row = (await conn.execute(_INBOX_PROCESSED_EXPIRED_COUNT, {"retention_seconds": retention_seconds})).one()
    return int(row.expired)


_OUTBOX_PUBLISHED_EXPIRED_COUNT = statement(
    """
    SELECT count(*) AS expired FROM kenning_outbox
    WHERE status = 'published' AND published_at < now() - make_interval(secs => :retention_seconds)
    """
)


async def outbox_published_expired_count(conn: Executor, *, retention_seconds: float) -> int:
    """Published outbox rows ``outbox.outbox_delete_published`` would delete (dry run)."""
    row = (await conn.execute(_OUTBOX_PUBLISHED_EXPIRED_COUNT, {"retention_seconds": retention_seconds})).one()
    return int(row.expired)
