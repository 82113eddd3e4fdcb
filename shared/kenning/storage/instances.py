"""SQL for workflow definitions and instances: start, claim, lease, finish, cancel.

Every write by a worker is fenced: it names the lease token it was given at claim time,
and a statement that matches zero rows means the lease was lost (docs/architecture.md invariant 1).
The database clock is the only clock; ``now`` parameters exist so tests can move time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kenning.core.names import (
    ACTIVITY_FAILED,
    CHANNEL_INSTANCES,
    COMPENSATION_EXECUTED,
    COMPENSATION_FAILED,
    EVENT_TIMEOUT,
)
from kenning.core.records import FoldedWrites, InstanceRow, NewInstance, StartOutcome
from kenning.db import Executor, statement
from kenning.storage import strategies as strategies_sql
from kenning.storage.children import TOLD, sealed_input, tell_parents
from kenning.storage.claims import CRASH_LOOP
from kenning.storage.fencing import LEASE_FENCE, PENDING_STEP, SAVE_COMPENSATIONS
from kenning.storage.names import notify, notify_results
from kenning.storage.published import search_texts, start_attributes
from kenning.storage.queue_rows import QUEUE_ROWS, QUEUES_NOTIFIED, QUEUES_UNSEEN, queues_name
from kenning.storage.rows import instance_row_columns
from kenning.storage.strategies import KeyStrategy
from kenning.storage.streams import reopen_ended_streams

START_ATTRIBUTES = """attributed AS (
        SELECT s.id, s.attributes, s.search, i.created_at
        FROM incoming AS s
        JOIN first_inserted AS f ON f.position = s.position
        JOIN inserted AS i ON i.id = s.id
        WHERE s.attributes IS NOT NULL
    ), """ + start_attributes("attributed")


# The one insert of new instances: a client's batch of starts, an event's start, a cron tick.
_INSTANCES_INSERT = statement(
    f"""
    WITH incoming AS (
        SELECT * FROM jsonb_to_recordset(CAST(:starts AS jsonb)) AS s(
            position integer, id text, name text, hash text, input jsonb, key text, not_before timestamptz,
            trace jsonb, queue text, partition text, priority integer, timeout double precision,
            attributes jsonb, search jsonb, delay double precision)
    ), keyed AS (
        -- starts into a queue with a partition strategy: unless they are being decided
        -- under their key's lock (:decided), left to that (kenning/storage/strategies.py)
        SELECT s.position FROM incoming AS s
        WHERE NOT CAST(:decided AS boolean)
          AND EXISTS (SELECT FROM kenning_queues AS q WHERE q.name = s.queue AND q.partition_strategy <> 'wait')
    ), admitted AS (
        -- a start with not_before (a cron tick) only if its workflow was first seen by then
        SELECT s.position, s.id, s.name, s.hash, s.input, s.key, s.trace, s.queue, s.partition, s.priority,
               s.timeout, s.delay
        FROM incoming AS s
        WHERE (s.not_before IS NULL
               OR (SELECT min(d.created_at) FROM kenning_workflow_definitions AS d WHERE d.workflow_name = s.name)
                  <= s.not_before)
          AND NOT EXISTS (SELECT FROM keyed AS k WHERE k.position = s.position)
    ), inserted AS (
        INSERT INTO kenning_instances (id, workflow_name, source_hash, input, idempotency_key, available_at,
                                       trace_context, queue_name, partition_key, priority, deadline_at)
        SELECT id, name, hash, input, key, now() + make_interval(secs => coalesce(delay, 0)), trace,
               -- a queued row's partition is '' when it names none: the claim walks keys
               queue, CASE WHEN queue IS NOT NULL THEN coalesce(partition, '') END, coalesce(priority, 0),
               now() + make_interval(secs => timeout)
        FROM admitted ORDER BY position
        ON CONFLICT DO NOTHING
        RETURNING id, created_at
    ), named AS (
        SELECT queue, array_agg(DISTINCT name ORDER BY name) AS names FROM admitted WHERE queue IS NOT NULL
        GROUP BY queue
    ), {QUEUE_ROWS}, first_inserted AS (
        -- two starts of one explicit id in a batch: the first is the one inserted
        SELECT DISTINCT ON (s.id) s.position
        FROM incoming AS s JOIN inserted AS i ON i.id = s.id
        ORDER BY s.id, s.position
    ), {START_ATTRIBUTES}
    -- identical notifications of one transaction reach listeners once: one wake-up per batch
    -- (none when :notify is false: the caller announces the batch later, instances_announce);
    -- queues created or newly naming a workflow at once (storage/queue_rows.py)
    SELECT s.position,
           EXISTS (SELECT FROM first_inserted AS f WHERE f.position = s.position) AS inserted,
           EXISTS (SELECT FROM admitted AS a WHERE a.position = s.position) AS admitted,
           EXISTS (SELECT FROM keyed AS k WHERE k.position = s.position) AS keyed,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM inserted WHERE CAST(:notify AS boolean) LIMIT 1) AS notified,
           {QUEUES_NOTIFIED},
           {QUEUES_UNSEEN}
    FROM incoming AS s
    """
)


async def instances_start(
    conn: Executor,
    starts: Sequence[NewInstance],
    *,
    notify: bool = True,
    decisions: list[tuple[str, str]] | None = None,
) -> list[StartOutcome]:
    """Insert runnable instances in one statement and wake workers once (``notify``
    false: not at all; the caller's ``instances_announce`` does later); the outcome of
    each start (``instance_find_existing`` names the instance an ``EXISTS`` met). Starts
    into queues with a partition strategy are decided in one transaction with their
    key's lock (``kenning/storage/strategies.py``); ``decisions`` gets (queue, strategy)
    for each start over its key's limit that a strategy decided (for the caller's metrics)."""
    if not starts:
        return []
    # One statement for every start (the common case: one round trip); those into a queue
    # with a strategy it leaves out, to be decided under their key's lock.
    outcomes, keyed = await _instances_insert(conn, starts, notify, decided=False)
    if not keyed:
        return outcomes
    pending = [starts[p] for p in keyed]
    pairs = [(s.queue_name, s.partition_key or "") for s in pending if s.queue_name is not None]
    # a savepoint when the caller's transaction is open (an event's start), else BEGIN
    async with conn.driver.transaction():
        strategies = {(k.queue, k.key): k for k in await strategies_sql.keys_lock(conn, pairs)}
        decided = await _instances_start_keyed(conn, pending, strategies, notify, decisions)
    for position, outcome in zip(keyed, decided, strict=True):
        outcomes[position] = outcome
    return outcomes


async def _instances_start_keyed(
    conn: Executor,
    starts: Sequence[NewInstance],
    keyed: dict[tuple[str, str], KeyStrategy],
    notify: bool,
    decisions: list[tuple[str, str]] | None,
) -> list[StartOutcome]:
    """``instances_start`` under the locks of the keys with a strategy, in batch order:
    each start counts the key's open instances and the starts before it in the batch."""

    def strategy_of(start: NewInstance) -> KeyStrategy | None:
        return None if start.queue_name is None else keyed.get((start.queue_name, start.partition_key or ""))

    held = await strategies_sql.keys_open(conn, list(keyed))
    outcomes: list[StartOutcome | None] = [None] * len(starts)
    to_insert: list[int] = []
    singletons: set[tuple[str, str]] = set()  # singleton keys a start of this batch takes
    for position, start in enumerate(starts):
        key = strategy_of(start)
        if key is not None and key.strategy == "singleton":
            if held[(key.queue, key.key)] or (key.queue, key.key) in singletons:
                outcomes[position] = StartOutcome.JOINED
                continue
            singletons.add((key.queue, key.key))
        to_insert.append(position)
    inserted, _ = await _instances_insert(conn, [starts[p] for p in to_insert], notify, decided=True)
    cancel_now: list[str] = []
    cancel_old: list[str] = []
    cancel_old_by: set[str] = set()  # the starts that made cancel_in_progress cancel an older one
    for position, outcome in zip(to_insert, inserted, strict=True):
        outcomes[position] = outcome
        start, key = starts[position], strategy_of(starts[position])
        if key is None or outcome is not StartOutcome.STARTED:
            continue
        open_ids = held[(key.queue, key.key)]
        if key.strategy == "cancel_newest" and len(open_ids) >= key.limit:
            cancel_now.append(start.instance_id)
            outcomes[position] = StartOutcome.CANCELLED
            continue
        while key.strategy == "cancel_in_progress" and len(open_ids) >= key.limit:
            cancel_old.append(open_ids.pop(0))
            cancel_old_by.add(start.instance_id)
        open_ids.append(start.instance_id)
    await strategies_sql.instances_cancel_at_start(conn, cancel_now)
    for instance_id in cancel_old:  # rare (one per start over the limit): one statement each
        await instance_request_cancel(conn, instance_id)
    if decisions is not None:
        for position, decided in enumerate(outcomes):
            key = strategy_of(starts[position])
            if key is not None and (
                decided in (StartOutcome.CANCELLED, StartOutcome.JOINED)
                or (key.strategy == "cancel_in_progress" and starts[position].instance_id in cancel_old_by)
            ):
                decisions.append((key.queue, key.strategy))
    return [StartOutcome.EXISTS if outcome is None else outcome for outcome in outcomes]


