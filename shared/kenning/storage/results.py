"""SQL of a connection that listens for finished instances (``kenning.client.results``)."""

from __future__ import annotations

from kenning.core.names import CHANNEL_RESULTS, RESULTS_LISTENERS_LOCK, RESULTS_LISTENERS_LOCKS
from kenning.db import Executor, statement

_RESULTS_LISTENERS_JOIN = statement(
    f"""
    SELECT bool_and(pg_advisory_lock_shared(k) IS NOT NULL) AS joined
    FROM generate_series(CAST({RESULTS_LISTENERS_LOCK} AS bigint),
                         {RESULTS_LISTENERS_LOCK + RESULTS_LISTENERS_LOCKS - 1}) AS k
    """
)
_RESULTS_LISTEN = statement(f'LISTEN "{CHANNEL_RESULTS}"')


async def results_listen(conn: Executor) -> None:
    """Make this session a listener for finished instances: it takes the listeners' locks
    shared (finishing statements notify only while someone holds it; a finishing
    transaction that saw nobody is waited for, so the caller's next read sees what it
    finished), then LISTENs. Both last as long as the session."""
    await conn.execute(_RESULTS_LISTENERS_JOIN)
    await conn.execute(_RESULTS_LISTEN)
