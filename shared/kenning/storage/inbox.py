"""SQL for the inbox: CloudEvents and cancellation requests on their way to workflows.

The ingress inserts rows (one statement per request, a batch all or nothing) and
notifies; workers claim them in batches (``FOR UPDATE SKIP LOCKED``), each claim with a
token that fences the later writes, and process every row in one transaction that starts
by marking it processed. Processed rows are kept for the retention period: they answer
duplicates by ``(source, id)`` and ``wait_event(since=...)``.

The database clock is the only clock; ``now`` parameters exist so tests can move time.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import CHANNEL_INBOX
from kenning.core.records import StoredEvent
from kenning.db import Executor, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.names import notify
from kenning.storage.receivers import CLAIMABLE, FOREIGN_TYPES, Receiver, receivers_json

CANCEL_SOURCE = "kenning.ingress"
CANCEL_TYPE = "kenning.cancel"


@dataclass(frozen=True)
class NewEvent:
    """A CloudEvent accepted by the ingress: ``data`` is JSON (or a text string), or the
    event has ``data_bytes``; ``attributes`` holds every context attribute."""

    source: str
    event_id: str
    event_type: str
    attributes: dict[str, Any] = field(default_factory=dict)
    data: Any = None
    data_bytes: bytes | None = None
    instance_id: str | None = None  # the kenninginstanceid extension
    # (data, data_bytes) as the row keeps them, when the writer sealed them already (``sealed``)
    stored: tuple[str | None, bytes | None] | None = None


@dataclass(frozen=True)
class ClaimedRow:
    kind: str  # 'event' or 'cancel'
    attempts: int  # including this one
    claim_token: str
    event: StoredEvent


_INBOX_INSERT_EVENTS = statement(
    f"""
    WITH incoming AS (
        SELECT * FROM unnest(
            CAST(:sources AS text[]), CAST(:event_ids AS text[]), CAST(:event_types AS text[]),
            CAST(:instance_ids AS text[]), CAST(:attributes AS text[]), CAST(:data AS text[]),
            CAST(:data_bytes AS bytea[])
        ) WITH ORDINALITY AS e(source, event_id, event_type, instance_id, attributes, data, data_bytes, position)
    ), inserted AS (
        INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id, attributes, data, data_bytes)
        SELECT 'event', source, event_id, event_type, instance_id, CAST(attributes AS jsonb), CAST(data AS jsonb),
               data_bytes
        FROM incoming
        ORDER BY position
        ON CONFLICT DO NOTHING
        RETURNING source, event_id
    )
    SELECT source, event_id, {notify(CHANNEL_INBOX)} AS notified FROM inserted
    """
)


async def inbox_insert_events(conn: Executor, events: Sequence[NewEvent]) -> list[bool]:
    """Store ``events`` in one statement and wake workers. Returns, per event, whether it
    was stored (False: a duplicate by ``(source, id)``, also within the batch).

    JSON data is sealed (``kenning.codecs.seal``) when this process has keys: every
    writer of events (the ingress and its broker sources, the console, ``kenning.testing``)
    comes through here; the type, source, id and attributes stay plain for routing."""
    if not events:
        return []
    stored = [_stored_data(e) for e in events]
    params = {
        "sources": [e.source for e in events],
        "event_ids": [e.event_id for e in events],
        "event_types": [e.event_type for e in events],
        "instance_ids": [e.instance_id for e in events],
        "attributes": [json.dumps(e.attributes, ensure_ascii=False) for e in events],
        "data": [data for data, _ in stored],
        "data_bytes": [data_bytes for _, data_bytes in stored],
    }
    inserted = {(row.source, row.event_id) for row in await conn.execute(_INBOX_INSERT_EVENTS, params)}
    result = []
    for event in events:
        key = (event.source, event.event_id)
        result.append(key in inserted)
        inserted.discard(key)  # a second copy in the same batch is a duplicate
    return result


def sealed(events: Sequence[NewEvent]) -> list[NewEvent]:
    """``events`` with their data in the form their rows keep (``stored``), which
    ``inbox_insert_events`` writes as it is: for a writer that seals off its event loop.
    Sealing offloads data above ``KENNING_OFFLOAD_BYTES`` to the object store, an upload that
    blocks its thread (``kenning.objects.payloads``) and raises ``ObjectStoreError`` when the
    store fails; the ingress runs it in a thread, for one request's events at a time."""
    return [e if e.stored is not None else dataclasses.replace(e, stored=_stored_data(e)) for e in events]


