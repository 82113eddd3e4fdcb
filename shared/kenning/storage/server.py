"""SQL about the server a connection reaches, rather than about Kenning's tables."""

from __future__ import annotations

from kenning.db import Executor, statement

_SERVER_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


async def server_backend_pid(conn: Executor) -> int:
    """The process ID of the server backend running this statement. A connection made
    straight to PostgreSQL was told the same ID when it connected; one made through a
    pooler such as pgbouncer was told a key of the pooler's own."""
    row = (await conn.execute(_SERVER_BACKEND_PID)).one()
    return int(row.pid)
