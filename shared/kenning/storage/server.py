"""SQL about the server a connection reaches, rather than about Kenning's tables."""

from __future__ import annotations

from collections.abc import Mapping

from kenning.db import Executor, statement

_SERVER_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


async def server_backend_pid(conn: Executor) -> int:
    """The process ID of the server backend running this statement. A connection made
    straight to PostgreSQL was told the same ID when it connected; one made through a
    pooler such as pgbouncer was told a key of the pooler's own."""
    row = (await conn.execute(_SERVER_BACKEND_PID)).one()
    return int(row.pid)


_SETTINGS_APPLY = statement(
    """
    SELECT count(set_config(s.name, s.value, :local)) AS applied
    FROM unnest(CAST(:names AS text[]), CAST(:values AS text[])) AS s(name, value)
    """
)


async def settings_apply(conn: Executor, settings: Mapping[str, str], *, local: bool) -> None:
    """Set the server's ``settings`` (name -> value) in one round trip: for the session,
    or (``local``) until the current transaction ends, as ``SET LOCAL`` does."""
    if settings:
        names, values = list(settings), list(settings.values())
        await conn.execute(_SETTINGS_APPLY, {"names": names, "values": values, "local": local})