async def _instances_insert(
    conn: Executor, starts: Sequence[NewInstance], notify: bool, *, decided: bool
) -> tuple[list[StartOutcome], list[int]]:
    """The insert; with ``decided`` false, starts into a queue with a partition strategy are
    not inserted: their positions are returned, to be decided under their key's lock."""
    if not starts:
        return [], []
    payload = [
        {
            "position": position,
            "id": start.instance_id,
            "name": start.workflow_name,
            "hash": start.source_hash,
            "input": sealed_input(start.instance_id, start.input_json),
            "key": start.idempotency_key,
            "not_before": None if start.not_before is None else start.not_before.isoformat(),
            "trace": start.trace_context,
            "queue": start.queue_name,
            "partition": start.partition_key,
            "priority": start.priority,
            "timeout": start.timeout_seconds,
            "attributes": start.search_attributes,
            "search": search_texts(start.search_attributes),
            "delay": start.delay_seconds,
        }
        for position, start in enumerate(starts)
    ]
    outcomes = [StartOutcome.EXISTS] * len(starts)
    rows = await conn.execute(_INSTANCES_INSERT, {"starts": json.dumps(payload), "notify": notify, "decided": decided})
    keyed = sorted(row.position for row in rows if row.keyed)
    for row in rows:
        if row.keyed:
            continue
        if row.inserted:
            outcomes[row.position] = StartOutcome.STARTED
        elif not row.admitted:
            outcomes[row.position] = StartOutcome.BEFORE_SCHEDULE
    if any(row.queues_unseen for row in rows):
        admitted = [starts[row.position] for row in rows if row.admitted]
        await queues_name(conn, [(s.queue_name, s.workflow_name) for s in admitted if s.queue_name is not None])
    return outcomes, keyed


