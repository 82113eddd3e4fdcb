"""The console's reads (``kenning console``): the instances list, the counts by status,
one instance's page and its live fingerprint. One function per statement, rows read by
name; nothing here writes.

**The list** is ordered newest first by ``(created_at, id)`` and paged by keyset: a page
asks for the rows after the last one shown, so page 1,000 costs what page 1 does. The
filters an index serves (status, workflow, a time range) narrow the index range
(``kenning_instances_created``, and migration 0006's ``..._status_created`` and
``..._workflow_status_created``, whose status and workflow keys are under ``COLLATE "C"``:
the statements here compare those columns under that collation, which is what lets them use
the two indexes and keeps every other statement, the claim first, off them; see 0006's
docstring). The filters no index serves (an instance id or idempotency key
prefix, a search in input/result) are a **bounded scan**: one page looks at most
``scan_limit`` rows of the indexed range, keeps those that match, and, if it found too
few, says how far it looked so the next page goes on from there. A search never reads
the whole table at once, and never misses a row. The list's statement is assembled from
fixed clauses, one text per combination of filters given (cached), so each combination
is one prepared statement.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.db import Executor, Statement, statement

# the statuses the list filters on and the counts show (the console imports them from here)
from kenning.storage.records import INSTANCE_STATUSES


@dataclass(frozen=True)
class InstanceFilters:
    """What the list shows; empty fields filter nothing."""

    status: str = ""
    workflow: str = ""
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    id_prefix: str = ""
    key_prefix: str = ""
    contains: str = ""  # JSON text: input or result @> this
    text: str = ""  # input or result, as JSON text, contains this (case-insensitive)

    @property
    def scans(self) -> bool:
        """Some filter is judged row by row (a bounded scan), not by an index."""
        return bool(self.id_prefix or self.key_prefix or self.contains or self.text)


@dataclass(frozen=True)
class Cursor:
    """The last row of a page (or of a scan): the next page starts after it."""

    created_at: datetime
    id: str


_LIST_COLUMNS = """i.id, i.workflow_name, i.status, i.created_at, i.updated_at, i.started_at, i.finished_at,
           i.idempotency_key, i.lease_owner, i.cancel_requested"""


# The status and the workflow as migration 0006's indexes key them (byte order: the list
# only asks for equality); compared so, the range is an index range.
_STATUS = 'i.status COLLATE "C"'
_WORKFLOW = 'i.workflow_name COLLATE "C"'


def _indexed_where(f: InstanceFilters, after: bool) -> str:
    clauses = ["true"]
    if f.status:
        clauses.append(f"{_STATUS} = :status")
    if f.workflow:
        clauses.append(f"{_WORKFLOW} = :workflow")
    if f.since is not None:
        clauses.append("i.created_at >= :since")
    if f.until is not None:
        clauses.append("i.created_at < :until")
    if after:  # the keyset: rows older than the cursor, ties broken by id
        clauses.append("i.created_at <= :after_created AND (i.created_at < :after_created OR i.id < :after_id)")
    return " AND ".join(clauses)


def _hit(f: InstanceFilters) -> str:
    clauses = ["true"]
    if f.id_prefix:
        clauses.append("starts_with(i.id, :id_prefix)")
    if f.key_prefix:
        clauses.append("starts_with(i.idempotency_key, :key_prefix)")
    if f.contains:
        clauses.append("(i.input @> CAST(:contains AS jsonb) OR i.result @> CAST(:contains AS jsonb))")
    if f.text:
        clauses.append(
            "(strpos(lower(CAST(i.input AS text)), :text) > 0"
            " OR strpos(lower(coalesce(CAST(i.result AS text), '')), :text) > 0)"
        )
    return " AND ".join(clauses)


def _shape(f: InstanceFilters) -> InstanceFilters:
    """The filters' shape: which are given, not their values (the statement cache's key)."""
    stamp = datetime(2000, 1, 1)
    return InstanceFilters(
        status="x" if f.status else "",
        workflow="x" if f.workflow else "",
        since=stamp if f.since is not None else None,
        until=stamp if f.until is not None else None,
        id_prefix="x" if f.id_prefix else "",
        key_prefix="x" if f.key_prefix else "",
        contains="x" if f.contains else "",
        text="x" if f.text else "",
    )


def _ordered(shape: InstanceFilters, after: bool, limit: str) -> str:
    """A subquery of the instances the indexed filters select, newest first, the first
    ``limit`` (a parameter's name) only. A workflow without a status is read as one
    range of ``kenning_instances_workflow_status_created`` per status, merged (each
    range is in the list's order, so PostgreSQL merges them and stops at ``limit``)."""
    where = _indexed_where(shape, after)
    order = "ORDER BY i.created_at DESC, i.id DESC"
    if shape.workflow and not shape.status:
        ranges = " UNION ALL ".join(
            f"(SELECT * FROM kenning_instances AS i WHERE {_STATUS} = '{status}' AND {where} {order} LIMIT :{limit})"
            for status in INSTANCE_STATUSES
        )
        return f"(SELECT * FROM ({ranges}) AS i {order} LIMIT :{limit})"
    return f"(SELECT * FROM kenning_instances AS i WHERE {where} {order} LIMIT :{limit})"


@functools.cache
def _page_statement(shape: InstanceFilters, after: bool) -> Statement:
    order = "ORDER BY i.created_at DESC, i.id DESC"
    if not shape.scans:
        return statement(f"SELECT {_LIST_COLUMNS} FROM {_ordered(shape, after, 'limit')} AS i {order}")
    # at most :scan_limit rows of the indexed range are judged; the outer LIMIT stops as
    # soon as enough match
    return statement(
        f"""
        SELECT {_LIST_COLUMNS}
        FROM {_ordered(shape, after, "scan_limit")} AS i
        WHERE {_hit(shape)}
        {order}
        LIMIT :limit
        """
    )


@functools.cache
def _scan_end_statement(shape: InstanceFilters, after: bool) -> Statement:
    return statement(
        f"""
        SELECT i.created_at, i.id
        FROM {_ordered(shape, after, "scan_limit")} AS i
        ORDER BY i.created_at DESC, i.id DESC
        OFFSET :scan_limit - 1 LIMIT 1
        """
    )


def _parameters(f: InstanceFilters, after: Cursor | None) -> dict[str, Any]:
    return {
        "status": f.status,
        "workflow": f.workflow,
        "since": f.since,
        "until": f.until,
        "id_prefix": f.id_prefix,
        "key_prefix": f.key_prefix,
        "contains": f.contains or None,
        "text": f.text.lower(),
        "after_created": after.created_at if after else None,
        "after_id": after.id if after else None,
    }


@dataclass(frozen=True)
class InstancePage:
    rows: list[Any]
    # where the next page starts; None: this was the last
    next: Cursor | None
    # a bounded scan found fewer than a page: how far it looked (rows judged)
    scanned: int | None = None


async def instances_page(
    conn: Executor, filters: InstanceFilters, *, after: Cursor | None, limit: int, scan_limit: int
) -> InstancePage:
    """One page of the list, newest first, after ``after``."""
    shape = _shape(filters)
    params = {**_parameters(filters, after), "limit": limit + 1, "scan_limit": scan_limit}
    rows = (await conn.execute(_page_statement(shape, after is not None), params)).all()
    if len(rows) > limit:
        last = rows[limit - 1]
        return InstancePage(rows[:limit], Cursor(last.created_at, last.id))
    if not filters.scans:
        return InstancePage(rows, None)
    # fewer matches than a page: either the range ended, or the scan's bound did
    end = (await conn.execute(_scan_end_statement(shape, after is not None), params)).first()
    if end is None:
        return InstancePage(rows, None)
    return InstancePage(rows, Cursor(end.created_at, end.id), scanned=scan_limit)


_INSTANCE_BY_ID = statement(f"SELECT {_LIST_COLUMNS} FROM kenning_instances AS i WHERE i.id = :id")


async def instance_by_id(conn: Executor, instance_id: str) -> Any | None:
    """The list's row of one instance (the id filter's exact match)."""
    return (await conn.execute(_INSTANCE_BY_ID, {"id": instance_id})).first()


@functools.cache
def _counts_statement(shape: InstanceFilters) -> Statement:
    where = _indexed_where(InstanceFilters(workflow=shape.workflow, since=shape.since, until=shape.until), False)
    return statement(
        f"""
        SELECT s.status,
               (SELECT count(*) FROM (SELECT 1 FROM kenning_instances AS i
                                      WHERE {_STATUS} = s.status AND {where}
                                      ORDER BY i.created_at DESC, i.id DESC
                                      LIMIT :cap) AS c) AS count
        FROM unnest(CAST(:statuses AS text[])) WITH ORDINALITY AS s(status, position)
        ORDER BY s.position
        """
    )


async def instances_counts(conn: Executor, filters: InstanceFilters, *, cap: int) -> dict[str, int]:
    """Instances per status under the workflow and time filters, each counted up to
    ``cap`` (a count of ``cap`` means "at least"): an index-only range per status."""
    params = {**_parameters(filters, None), "cap": cap, "statuses": list(INSTANCE_STATUSES)}
    rows = await conn.execute(_counts_statement(_shape(filters)), params)
    return {row.status: int(row.count) for row in rows}


_WORKFLOW_NAMES = statement("SELECT DISTINCT workflow_name FROM kenning_workflow_definitions ORDER BY workflow_name")


async def workflow_names(conn: Executor) -> list[str]:
    """Every workflow ever registered (definitions: one row per name and code version)."""
    return [row.workflow_name for row in await conn.execute(_WORKFLOW_NAMES)]


# ------------------------------------------------------------------ one instance

_INSTANCE = statement("SELECT * FROM kenning_instances WHERE id = :id")


async def instance(conn: Executor, instance_id: str) -> Any | None:
    """Every column of one instance (the columns later migrations add included)."""
    return (await conn.execute(_INSTANCE, {"id": instance_id})).first()


_HISTORY = statement(
    """
    SELECT seq, step_id, kind, step_name, payload, payload_bytes IS NOT NULL AS binary, created_at,
           attempts, started_at, run_seconds
    FROM kenning_history WHERE instance_id = :id ORDER BY seq
    """
)


async def instance_history(conn: Executor, instance_id: str) -> list[Any]:
    """The recorded steps, in the order they were recorded."""
    return (await conn.execute(_HISTORY, {"id": instance_id})).all()


_COMPENSATIONS = statement(
    """
    SELECT comp_id, position, function_name, args, kwargs, retry_policy, created_at
    FROM kenning_compensations WHERE instance_id = :id ORDER BY position
    """
)


async def instance_compensations(conn: Executor, instance_id: str) -> list[Any]:
    """The compensations registered, in the order they were (they run in reverse)."""
    return (await conn.execute(_COMPENSATIONS, {"id": instance_id})).all()


_WAITS = statement(
    """
    SELECT step_id, step_name, event_type, match, since, timeout_at, created_at
    FROM kenning_event_subscriptions WHERE instance_id = :id ORDER BY created_at, step_id
    """
)


async def instance_waits(conn: Executor, instance_id: str) -> list[Any]:
    """The events the instance waits for now (``wait_event``), with their ``match``."""
    return (await conn.execute(_WAITS, {"id": instance_id})).all()


_TIMERS = statement(
    "SELECT step_id, step_name, due_at, created_at FROM kenning_timers WHERE instance_id = :id ORDER BY due_at"
)


async def instance_timers(conn: Executor, instance_id: str) -> list[Any]:
    """The timers the instance waits on now (``wait_timer``, ``sleep``)."""
    return (await conn.execute(_TIMERS, {"id": instance_id})).all()


_SENT = statement(
    """
    SELECT id, event_type, source, subject, content_type, data, data_bytes IS NOT NULL AS binary, extensions,
           status, attempts, last_error, created_at, published_at
    FROM kenning_outbox WHERE instance_id = :id ORDER BY created_seq
    """
)


async def instance_sent_events(conn: Executor, instance_id: str) -> list[Any]:
    """The CloudEvents the instance sent (its outbox rows) and how their delivery went."""
    return (await conn.execute(_SENT, {"id": instance_id})).all()


_FINGERPRINT = statement(
    """
    SELECT i.status, i.updated_at, i.lease_owner,
           (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id = i.id) AS steps
    FROM kenning_instances AS i WHERE i.id = :id
    """
)


async def instance_fingerprint(conn: Executor, instance_id: str) -> Any | None:
    """What changes when an instance moves: status, update time, lease holder, steps recorded."""
    return (await conn.execute(_FINGERPRINT, {"id": instance_id})).first()
