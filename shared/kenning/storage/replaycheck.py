"""SQL for ``kenning replay-check``: read-only, run against production.

Each page is read in a transaction that ``replay_transaction_read_only`` makes read-only
first, so PostgreSQL itself refuses any write the check might attempt. Histories and
compensations come from ``storage.history``'s batched loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kenning import codecs
from kenning.core.records import TERMINAL_STATUSES
from kenning.db import Executor, statement

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))


@dataclass(frozen=True)
class ReplayCandidate:
    """An instance to replay: what the engine needs of its row."""

    id: str
    workflow_name: str
    status: str
    input: dict[str, Any]
    run_count: int


_READ_ONLY = statement("SET TRANSACTION READ ONLY")


async def replay_transaction_read_only(conn: Executor) -> None:
    """The first statement of each of the check's transactions."""
    await conn.execute(_READ_ONLY)


_IN_FLIGHT_PAGE = statement(
    f"""
    SELECT id, workflow_name, status, input, run_count
    FROM kenning_instances
    WHERE workflow_name = ANY(:workflows) AND status NOT IN ({_TERMINAL}) AND id > :after
    ORDER BY id
    LIMIT :limit
    """
)


async def replay_in_flight_page(
    conn: Executor, *, workflows: Sequence[str], after: str, limit: int
) -> list[ReplayCandidate]:
    """Instances of ``workflows`` not yet finished, by id after ``after`` (keyset pages:
    the whole walk reads the primary key once)."""
    rows = await conn.execute(_IN_FLIGHT_PAGE, {"workflows": list(workflows), "after": after, "limit": limit})
    return [_candidate(row) for row in rows]


_RECENT_FINISHED = statement(
    f"""
    SELECT id, workflow_name, status, input, run_count
    FROM kenning_instances
    WHERE workflow_name = ANY(:workflows) AND status IN ({_TERMINAL})
    ORDER BY created_at DESC, id
    LIMIT :limit
    """
)


async def replay_recent_finished(conn: Executor, *, workflows: Sequence[str], limit: int) -> list[ReplayCandidate]:
    """The most recently started finished instances of ``workflows`` (newest first, on
    the creation index)."""
    rows = await conn.execute(_RECENT_FINISHED, {"workflows": list(workflows), "limit": limit})
    return [_candidate(row) for row in rows]


def _candidate(row: Any) -> ReplayCandidate:
    return ReplayCandidate(
        id=row.id,
        workflow_name=row.workflow_name,
        status=row.status,
        input=codecs.unseal(row.input),
        run_count=row.run_count,
    )