_INSTANCES_ANNOUNCE = statement(f"SELECT {notify(CHANNEL_INSTANCES)} AS notified")


async def instances_announce(conn: Executor) -> None:
    """Wake the workers for instances inserted without a NOTIFY (``instances_start``
    with ``notify=False``): one statement, one commit, one notification."""
    await conn.execute(_INSTANCES_ANNOUNCE)


async def instances_insert_many(conn: Executor, starts: Sequence[NewInstance]) -> list[bool]:
    """Per start, whether it was inserted (False: its id or idempotency key exists already)."""
    return [outcome is StartOutcome.STARTED for outcome in await instances_start(conn, starts)]


_INSTANCE_FIND_EXISTING = statement(
    """
    SELECT id FROM kenning_instances
    WHERE id = :id OR (workflow_name = :name AND idempotency_key = CAST(:key AS text))
    LIMIT 1
    """
)


async def instance_insert(
    conn: Executor,
    *,
    instance_id: str,
    workflow_name: str,
    source_hash: str,
    input_json: dict[str, Any],
    idempotency_key: str | None,
) -> tuple[str, bool]:
    """Insert a runnable instance and wake workers; ``(id, False)`` if it already existed."""
    start = NewInstance(instance_id, workflow_name, source_hash, input_json, idempotency_key)
    (outcome,) = await instances_start(conn, [start])
    if outcome is StartOutcome.STARTED:
        return instance_id, True
    return await instance_find_existing(conn, instance_id, workflow_name, idempotency_key), False