def _stored_data(event: NewEvent) -> tuple[str | None, bytes | None]:
    """(data, data_bytes) as stored: JSON sealed; binary data sealed into ``data`` with an
    empty ``data_bytes`` as the sign (``kenning.codecs.seal_bytes``), or as it came."""
    if event.stored is not None:
        return event.stored
    if event.data_bytes is not None:
        sealed = codecs.seal_bytes(event.data_bytes)
        return (None, event.data_bytes) if sealed is None else (json.dumps(sealed), b"")
    return None if event.data is None else json.dumps(codecs.seal(event.data), ensure_ascii=False), None


_INBOX_INSERT_CANCEL = statement(
    f"""
    WITH target AS (
        SELECT id FROM kenning_instances WHERE id = :instance_id
    ), inserted AS (
        INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id)
        SELECT 'cancel', :source, CAST(gen_random_uuid() AS text), :event_type, id FROM target
        RETURNING id
    )
    SELECT id, {notify(CHANNEL_INBOX)} AS notified FROM inserted
    """
)


async def inbox_insert_cancel(conn: Executor, instance_id: str) -> bool:
    """Store a cancellation request for ``instance_id`` and wake workers; False (nothing
    stored) for an unknown instance. Requests are not deduplicated: applying one twice
    is harmless."""
    row = (
        await conn.execute(
            _INBOX_INSERT_CANCEL, {"instance_id": instance_id, "source": CANCEL_SOURCE, "event_type": CANCEL_TYPE}
        )
    ).first()
    return row is not None


_INBOX_CHECK_READY = statement("SELECT true AS ready FROM kenning_inbox LIMIT 1")


async def inbox_check_ready(conn: Executor) -> None:
    """Raises unless the database answers and the inbox table exists."""
    await conn.execute(_INBOX_CHECK_READY)


_COLUMNS = """x.id AS inbox_id, x.kind, x.source, x.event_id, x.event_type, x.instance_id, x.attributes,
              x.data, x.data_bytes, x.received_at, x.attempts, CAST(x.claim_token AS text) AS claim_token"""

_INBOX_CLAIM_PENDING = statement(
    f"""
    WITH {FOREIGN_TYPES}, batch AS (
        SELECT id FROM kenning_inbox AS x
        WHERE status = 'pending' AND available_at <= {NOW} AND {CLAIMABLE}
        ORDER BY available_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE kenning_inbox AS x
    SET attempts = x.attempts + 1,
        claim_token = gen_random_uuid(),
        available_at = {NOW} + make_interval(secs => :lease_seconds)
    FROM batch
    WHERE x.id = batch.id
    RETURNING {_COLUMNS}
    """
)


def stored_event(row: Any) -> StoredEvent:
    """The event of a row with an inbox row's columns, its id named ``inbox_id``."""
    return StoredEvent(
        inbox_id=row.inbox_id,
        source=row.source,
        event_id=row.event_id,
        event_type=row.event_type,
        instance_id=row.instance_id,
        attributes=dict(row.attributes or {}),
        data=row.data,
        data_bytes=bytes(row.data_bytes) if row.data_bytes is not None else None,
        received_at=row.received_at,
    )


@dataclass(frozen=True)
class ClaimScope:
    """What a worker's inbox claim may take: events whose every live receiver (declared
    within ``receiver_ttl`` seconds by any worker) is among ``receivers``, its own."""

    receivers: Sequence[Receiver] = ()
    receiver_ttl: float = 0.0  # 0: no receiver is live, every event is claimable

    def params(self) -> dict[str, Any]:
        return {"mine": receivers_json(self.receivers), "receiver_ttl": self.receiver_ttl}


