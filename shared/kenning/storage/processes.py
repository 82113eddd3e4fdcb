"""SQL for the registry of the fleet's processes (``kenning_processes``, migration 0009).

Every long-running process (worker, scheduler, relayer, ingress, console) registers at
start, heartbeats ``last_seen`` (with what it says of itself: ``details``) and deregisters
when it stops cleanly (``kenning.hosting.presence``). One that dies without a word stops
heartbeating: once ``last_seen`` is older than its own ``expires_after_seconds`` it is
*stale* (shown so), and the scheduler deletes it once silent for ``forget_after`` times
its expiry. Liveness is
judged on the database's clock, so the hosts' clocks never matter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.db import Executor, statement
from kenning.storage.clock import NOW

KINDS = ("worker", "scheduler", "relayer", "ingress", "console")

# a row is live while its last heartbeat is younger than its own expiry
_LIVE = f"p.last_seen > {NOW} - make_interval(secs => p.expires_after_seconds)"

# The code versions the live workers run (their ``details.code_version``), as an array: an
# uncorrelated subquery, computed once per statement (a row per process: a few rows).
LIVE_VERSIONS = """(SELECT coalesce(array_agg(DISTINCT p.details ->> 'code_version'), '{}')
        FROM kenning_processes AS p
        WHERE p.kind = 'worker' AND p.details ? 'code_version'
          AND p.last_seen > now() - make_interval(secs => p.expires_after_seconds))"""

_PROCESS_REGISTER = statement(
    """
    INSERT INTO kenning_processes AS p (id, kind, host, pid, version, started_at, last_seen,
                                        expires_after_seconds, details)
    VALUES (:id, :kind, :host, :pid, :version, now(), now(), :expires_after_seconds, CAST(:details AS jsonb))
    -- the same id again: a process whose row the scheduler deleted while it could not reach
    -- the database (it is back); its start time stays
    ON CONFLICT (id) DO UPDATE SET
        last_seen = now(), expires_after_seconds = EXCLUDED.expires_after_seconds, details = EXCLUDED.details
    """
)


async def process_register(
    conn: Executor,
    *,
    id: str,
    kind: str,
    host: str,
    pid: int,
    version: str,
    expires_after_seconds: float,
    details: Mapping[str, Any],
) -> None:
    """Register (or register again) one process as alive now."""
    await conn.execute(
        _PROCESS_REGISTER,
        {
            "id": id,
            "kind": kind,
            "host": host,
            "pid": pid,
            "version": version,
            "expires_after_seconds": expires_after_seconds,
            "details": json.dumps(dict(details)),
        },
    )


_PROCESS_HEARTBEAT = statement(
    """
    UPDATE kenning_processes SET last_seen = now(), details = CAST(:details AS jsonb)
    WHERE id = :id
    """
)


async def process_heartbeat(conn: Executor, process_id: str, details: Mapping[str, Any]) -> bool:
    """Mark the process alive now with its current details; False if its row is gone
    (deleted as stale while the process could not reach the database: register again)."""
    rows = await conn.execute(_PROCESS_HEARTBEAT, {"id": process_id, "details": json.dumps(dict(details))})
    return rows.rowcount > 0


# A write that changes no value: an UPDATE still writes a new row version (WAL), so its
# commit waits as every other commit does (for the disk, for a synchronous standby), and
# an unchanged, unindexed column keeps the update HOT (no index entry, nothing to vacuum
# but the old version).
_PROCESS_COMMIT_PROBE = statement("UPDATE kenning_processes SET details = details WHERE id = :id")


async def process_commit_probe(conn: Executor, process_id: str) -> bool:
    """One small committed write on the process's own row (``kenning.hosting.commitwatch``
    times it); False if its row is missing (nothing was written: register it)."""
    return (await conn.execute(_PROCESS_COMMIT_PROBE, {"id": process_id})).rowcount > 0


_PROCESS_DEREGISTER = statement("DELETE FROM kenning_processes WHERE id = :id")


async def process_deregister(conn: Executor, process_id: str) -> bool:
    """Remove a process that stops cleanly; False if it was not registered."""
    return (await conn.execute(_PROCESS_DEREGISTER, {"id": process_id})).rowcount > 0


@dataclass(frozen=True)
class ProcessEntry:
    """One row of the registry, judged on the database's clock."""

    id: str
    kind: str
    host: str
    pid: int
    version: str
    started_at: datetime
    last_seen: datetime
    expires_after_seconds: float
    seen_seconds_ago: float
    live: bool
    details: dict[str, Any]


