"""SQL for flow control per key (kenning/flow.py): debounced bursts and event batches.

A burst or batch is an ordinary instance row, ``pending`` with its run-after time
(``available_at``) at the burst's due time, plus a ``kenning_bursts`` row naming its
workflow, key and what was folded into it. A start or event joins the key's newest burst
while its instance is still unclaimed and not yet due (``status = 'pending'``, never run,
``available_at > now()``), under the key's advisory lock (``flow_lock``, one statement
before the join, so the join's snapshot sees every burst committed before the lock was
taken) and the instance row's lock (the claim skips a row the join holds; a join that
waits for a claim finds the row ``running`` and opens a new burst). Else it opens a new
one: ``instances_start`` with the burst's delay, and ``burst_open``. All of it commits
in the start's transaction (a client's, or the inbox row's), so an accepted start or
event is in exactly one instance (docs/workflows.md, "Flow control").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import CHANNEL_INSTANCES
from kenning.db import Executor, statement
from kenning.objects import payloads
from kenning.storage.names import notify

DEBOUNCE = "debounce"
BATCH = "batch"
BATCH_INPUT_KEY = "events"  # kenning.flow.BATCH_PARAMETER: the batch workflow's input, its events

# The advisory locks' key space (two int4 keys, as the mailboxes' "KMSG")
_FLOW_LOCKS = 0x4B464C57  # "KFLW"

_FLOW_LOCK = statement(
    f"SELECT pg_advisory_xact_lock({_FLOW_LOCKS}, hashtext(:name || chr(1) || :key)) IS NULL AS locked"
)


async def flow_lock(conn: Executor, workflow_name: str, key: str) -> None:
    """Hold the key's lock to the end of the transaction: its starts join or open one at a time."""
    await conn.execute(_FLOW_LOCK, {"name": workflow_name, "key": key})


_NEWEST_BURST = """burst AS (
        SELECT instance_id, folded, max_size, seqs, opened_at FROM kenning_bursts
        WHERE workflow_name = :name AND flow_key = :key AND kind = :kind
        ORDER BY opened_at DESC LIMIT 1
    )"""
_OPEN = "i.status = 'pending' AND i.run_count = 0 AND NOT i.cancel_requested AND i.available_at > now()"

# The new input is sealed like every input (encrypted, or offloaded when large) under the
# burst instance's objects, so the burst is found first (its instance row locked), then joined.
_DEBOUNCE_PLACE = statement(
    f"""
    WITH {_NEWEST_BURST}
    SELECT i.id FROM burst AS b JOIN kenning_instances AS i ON i.id = b.instance_id
    WHERE {_OPEN}
    FOR UPDATE OF i
    """
)

_DEBOUNCE_JOIN = statement(
    f"""
    WITH {_NEWEST_BURST}, joined AS (
        UPDATE kenning_instances AS i
        SET input = CAST(:input AS jsonb),
            -- quiet for the period from now, but no later than max_wait after the first start
            available_at = CASE WHEN CAST(:max_wait AS float8) IS NULL
                                THEN now() + make_interval(secs => :period)
                                ELSE least(now() + make_interval(secs => :period),
                                           b.opened_at + make_interval(secs => :max_wait)) END
        FROM burst AS b
        WHERE i.id = b.instance_id AND i.id = :id AND {_OPEN}
        RETURNING i.id
    ), counted AS (
        UPDATE kenning_bursts AS f
        SET folded = f.folded + 1, last_at = now(),
            -- an event's start: its inbox id, so every accepted event is accounted for
            seqs = CASE WHEN CAST(:seq AS bigint) IS NULL THEN f.seqs
                        ELSE array_append(coalesce(f.seqs, '{{}}'), CAST(:seq AS bigint)) END
        FROM joined WHERE f.instance_id = joined.id
        RETURNING f.instance_id
    )
    SELECT id FROM joined WHERE EXISTS (SELECT FROM counted)
    """
)


async def debounce_join(
    conn: Executor,
    workflow_name: str,
    key: str,
    input_json: Any,
    period: float,
    max_wait: float | None,
    seq: int | None = None,
) -> str | None:
    """Fold a start into its key's open burst (its input replaces the burst's, its due time
    moves on; ``seq``: an event's inbox id, recorded); the burst's instance id, or None
    when the key has no open burst."""
    found = {"name": workflow_name, "key": key, "kind": DEBOUNCE}
    place = (await conn.execute(_DEBOUNCE_PLACE, found)).first()
    if place is None:
        return None
    with payloads.owned_by(str(place.id)):  # sealed as the burst's first input was
        sealed = codecs.seal(input_json)
    params = {
        **found,
        "id": str(place.id),
        "input": json.dumps(sealed),
        "period": period,
        "max_wait": max_wait,
        "seq": seq,
    }
    row = (await conn.execute(_DEBOUNCE_JOIN, params)).first()
    return None if row is None else str(row.id)


