"""SQL for child workflows (``kenning.children``): a parent starts a child, waits for its
end, and is told of it; a parent's end cancels the children it leaves unfinished.

- **Start.** The child's row and the parent's ``ChildStarted`` step are one fenced
  statement (``child_start_and_record``): a crash before its commit starts no child, and
  a replay after it reads the child's id back, so one step starts exactly one child.
- **Wait.** ``child_wait_or_suspend`` takes a child that has ended at once (its outcome
  recorded as the parent's ``EventReceived``); else it subscribes the parent to the
  child's end and releases the lease, in one fenced statement.
- **Wake.** Every statement that ends instances carries ``tell_parents``: for an ended
  child it inserts an inbox event (``CHILD_EVENT_TYPE``, addressed to the parent, the
  child's outcome as data) and wakes the inbox processor in the same transaction, which
  delivers it through the subscription like any CloudEvent (docs/architecture.md
  invariant 3): no row of another instance is locked by the finishing statement, so a
  group commit ending a child never waits for, or deadlocks with, its parent's writes.
  For an ended parent it inserts a cancellation request for each unfinished child whose
  policy is ``cancel``. The event is inserted whether or not the parent waits for that
  child now (reading that would lock or race the parent's rows); one that reaches no
  waiting parent is not "no receiver" (the worker's inbox loop leaves it unmarked): the
  parent takes the child's end from its row when it comes to wait.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kenning import codecs
from kenning.core.names import (
    CHANNEL_INBOX,
    CHANNEL_INSTANCES,
    CHANNEL_SUBSCRIPTIONS,
    CHILD_EVENT_SOURCE,
    CHILD_EVENT_TYPE,
    CHILD_STARTED,
    EVENT_RECEIVED,
)
from kenning.core.records import FoldedWrites
from kenning.db import Executor, statement
from kenning.objects import payloads
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS, suspend_as
from kenning.storage.inbox import CANCEL_TYPE
from kenning.storage.names import notify
from kenning.storage.published import search_texts, start_attributes
from kenning.storage.queue_rows import QUEUE_ROWS, QUEUES_NOTIFIED, QUEUES_UNSEEN, queues_name
from kenning.storage.streams import close_ended_streams

if TYPE_CHECKING:
    from kenning.core.records import NewInstance  # instances imports this module's fragments

# The source of the cancellation requests a parent's end sends its children.
PARENT_CANCEL_SOURCE = "kenning.parent"
TERMINAL = "('completed', 'failed', 'cancelled')"  # an ended instance's statuses, as SQL


def sealed_input(instance_id: str, input_json: Any) -> Any:
    """An instance's input as its row keeps it; a large one goes to the object store
    under the instance's own objects (retention deletes them with it)."""
    with payloads.owned_by(instance_id):
        return codecs.seal(input_json)


def parent_end_cancels(children: str) -> str:
    """SQL: what a parent's end does to its unfinished ``on_parent_cancel='cancel'``
    children, a cancellation request in the inbox for each; ``children`` is a FROM item of
    child rows (``id``, ``on_parent_cancel``, ``status``) aliased ``c``."""
    return f"""INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id)
        SELECT 'cancel', '{PARENT_CANCEL_SOURCE}', CAST(gen_random_uuid() AS text), '{CANCEL_TYPE}', c.id
        FROM {children}
        WHERE c.on_parent_cancel = 'cancel' AND c.status NOT IN {TERMINAL}"""


def _child_data(row: str) -> str:
    """The event data of an ended child (``row`` has id, status, result, error)."""
    return (
        f"jsonb_build_object('child_id', {row}.id, 'status', {row}.status, "
        f"'result', {row}.result -> 'result', 'error', {row}.error)"
    )


def tell_parents(finished: str) -> str:
    """Two CTEs for a statement that ends instances; ``finished`` is its CTE of the ended
    rows with ``id, parent_id, status, result, error`` as they now are (a CTE's own
    update is not visible to the rest of the statement, so they come from its RETURNING).
    Read ``TOLD`` in the statement's main query. The ended instances' open streams
    are closed with them (``streams.close_ended_streams``): every end goes through here."""
    return f"""{close_ended_streams(finished)}, parents_told AS (
        INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id, data)
        SELECT 'event', '{CHILD_EVENT_SOURCE}', f.id, '{CHILD_EVENT_TYPE}', f.parent_id, {_child_data("f")}
        FROM {finished} AS f
        WHERE f.parent_id IS NOT NULL
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), orphans_cancelled AS (
        -- the parent index: one probe per ended instance, empty for nearly all
        {parent_end_cancels(f"{finished} AS f JOIN kenning_instances AS c ON c.parent_id = f.id")}
        RETURNING 1
    )"""


