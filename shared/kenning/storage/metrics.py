"""The one statement behind the database gauges of ``/metrics`` (``kenning.observability.metrics``).

Run once per scrape, never per event. Each part reads only rows an existing index already
singles out, so its cost follows the work in flight, not the tables' history:

- claimable instances (pending, running, compensating): the claim's partial index
  ``kenning_instances_claimable``; "runnable" is what the claim would take now
  (``available_at`` due: new, woken, backed off, or a lease that expired);
- waiting instances: ``kenning_instances_waiting``, ``kenning_instances_waiting_message``;
  instances the scheduler's stuck check marked (``stuck_reason``): ``kenning_instances_stuck``;
- timers due: ``kenning_timers_due``; the inbox backlog: ``kenning_inbox_pending``;
  the outbox backlog: ``kenning_outbox_due``, its dead letters ``kenning_outbox_failed``;
- each queue (``kenning_queues``, one row per queue): its runnable instances from
  ``kenning_instances_queued``, its unexpired leases from ``kenning_instances_queue_leased``,
  both index-only reads (their columns are the indexes' own), one probe per queue.

- the fleet's registry (``kenning_processes``, a row per process): live and stale
  processes of each kind;
- due instances pinned to a code version no live worker runs (``pinned_version``,
  migration 0024): the runnable rows again, on the same two indexes.

Parked inbox rows (``failed``) have no index of their own, so they are counted as they
are parked (``kenning_inbox_parked_total``), not here.
"""

from __future__ import annotations

from kenning.core.records import MetricsRow
from kenning.db import Executor, statement
from kenning.storage.processes import LIVE_VERSIONS