async def inbox_claim_pending(
    conn: Executor, *, limit: int, lease_seconds: float, scope: ClaimScope | None = None, now: datetime | None = None
) -> list[ClaimedRow]:
    """Claim up to ``limit`` due rows, oldest first, in one round trip.

    The claim counts an attempt and holds the row for ``lease_seconds``: a worker that
    dies holding it leaves it to the next claim after that, with the attempt counted, so
    an event that kills its worker every time is parked after the maximum attempts.
    Events of a type with a receiver outside ``scope`` are left to other workers.
    """
    params = {"limit": limit, "lease_seconds": lease_seconds, "now": now, **(scope or ClaimScope()).params()}
    result = await conn.execute(_INBOX_CLAIM_PENDING, params)
    rows = sorted(result, key=lambda row: int(row.inbox_id))
    return [
        ClaimedRow(kind=row.kind, attempts=row.attempts, claim_token=row.claim_token, event=stored_event(row))
        for row in rows
    ]


_INBOX_MARK_NO_RECEIVER = statement(
    "UPDATE kenning_inbox SET no_receiver = true WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'processed'"
)


async def inbox_mark_no_receiver(conn: Executor, inbox_ids: Sequence[int]) -> None:
    """In the processing transaction: these events had nothing to receive them."""
    if inbox_ids:
        await conn.execute(_INBOX_MARK_NO_RECEIVER, {"ids": list(inbox_ids)})


_INBOX_MARK_PROCESSED = statement(
    """
    UPDATE kenning_inbox AS x
    SET status = 'processed', processed_at = now(), claim_token = NULL
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS r(id, token)
    WHERE x.id = r.id AND x.claim_token = r.token AND x.status = 'pending'
    RETURNING x.id
    """
)


async def inbox_mark_processed(conn: Executor, claims: Sequence[tuple[int, str]]) -> set[int]:
    """First statement of the processing transaction: mark the claimed rows processed,
    locking them until commit. Returns the ids marked; a row missing was reclaimed by
    another worker after its lease ran out and is not ours any more."""
    if not claims:
        return set()
    result = await conn.execute(
        _INBOX_MARK_PROCESSED, {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims]}
    )
    return {int(row.id) for row in result}


_LIMIT_LOCK_WAIT = statement("SELECT set_config('lock_timeout', :timeout, true) AS lock_timeout")


async def inbox_limit_lock_wait(conn: Executor, seconds: float) -> None:
    """``SET LOCAL lock_timeout`` for the rest of this transaction: a lock held longer
    raises ``LockNotAvailable`` instead of stalling the inbox loop."""
    await conn.execute(_LIMIT_LOCK_WAIT, {"timeout": f"{max(1, round(seconds * 1000))}ms"})


_INBOX_RECORD_FAILURE = statement(
    """
    UPDATE kenning_inbox
    SET status = CASE WHEN :park OR attempts >= :max_attempts THEN 'failed' ELSE 'pending' END,
        processed_at = CASE WHEN :park OR attempts >= :max_attempts THEN now() END,
        available_at = now() + make_interval(
            secs => least(:retry_seconds * power(2, greatest(attempts - 1, 0)), :max_retry_seconds)),
        last_error = :error,
        claim_token = NULL
    WHERE id = :id AND claim_token = CAST(:token AS uuid)
    RETURNING status, extract(epoch FROM available_at - now()) AS retry_in_seconds
    """
)


async def inbox_record_failure(
    conn: Executor,
    inbox_id: int,
    token: str,
    *,
    error: str,
    max_attempts: int,
    retry_seconds: float,
    max_retry_seconds: float,
    park: bool = False,
) -> tuple[str, float] | None:
    """After a failed attempt: back off (``retry_seconds`` doubled per attempt, capped),
    or park the row as ``failed`` after ``max_attempts`` (at once with ``park``).
    Returns (new status, seconds until the retry), or None if the claim was lost."""
    row = (
        await conn.execute(
            _INBOX_RECORD_FAILURE,
            {
                "id": inbox_id,
                "token": token,
                "error": error[:4000],
                "max_attempts": max_attempts,
                "retry_seconds": retry_seconds,
                "max_retry_seconds": max_retry_seconds,
                "park": park,
            },
        )
    ).first()
    return None if row is None else (str(row.status), float(row.retry_in_seconds))


