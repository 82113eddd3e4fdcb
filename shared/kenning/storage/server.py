"""SQL about the server a connection reaches, rather than about Kenning's tables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kenning.db import Executor, statement

_SERVER_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


async def server_backend_pid(conn: Executor) -> int:
    """The process ID of the server backend running this statement. A connection made
    straight to PostgreSQL was told the same ID when it connected; one made through a
    pooler such as pgbouncer was told a key of the pooler's own."""
    row = (await conn.execute(_SERVER_BACKEND_PID)).one()
    return int(row.pid)


_COMMITS_WAITING = statement(
    """
    SELECT count(*) AS sessions,
           CAST(coalesce(extract(epoch FROM clock_timestamp() - min(a.query_start)), 0) AS float8)
               AS oldest_seconds,
           current_setting('synchronous_standby_names') AS standby_names,
           (SELECT count(*) FROM pg_stat_replication AS r WHERE r.sync_state IN ('sync', 'quorum'))
               AS sync_standbys
    FROM pg_stat_activity AS a
    -- every database's sessions: a synchronous standby holds up the whole cluster's commits
    WHERE a.wait_event_type = 'IPC' AND a.wait_event = 'SyncRep'
    """
)

_SETTINGS_APPLY = statement(
    """
    SELECT count(set_config(s.name, s.value, :local)) AS applied
    FROM unnest(CAST(:names AS text[]), CAST(:values AS text[])) AS s(name, value)
    """
)


@dataclass(frozen=True)
class CommitWaits:
    """The sessions whose commit waits for a synchronous standby to confirm it."""

    sessions: int
    oldest_seconds: float  # since the oldest one's statement (or COMMIT) began; 0: none
    standby_names: str  # synchronous_standby_names: the standbys a commit waits for
    sync_standbys: int  # standbys connected as synchronous (pg_stat_replication)


async def commits_waiting(conn: Executor) -> CommitWaits:
    """Who waits for a synchronous standby now (a read: it works while commits hang).
    A role without ``pg_read_all_stats`` sees only its own role's sessions."""
    row = (await conn.execute(_COMMITS_WAITING)).one()
    return CommitWaits(
        sessions=int(row.sessions),
        oldest_seconds=float(row.oldest_seconds),
        standby_names=str(row.standby_names),
        sync_standbys=int(row.sync_standbys),
    )


async def settings_apply(conn: Executor, settings: Mapping[str, str], *, local: bool) -> None:
    """Set the server's ``settings`` (name -> value) in one round trip: for the session,
    or (``local``) until the current transaction ends, as ``SET LOCAL`` does."""
    if settings:
        names, values = list(settings), list(settings.values())
        await conn.execute(_SETTINGS_APPLY, {"names": names, "values": values, "local": local})
