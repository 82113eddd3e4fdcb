"""SQL for the console's events pages and the one action no other command had: the inbox
and the outbox a page at a time (newest first, keyset pagination), how many rows each
status holds, and a parked inbox row made deliverable again.

Cancel, retry and the outbox's retry reuse the statements the CLI runs
(``instances.instance_request_cancel``, ``instances.instance_retry``,
``sagas.saga_retry``, ``outbox.outbox_retry_failed``); a start from the console goes
through ``kenning.starting`` and an event it sends through ``inbox.inbox_insert_events``,
as every other start and event does.

Keyset pagination: a page is the rows older than the last one shown (``before``: an inbox
id, an outbox ``created_seq``), so a page costs the same on the thousandth page as on the
first and rows arriving meanwhile never shift it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import CHANNEL_INBOX, EVENT_RECEIVED
from kenning.db import Executor, statement
from kenning.storage.names import notify

# what the console calls each inbox status: the worker's words are pending/processed/failed
INBOX_STATUSES = {"pending": "received", "processed": "delivered", "failed": "parked"}
OUTBOX_STATUSES = {"pending": "pending", "publishing": "publishing", "published": "published", "failed": "dead letter"}
# counts stop here: a status with more rows shows "10000+" (a count never scans a million rows)
COUNT_CAP = 10_000


@dataclass(frozen=True)
class InboxEntry:
    id: int
    kind: str  # 'event' or 'cancel'
    source: str
    event_id: str
    event_type: str
    instance_id: str | None
    attributes: dict[str, Any]
    data: Any
    data_size: int | None  # bytes of binary data, None when the data is JSON or absent
    status: str
    attempts: int
    available_at: datetime
    last_error: str | None
    received_at: datetime
    processed_at: datetime | None
    no_receiver: bool = False  # processed with nothing to receive it (migration 0008)


@dataclass(frozen=True)
class OutboxEntry:
    id: str
    instance_id: str | None
    event_type: str
    source: str
    subject: str | None
    data: Any
    data_size: int | None
    extensions: dict[str, Any]
    status: str
    attempts: int
    available_at: datetime
    lease_owner: str | None
    last_error: str | None  # the broker's answer to the last attempt
    last_attempt_at: datetime | None
    created_seq: int
    created_at: datetime
    published_at: datetime | None


_INBOX_PAGE = statement(
    """
    SELECT id, kind, source, event_id, event_type, instance_id, attributes, data,
           octet_length(data_bytes) AS data_size, status, attempts, available_at, last_error,
           received_at, processed_at, no_receiver
    FROM kenning_inbox
    WHERE (CAST(:status AS text) IS NULL OR status = :status)
      AND (CAST(:event_type AS text) IS NULL OR event_type = :event_type)
      AND (CAST(:before AS bigint) IS NULL OR id < :before)
    ORDER BY id DESC
    LIMIT :limit
    """
)


async def inbox_page(
    conn: Executor, *, status: str | None = None, event_type: str | None = None, before: int | None = None, limit: int
) -> list[InboxEntry]:
    """Inbox rows newest first, older than the row id ``before`` if given."""
    params = {"status": status, "event_type": event_type, "before": before, "limit": limit}
    return [_inbox_entry(row) for row in await conn.execute(_INBOX_PAGE, params)]


def _inbox_entry(row: Any) -> InboxEntry:
    """A row as the console shows it: sealed data opened, or "encrypted" without the key
    (binary data sealed beside an empty ``data_bytes``: its size once opened)."""
    values = {**row._asdict(), "attributes": dict(row.attributes or {}), "data": codecs.shown(row.data)}
    if row.data_size is not None and row.data is not None:
        opened = values["data"]
        if opened == codecs.ENCRYPTED:
            values["data_size"] = None  # shown as "encrypted"
        else:
            values["data"], values["data_size"] = None, len(codecs.unseal_bytes(opened))
    return InboxEntry(**values)


_INBOX_EVENT = statement(
    """
    SELECT id, kind, source, event_id, event_type, instance_id, attributes, data,
           octet_length(data_bytes) AS data_size, status, attempts, available_at, last_error,
           received_at, processed_at, no_receiver
    FROM kenning_inbox WHERE id = :id
    """
)


async def inbox_event(conn: Executor, inbox_id: int) -> InboxEntry | None:
    row = (await conn.execute(_INBOX_EVENT, {"id": inbox_id})).first()
    return None if row is None else _inbox_entry(row)


def _event_start_key(source: str, event_id: str) -> str:
    """The idempotency key of the instance an event starts, as the worker's inbox writes it
    (kenning_worker.inbox.event_start_key; storage imports no service)."""
    return "cloudevent:" + json.dumps([source, event_id], ensure_ascii=False)


# The instances each listed inbox row started (an event_handler workflow is named as the
# event's type and keyed by the event: the (workflow_name, idempotency_key) index) or
# woke (an EventReceived history row naming the event). The second reads every
# EventReceived row (no index names an event); a page lists few rows, so one read per
# page. At most :per_row of each row, ordered, so a broadcast waking thousands stays small.
_INBOX_INSTANCES = statement(
    f"""
    WITH page AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:types AS text[]), CAST(:keys AS text[]),
                             CAST(:sources AS text[]), CAST(:event_ids AS text[]))
            AS p(inbox_id, event_type, start_key, source, event_id)
    ), found AS (
        SELECT p.inbox_id, i.id AS instance_id, 'started' AS how
        FROM page AS p
        JOIN kenning_instances AS i ON i.workflow_name = p.event_type AND i.idempotency_key = p.start_key
        UNION
        SELECT p.inbox_id, h.instance_id, 'woke' AS how
        FROM page AS p
        JOIN kenning_history AS h
          ON h.kind = '{EVENT_RECEIVED}' AND h.payload ->> 'source' = p.source AND h.payload ->> 'id' = p.event_id
    )
    SELECT inbox_id, instance_id, how
    FROM (SELECT found.*, row_number() OVER (PARTITION BY inbox_id ORDER BY how, instance_id) AS nth FROM found) AS n
    WHERE nth <= :per_row
    ORDER BY inbox_id, how, instance_id
    """
)


@dataclass(frozen=True)
class EventInstance:
    instance_id: str
    how: str  # 'started' or 'woke'


async def inbox_instances(
    conn: Executor, rows: Sequence[InboxEntry], *, per_row: int
) -> dict[int, list[EventInstance]]:
    """For each event row of ``rows``: the instances it started or woke, at most
    ``per_row`` (one more tells there are more), by inbox row id."""
    events = [row for row in rows if row.kind == "event"]
    if not events:
        return {}
    params = {
        "ids": [row.id for row in events],
        "types": [row.event_type for row in events],
        "keys": [_event_start_key(row.source, row.event_id) for row in events],
        "sources": [row.source for row in events],
        "event_ids": [row.event_id for row in events],
        "per_row": per_row,
    }
    found: dict[int, list[EventInstance]] = {}
    for row in await conn.execute(_INBOX_INSTANCES, params):
        found.setdefault(int(row.inbox_id), []).append(EventInstance(row.instance_id, row.how))
    return found


_INBOX_COUNTS = statement(
    """
    SELECT (SELECT count(*) FROM (SELECT FROM kenning_inbox WHERE status = 'pending' LIMIT :cap) AS p) AS pending,
           (SELECT count(*) FROM (SELECT FROM kenning_inbox WHERE status = 'processed' LIMIT :cap) AS d) AS processed,
           (SELECT count(*) FROM (SELECT FROM kenning_inbox WHERE status = 'failed' LIMIT :cap) AS f) AS failed
    """
)


async def inbox_counts(conn: Executor) -> dict[str, int]:
    """Rows per inbox status, each count stopping at ``COUNT_CAP``."""
    row = (await conn.execute(_INBOX_COUNTS, {"cap": COUNT_CAP})).one()
    return {"pending": int(row.pending), "processed": int(row.processed), "failed": int(row.failed)}


_INBOX_RETRY_PARKED = statement(
    f"""
    WITH retried AS (
        UPDATE kenning_inbox
        SET status = 'pending', attempts = 0, available_at = now(), processed_at = NULL, claim_token = NULL
        WHERE status = 'failed' AND id = ANY(CAST(:ids AS bigint[]))
        RETURNING id
    )
    SELECT id, {notify(CHANNEL_INBOX)} AS notified FROM retried
    """
)


async def inbox_retry_parked(conn: Executor, ids: Sequence[int]) -> list[int]:
    """Make parked (``failed``) inbox rows deliverable again, due now with a fresh attempt
    count, and wake the workers; ``last_error`` stays until the next attempt writes its
    own. Returns the ids retried (a row not parked any more is left as it is)."""
    if not ids:
        return []
    return sorted(int(row.id) for row in await conn.execute(_INBOX_RETRY_PARKED, {"ids": list(ids)}))


_OUTBOX_PAGE = statement(
    """
    SELECT CAST(id AS text) AS id, instance_id, event_type, source, subject, data,
           octet_length(data_bytes) AS data_size, extensions, status, attempts, available_at, lease_owner,
           last_error, last_attempt_at, created_seq, created_at, published_at
    FROM kenning_outbox
    WHERE (CAST(:status AS text) IS NULL OR status = :status)
      AND (CAST(:event_type AS text) IS NULL OR event_type = :event_type)
      AND (CAST(:before AS bigint) IS NULL OR created_seq < :before)
    ORDER BY created_seq DESC
    LIMIT :limit
    """
)


async def outbox_page(
    conn: Executor, *, status: str | None = None, event_type: str | None = None, before: int | None = None, limit: int
) -> list[OutboxEntry]:
    """Outbox events newest first, older than the ``created_seq`` ``before`` if given."""
    params = {"status": status, "event_type": event_type, "before": before, "limit": limit}
    return [_outbox_entry(row) for row in await conn.execute(_OUTBOX_PAGE, params)]


def _outbox_entry(row: Any) -> OutboxEntry:
    """An outbox row as the console shows it, as ``_inbox_entry`` shows an inbox row."""
    values = {**row._asdict(), "extensions": dict(row.extensions or {}), "data": codecs.shown(row.data)}
    if row.data_size is not None and row.data is not None:  # binary data sealed beside an empty data_bytes
        opened = values["data"]
        if opened == codecs.ENCRYPTED:
            values["data_size"] = None  # shown as "encrypted"
        else:
            values["data"], values["data_size"] = None, len(codecs.unseal_bytes(opened))
    return OutboxEntry(**values)


_OUTBOX_EVENT = statement(
    """
    SELECT CAST(id AS text) AS id, instance_id, event_type, source, subject, data,
           octet_length(data_bytes) AS data_size, extensions, status, attempts, available_at, lease_owner,
           last_error, last_attempt_at, created_seq, created_at, published_at
    FROM kenning_outbox WHERE id = CAST(:id AS uuid)
    """
)


async def outbox_event(conn: Executor, event_id: str) -> OutboxEntry | None:
    """One outbox event by its id (a UUID: the caller checks the form)."""
    row = (await conn.execute(_OUTBOX_EVENT, {"id": event_id})).first()
    return None if row is None else _outbox_entry(row)


_OUTBOX_COUNTS = statement(
    """
    SELECT (SELECT count(*) FROM (SELECT FROM kenning_outbox WHERE status = 'pending' LIMIT :cap) AS p) AS pending,
           (SELECT count(*) FROM (SELECT FROM kenning_outbox WHERE status = 'publishing' LIMIT :cap) AS l)
               AS publishing,
           (SELECT count(*) FROM (SELECT FROM kenning_outbox WHERE status = 'published' LIMIT :cap) AS d) AS published,
           (SELECT count(*) FROM (SELECT FROM kenning_outbox WHERE status = 'failed' LIMIT :cap) AS f) AS failed
    """
)


async def outbox_counts(conn: Executor) -> dict[str, int]:
    """Events per outbox status, each count stopping at ``COUNT_CAP``."""
    row = (await conn.execute(_OUTBOX_COUNTS, {"cap": COUNT_CAP})).one()
    return {name: int(getattr(row, name)) for name in OUTBOX_STATUSES}