# The batch's input is sealed like every input (kenning.codecs: encrypted, or a reference
# to the object store when large), so SQL cannot add the event to it: the open batch is
# found and its instance row locked here, the caller's process opens the input, adds the
# event at its place and seals it again, and _BATCH_APPEND writes it.
_BATCH_PLACE = statement(
    f"""
    WITH {_NEWEST_BURST}
    SELECT i.id, i.input, b.folded + 1 >= b.max_size AS full,
           -- the event's place among the batch's: arrival (inbox) order, whichever worker came first
           (SELECT count(*) FROM unnest(b.seqs) AS s WHERE s < :seq) AS position
    FROM burst AS b JOIN kenning_instances AS i ON i.id = b.instance_id
    WHERE b.folded < b.max_size AND {_OPEN}
    FOR UPDATE OF i
    """
)

_BATCH_APPEND = statement(
    f"""
    WITH appended AS (
        UPDATE kenning_instances AS i
        SET input = CAST(:input AS jsonb),
            available_at = CASE WHEN :full THEN now() ELSE i.available_at END
        WHERE i.id = :id
        RETURNING i.id
    ), counted AS (
        UPDATE kenning_bursts AS f
        SET folded = f.folded + 1, last_at = now(), seqs = array_append(f.seqs, CAST(:seq AS bigint))
        FROM appended WHERE f.instance_id = appended.id
        RETURNING f.instance_id
    )
    SELECT a.id, CASE WHEN :full THEN {notify(CHANNEL_INSTANCES)} END AS notified
    FROM appended AS a WHERE EXISTS (SELECT FROM counted)
    """
)


async def batch_append(conn: Executor, workflow_name: str, key: str, seq: int, event: Any) -> str | None:
    """Add an event to its key's open batch (in arrival order; a batch now full is due at
    once, and wakes the workers); the batch's instance id, or None when none is open.
    Under the key's lock (``flow_lock``), in one transaction: the place, then the write."""
    params = {"name": workflow_name, "key": key, "kind": BATCH, "seq": seq}
    place = (await conn.execute(_BATCH_PLACE, params)).first()
    if place is None:
        return None
    instance_id = str(place.id)
    inputs = codecs.unseal(place.input)  # the batch so far (read back from the store if large)
    events = list(inputs.get(BATCH_INPUT_KEY) or [])
    events.insert(int(place.position), event)
    with payloads.owned_by(instance_id):  # a large batch lives with its instance's objects
        sealed = codecs.seal({**inputs, BATCH_INPUT_KEY: events})
    written = {"id": instance_id, "input": json.dumps(sealed), "full": bool(place.full), "seq": seq}
    row = (await conn.execute(_BATCH_APPEND, written)).first()
    return None if row is None else str(row.id)


_BURST_OPEN = statement(
    """
    INSERT INTO kenning_bursts (instance_id, kind, workflow_name, flow_key, period_seconds, max_wait_seconds,
                                max_size, seqs)
    VALUES (:id, :kind, :name, :key, :period, :max_wait, :max_size, CAST(:seqs AS bigint[]))
    """
)


async def burst_open(
    conn: Executor,
    *,
    instance_id: str,
    kind: str,
    workflow_name: str,
    key: str,
    period: float | None = None,
    max_wait: float | None = None,
    max_size: int | None = None,
    seq: int | None = None,
) -> None:
    """Record the burst (or batch) whose first start just inserted ``instance_id``."""
    params = {
        "id": instance_id,
        "kind": kind,
        "name": workflow_name,
        "key": key,
        "period": period,
        "max_wait": max_wait,
        "max_size": max_size,
        "seqs": None if seq is None else [seq],
    }
    await conn.execute(_BURST_OPEN, params)


@dataclass(frozen=True)
class Burst:
    """What an instance's burst or batch holds, for ``kenning why`` and the console."""

    kind: str  # DEBOUNCE or BATCH
    key: str
    folded: int  # starts or events folded into it
    opened_at: datetime
    last_at: datetime
    period_seconds: float | None
    max_wait_seconds: float | None
    max_size: int | None
    due_at: datetime  # when it runs unless another start moves it (the instance's run-after time)
    open: bool  # still taking starts or events


_BURST_GET = statement(
    """
    SELECT b.kind, b.flow_key, b.folded, b.opened_at, b.last_at, b.period_seconds, b.max_wait_seconds,
           b.max_size, i.available_at AS due_at,
           (i.status = 'pending' AND i.run_count = 0 AND NOT i.cancel_requested AND i.available_at > now()
            AND (b.max_size IS NULL OR b.folded < b.max_size)) AS open
    FROM kenning_bursts AS b JOIN kenning_instances AS i ON i.id = b.instance_id
    WHERE b.instance_id = :id
    """
)


async def burst_get(conn: Executor, instance_id: str) -> Burst | None:
    row = (await conn.execute(_BURST_GET, {"id": instance_id})).first()
    if row is None:
        return None
    return Burst(
        kind=row.kind,
        key=row.flow_key,
        folded=row.folded,
        opened_at=row.opened_at,
        last_at=row.last_at,
        period_seconds=row.period_seconds,
        max_wait_seconds=row.max_wait_seconds,
        max_size=row.max_size,
        due_at=row.due_at,
        open=bool(row.open),
    )