async def instance_find_existing(
    conn: Executor, instance_id: str, workflow_name: str, idempotency_key: str | None
) -> str:
    """The instance a start conflicted with: same id, or same workflow and idempotency key."""
    params = {"id": instance_id, "name": workflow_name, "key": idempotency_key}
    existing = (await conn.execute(_INSTANCE_FIND_EXISTING, params)).first()
    if existing is None:  # a concurrent insert of the same key has not committed yet
        raise RuntimeError(f"instance {instance_id} conflicts with an uncommitted start")
    return str(existing.id)


# A lease renews only while it has not expired: an expired one is up for any claim (the
# plain claim's takeover, and a queue's claim counts it as holding no slot and may have
# admitted another in its place), so renewing it would let two hold what one may.
_INSTANCE_HEARTBEAT = statement(
    """
    WITH mine AS (
        SELECT id FROM kenning_instances
        WHERE lease_token = ANY(CAST(:tokens AS uuid[])) AND available_at > now()
        FOR UPDATE SKIP LOCKED
    )
    UPDATE kenning_instances AS i
    SET available_at = now() + make_interval(secs => :lease_seconds)
    FROM mine WHERE i.id = mine.id AND i.available_at > now()
    RETURNING CAST(i.lease_token AS text) AS lease_token
    """
)
_INSTANCE_LEASES_HELD = statement(
    "SELECT CAST(lease_token AS text) AS lease_token FROM kenning_instances "
    "WHERE lease_token = ANY(CAST(:tokens AS uuid[])) AND available_at > now()"
)


async def instance_heartbeat(conn: Executor, tokens: Sequence[str], lease_seconds: float) -> set[str]:
    """Extend the leases still held; returns the tokens that are no longer held: taken
    over, released, or expired (an expired lease is not renewed; its run must stop).

    Rows locked by an in-flight step write are skipped rather than waited for: that write
    holds the lease already, and the next heartbeat extends it.
    """
    if not tokens:
        return set()
    renewed = {
        row.lease_token
        for row in await conn.execute(_INSTANCE_HEARTBEAT, {"tokens": list(tokens), "lease_seconds": lease_seconds})
    }
    unconfirmed = [t for t in tokens if t not in renewed]
    if not unconfirmed:
        return set()
    held = {row.lease_token for row in await conn.execute(_INSTANCE_LEASES_HELD, {"tokens": unconfirmed})}
    return {t for t in unconfirmed if t not in held}


_INSTANCE_COMPLETE = statement(
    f"""
    -- the workflow's last step is folded into its completion: one statement, one commit
    WITH {LEASE_FENCE}, {PENDING_STEP}, {SAVE_COMPENSATIONS}, completed AS (
        UPDATE kenning_instances AS i
        SET status = 'completed', result = CAST(:result AS jsonb), lease_token = NULL, lease_owner = NULL,
            available_at = NULL, attempts = '{{}}', finished_at = now(), updated_at = now()
        FROM fence
        WHERE i.id = fence.id AND NOT fence.cancel_requested
        RETURNING i.id, i.parent_id, i.status, i.result, i.error
    ), {tell_parents("completed")}
    SELECT id, {notify_results("completed")} AS results_notified, {TOLD} FROM completed
    """
)


