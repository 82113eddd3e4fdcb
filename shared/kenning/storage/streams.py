"""SQL for durable streams (migration 0019, ``kenning.streams``).

A write appends one entry under the stream's header row (``kenning_streams``), whose row
lock orders the writers: the header's ``length`` is the entry's offset, and the lock is
held until the writing transaction commits, so a later offset never commits before an
earlier one and a reader that saw offset n has seen every offset below it. Every write is
fenced by the instance's lease token and takes the instance row first (``FOR UPDATE``,
as ``fencing.LEASE_FENCE``), then the header: the order the statements that end
instances take them in (``close_ended_streams``), so the two never deadlock, and a
write after the end finds the lease gone. Writes and closes notify ``CHANNEL_RESULTS``
with the instance's id while a client listens, as its end does: a reader waits on the
client's one LISTEN connection (``kenning.client.results``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.records import TERMINAL_STATUSES
from kenning.core.streams import WORKFLOW_ATTEMPT, StreamEntry
from kenning.db import Executor, statement
from kenning.storage.names import notify_results

_FENCE = """fence AS (
        SELECT id, run FROM kenning_instances
        WHERE id = :instance_id AND lease_token = CAST(:token AS uuid)
        FOR UPDATE
    )"""


def close_ended_streams(finished: str) -> str:
    """A CTE for a statement that ends instances (``finished``: its CTE of the ended rows,
    with ``id``): every open stream of theirs is closed in the same transaction. A
    data-modifying CTE runs whether or not the statement reads it."""
    return f"""streams_closed AS (
        UPDATE kenning_streams AS s SET closed_at = now(), ended = true, updated_at = now()
        FROM {finished} AS f
        WHERE s.instance_id = f.id AND s.closed_at IS NULL
        RETURNING 1
    )"""


def reopen_ended_streams(retried: str) -> str:
    """A CTE for a statement that makes ended instances run again (a retry; ``retried``:
    its CTE of their ids, ``id``): the streams their end closed are open again, so the
    instance writes on where it stopped (one closed by ``close_stream`` stays closed)."""
    return f"""streams_reopened AS (
        UPDATE kenning_streams AS s SET closed_at = NULL, ended = false, updated_at = now()
        FROM {retried} AS r
        WHERE s.instance_id = r.id AND s.ended
        RETURNING 1
    )"""


# The attempt number a writer gets: 0 from workflow code; from an activity step, the
# number its first write was given, else the engine's attempt number, raised above the
# step's last writer's (an attempt abandoned by a crashed worker was never counted, so its
# retry has the same engine number; the stream still tells the two apart).
# The writing step's label: its step id, and after a continue_as_new the run it is in
# (``generate:1@2``): a run's step ids start again, its attempts must not follow the last run's.
_STEP = "(SELECT label FROM step)"
_STEP_LABEL = """step AS (
        SELECT CASE WHEN f.run > 1 THEN CAST(:step_id AS text) || '@' || f.run
                    ELSE CAST(:step_id AS text) END AS label
        FROM fence AS f
    )"""
_NEW_WRITER = f"""jsonb_build_object({_STEP}, jsonb_build_array(CAST(:writer AS text), greatest(
                CAST(:attempt AS integer), coalesce(CAST(s.writers -> {_STEP} ->> 1 AS integer), 0) + 1)))"""
_STREAM_WRITE = statement(
    f"""
    WITH {_FENCE}, {_STEP_LABEL}, header AS (
        INSERT INTO kenning_streams AS s (instance_id, key, length, writers)
        SELECT f.id, :key, 1,
               CASE WHEN {_STEP} IS NULL THEN CAST('{{}}' AS jsonb)
                    ELSE jsonb_build_object(
                        {_STEP}, jsonb_build_array(CAST(:writer AS text), CAST(:attempt AS integer)))
               END
        FROM fence AS f
        ON CONFLICT (instance_id, key) DO UPDATE
        SET length = s.length + 1, updated_at = now(),
            writers = CASE WHEN {_STEP} IS NULL OR s.writers -> {_STEP} ->> 0 = CAST(:writer AS text) THEN s.writers
                           ELSE s.writers || {_NEW_WRITER} END
        WHERE s.closed_at IS NULL AND s.length < :max_entries
        RETURNING s.instance_id, s.length - 1 AS entry_offset,
                  CASE WHEN {_STEP} IS NULL THEN {WORKFLOW_ATTEMPT}
                       ELSE CAST(s.writers -> {_STEP} ->> 1 AS integer) END AS attempt
    ), entry AS (
        INSERT INTO kenning_stream_entries (instance_id, key, "offset", attempt, step_id, value)
        SELECT h.instance_id, :key, h.entry_offset, h.attempt, {_STEP}, CAST(:value AS jsonb) FROM header AS h
        RETURNING instance_id AS id, "offset" AS entry_offset, attempt, step_id, written_at
    )
    SELECT (SELECT count(*) FROM fence) AS leased, e.entry_offset, e.attempt, e.step_id, e.written_at,
           {notify_results("entry")} AS notified
    FROM (SELECT 1) AS one LEFT JOIN entry AS e ON true
    """
)


@dataclass(frozen=True)
class StreamWritten:
    """``stream_write``'s answer: the entry written (None when nothing was: the lease was
    lost, or the stream is closed or full, which ``stream_state`` then tells)."""

    leased: bool
    entry: StreamEntry | None


async def stream_write(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    key: str,
    value: Any,
    step_id: str | None,
    attempt: int,
    writer: str,
    max_entries: int,
) -> StreamWritten:
    """Append ``value`` (JSON) to the instance's stream ``key``, in the caller's
    transaction. ``step_id``: the activity step writing (None: workflow code), with its
    ``attempt`` (the engine's number) and ``writer`` (that attempt's identity: the lease
    token and the number)."""
    params = {
        "instance_id": instance_id,
        "token": token,
        "key": key,
        "value": json.dumps(value),
        "step_id": step_id,
        "attempt": attempt,
        "writer": writer,
        "max_entries": max_entries,
    }
    row = (await conn.execute(_STREAM_WRITE, params)).one()
    if row.entry_offset is None:
        return StreamWritten(bool(row.leased), None)
    entry = StreamEntry(int(row.entry_offset), int(row.attempt), value, row.written_at, row.step_id)
    return StreamWritten(True, entry)


_STREAM_CLOSE = statement(
    f"""
    WITH {_FENCE}, closed AS (
        INSERT INTO kenning_streams AS s (instance_id, key, closed_at)
        SELECT f.id, :key, now() FROM fence AS f
        ON CONFLICT (instance_id, key) DO UPDATE SET closed_at = now(), updated_at = now()
        WHERE s.closed_at IS NULL
        RETURNING s.instance_id AS id
    )
    SELECT (SELECT count(*) FROM fence) AS leased, {notify_results("closed")} AS notified
    """
)


async def stream_close(conn: Executor, *, instance_id: str, token: str, key: str) -> bool:
    """Close the instance's stream ``key`` (a stream never written is closed empty; one
    closed already stays as it was); False when the lease was lost (nothing written)."""
    row = (await conn.execute(_STREAM_CLOSE, {"instance_id": instance_id, "token": token, "key": key})).one()
    return bool(row.leased)


_STREAM_STATE = statement(
    """
    SELECT length, closed_at FROM kenning_streams WHERE instance_id = :instance_id AND key = :key
    """
)


@dataclass(frozen=True)
class StreamState:
    length: int
    closed: bool


async def stream_state(conn: Executor, instance_id: str, key: str) -> StreamState:
    """The stream's length and whether it is closed (why a write wrote nothing)."""
    row = (await conn.execute(_STREAM_STATE, {"instance_id": instance_id, "key": key})).first()
    if row is None:
        return StreamState(0, False)
    return StreamState(int(row.length), row.closed_at is not None)