_INBOX_RELEASE = statement(
    f"""
    WITH released AS (
        UPDATE kenning_inbox AS x
        SET attempts = greatest(x.attempts - 1, 0), claim_token = NULL,
            available_at = now() + make_interval(secs => :delay)
        FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS r(id, token)
        WHERE x.id = r.id AND x.claim_token = r.token AND x.status = 'pending'
        RETURNING x.id
    )
    SELECT id, {notify(CHANNEL_INBOX)} AS notified FROM released
    """
)


async def inbox_release(conn: Executor, claims: Sequence[tuple[int, str]], delay_seconds: float = 0.0) -> int:
    """Give claimed rows back without counting the attempt (shutdown, or a lock held by a
    concurrent delivery), due again after ``delay_seconds``; wakes workers."""
    if not claims:
        return 0
    result = await conn.execute(
        _INBOX_RELEASE,
        {"ids": [c[0] for c in claims], "tokens": [c[1] for c in claims], "delay": delay_seconds},
    )
    return len(result.all())


_INBOX_DEFER = statement(
    """
    UPDATE kenning_inbox
    SET attempts = greatest(attempts - 1, 0), claim_token = NULL, last_error = :error,
        available_at = now() + make_interval(secs => :delay)
    WHERE id = :id AND claim_token = CAST(:token AS uuid) AND status = 'pending'
    RETURNING id
    """
)


async def inbox_defer(conn: Executor, inbox_id: int, token: str, *, error: str, delay_seconds: float) -> bool:
    """Give a claimed row back, its attempt not counted, due again after ``delay_seconds``,
    with ``error`` as its reason: a row this worker cannot read (its data sealed under a key
    the worker lacks) waits for a worker that has the key, and is never parked for it.
    False if the claim was lost."""
    params = {"id": inbox_id, "token": token, "error": error[:4000], "delay": delay_seconds}
    return (await conn.execute(_INBOX_DEFER, params)).first() is not None


_INBOX_NEXT_AVAILABLE = statement(
    f"""
    WITH {FOREIGN_TYPES}
    SELECT extract(epoch FROM min(available_at) - {NOW}) AS seconds_until_next FROM kenning_inbox AS x
    WHERE status = 'pending' AND {CLAIMABLE}
    """
)


async def inbox_seconds_until_next(
    conn: Executor, scope: ClaimScope | None = None, now: datetime | None = None
) -> float | None:
    """Seconds until the next pending row this worker may claim is due (negative: already
    due), or None: rows left to other workers (``ClaimScope``) do not count, or a worker
    that lacks their receivers would spin on them."""
    params = {"now": now, **(scope or ClaimScope()).params()}
    row = (await conn.execute(_INBOX_NEXT_AVAILABLE, params)).one()  # an aggregate: always one row
    return seconds_or_none(row.seconds_until_next)


_INBOX_DELETE_PROCESSED = statement(
    f"""
    WITH expired AS (
        SELECT id FROM kenning_inbox
        WHERE status = 'processed' AND processed_at < {NOW} - make_interval(secs => :retention_seconds)
        ORDER BY processed_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM kenning_inbox AS x USING expired WHERE x.id = expired.id RETURNING 1
    )
    SELECT count(*) AS deleted_count FROM deleted
    """
)


async def inbox_delete_processed(
    conn: Executor, *, retention_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to ``limit`` rows processed more than ``retention_seconds`` ago; parked
    (``failed``) rows stay for operators. Returns how many were deleted."""
    row = (
        await conn.execute(
            _INBOX_DELETE_PROCESSED, {"retention_seconds": retention_seconds, "limit": limit, "now": now}
        )
    ).first()
    return int(row.deleted_count) if row is not None else 0