async def instance_complete(
    conn: Executor, instance_id: str, token: str, result: Any, folded: FoldedWrites | None = None
) -> bool:
    """Complete a leased instance, recording its last step in the same statement: the
    single-instance form of ``writes.writes_apply``, which workers use; the benchmark's
    bare engine drives this one. False: the lease was lost, or a cancel came first (then
    the step and compensations are written, the instance is not completed)."""
    params = {"id": instance_id, "token": token, "result": json.dumps(result), **(folded or FoldedWrites()).params()}
    row = (await conn.execute(_INSTANCE_COMPLETE, params)).first()
    return row is not None


_INSTANCE_FINISH = statement(
    f"""
    WITH finished AS (
        UPDATE kenning_instances
        SET status = :status, error = coalesce(CAST(:error AS jsonb), error), lease_token = NULL, lease_owner = NULL,
            available_at = NULL, finished_at = now(), updated_at = now()
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        RETURNING id, parent_id, status, result, error
    ), {tell_parents("finished")}
    SELECT id, {notify_results("finished")} AS results_notified, {TOLD} FROM finished
    """
)


async def instance_finish(
    conn: Executor, instance_id: str, token: str, status: str, error: dict[str, Any] | None
) -> bool:
    """End an instance ``failed`` or ``cancelled``; the error is kept for operators."""
    row = (
        await conn.execute(
            _INSTANCE_FINISH,
            {"id": instance_id, "token": token, "status": status, "error": json.dumps(error) if error else None},
        )
    ).first()
    return row is not None


_INSTANCE_BEGIN_COMPENSATING = statement(
    f"""
    WITH {LEASE_FENCE}, fenced AS (
        UPDATE kenning_instances AS i
        SET status = 'compensating', error = coalesce(CAST(:error AS jsonb), i.error), updated_at = now()
        FROM fence
        WHERE i.id = fence.id
        RETURNING i.id
    ), {SAVE_COMPENSATIONS}
    SELECT count(*) AS updated_count FROM fenced
    """
)


async def instance_begin_compensating(
    conn: Executor,
    instance_id: str,
    token: str,
    error: dict[str, Any] | None,
    compensations_json: list[dict[str, Any]],
) -> bool:
    row = (
        await conn.execute(
            _INSTANCE_BEGIN_COMPENSATING,
            {
                "id": instance_id,
                "token": token,
                "error": json.dumps(error) if error else None,
                "compensations": json.dumps(compensations_json),
            },
        )
    ).first()
    return row is not None and row.updated_count == 1


_INSTANCE_RECORD_ATTEMPT = statement(
    """
    UPDATE kenning_instances
    -- merged into the step's entry: the heartbeat details an attempt left stay for the next
    SET attempts = jsonb_set(attempts, ARRAY[CAST(:step AS text)],
            coalesce(attempts -> CAST(:step AS text), '{}') || jsonb_build_object(
            'attempts', CAST(:attempt AS integer),
            'first_failed_at', coalesce(attempts -> CAST(:step AS text) -> 'first_failed_at', to_jsonb(now())),
            'last_error', CAST(:error AS jsonb))),
        updated_at = now()
    WHERE id = :id AND lease_token = CAST(:token AS uuid)
    RETURNING extract(epoch FROM now() - CAST(attempts -> CAST(:step AS text) ->> 'first_failed_at' AS timestamptz))
                  AS seconds_since_first_failure,
              cancel_requested
    """
)