# The entries from an offset, at most :limit of them and, past the first, only while the
# JSON read so far is under :max_bytes (so a backlog of large entries is read in pieces);
# ``through`` is the running size, which tells the caller whether the bound cut the read.
_STREAM_READ = statement(
    """
    SELECT i.status, s.closed_at, e.entry_offset, e.attempt, e.step_id, e.value, e.written_at, e.size, e.through
    FROM kenning_instances AS i
    LEFT JOIN kenning_streams AS s ON s.instance_id = i.id AND s.key = :key
    LEFT JOIN LATERAL (
        SELECT w.* FROM (
            SELECT x."offset" AS entry_offset, x.attempt, x.step_id, x.value, x.written_at, t.size,
                   sum(t.size) OVER (ORDER BY x."offset") AS through
            FROM kenning_stream_entries AS x
            CROSS JOIN LATERAL (SELECT octet_length(CAST(x.value AS text)) AS size OFFSET 0) AS t
            WHERE x.instance_id = i.id AND x.key = :key AND x."offset" >= :offset
            ORDER BY x."offset"
            LIMIT :limit
        ) AS w
        WHERE w.through - w.size < :max_bytes
    ) AS e ON true
    WHERE i.id = :instance_id
    ORDER BY e.entry_offset
    """
)

# no bound on a read's bytes (a test's whole stream)
UNBOUNDED = 2**62