# One row per figure group: ``area`` says which (instances, stuck, timers, inbox, outbox,
# queues, processes), ``workflow`` and ``status`` label it; the timers, inbox and outbox rows are always
# there (aggregates without GROUP BY), a queue's as long as the queue exists, instances and
# stuck ones only for the groups that have some (a stuck row's ``status`` is its reason; a
# queue's ``workflow`` is its name, its ``status`` 'paused' or 'active').
# ``total``: rows (a queue's: its depth, runnable and not leased); ``due``: rows whose time
# has come (runnable, due, claimable); ``oldest_seconds``: age of the oldest of those
# (instances and queues: since it became runnable; inbox: since received; outbox: since
# created); ``retrying``: rows with a failed attempt behind them; ``leased``: a queue's
# instances held by an unexpired lease (the slots its limits count). A processes row's
# ``workflow`` is the kind, ``total`` its live processes, ``due`` its stale ones. A pinned
# row's ``status`` is the code version its instances wait for, ``total`` how many are due.
_METRICS_SNAPSHOT = statement(
    f"""
    SELECT 'instances' AS area, workflow_name AS workflow, status,
           count(*) AS total,
           count(*) FILTER (WHERE available_at <= now()) AS due,
           CAST(extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now())) AS float8)
               AS oldest_seconds,
           0 AS retrying, 0 AS leased
    -- the claimable index holds the instances in no queue, kenning_instances_queued the rest
    FROM (SELECT workflow_name, status, available_at FROM kenning_instances
          WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NULL
          UNION ALL
          SELECT workflow_name, status, available_at FROM kenning_instances
          WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL) AS runnable
    GROUP BY workflow_name, status
    UNION ALL
    SELECT 'instances', workflow_name, status, count(*), 0, NULL, 0, 0
    -- one branch per partial index: the planner cannot split one IN list over two of them,
    -- and read the whole table instead
    FROM (SELECT workflow_name, status FROM kenning_instances
          WHERE status IN ('waiting_for_timer', 'waiting_for_event')
          UNION ALL
          SELECT workflow_name, status FROM kenning_instances
          WHERE status = 'waiting_for_message') AS waiting
    GROUP BY workflow_name, status
    UNION ALL
    SELECT 'stuck', workflow_name, stuck_reason, count(*), 0, NULL, 0, 0
    FROM kenning_instances
    WHERE stuck_reason IS NOT NULL
    GROUP BY workflow_name, stuck_reason
    UNION ALL
    SELECT 'timers', '', 'waiting', count(*), count(*) FILTER (WHERE due_at <= now()),
           CAST(extract(epoch FROM now() - min(due_at) FILTER (WHERE due_at <= now())) AS float8), 0, 0
    FROM kenning_timers
    UNION ALL
    SELECT 'inbox', '', 'pending', count(*), count(*) FILTER (WHERE available_at <= now()),
           CAST(extract(epoch FROM now() - min(received_at)) AS float8), count(*) FILTER (WHERE attempts > 0), 0
    FROM kenning_inbox
    WHERE status = 'pending'
    UNION ALL
    SELECT 'outbox', '', 'pending', count(*), count(*) FILTER (WHERE available_at <= now()),
           CAST(extract(epoch FROM now() - min(created_at)) AS float8), count(*) FILTER (WHERE attempts > 0), 0
    FROM kenning_outbox
    WHERE status IN ('pending', 'publishing')
    UNION ALL
    SELECT 'outbox', '', 'failed', count(*), 0, NULL, 0, 0
    FROM kenning_outbox
    WHERE status = 'failed'
    UNION ALL
    -- a lease is only ever held by a runnable instance (every other status clears it), so
    -- the queue's unexpired leases are among its runnable rows and the depth is the rest
    SELECT 'queues', q.name, CASE WHEN q.paused THEN 'paused' ELSE 'active' END,
           greatest(0, r.runnable - l.leased), r.due, r.oldest_seconds, 0, l.leased
    FROM kenning_queues AS q
    CROSS JOIN LATERAL (
        SELECT count(*) AS runnable, count(*) FILTER (WHERE i.available_at <= now()) AS due,
               CAST(extract(epoch FROM now() - min(i.available_at) FILTER (WHERE i.available_at <= now()))
                    AS float8) AS oldest_seconds
        FROM kenning_instances AS i
        WHERE i.queue_name = q.name AND i.queue_name IS NOT NULL
          AND i.status IN ('pending', 'running', 'compensating')
    ) AS r
    CROSS JOIN LATERAL (
        SELECT count(*) AS leased
        FROM kenning_instances AS i
        WHERE i.queue_name = q.name AND i.queue_name IS NOT NULL AND i.lease_token IS NOT NULL
          AND i.available_at > now()
    ) AS l
    UNION ALL
    -- the fleet's registry (one row per process): live ones heartbeat within their expiry;
    -- every kind has its row, so a fleet that lost its last worker reads 0, not "no data"
    SELECT 'processes', k.kind, 'live',
           count(p.id) FILTER (WHERE p.last_seen > now() - make_interval(secs => p.expires_after_seconds)),
           count(p.id) FILTER (WHERE p.last_seen <= now() - make_interval(secs => p.expires_after_seconds)),
           NULL, 0, 0
    FROM unnest(ARRAY['worker', 'scheduler', 'relayer', 'ingress', 'console']) AS k(kind)
    LEFT JOIN kenning_processes AS p ON p.kind = k.kind
    GROUP BY k.kind
    UNION ALL
    SELECT 'pinned', workflow_name, pinned_version, count(*), count(*), NULL, 0, 0
    FROM (SELECT workflow_name, pinned_version, available_at FROM kenning_instances
          WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NULL
          UNION ALL
          SELECT workflow_name, pinned_version, available_at FROM kenning_instances
          WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL) AS runnable
    WHERE pinned_version IS NOT NULL AND available_at <= now()
      AND pinned_version <> ALL(CAST({LIVE_VERSIONS} AS text[]))
    GROUP BY workflow_name, pinned_version
    """
)


async def metrics_snapshot(conn: Executor) -> list[MetricsRow]:
    """Every database gauge, in one statement (one round trip, one snapshot)."""
    rows = (await conn.execute(_METRICS_SNAPSHOT)).all()
    return [
        MetricsRow(
            area=row.area,
            workflow=row.workflow,
            status=row.status,
            total=int(row.total),
            due=int(row.due),
            oldest_seconds=None if row.oldest_seconds is None else float(row.oldest_seconds),
            retrying=int(row.retrying),
            leased=int(row.leased),
        )
        for row in rows
    ]