async def instance_record_attempt(
    conn: Executor, instance_id: str, token: str, step_id: str, attempt: int, error: Any
) -> tuple[float, bool] | None:
    """Count a failed attempt in the database; returns (seconds since the first failure,
    cancel requested), or None if the lease was lost. ``error``: its text, or the text
    sealed (``kenning.codecs``)."""
    row = (
        await conn.execute(
            _INSTANCE_RECORD_ATTEMPT,
            {
                "id": instance_id,
                "token": token,
                "step": step_id,
                "attempt": attempt,
                "error": json.dumps(error[:2000] if isinstance(error, str) else error),
            },
        )
    ).first()
    return None if row is None else (float(row.seconds_since_first_failure), bool(row.cancel_requested))


_INSTANCE_RECORD_HEARTBEAT = statement(
    """
    UPDATE kenning_instances
    SET attempts = jsonb_set(attempts, ARRAY[CAST(:step AS text)],
            coalesce(attempts -> CAST(:step AS text), '{}')
            || jsonb_build_object('heartbeat_details', CAST(:details AS jsonb)))
    WHERE id = :id AND lease_token = CAST(:token AS uuid)
    RETURNING 1 AS recorded
    """
)


async def instance_record_heartbeat(conn: Executor, instance_id: str, token: str, step_id: str, details: Any) -> bool:
    """Keep an activity attempt's heartbeat details in its step's entry of ``attempts``
    (cleared with the entry when the step is recorded); False if the lease was lost."""
    row = (
        await conn.execute(
            _INSTANCE_RECORD_HEARTBEAT,
            {"id": instance_id, "token": token, "step": step_id, "details": json.dumps(details)},
        )
    ).first()
    return row is not None


_INSTANCE_RESCHEDULE = statement(
    f"""
    WITH released AS (
        UPDATE kenning_instances
        SET status = CASE WHEN status = 'running' THEN 'pending' ELSE status END,
            lease_token = NULL, lease_owner = NULL,
            -- a cancel makes a running instance's back-off due now (it compensates at
            -- once); a compensating one's back-off is its failing compensation's, kept
            available_at = CASE WHEN cancel_requested AND status <> 'compensating' THEN now()
                                ELSE now() + make_interval(secs => :delay) END,
            updated_at = now()
        WHERE id = :id AND lease_token = CAST(:token AS uuid)
        RETURNING id, available_at <= now() AS due
    )
    SELECT id, CASE WHEN due THEN {notify(CHANNEL_INSTANCES)} END AS notified FROM released
    """
)


async def instance_release(conn: Executor, instance_id: str, token: str, delay_seconds: float = 0.0) -> bool:
    """Give the lease back so any worker may claim the instance after ``delay_seconds``.

    Used for durable retry back-offs (the worker is freed while it waits) and for
    instances still in flight when a worker shuts down.
    """
    row = (
        await conn.execute(_INSTANCE_RESCHEDULE, {"id": instance_id, "token": token, "delay": delay_seconds})
    ).first()
    return row is not None


_INSTANCE_RELEASE_CRASHED = statement(
    """
    -- the run raised: the instance is handed back as if its lease had expired (a fresh
    -- token nobody holds, due after the delay), so the next claim takes it as a suspect
    -- and counts the run unless it recorded a step. A clean release would reset that
    -- count: an instance that raised the same way on every run would loop for ever.
    UPDATE kenning_instances
    SET lease_token = gen_random_uuid(), available_at = now() + make_interval(secs => :delay), updated_at = now()
    WHERE id = :id AND lease_token = CAST(:token AS uuid)
    RETURNING id
    """
)


async def instance_release_crashed(conn: Executor, instance_id: str, token: str, delay_seconds: float) -> bool:
    """Hand back an instance whose run raised unexpectedly, counted as a run without
    progress (``runs_without_progress``, ``--max-runs``) unless it recorded a step."""
    params = {"id": instance_id, "token": token, "delay": delay_seconds}
    return (await conn.execute(_INSTANCE_RELEASE_CRASHED, params)).first() is not None


