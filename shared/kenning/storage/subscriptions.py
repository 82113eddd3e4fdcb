"""SQL for event subscriptions: an instance waiting in ``wait_event``.

Registering a subscription and releasing the lease are one fenced statement
(docs/architecture.md invariant 3). Delivery and timeouts both lock the subscription row and delete it in the
transaction that records the outcome, so exactly one of them wins. Delivery matches
subscriptions to an event (type, ``match`` containment, addressed instance, the ``since``
window) and, once per new subscription, looks for an event already in the inbox.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.names import (
    CHANNEL_INSTANCES,
    CHANNEL_SUBSCRIPTIONS,
    CHANNEL_TIMERS,
    CHILD_EVENT_SOURCE,
    CHILD_EVENT_TYPE,
    EVENT_RECEIVED,
)
from kenning.core.records import FoldedWrites, StoredEvent, SuspendOutcome
from kenning.db import Executor, statement
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS, suspend_as
from kenning.storage.inbox import stored_event
from kenning.storage.names import notify

_SUBSCRIPTION_REGISTER_AND_SUSPEND = statement(
    f"""
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, {suspend_as("waiting_for_event")}, registered AS (
        INSERT INTO kenning_event_subscriptions
            (instance_id, step_id, step_name, event_type, match, since, timeout_at)
        SELECT id, :step_id, :step_name, :event_type, CAST(:match AS jsonb),
               coalesce(CAST(:since_at AS timestamptz),
                        now() - make_interval(secs => CAST(:since_seconds AS float8))),
               now() + make_interval(secs => CAST(:timeout_seconds AS float8))
        FROM suspended
        RETURNING timeout_at
    )
    SELECT fence.cancel_requested,
           (SELECT {notify(CHANNEL_TIMERS)} FROM registered WHERE timeout_at IS NOT NULL)
               AS notified_timers,
           (SELECT {notify(CHANNEL_SUBSCRIPTIONS)} FROM registered) AS notified_subscriptions
    FROM fence
    """
)


async def subscription_register_and_suspend(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    event_type: str,
    match: dict[str, Any] | None,
    since_at: datetime | None,
    since_seconds: float | None,
    timeout_seconds: float | None,
    folded: FoldedWrites | None = None,
) -> SuspendOutcome:
    """Subscribe to ``event_type`` (optionally only events whose data matches ``match``,
    and also those received since ``since_*``), time out after ``timeout_seconds`` on the
    database clock, and release the lease, in one fenced statement."""
    row = (
        await conn.execute(
            _SUBSCRIPTION_REGISTER_AND_SUSPEND,
            {
                "id": instance_id,
                "token": token,
                "step_id": step_id,
                "step_name": step_name,
                "event_type": event_type,
                "match": json.dumps(match) if match is not None else None,
                "since_at": since_at,
                "since_seconds": since_seconds,
                "timeout_seconds": timeout_seconds,
                **(folded or FoldedWrites()).params(),
            },
        )
    ).first()
    if row is None:
        return SuspendOutcome.LEASE_LOST
    return SuspendOutcome.CANCELLED if row.cancel_requested else SuspendOutcome.SUSPENDED


# ------------------------------------------------------------------ delivery
#
# A subscription takes an event of its type when the event was received at or after
# coalesce(since, created_at), its data contains ``match`` (any data when match is NULL),
# the event is addressed to no instance or to this one, and this instance has not recorded
# the same (source, id) yet. Delivery locks the subscription and the instance with NOWAIT:
# a row held by a concurrent delivery, timeout or cancel raises LockNotAvailable, and the
# caller retries the event shortly instead of waiting (no deadlocks, nothing skipped).

_DELIVER_TAIL = f"""
    locked AS (
        SELECT i.id FROM kenning_instances AS i JOIN chosen ON chosen.instance_id = i.id
        WHERE i.status = 'waiting_for_event'
        FOR UPDATE OF i NOWAIT
    ), woken AS (
        UPDATE kenning_instances AS i
        SET status = 'pending', available_at = now(), updated_at = now(),
            -- the event's trace goes on from here; origin: the trace the instance started in
            trace_context = CASE WHEN CAST(:trace AS jsonb) IS NULL THEN i.trace_context
                                 ELSE CAST(:trace AS jsonb) || jsonb_strip_nulls(jsonb_build_object('origin',
                                      coalesce(i.trace_context -> 'origin', i.trace_context -> 'traceparent'))) END
        FROM locked
        WHERE i.id = locked.id
        RETURNING i.id, i.workflow_name
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload, payload_bytes)
        SELECT chosen.instance_id, chosen.step_id, '{EVENT_RECEIVED}', chosen.step_name,
               CAST(:payload AS jsonb), :payload_bytes
        FROM chosen JOIN woken ON woken.id = chosen.instance_id
        ON CONFLICT DO NOTHING
        RETURNING instance_id, step_id
    ), unsubscribed AS (
        DELETE FROM kenning_event_subscriptions AS s USING woken WHERE s.instance_id = woken.id
        RETURNING s.instance_id
    )
    SELECT woken.id AS instance_id, woken.workflow_name, recorded.step_id,
           {notify(CHANNEL_INSTANCES)} AS notified
    FROM woken JOIN recorded ON recorded.instance_id = woken.id
