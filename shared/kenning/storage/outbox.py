"""SQL for the transactional outbox: insert (in an activity's transaction), claim, lease,
outcomes, retention and the operator's list and retry.

Row states: ``pending`` -> ``publishing`` (claimed under a lease) -> ``published`` or
``failed`` (dead letter), or back to ``pending`` with the next attempt time. ``available_at``
is the next attempt time while pending and the lease expiry while publishing, so one
index serves the claim and an expired lease is reclaimed by the normal claim. Every write
after the claim names the lease token (fencing). The database clock is the only clock;
``now`` parameters exist so tests can move time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kenning import codecs
from kenning.core.names import CHANNEL_OUTBOX
from kenning.db import Executor, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.names import notify

OUTBOX_STATUSES = ("pending", "publishing", "published", "failed")

# named as OutboxRow's fields
_COLUMNS = """
    CAST(o.id AS text) AS id, o.instance_id, o.event_type, o.source, o.subject, o.content_type, o.data,
    o.data_bytes, o.extensions, o.status, o.attempts, o.available_at, o.lease_owner, o.last_error,
    o.last_attempt_at, o.created_seq, o.created_at, o.published_at
"""


@dataclass(frozen=True)
class OutboxRow:
    id: str
    instance_id: str | None
    event_type: str
    source: str
    subject: str | None
    content_type: str | None
    data: Any  # JSON, or None when the event has no data or bytes data
    data_bytes: bytes | None
    extensions: dict[str, Any]
    status: str
    attempts: int
    available_at: datetime
    lease_owner: str | None
    last_error: str | None
    last_attempt_at: datetime | None
    created_seq: int
    created_at: datetime
    published_at: datetime | None
    unreadable: str | None = None  # its data could not be opened here (a key this process lacks)


def _row(row: Any, *, shown: bool = False) -> OutboxRow:
    """A row selected with ``_COLUMNS``, its data opened: for the relayer, which publishes
    the plain event (data it cannot open: ``unreadable`` says why, nothing raised, so the
    rest of its claim goes on), or ``shown`` to an operator ("encrypted" without a key)."""
    values = row._asdict()
    if values["data_bytes"] is not None:
        values["data_bytes"] = bytes(values["data_bytes"])
    values["extensions"] = dict(values["extensions"] or {})
    # binary data sealed in ``data`` beside an empty ``data_bytes``: opened into ``data_bytes``
    sealed_bytes = values["data_bytes"] is not None and values["data"] is not None
    if shown:
        values["data"] = codecs.shown(values["data"])
        if sealed_bytes and values["data"] != codecs.ENCRYPTED:
            values["data"], values["data_bytes"] = None, codecs.unseal_bytes(values["data"])
        return OutboxRow(**values)
    try:
        if sealed_bytes:
            values["data"], values["data_bytes"] = None, codecs.unseal_bytes(values["data"])
        else:
            values["data"] = codecs.unseal(values["data"])
    except codecs.CodecError as error:
        values["data"], values["data_bytes"], values["unreadable"] = None, None, str(error)
    return OutboxRow(**values)


@dataclass(frozen=True)
class OutboxOutcome:
    """What one delivery attempt decided for a claimed row."""

    id: str
    status: Literal["published", "pending", "failed"]
    error: str | None = None
    retry_in: float = 0.0  # seconds until the next attempt, for ``pending``

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "error": self.error, "retry_in": self.retry_in}


_OUTBOX_INSERT = statement(
    f"""
    WITH inserted AS (
        INSERT INTO kenning_outbox
            (id, instance_id, event_type, source, subject, content_type, data, data_bytes, extensions)
        VALUES (CAST(:id AS uuid), :instance_id, :event_type, :source, :subject, :content_type,
                CAST(:data AS jsonb), :data_bytes, CAST(:extensions AS jsonb))
        RETURNING id
    )
    SELECT {notify(CHANNEL_OUTBOX)} AS notified FROM inserted
    """
)


async def outbox_insert(
    conn: Executor,
    *,
    event_id: str,
    instance_id: str | None,
    event_type: str,
    source: str,
    subject: str | None = None,
    content_type: str | None = None,
    data_json: str | None = None,
    data_bytes: bytes | None = None,
    extensions: dict[str, Any] | None = None,
) -> None:
    """Insert a pending event in ``conn``'s transaction and wake relayers at its commit.

    ``data_json`` is JSON text (NULL for no data); ``data_bytes`` carries binary data.
    """
    await conn.execute(
        _OUTBOX_INSERT,
        {
            "id": event_id,
            "instance_id": instance_id,
            "event_type": event_type,
            "source": source,
            "subject": subject,
            "content_type": content_type,
            "data": data_json,
            "data_bytes": data_bytes,
            "extensions": json.dumps(extensions or {}),
        },
    )


_OUTBOX_CLAIM = statement(
    f"""
    WITH candidates AS (
        SELECT o.id FROM kenning_outbox AS o
        WHERE o.status IN ('pending', 'publishing')
          AND o.available_at <= {NOW}
          -- creation order per instance: only the oldest undelivered event of an instance
          -- is claimable; published and dead-lettered (failed) events do not hold it back.
          AND (o.instance_id IS NULL OR NOT EXISTS (
                SELECT 1 FROM kenning_outbox AS earlier
                WHERE earlier.instance_id = o.instance_id
                  AND earlier.created_seq < o.created_seq
                  AND earlier.status IN ('pending', 'publishing')))
        ORDER BY o.available_at, o.created_seq
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE kenning_outbox AS o
    SET status = 'publishing',
        lease_token = CAST(:token AS uuid),
        lease_owner = :owner,
        available_at = {NOW} + make_interval(secs => :lease_seconds),
        attempts = o.attempts + 1,
        last_attempt_at = {NOW}
    FROM candidates
    WHERE o.id = candidates.id
    RETURNING {_COLUMNS}
    """
)


async def outbox_claim_pending(
    conn: Executor,
    *,
    owner: str,
    token: str,
    limit: int,
    lease_seconds: float,
    now: datetime | None = None,
) -> list[OutboxRow]:
    """Claim up to ``limit`` due events under lease ``token`` in one round trip, oldest
    first, at most one per workflow instance (its oldest undelivered one).

    Due means pending and its next attempt time reached, or publishing under an expired
    lease (a relayer that died): expired leases are reclaimed here, not by a sweeper.
    Each claim counts as an attempt.
    """
    result = await conn.execute(
        _OUTBOX_CLAIM,
        {"owner": owner, "token": token, "limit": limit, "lease_seconds": lease_seconds, "now": now},
    )
    return sorted((_row(row) for row in result), key=lambda r: r.created_seq)


_OUTBOX_EXTEND_LEASE = statement(
    f"""
    UPDATE kenning_outbox
    SET available_at = {NOW} + make_interval(secs => :lease_seconds)
    WHERE id = ANY(CAST(:ids AS uuid[])) AND lease_token = CAST(:token AS uuid) AND status = 'publishing'
    """
)


async def outbox_extend_lease(
    conn: Executor, token: str, ids: Sequence[str], lease_seconds: float, now: datetime | None = None
) -> int:
    """Extend the lease on those of ``ids`` still held under ``token``; returns how many."""
    params = {"ids": list(ids), "token": token, "lease_seconds": lease_seconds, "now": now}
    result = await conn.execute(_OUTBOX_EXTEND_LEASE, params)
    return int(result.rowcount)


_OUTBOX_RECORD_OUTCOMES = statement(
    f"""
    WITH outcome AS (
        SELECT * FROM jsonb_to_recordset(CAST(:outcomes AS jsonb))
            AS x(id uuid, status text, error text, retry_in float8)
    )
    UPDATE kenning_outbox AS o
    SET status = x.status,
        lease_token = NULL,
        published_at = CASE WHEN x.status = 'published' THEN {NOW} ELSE o.published_at END,
        -- the next attempt time, or for a final outcome the time it was reached
        available_at = {NOW} + make_interval(secs => CASE WHEN x.status = 'pending' THEN x.retry_in ELSE 0 END),
        last_error = coalesce(x.error, o.last_error)
    FROM outcome AS x
    WHERE o.id = x.id AND o.lease_token = CAST(:token AS uuid) AND o.status = 'publishing'
    RETURNING CAST(o.id AS text) AS id
    """
)


async def outbox_record_outcomes(
    conn: Executor, token: str, outcomes: Sequence[OutboxOutcome], now: datetime | None = None
) -> set[str]:
    """Record a batch's outcomes (published, next attempt, dead letter) in one statement,
    fenced by the lease token; returns the ids written. A missing id means the lease was
    lost and another relayer owns the row now."""
    if not outcomes:
        return set()
    payload = json.dumps([o.to_json() for o in outcomes])
    result = await conn.execute(_OUTBOX_RECORD_OUTCOMES, {"token": token, "outcomes": payload, "now": now})
    return {row.id for row in result}


_OUTBOX_RELEASE = statement(
    f"""
    WITH released AS (
        UPDATE kenning_outbox
        SET status = 'pending', lease_token = NULL, available_at = now() + make_interval(secs => :delay),
            attempts = greatest(attempts - 1, 0)
        WHERE lease_token = CAST(:token AS uuid) AND status = 'publishing'
          AND id = ANY(CAST(:ids AS uuid[]))
        RETURNING id
    )
    SELECT count(*) AS released_count,
           CASE WHEN count(*) > 0 THEN {notify(CHANNEL_OUTBOX)} END AS notified
    FROM released
    """
)


async def outbox_release(conn: Executor, token: str, ids: Sequence[str], delay_seconds: float = 0.0) -> int:
    """Hand back claimed rows that were not attempted (shutdown; data this relayer cannot
    open), uncounted, due after ``delay_seconds``."""
    if not ids:
        return 0
    params = {"token": token, "ids": list(ids), "delay": delay_seconds}
    row = (await conn.execute(_OUTBOX_RELEASE, params)).first()
    return 0 if row is None else int(row.released_count)


_OUTBOX_NEXT_AVAILABLE = statement(
    f"""
    SELECT extract(epoch FROM min(available_at) - {NOW}) AS seconds_until_next
    FROM kenning_outbox WHERE status IN ('pending', 'publishing') AND available_at > {NOW}
    """
)


async def outbox_seconds_until_next(conn: Executor, now: datetime | None = None) -> float | None:
    """Seconds until the next event that is not yet due becomes due (a retry back-off or a
    lease expiring), or None. Events due already but not claimed are held back by an
    earlier event of their instance, or are being claimed by another relayer."""
    row = (await conn.execute(_OUTBOX_NEXT_AVAILABLE, {"now": now})).one()  # an aggregate: always one row
    return seconds_or_none(row.seconds_until_next)


_OUTBOX_DELETE_PUBLISHED = statement(
    f"""
    WITH doomed AS (
        SELECT id FROM kenning_outbox
        WHERE status = 'published' AND published_at < {NOW} - make_interval(secs => :retention)
        ORDER BY published_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM kenning_outbox AS o USING doomed WHERE o.id = doomed.id
    """
)


async def outbox_delete_published(
    conn: Executor, *, retention_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to ``limit`` events published more than ``retention_seconds`` ago."""
    result = await conn.execute(_OUTBOX_DELETE_PUBLISHED, {"retention": retention_seconds, "limit": limit, "now": now})
    return int(result.rowcount)


_OUTBOX_LIST = statement(
    f"""
    SELECT {_COLUMNS}
    FROM kenning_outbox AS o
    WHERE (CAST(:status AS text) IS NULL OR o.status = :status)
      AND (CAST(:instance_id AS text) IS NULL OR o.instance_id = :instance_id)
    ORDER BY o.created_seq DESC
    LIMIT :limit
    """
)


async def outbox_list(
    conn: Executor, *, status: str | None = None, instance_id: str | None = None, limit: int = 50
) -> list[OutboxRow]:
    """Events newest first, optionally of one status or one instance."""
    result = await conn.execute(_OUTBOX_LIST, {"status": status, "instance_id": instance_id, "limit": limit})
    return [_row(row, shown=True) for row in result]


_OUTBOX_STATUSES = statement(
    "SELECT CAST(id AS text) AS id, status FROM kenning_outbox WHERE id = ANY(CAST(:ids AS uuid[]))"
)


async def outbox_statuses(conn: Executor, ids: Sequence[str]) -> dict[str, str]:
    """The status of each of ``ids`` that exists."""
    if not ids:
        return {}
    return {row.id: row.status for row in await conn.execute(_OUTBOX_STATUSES, {"ids": list(ids)})}


_OUTBOX_RETRY_FAILED = statement(
    f"""
    WITH retried AS (
        UPDATE kenning_outbox
        SET status = 'pending', attempts = 0, available_at = now(), lease_token = NULL
        WHERE status = 'failed' AND (CAST(:all_failed AS boolean) OR id = ANY(CAST(:ids AS uuid[])))
        RETURNING CAST(id AS text) AS id
    )
    SELECT id, {notify(CHANNEL_OUTBOX)} AS notified FROM retried
    """
)


async def outbox_retry_failed(conn: Executor, ids: Sequence[str] | None) -> list[str]:
    """Put dead-lettered events back to pending with a fresh attempt count, due now;
    ``ids=None`` means every failed event. Returns the ids retried."""
    params = {"all_failed": ids is None, "ids": list(ids or [])}
    return sorted(row.id for row in await conn.execute(_OUTBOX_RETRY_FAILED, params))