_INSTANCE_PROGRESSED = statement(
    """
    SELECT EXISTS (
        SELECT FROM kenning_instances AS i JOIN kenning_history AS h ON h.instance_id = i.id
        WHERE i.lease_token = CAST(:token AS uuid) AND h.created_at >= i.claimed_at
    ) AS progressed
    """
)


async def instance_progressed(conn: Executor, token: str) -> bool:
    """Whether the run holding this lease recorded a step since its claim: the claim's
    own test of progress, for a worker whose suspect records steps in transactions of
    their own (``history_record_step``) rather than through its group commit."""
    row = (await conn.execute(_INSTANCE_PROGRESSED, {"token": token})).first()
    return row is not None and bool(row.progressed)


_INSTANCE_REQUEST_CANCEL = statement(
    f"""
    WITH target AS (
        SELECT id, status, status = 'failed' AND coalesce(error ->> 'reason' = '{CRASH_LOOP}', false) AS crash_loop
        FROM kenning_instances WHERE id = :id FOR UPDATE
    ), flagged AS (
        UPDATE kenning_instances AS i
        SET cancel_requested = true,
            -- a waiting or pending instance becomes runnable now so a worker compensates it;
            -- a leased one sees the flag with its next fenced write. A crash-looped one
            -- resumes as kenning instances retry would resume it (its saga's state, error
            -- and attempts as parked, its run count reset), to be compensated.
            status = CASE WHEN target.crash_loop THEN coalesce(i.error ->> 'resume_status', 'pending')
                          WHEN i.status IN ('waiting_for_event', 'waiting_for_timer', 'waiting_for_message')
                              THEN 'pending'
                          ELSE i.status END,
            error = CASE WHEN target.crash_loop THEN nullif(i.error -> 'previous_error', CAST('null' AS jsonb))
                         ELSE i.error END,
            runs_without_progress = CASE WHEN target.crash_loop THEN 0 ELSE i.runs_without_progress END,
            finished_at = CASE WHEN target.crash_loop THEN NULL ELSE i.finished_at END,
            available_at = CASE WHEN i.lease_token IS NULL THEN now() ELSE i.available_at END,
            updated_at = now()
        FROM target
        WHERE i.id = target.id AND (target.status NOT IN ('completed', 'failed', 'cancelled') OR target.crash_loop)
        RETURNING i.id
    ), unsubscribed AS (
        DELETE FROM kenning_event_subscriptions WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    ), untimed AS (
        DELETE FROM kenning_timers WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    ), unwaited AS (
        DELETE FROM kenning_message_waits WHERE instance_id IN (SELECT id FROM flagged) RETURNING 1
    )
    SELECT target.status AS previous_status, (SELECT count(*) FROM flagged) > 0 AS flagged,
           {notify(CHANNEL_INSTANCES)} AS notified
    FROM target
    """
)


async def instance_request_cancel(conn: Executor, instance_id: str) -> tuple[str, bool] | None:
    """Ask for cancellation. Returns (status before, whether it will be cancelled), or None
    for an unknown instance. Finished instances are left as they are, but for one parked
    as ``crash_loop``: it resumes to be compensated (its body runs only up to its next new
    step), since giving up on it is what an operator may want instead of a retry."""
    row = (await conn.execute(_INSTANCE_REQUEST_CANCEL, {"id": instance_id})).first()
    return None if row is None else (str(row.previous_status), bool(row.flagged))


_INSTANCE_GET = statement(
    f"""
    SELECT {instance_row_columns()}
    FROM kenning_instances WHERE id = :id
    """
)


def _instance_row(row: Any) -> InstanceRow:
    """A row of ``_INSTANCE_GET`` or ``_INSTANCE_LIST``, whose columns are InstanceRow's fields."""
    return InstanceRow(**row._asdict())


async def instance_get(conn: Executor, instance_id: str) -> InstanceRow | None:
    row = (await conn.execute(_INSTANCE_GET, {"id": instance_id})).first()
    return None if row is None else _instance_row(row)