# The main query's column that wakes the inbox processor when ``tell_parents`` wrote rows.
TOLD = f"""(SELECT {notify(CHANNEL_INBOX)} FROM (
        SELECT 1 FROM parents_told UNION ALL SELECT 1 FROM orphans_cancelled LIMIT 1) AS t) AS inbox_notified"""


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


_CHILD_START_AND_RECORD = statement(
    f"""
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, inserted AS (
        INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, trace_context,
                                       parent_id, parent_step, on_parent_cancel, queue_name, partition_key, priority,
                                       deadline_at, pinned_version)
        SELECT :child_id, :workflow, :hash, CAST(:input AS jsonb), now(), CAST(:trace AS jsonb),
               fence.id, :step_id, :policy,
               -- in its workflow's queue as any start (instances._INSTANCES_INSERT): the queue's claim takes it
               CAST(:queue AS text), CASE WHEN CAST(:queue AS text) IS NOT NULL THEN coalesce(:partition, '') END,
               :priority,
               -- its own workflow timeout, from its start (instances._INSTANCES_INSERT's rule)
               now() + make_interval(secs => CAST(:timeout AS float8)),
               -- a pinned child of a pinned parent runs on its parent's version; any other
               -- pinned child is pinned by its first claim (docs/operations.md#version-pinning)
               CASE WHEN CAST(:pinned AS boolean)
                    THEN (SELECT p.pinned_version FROM kenning_instances AS p WHERE p.id = fence.id) END
        FROM fence WHERE NOT fence.cancel_requested
        ON CONFLICT DO NOTHING
        RETURNING id, queue_name, created_at
    ), child_attributed AS (
        SELECT id, CAST(:attributes AS jsonb) AS attributes, CAST(:search AS jsonb) AS search, created_at
        FROM inserted
    ), {start_attributes("child_attributed")}, named AS (
        -- its queue's row as any start keeps it (storage/queue_rows.py)
        SELECT queue_name AS queue, ARRAY[CAST(:workflow AS text)] AS names FROM inserted WHERE queue_name IS NOT NULL
    ), {QUEUE_ROWS}, existing AS (
        -- an explicit child id met an instance: this parent's child again, or someone else's
        SELECT parent_id FROM kenning_instances WHERE id = :child_id
    ), recorded AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT fence.id, :step_id, '{CHILD_STARTED}', :step_name, CAST(:payload AS jsonb)
        FROM fence
        WHERE NOT fence.cancel_requested
          AND (EXISTS (SELECT FROM inserted)
               OR EXISTS (SELECT FROM existing WHERE existing.parent_id = fence.id))
          -- read first, the held-back step is inserted first: history's seq keeps the
          -- order the steps ran in (an unread CTE runs after the main query)
          AND (SELECT count(*) FROM pending_step) >= 0
        RETURNING 1
    )
    SELECT fence.cancel_requested, EXISTS (SELECT FROM recorded) AS recorded,
           (SELECT parent_id FROM existing) AS existing_parent,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM inserted) AS notified,
           {QUEUES_NOTIFIED},
           {QUEUES_UNSEEN}
    FROM fence
    """
)


@dataclass(frozen=True)
class ChildStartOutcome:
    """What ``child_start_and_record`` did; None from it: the lease was lost."""

    cancel_requested: bool  # nothing was written
    recorded: bool  # the step is recorded: the child was started, or was this parent's already
    # the instance an explicit id met when it is not this parent's child ('' for a top-level one)
    taken_by: str | None


async def child_start_and_record(
    conn: Executor,
    *,
    parent_id: str,
    token: str,
    step_id: str,
    step_name: str,
    child: NewInstance,
    on_parent_cancel: str,
    pinned: bool = False,
    folded: FoldedWrites | None = None,
) -> ChildStartOutcome | None:
    """Insert ``child`` as a child of the leased ``parent_id`` (in its queue, if it names
    one) and record the parent's ``ChildStarted`` step naming it, in one fenced statement
    with what ``folded`` holds; nothing when cancellation was requested."""
    row = (
        await conn.execute(
            _CHILD_START_AND_RECORD,
            {
                "id": parent_id,
                "token": token,
                "child_id": child.instance_id,
                "workflow": child.workflow_name,
                "hash": child.source_hash,
                "input": json.dumps(sealed_input(child.instance_id, child.input_json)),
                "trace": None if child.trace_context is None else json.dumps(child.trace_context),
                "step_id": step_id,
                "step_name": step_name,
                "policy": on_parent_cancel,
                "queue": child.queue_name,
                "partition": child.partition_key,
                "priority": child.priority,
                "timeout": child.timeout_seconds,
                "pinned": pinned,
                "attributes": _json_or_none(child.search_attributes),
                "search": _json_or_none(search_texts(child.search_attributes)),
                "payload": json.dumps({"child_id": child.instance_id, "workflow": child.workflow_name}),
                **(folded or FoldedWrites()).params(),
            },
        )
    ).first()
    if row is None:
        return None
    if row.queues_unseen and child.queue_name is not None:
        await queues_name(conn, [(child.queue_name, child.workflow_name)])
    existing = row.existing_parent
    taken_by = None if row.recorded or row.cancel_requested else ("" if existing is None else str(existing))
    return ChildStartOutcome(bool(row.cancel_requested), bool(row.recorded), taken_by)