"""

_SUBSCRIPTION_DELIVER_EVENT = statement(
    f"""
    WITH candidates AS (
        SELECT s.instance_id, s.step_id, s.step_name, s.created_at
        FROM kenning_event_subscriptions AS s
        WHERE s.event_type = :event_type
          AND (CAST(:target AS text) IS NULL OR s.instance_id = CAST(:target AS text))
          AND (s.match IS NULL OR CAST(:data AS jsonb) @> s.match)
          AND CAST(:received_at AS timestamptz) >= coalesce(s.since, s.created_at)
          AND NOT EXISTS (
              SELECT 1 FROM kenning_history AS h
              WHERE h.instance_id = s.instance_id AND h.kind = '{EVENT_RECEIVED}'
                AND h.payload ->> 'source' = :source AND h.payload ->> 'id' = :event_id)
        FOR UPDATE OF s NOWAIT
    ), chosen AS (
        SELECT DISTINCT ON (instance_id) instance_id, step_id, step_name
        FROM candidates
        ORDER BY instance_id, created_at, step_id
    ),"""
    + _DELIVER_TAIL
)


@dataclass(frozen=True)
class Delivery:
    instance_id: str
    workflow_name: str
    step_id: str


def _delivery(row: Any) -> Delivery:
    """A row of ``_DELIVER_TAIL``."""
    return Delivery(instance_id=row.instance_id, workflow_name=row.workflow_name, step_id=row.step_id)


async def subscription_deliver_event(
    conn: Executor,
    *,
    event_type: str,
    source: str,
    event_id: str,
    received_at: datetime,
    data: Any,
    target_instance_id: str | None,
    payload: dict[str, Any],
    payload_bytes: bytes | None,
    trace: dict[str, str] | None = None,
) -> list[Delivery]:
    """Deliver one event to every subscription that takes it, in the caller's transaction:
    record ``EventReceived`` (``payload``) at the subscription's step, delete the
    instance's subscriptions and make it runnable, waking workers (docs/architecture.md invariant 3).

    ``data`` is the event's JSON data for ``match`` (None for binary data); ``trace``: the
    delivery's trace context (kenning.observability.tracing), which the woken instance continues.
    Raises ``LockNotAvailable`` (wrapped by SQLAlchemy) if a subscription or instance it
    needs is locked by another transaction."""
    result = await conn.execute(
        _SUBSCRIPTION_DELIVER_EVENT,
        {
            "event_type": event_type,
            "target": target_instance_id,
            "data": json.dumps(data) if data is not None else None,
            "received_at": received_at,
            "source": source,
            "event_id": event_id,
            "payload": json.dumps(payload),
            "payload_bytes": payload_bytes,
            "trace": None if trace is None else json.dumps(trace),
        },
    )
    return [_delivery(row) for row in result]


# A subscription takes inbox row x (the rules above the delivery's statements). Data the
# writer sealed (kenning.codecs: an object with the envelope's key) or offloaded (a
# reference to the object store, kenning.objects.offload) cannot be looked into here: such
# a row is a candidate, and the worker tests ``match`` on the opened data
# (kenning.events.data_contains), going on to the next candidate if it does not hold.
# kenning.events.opaque_to_sql is the same test in Python.
SEALED_DATA = "((x.data ->> '$enc') IS NOT NULL OR (x.data ->> '$ref') IS NOT NULL)"
_TAKES = f"""x.event_type = fresh.event_type AND x.status <> 'failed'
          AND x.received_at >= coalesce(fresh.since, fresh.created_at)
          AND (x.instance_id IS NULL OR x.instance_id = fresh.instance_id)
          AND (fresh.match IS NULL OR x.data @> fresh.match OR {SEALED_DATA})
          AND NOT EXISTS (
              SELECT 1 FROM kenning_history AS h
              WHERE h.instance_id = fresh.instance_id AND h.kind = '{EVENT_RECEIVED}'
                AND h.payload ->> 'source' = x.source AND h.payload ->> 'id' = x.event_id)"""
# A parent's wait for a child's end (kenning.storage.children.child_wait_or_suspend); it
# reads only the subscription's columns, so the planner applies it before either scan.
_IS_CHILD_WAIT = f"(fresh.event_type = '{CHILD_EVENT_TYPE}' AND fresh.match ->> 'child_id' IS NOT NULL)"

_SUBSCRIPTION_CLAIM_UNCHECKED = statement(
    f"""
    WITH fresh AS (
        SELECT instance_id, step_id, event_type, match, since, created_at
        FROM kenning_event_subscriptions
        WHERE checked_at IS NULL
        ORDER BY created_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    -- the event's columns are named as in inbox.stored_event; the subscription's are renamed
    -- (the event has an instance_id of its own: the instance it is addressed to)
    SELECT fresh.instance_id AS subscription_instance_id, fresh.step_id AS subscription_step_id,
           fresh.match AS subscription_match, e.id AS inbox_id, e.source, e.event_id, e.event_type,
           e.instance_id, e.attributes, e.data, e.data_bytes, e.received_at
    FROM fresh
    LEFT JOIN LATERAL (
        -- a parent waiting for a child (since -infinity): the child's end is one inbox row,
        -- found by the unique key (kind, source, event_id), not by a walk over every
        -- child's end in the inbox (291 ms with 300,000 of them)
        SELECT x.* FROM kenning_inbox AS x
        WHERE {_IS_CHILD_WAIT}
          AND x.kind = 'event' AND x.source = '{CHILD_EVENT_SOURCE}' AND x.event_id = fresh.match ->> 'child_id'
          AND {_TAKES}
        UNION ALL
        (SELECT x.* FROM kenning_inbox AS x
         WHERE NOT {_IS_CHILD_WAIT}
           AND x.kind = 'event' AND x.event_type = fresh.event_type AND {_TAKES}
         ORDER BY x.received_at, x.id
         LIMIT 1)
    ) AS e ON true
    """
)


@dataclass(frozen=True)
class UncheckedSubscription:
    instance_id: str
    step_id: str
    event: StoredEvent | None  # the oldest inbox event it takes, if any (sealed data: may take)
    match: Any = None  # its wait_event(match=...), to test on sealed data


async def subscription_claim_unchecked(conn: Executor, *, limit: int) -> list[UncheckedSubscription]:
    """Lock up to ``limit`` subscriptions no worker has checked yet (``SKIP LOCKED``),
    each with the oldest event already in the inbox (pending or processed) that it takes.

    This covers events received in the ``since`` window before the workflow subscribed,
    and the race where an event was processed while the subscription was not yet
    committed."""
    result = await conn.execute(_SUBSCRIPTION_CLAIM_UNCHECKED, {"limit": limit})
    return [
        UncheckedSubscription(
            instance_id=row.subscription_instance_id,
            step_id=row.subscription_step_id,
            event=None if row.inbox_id is None else stored_event(row),
            match=row.subscription_match,
        )
        for row in result
    ]


_SUBSCRIPTION_CANDIDATES_AFTER = statement(
    f"""
    WITH fresh AS (
        SELECT instance_id, step_id, event_type, match, since, created_at
        FROM kenning_event_subscriptions
        WHERE instance_id = :instance_id AND step_id = :step_id
    )
    SELECT x.id AS inbox_id, x.source, x.event_id, x.event_type, x.instance_id, x.attributes, x.data,
           x.data_bytes, x.received_at
    FROM fresh JOIN kenning_inbox AS x
      ON x.kind = 'event' AND {_TAKES}
         AND (x.received_at, x.id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
    ORDER BY x.received_at, x.id
    LIMIT :limit
    """
)


async def subscription_candidates_after(
    conn: Executor, *, instance_id: str, step_id: str, after: StoredEvent, limit: int
) -> list[StoredEvent]:
    """The inbox events after ``after`` (in ``subscription_claim_unchecked``'s order) that a
    subscription may take: those whose plain data matches, and those whose data is sealed,
    for the caller to test. Read in the transaction that locked the subscription."""
    params = {
        "instance_id": instance_id,
        "step_id": step_id,
        "after_at": after.received_at,
        "after_id": after.inbox_id,
        "limit": limit,
    }
    return [stored_event(row) for row in await conn.execute(_SUBSCRIPTION_CANDIDATES_AFTER, params)]


_SUBSCRIPTION_DELIVER_TO = statement(
    """
    WITH chosen AS (
        SELECT instance_id, step_id, step_name FROM kenning_event_subscriptions
        WHERE instance_id = :instance_id AND step_id = :step_id
        FOR UPDATE NOWAIT
    ),"""
    + _DELIVER_TAIL
)


async def subscription_deliver_to(
    conn: Executor,
    *,
    instance_id: str,
    step_id: str,
    payload: dict[str, Any],
    payload_bytes: bytes | None,
    trace: dict[str, str] | None = None,
) -> Delivery | None:
    """Deliver an event (``payload``) to one subscription, as ``subscription_deliver_event``
    does; None if the subscription or its waiting instance is gone."""
    row = (
        await conn.execute(
            _SUBSCRIPTION_DELIVER_TO,
            {
                "instance_id": instance_id,
                "step_id": step_id,
                "payload": json.dumps(payload),
                "payload_bytes": payload_bytes,
                "trace": None if trace is None else json.dumps(trace),
            },
        )
    ).first()
    return None if row is None else _delivery(row)


_SUBSCRIPTION_MARK_CHECKED = statement(
    """
    UPDATE kenning_event_subscriptions AS s SET checked_at = now()
    FROM unnest(CAST(:instance_ids AS text[]), CAST(:step_ids AS text[])) AS k(instance_id, step_id)
    WHERE s.instance_id = k.instance_id AND s.step_id = k.step_id
    """
)


async def subscription_mark_checked(conn: Executor, keys: Sequence[tuple[str, str]]) -> None:
    """Record that these subscriptions found no earlier event: from now on only events
    processed after them can satisfy them, which the normal delivery does."""
    if keys:
        await conn.execute(
            _SUBSCRIPTION_MARK_CHECKED, {"instance_ids": [k[0] for k in keys], "step_ids": [k[1] for k in keys]}
        )
