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

import dataclasses
import functools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# the statuses the list filters on and the counts show (the console imports them from here)
from kenning.core.records import INSTANCE_STATUSES
from kenning.db import Executor, Statement, statement
from kenning.storage import published


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
    where: str = ""  # JSON object: search attributes (kenning_search_attributes) holding every pair

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
        where="x" if f.where else "",
    )


def _ordered(shape: InstanceFilters, after: bool, limit: str) -> str:
    """A subquery of the instances the indexed filters select, newest first, the first
    ``limit`` (a parameter's name) only. A workflow without a status is read as one
    range of ``kenning_instances_workflow_status_created`` per status, merged (each
    range is in the list's order, so PostgreSQL merges them and stops at ``limit``)."""
    if shape.where:
        return _by_search_attributes(shape, after, limit)
    where = _indexed_where(shape, after)
    order = "ORDER BY i.created_at DESC, i.id DESC"
    if shape.workflow and not shape.status:
        ranges = " UNION ALL ".join(
            f"(SELECT * FROM kenning_instances AS i WHERE {_STATUS} = '{status}' AND {where} {order} LIMIT :{limit})"
            for status in INSTANCE_STATUSES
        )
        return f"(SELECT * FROM ({ranges}) AS i {order} LIMIT :{limit})"
    return f"(SELECT * FROM kenning_instances AS i WHERE {where} {order} LIMIT :{limit})"