@dataclass(frozen=True)
class StreamRead:
    """One read of a stream, in one snapshot: the entries from an offset (within the
    bounds), their sizes (bytes of JSON), whether the bounds may have left some out
    (``more``: read on before waiting), and whether the stream is closed: by
    ``close_stream``, or because its instance has ended (a stream never written
    included). A closed stream is over once a read of it has no ``more``."""

    instance_status: str
    entries: list[StreamEntry]
    closed: bool
    more: bool = False
    sizes: list[int] = field(default_factory=list)


async def stream_read(
    conn: Executor,
    instance_id: str,
    key: str,
    *,
    offset: int,
    limit: int,
    max_bytes: int = UNBOUNDED,
    shown: bool = False,
) -> StreamRead | None:
    """The entries of ``key`` from ``offset`` on, in order, at most ``limit`` and, past
    the first, while under ``max_bytes`` of JSON; None when there is no such instance."""
    params = {"instance_id": instance_id, "key": key, "offset": offset, "limit": limit, "max_bytes": max_bytes}
    rows = await conn.execute(_STREAM_READ, params)
    if not rows:
        return None
    first = rows[0]
    found = [row for row in rows if row.entry_offset is not None]
    opened = codecs.shown if shown else codecs.unseal  # shown: "encrypted" without the key
    entries = [
        StreamEntry(
            int(row.entry_offset),
            int(row.attempt),
            opened(row.value),
            row.written_at,
            row.step_id,
        )
        for row in found
    ]
    more = limit > 0 and bool(found) and (len(found) == limit or int(found[-1].through) >= max_bytes)
    closed = first.closed_at is not None or first.status in TERMINAL_STATUSES
    return StreamRead(str(first.status), entries, closed, more, [int(row.size) for row in found])


@dataclass(frozen=True)
class StreamSummary:
    """A stream as an instance's page lists it."""

    key: str
    length: int
    closed_at: datetime | None
    updated_at: datetime


_STREAMS_OF = statement(
    """
    SELECT key, length, closed_at, updated_at FROM kenning_streams
    WHERE instance_id = :instance_id ORDER BY created_at, key LIMIT :limit
    """
)


async def streams_of(conn: Executor, instance_id: str, *, limit: int = 100) -> list[StreamSummary]:
    """The instance's streams, oldest first (at most ``limit``)."""
    rows = await conn.execute(_STREAMS_OF, {"instance_id": instance_id, "limit": limit})
    return [StreamSummary(row.key, int(row.length), row.closed_at, row.updated_at) for row in rows]
