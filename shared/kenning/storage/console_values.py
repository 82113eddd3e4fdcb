"""One value of an instance, whole, for the console's download: streamed in chunks.

A value (an input, a result, a step's record, a sent event's data...) is jsonb; the
download is its JSON text as PostgreSQL writes it, UTF-8. One statement turns it into
bytes once (``convert_to(CAST(... AS text))``: about a second for 100 MB) and returns it
as rows of ``chunk`` bytes each, which psycopg's ``stream()`` hands over one at a time
(single-row mode, binary): the console holds one chunk, never the value, and never one
result holding it all. (A chunk per statement, ``substring(CAST(... AS text) ...)``, would
cast the whole value again for each chunk.) The values a download may name are the fixed
``SOURCES``: the statement is assembled from them only, one text per source.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from psycopg.rows import dict_row

from kenning.db import Executor, Statement, statement


@dataclass(frozen=True)
class Source:
    """Where a kind of value is: its table and jsonb column, and the column that tells
    which row of the instance (none: the instance's own row)."""

    table: str
    column: str
    instance_column: str = "instance_id"
    key: str = ""


SOURCES = {
    "input": Source("kenning_instances", "input", instance_column="id"),
    "result": Source("kenning_instances", "result", instance_column="id"),
    "error": Source("kenning_instances", "error", instance_column="id"),
    "step": Source("kenning_history", "payload", key="seq"),
    "sent": Source("kenning_outbox", "data", key="id"),
    "args": Source("kenning_compensations", "args", key="comp_id"),
    "kwargs": Source("kenning_compensations", "kwargs", key="comp_id"),
    "match": Source("kenning_event_subscriptions", "match", key="step_id"),
    "value": Source("kenning_values", "value", key="key"),  # a published value
}


@functools.cache
def _chunks_statement(name: str) -> Statement:
    source = SOURCES[name]
    keyed = f"AND CAST(t.{source.key} AS text) = :key" if source.key else ""
    # OFFSET 0: the subquery is made once, not merged into the outer query (where each
    # chunk would convert the value again); generate_series's rows come in order
    return statement(
        f"""
        SELECT octet_length(v.raw) AS total, substring(v.raw FROM g.start FOR CAST(:chunk AS integer)) AS chunk
        FROM (SELECT convert_to(CAST(t.{source.column} AS text), 'UTF8') AS raw
              FROM {source.table} AS t
              WHERE t.{source.instance_column} = :instance_id {keyed} AND t.{source.column} IS NOT NULL
              OFFSET 0) AS v
        CROSS JOIN LATERAL generate_series(1, greatest(octet_length(v.raw), 1), CAST(:chunk AS integer)) AS g(start)
        """
    )


async def value_chunks(
    conn: Executor, name: str, instance_id: str, key: str, *, chunk: int
) -> AsyncIterator[tuple[int, bytes]]:
    """The value's size in bytes and its next ``chunk`` bytes, one pair per row; nothing
    when there is no such value. ``name`` is one of ``SOURCES`` (KeyError otherwise)."""
    query = _chunks_statement(name)
    cursor = conn.driver.cursor(row_factory=dict_row)
    params = {"instance_id": instance_id, "key": key, "chunk": chunk}
    async for row in cursor.stream(query.sql, params, binary=True):
        yield int(row["total"]), bytes(row["chunk"])
