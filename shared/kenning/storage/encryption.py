"""The rows ``kenning encryption rotate`` rewrites: every column that holds sealed user
payloads (``kenning.codecs``), walked in ctid order in batches.

A ``whole`` column holds one payload sealed as a whole (an instance's input, a message's
data): a plain value in it was written before encryption was on and is sealed too. The
others (an instance's result and error, a history record) hold envelopes inside a
framework record whose keys stay plain; only their envelopes are rewritten. A batch locks
its rows (``FOR UPDATE``, as every write of theirs does) and rewrites them in the same
transaction, so a worker's write waits for it or comes first, and nothing is lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kenning.db import Executor, statement


@dataclass(frozen=True)
class SealedColumn:
    table: str
    column: str
    whole: bool


SEALED_COLUMNS: tuple[SealedColumn, ...] = (
    SealedColumn("kenning_instances", "input", True),
    SealedColumn("kenning_instances", "result", False),
    SealedColumn("kenning_instances", "error", False),
    SealedColumn("kenning_history", "payload", False),
    SealedColumn("kenning_instance_runs", "input", True),
    SealedColumn("kenning_compensations", "args", True),
    SealedColumn("kenning_compensations", "kwargs", True),
    SealedColumn("kenning_messages", "data", True),
    SealedColumn("kenning_replies", "value", True),
    SealedColumn("kenning_values", "value", True),
    SealedColumn("kenning_stream_entries", "value", True),
    SealedColumn("kenning_outbox", "data", True),
    # an event's data as its writer sealed it (kenning.storage.inbox); a wait_event(match=...)
    # tests sealed data after opening it (kenning.storage.subscriptions), so a row sealed
    # here (a child's end, or a row written before encryption was on) is still found
    SealedColumn("kenning_inbox", "data", True),
)


def _stale(column: SealedColumn) -> str:
    """SQL: the row may hold a payload not sealed under ``:key`` (``:pattern``: an
    envelope naming another key, in the jsonb text form ``"$enc": "k1"``)."""
    c = column.column
    if column.whole:
        return (
            f"{c} IS NOT NULL AND NOT (jsonb_typeof({c}) = 'object' AND {c} ? 'v' "
            f"AND coalesce({c} ->> '$enc' = :key, false))"
        )
    return f"{c} IS NOT NULL AND CAST({c} AS text) ~ :pattern"


def _select(column: SealedColumn) -> str:
    return f"""
    SELECT CAST(ctid AS text) AS at, {column.column} AS value FROM {column.table}
    WHERE ctid > CAST(:after AS tid) AND {_stale(column)}
    ORDER BY ctid
    LIMIT :limit
    FOR UPDATE
    """


def _update(column: SealedColumn) -> str:
    return f"""
    UPDATE {column.table} AS t SET {column.column} = x.value
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS x(at text, value jsonb)
    WHERE t.ctid = CAST(x.at AS tid)
    """


_SELECTS = {column: statement(_select(column)) for column in SEALED_COLUMNS}
_UPDATES = {column: statement(_update(column)) for column in SEALED_COLUMNS}


@dataclass(frozen=True)
class StoredPayload:
    at: str  # the row's ctid: valid while this transaction holds the row's lock
    value: Any


def _params(key_id: str) -> dict[str, str]:
    return {"key": key_id, "pattern": '"\\$enc": "(?!' + re.escape(key_id) + '")'}


async def sealed_batch(
    conn: Executor, column: SealedColumn, *, key_id: str, after: str, limit: int
) -> list[StoredPayload]:
    """Lock and read up to ``limit`` rows past ctid ``after`` that may hold payloads not
    sealed under ``key_id``."""
    rows = await conn.execute(_SELECTS[column], {"after": after, "limit": limit, **_params(key_id)})
    return [StoredPayload(row.at, row.value) for row in rows]


async def sealed_rewrite(conn: Executor, column: SealedColumn, rewritten: Sequence[StoredPayload]) -> None:
    """Write the rows ``sealed_batch`` locked with their new values, in its transaction."""
    if rewritten:
        rows = json.dumps([{"at": r.at, "value": r.value} for r in rewritten])
        await conn.execute(_UPDATES[column], {"rows": rows})