_INSTANCE_LIST = statement(
    f"""
    SELECT {instance_row_columns()}
    FROM kenning_instances
    WHERE (CAST(:status AS text) IS NULL OR status = :status)
      AND (CAST(:workflow AS text) IS NULL OR workflow_name = :workflow)
    ORDER BY created_at DESC, id
    LIMIT :limit
    """
)


async def instance_list(
    conn: Executor, *, status: str | None = None, workflow_name: str | None = None, limit: int = 50
) -> list[InstanceRow]:
    result = await conn.execute(_INSTANCE_LIST, {"status": status, "workflow": workflow_name, "limit": limit})
    return [_instance_row(row) for row in result]


_INSTANCE_RETRY = statement(
    f"""
    WITH target AS (
        SELECT i.id,
               coalesce(i.error ->> 'reason' = '{CRASH_LOOP}', false) AS crash_loop,
               (SELECT count(*) FROM kenning_history h
                WHERE h.instance_id = i.id AND h.kind = '{COMPENSATION_EXECUTED}') AS compensated
        FROM kenning_instances i
        WHERE i.id = :id AND i.status = 'failed'
        FOR UPDATE
    ), cleared AS (
        DELETE FROM kenning_history h USING target
        WHERE h.instance_id = target.id AND target.compensated = 0 AND NOT target.crash_loop
          AND h.kind IN ('{ACTIVITY_FAILED}', '{EVENT_TIMEOUT}', '{COMPENSATION_FAILED}')
        RETURNING h.step_id
    ), retried AS (
        -- a crash-looped instance failed in no step: it resumes where it was parked (its
        -- saga's compensations included), with the error, attempts and cancel it had then
        UPDATE kenning_instances AS i
        SET status = CASE WHEN target.crash_loop THEN coalesce(i.error ->> 'resume_status', 'pending')
                          ELSE 'pending' END,
            error = CASE WHEN target.crash_loop
                         THEN nullif(i.error -> 'previous_error', CAST('null' AS jsonb)) END,
            attempts = CASE WHEN target.crash_loop THEN i.attempts ELSE '{{}}' END,
            cancel_requested = target.crash_loop AND i.cancel_requested,
            result = NULL, runs_without_progress = 0,
            available_at = now(), finished_at = NULL, updated_at = now()
        FROM target
        WHERE i.id = target.id AND (target.compensated = 0 OR target.crash_loop)
        RETURNING i.id
    ), {reopen_ended_streams("retried")}
    SELECT target.compensated, target.crash_loop, (SELECT count(*) FROM cleared) AS cleared_count,
           (SELECT count(*) FROM retried) AS retried_count,
           (SELECT {notify(CHANNEL_INSTANCES)} FROM retried) AS notified
    FROM target
    """
)


async def instance_retry(conn: Executor, instance_id: str) -> dict[str, Any]:
    """Make a failed instance runnable again: its failed steps are forgotten, so replay
    re-runs them, and every step that succeeded is replayed from history.

    Refused once a compensation has run: replaying steps whose effects were undone would
    leave the saga inconsistent; start a new instance instead. A crash-looped instance
    (parked by the claim) resumes as it was parked, its run counter reset.
    """
    row = (await conn.execute(_INSTANCE_RETRY, {"id": instance_id})).first()
    if row is None:
        return {"retried": False, "message": "only a failed instance can be retried"}
    compensated, cleared, retried = int(row.compensated), int(row.cleared_count), int(row.retried_count)
    if row.crash_loop:
        return {"retried": bool(retried), "message": "runnable again; its crash-loop run counter was reset"}
    if compensated:
        return {
            "retried": False,
            "message": f"{compensated} compensation(s) already undid its steps; start a new instance instead",
        }
    return {"retried": bool(retried), "message": f"runnable again; {cleared} failed step(s) will run anew"}