# The EventReceived payload of a child's end, as the inbox delivery would record it
# (kenning.events.event_history_payload of the CHILD_EVENT_TYPE event).
_ENDED_PAYLOAD = f"""jsonb_build_object(
        'type', '{CHILD_EVENT_TYPE}', 'source', '{CHILD_EVENT_SOURCE}', 'id', child.id, 'time', NULL,
        'datacontenttype', NULL, 'subject', NULL, 'extensions', CAST('{{}}' AS jsonb),
        'data', {_child_data("child")})"""

_CHILD_WAIT_OR_SUSPEND = statement(
    f"""
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, child AS (
        SELECT c.id, c.status, c.result, c.error FROM kenning_instances AS c
        WHERE c.id = :child_id AND c.status IN {TERMINAL}
    ), taken AS (
        INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload)
        SELECT fence.id, :step_id, '{EVENT_RECEIVED}', :step_name, {_ENDED_PAYLOAD}
        FROM fence, child WHERE NOT fence.cancel_requested
        ON CONFLICT DO NOTHING
        RETURNING payload
    ), unsubscribed AS (
        -- a subscription of this step left by an earlier run (the stuck check's repair)
        DELETE FROM kenning_event_subscriptions AS s USING fence, child
        WHERE s.instance_id = fence.id AND s.step_id = :step_id AND NOT fence.cancel_requested
        RETURNING 1
    ), {suspend_as("waiting_for_event", unless="child")}, registered AS (
        INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, match, since)
        SELECT id, :step_id, :step_name, '{CHILD_EVENT_TYPE}', jsonb_build_object('child_id', CAST(:child_id AS text)),
               CAST('-infinity' AS timestamptz)
        FROM suspended
        ON CONFLICT (instance_id, step_id) DO UPDATE
            SET checked_at = NULL, created_at = now(), match = EXCLUDED.match, since = EXCLUDED.since
        RETURNING 1
    )
    SELECT fence.cancel_requested, (SELECT {_ENDED_PAYLOAD} FROM child) AS payload,
           (SELECT {notify(CHANNEL_SUBSCRIPTIONS)} FROM registered) AS notified
    FROM fence
    """
)


@dataclass(frozen=True)
class ChildWait:
    """What ``child_wait_or_suspend`` did; None from it: the lease was lost."""

    cancel_requested: bool  # nothing was written, the lease is kept
    ended: dict[str, Any] | None  # the child had ended: the EventReceived payload recorded, lease kept


async def child_wait_or_suspend(
    conn: Executor,
    *,
    instance_id: str,
    token: str,
    step_id: str,
    step_name: str,
    child_id: str,
    folded: FoldedWrites | None = None,
) -> ChildWait | None:
    """Record the end of ``child_id`` at ``step_id`` if it has ended; else subscribe to it
    and release the lease (``suspend_as`` checks the cancellation flag): one statement."""
    row = (
        await conn.execute(
            _CHILD_WAIT_OR_SUSPEND,
            {
                "id": instance_id,
                "token": token,
                "step_id": step_id,
                "step_name": step_name,
                "child_id": child_id,
                **(folded or FoldedWrites()).params(),
            },
        )
    ).first()
    if row is None:
        return None
    if row.cancel_requested:
        return ChildWait(True, None)
    return ChildWait(False, row.payload)


_CHILDREN_OF = statement(
    """
    SELECT id, workflow_name, status, parent_step, on_parent_cancel, created_at, finished_at
    FROM kenning_instances WHERE parent_id = :id
    ORDER BY created_at, id
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class ChildRow:
    id: str
    workflow_name: str
    status: str
    parent_step: str | None
    on_parent_cancel: str | None


async def children_of(conn: Executor, parent_id: str, *, limit: int = 1000) -> list[ChildRow]:
    """A parent's children, oldest first (``kenning instances show``)."""
    result = await conn.execute(_CHILDREN_OF, {"id": parent_id, "limit": limit})
    return [ChildRow(r.id, r.workflow_name, r.status, r.parent_step, r.on_parent_cancel) for r in result]


_PARENT_OF = statement("SELECT parent_id, parent_step, on_parent_cancel FROM kenning_instances WHERE id = :id")


async def parent_of(conn: Executor, instance_id: str) -> tuple[str, str | None, str | None] | None:
    """(parent id, its step, the policy) of a child; None for a top-level or unknown instance."""
    row = (await conn.execute(_PARENT_OF, {"id": instance_id})).first()
    if row is None or row.parent_id is None:
        return None
    return str(row.parent_id), row.parent_step, row.on_parent_cancel