_PROCESSES_LIST = statement(
    f"""
    SELECT p.id, p.kind, p.host, p.pid, p.version, p.started_at, p.last_seen, p.expires_after_seconds,
           CAST(extract(epoch FROM {NOW} - p.last_seen) AS float8) AS seen_seconds_ago,
           {_LIVE} AS live, p.details
    FROM kenning_processes AS p
    WHERE (CAST(:kind AS text) IS NULL OR p.kind = :kind)
    ORDER BY p.kind, p.host, p.started_at, p.id
    """
)


async def processes_list(conn: Executor, *, kind: str | None = None, now: datetime | None = None) -> list[ProcessEntry]:
    """Every registered process (of ``kind``, if given), live or stale, by kind and host."""
    rows = await conn.execute(_PROCESSES_LIST, {"kind": kind, "now": now})
    return [
        ProcessEntry(
            id=row.id,
            kind=row.kind,
            host=row.host,
            pid=int(row.pid),
            version=row.version,
            started_at=row.started_at,
            last_seen=row.last_seen,
            expires_after_seconds=float(row.expires_after_seconds),
            seen_seconds_ago=max(0.0, float(row.seen_seconds_ago)),
            live=bool(row.live),
            details=dict(row.details or {}),
        )
        for row in rows
    ]


_PROCESSES_LIVE_WORKERS_OF = statement(
    f"""
    SELECT count(*) FILTER (WHERE {_LIVE}) AS live, count(*) AS registered
    FROM kenning_processes AS p
    WHERE p.kind = 'worker' AND p.details -> 'workflows' ? :workflow
    """
)


async def processes_workers_of(conn: Executor, workflow_name: str, *, now: datetime | None = None) -> tuple[int, int]:
    """How many workers that run ``workflow_name`` are live, and how many are registered
    (live or stale): ``kenning why``'s "no live worker runs it"."""
    row = (await conn.execute(_PROCESSES_LIVE_WORKERS_OF, {"workflow": workflow_name, "now": now})).one()
    return int(row.live), int(row.registered)


_PROCESSES_VERSIONS_OF = statement(
    f"""
    SELECT p.details ->> 'code_version' AS code_version, count(*) AS live
    FROM kenning_processes AS p
    WHERE p.kind = 'worker' AND p.details -> 'workflows' ? :workflow AND {_LIVE}
    GROUP BY 1
    ORDER BY 1
    """
)


async def processes_versions_of(conn: Executor, workflow_name: str, *, now: datetime | None = None) -> dict[str, int]:
    """The code versions the live workers running ``workflow_name`` run, and how many run
    each: ``kenning why``'s "waits for a worker running version X" (a pinned instance)."""
    rows = await conn.execute(_PROCESSES_VERSIONS_OF, {"workflow": workflow_name, "now": now})
    return {str(row.code_version or "unknown"): int(row.live) for row in rows}


_PROCESSES_DELETE_STALE = statement(
    f"""
    DELETE FROM kenning_processes AS p
    WHERE p.last_seen < {NOW} - make_interval(secs => p.expires_after_seconds * CAST(:forget_after AS float8))
    RETURNING p.id, p.kind, p.host, p.pid
    """
)


async def processes_delete_stale(
    conn: Executor, *, forget_after: float, now: datetime | None = None
) -> list[tuple[str, str]]:
    """Delete the processes silent for ``forget_after`` times their expiry (they died
    without deregistering); returns their ``(id, kind)``. The table holds one row per
    process, so the scan is of a few rows."""
    rows = await conn.execute(_PROCESSES_DELETE_STALE, {"forget_after": forget_after, "now": now})
    return [(row.id, row.kind) for row in rows]