def _by_search_attributes(shape: InstanceFilters, after: bool, limit: str) -> str:
    """``_ordered`` for a ``where`` filter: driven by ``kenning_search_attributes_lookup``
    (migration 0012) in the list's order, its first pair's range, the keyset on its
    copy of ``created_at``; the other pairs (each on the primary key) and filters judged
    per entry."""
    keyset = "true"
    if after:
        keyset = "s.created_at <= :after_created AND (s.created_at < :after_created OR s.instance_id < :after_id)"
    return f"""(SELECT i.* FROM kenning_search_attributes AS s JOIN kenning_instances AS i ON i.id = s.instance_id
        WHERE s.key = :where_key AND s.value = :where_value AND {keyset} AND {_indexed_where(shape, False)}
          AND {published.other_pairs_hold("s", "where_others")}
        ORDER BY s.created_at DESC, s.instance_id DESC LIMIT :{limit})"""


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
    pairs = list(json.loads(f.where).items()) if f.where else [("", "")]  # the first drives
    return {
        "where_key": pairs[0][0],
        "where_value": pairs[0][1],
        "where_others": json.dumps(dict(pairs[1:])),
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
    if filters.where:  # its most selective pair drives the read
        ordered = await published.most_selective_first(conn, json.loads(filters.where))
        filters = dataclasses.replace(filters, where=json.dumps(ordered))
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
#
# Every value a user's code made (an input, a result, an error, a step's record, a sent
# event's data, a compensation's arguments, a wait's match) is read *bounded*: its size as
# JSON text (``<name>_size``), the value itself only when that is at most ``:bound`` bytes
# (``<name>``), else the first ``:preview`` characters of its text (``<name>_preview``). So
# a 100 MB result never crosses to the console for its page (the whole value streams from
# ``kenning.storage.console_values``). Each value's text is made once per row: in a
# ``LATERAL`` subquery that ``OFFSET 0`` keeps from being merged into the outer one (merged,
# each of the three uses would cast the value again: about a second each for 100 MB).


def _bounded(values: dict[str, str], alias: str = "v") -> tuple[str, str]:
    """The select list and the ``LATERAL`` join that read ``values`` (name -> jsonb
    expression) bounded, as said above."""
    texts = ", ".join(f"CAST({expr} AS text) AS {name}" for name, expr in values.items())
    columns = []
    for name, expr in values.items():
        text = f"{alias}.{name}"
        columns += [
            f"octet_length({text}) AS {name}_size",
            f"CASE WHEN octet_length({text}) <= :bound THEN {expr} END AS {name}",
            f"CASE WHEN octet_length({text}) > :bound THEN left({text}, :preview) END AS {name}_preview",
        ]
    return ", ".join(columns), f"CROSS JOIN LATERAL (SELECT {texts} OFFSET 0) AS {alias}"


@dataclass(frozen=True)
class Bounds:
    """How much of each value a page shows: whole up to ``bound`` bytes of JSON text,
    else a preview of its first ``preview`` characters."""

    bound: int = 4096
    preview: int = 1024

    def parameters(self) -> dict[str, int]:
        return {"bound": self.bound, "preview": self.preview}


_INSTANCE_VALUES, _INSTANCE_JOIN = _bounded({"input": "i.input", "result": "i.result", "error": "i.error"})
_INSTANCE = statement(
    f"""
    SELECT i.id, i.workflow_name, i.source_hash, i.status, i.idempotency_key, i.cancel_requested, i.lease_owner,
           i.available_at, i.attempts, i.run_count, i.run, i.created_at, i.updated_at, i.started_at, i.finished_at,
           i.stuck_reason, i.stuck_at, i.forked_from, i.forked_from_step, i.pinned_version,
           left(i.error ->> 'type', 200) AS error_type, left(i.error ->> 'message', :preview) AS error_message,
           left(i.error ->> 'reason', 200) AS error_reason,
           {_INSTANCE_VALUES}
    FROM kenning_instances AS i {_INSTANCE_JOIN}
    WHERE i.id = :id
    """
)


async def instance(conn: Executor, instance_id: str, bounds: Bounds) -> Any | None:
    """One instance for its page: its facts, and its input, result and error bounded
    (an error's type and the start of its message always)."""
    return (await conn.execute(_INSTANCE, {"id": instance_id, **bounds.parameters()})).first()


# a record's payload without its value: an event's attributes, an error's type and message
_PAYLOAD_REST = "h.payload - 'result' - 'data'"
_HISTORY_VALUES, _HISTORY_JOIN = _bounded({"payload": "h.payload", "payload_rest": _PAYLOAD_REST})
# The page is a keyset on seq: the steps after the last one shown. (instance_id, step_id)
# is the only index, so the instance's rows are read in that index and the first
# :limit by seq kept (a top-N sort of seq alone); only those are read whole.
_HISTORY_PAGE = statement(
    f"""
    SELECT h.seq, h.step_id, h.kind, h.step_name, h.payload_bytes IS NOT NULL AS binary, h.created_at,
           h.attempts, h.started_at, h.run_seconds, {_HISTORY_VALUES}
    FROM (SELECT step_id FROM kenning_history
          WHERE instance_id = :id AND seq > :after ORDER BY seq LIMIT :limit) AS page
    JOIN kenning_history AS h ON h.instance_id = :id AND h.step_id = page.step_id
    {_HISTORY_JOIN}
    ORDER BY h.seq
    """
)


async def instance_history_page(
    conn: Executor, instance_id: str, *, after: int, limit: int, bounds: Bounds
) -> list[Any]:
    """Up to ``limit`` recorded steps after the one numbered ``after`` (0: from the
    first), in the order they were recorded, their payloads bounded."""
    params = {"id": instance_id, "after": after, "limit": limit, **bounds.parameters()}
    return (await conn.execute(_HISTORY_PAGE, params)).all()


_HISTORY_PAGE_START = statement(
    """
    SELECT seq FROM kenning_history WHERE instance_id = :id AND seq < :before
    ORDER BY seq DESC OFFSET :limit LIMIT 1
    """
)


async def instance_history_page_start(conn: Executor, instance_id: str, *, before: int, limit: int) -> int:
    """Where the page of ``limit`` steps that ends just before step ``before`` starts: the
    ``after`` of :func:`instance_history_page` (0 when it is the first page). The newest
    page is the one before the largest number. The offset is a page, never the history."""
    row = (await conn.execute(_HISTORY_PAGE_START, {"id": instance_id, "before": before, "limit": limit})).first()
    return 0 if row is None else int(row.seq)


_HISTORY_POSITION = statement(
    """
    SELECT count(*) AS total, count(*) FILTER (WHERE seq <= :after) AS before,
           max(created_at) FILTER (WHERE seq <= :after) AS previous_at
    FROM kenning_history WHERE instance_id = :id
    """
)


@dataclass(frozen=True)
class HistoryPosition:
    total: int  # steps recorded
    before: int  # of them, up to the page's ``after``
    previous_at: datetime | None  # when the last of those was recorded


async def instance_history_position(conn: Executor, instance_id: str, after: int) -> HistoryPosition:
    """How many steps the instance recorded, how many of them come up to ``after``, and
    when the last of those was recorded (a page's first step started after it)."""
    row = (await conn.execute(_HISTORY_POSITION, {"id": instance_id, "after": after})).one()
    return HistoryPosition(int(row.total), int(row.before), row.previous_at)


# What else the timeline shows beside a page of history: rows recorded in the page's time
# range [:since, :until) (NULL: open), at most :limit of each (one more tells there are more).
_IN_RANGE = (
    "(CAST(:since AS timestamptz) IS NULL OR {at} >= :since) AND (CAST(:until AS timestamptz) IS NULL OR {at} < :until)"
)

_COMPENSATION_VALUES, _COMPENSATION_JOIN = _bounded({"args": "c.args", "kwargs": "c.kwargs"})
_COMPENSATIONS = statement(
    f"""
    SELECT c.comp_id, c.position, c.function_name, c.created_at, ran.kind AS ran_kind, ran.created_at AS ran_at,
           {_COMPENSATION_VALUES}
    FROM kenning_compensations AS c {_COMPENSATION_JOIN}
    -- its record, if it ran (on this page of history or another)
    LEFT JOIN kenning_history AS ran ON ran.instance_id = c.instance_id AND ran.step_id = 'compensation:' || c.comp_id
    WHERE c.instance_id = :id AND {_IN_RANGE.format(at="c.created_at")}
    ORDER BY c.position LIMIT :limit
    """
)


@dataclass(frozen=True)
class Window:
    """The time range of a page of history, and how many rows of each kind it shows."""

    since: datetime | None
    until: datetime | None
    limit: int

    def parameters(self, instance_id: str, bounds: Bounds) -> dict[str, Any]:
        return {"id": instance_id, "since": self.since, "until": self.until, "limit": self.limit, **bounds.parameters()}


async def instance_compensations(conn: Executor, instance_id: str, window: Window, bounds: Bounds) -> list[Any]:
    """The compensations registered in the window, in the order they were (they run in
    reverse), their arguments bounded, and the kind and time of their record if they ran."""
    return (await conn.execute(_COMPENSATIONS, window.parameters(instance_id, bounds))).all()


_WAIT_VALUES, _WAIT_JOIN = _bounded({"match": "w.match"})
_WAITS = statement(
    f"""
    -- a parent waiting for its child's end takes it whenever it came (since -infinity,
    -- which psycopg cannot read as a datetime): NULL, "no bound"
    SELECT w.step_id, w.step_name, w.event_type, CASE WHEN isfinite(w.since) THEN w.since END AS since,
           w.timeout_at, w.created_at, {_WAIT_VALUES}
    FROM kenning_event_subscriptions AS w {_WAIT_JOIN}
    WHERE w.instance_id = :id ORDER BY w.created_at, w.step_id LIMIT :limit
    """
)


async def instance_waits(conn: Executor, instance_id: str, *, limit: int, bounds: Bounds) -> list[Any]:
    """The events the instance waits for now (``wait_event``), with their ``match`` bounded."""
    return (await conn.execute(_WAITS, {"id": instance_id, "limit": limit, **bounds.parameters()})).all()


_TIMERS = statement(
    """
    SELECT step_id, step_name, due_at, created_at FROM kenning_timers WHERE instance_id = :id
    ORDER BY due_at LIMIT :limit
    """
)


async def instance_timers(conn: Executor, instance_id: str, *, limit: int) -> list[Any]:
    """The timers the instance waits on now (``wait_timer``, ``sleep``)."""
    return (await conn.execute(_TIMERS, {"id": instance_id, "limit": limit})).all()


_SENT_VALUES, _SENT_JOIN = _bounded({"data": "o.data"})
_SENT = statement(
    f"""
    SELECT o.id, o.event_type, o.source, o.subject, o.content_type, o.data_bytes IS NOT NULL AS binary,
           o.extensions, o.status, o.attempts, left(o.last_error, :preview) AS last_error, o.created_at,
           o.published_at, {_SENT_VALUES}
    FROM kenning_outbox AS o {_SENT_JOIN}
    WHERE o.instance_id = :id AND {_IN_RANGE.format(at="o.created_at")}
    ORDER BY o.created_seq LIMIT :limit
    """
)


async def instance_sent_events(conn: Executor, instance_id: str, window: Window, bounds: Bounds) -> list[Any]:
    """The CloudEvents the instance sent in the window (its outbox rows), their data
    bounded, and how their delivery went."""
    return (await conn.execute(_SENT, window.parameters(instance_id, bounds))).all()


_FINGERPRINT = statement(
    """
    SELECT i.status, i.updated_at, i.lease_owner,
           (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id = i.id) AS steps,
           -- an activity's first write begins a stream without a step: the page then lists it
           (SELECT count(*) FROM kenning_streams AS s WHERE s.instance_id = i.id) AS streams
    FROM kenning_instances AS i WHERE i.id = :id
    """
)


async def instance_fingerprint(conn: Executor, instance_id: str) -> Any | None:
    """What changes when an instance moves: status, update time, lease holder, steps
    recorded, streams begun."""
    return (await conn.execute(_FINGERPRINT, {"id": instance_id})).first()
