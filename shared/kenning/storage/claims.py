"""The claim: the one statement by which a worker takes instances to run, in two forms.

``instance_claim`` takes due instances in no queue; ``queue_claim`` takes them from one
queue under its limits (at most N leased at once, per worker, per partition key, N starts
per period; partition keys served round-robin). Both are written around the same parts
(``claim_parts``): the candidates locked ``FOR UPDATE SKIP LOCKED``, the rows chosen among
them, and one ``UPDATE ... RETURNING`` that sets the lease (River's ``JobGetAvailable``,
procrastinate's ``procrastinate_fetch_job``).

Expired leases are reclaimed here, by the ordinary claim, not by a sweeper: a row whose
lease is still set is *taken over*, its run counted unless it recorded a step, and parked
as ``crash_loop`` at ``--max-runs`` (docs/architecture.md invariant 4). The statements as
PostgreSQL receives them, for reading as one text, are checked in under
``shared/kenning/storage/sql/`` (``tests/unit/test_sql_snapshots.py`` keeps them current).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.records import ClaimedInstance, ParkedInstance
from kenning.db import Executor, Statement, statement
from kenning.storage.clock import NOW, seconds_or_none
from kenning.storage.names import notify_result

# Runs in a row that may end without a clean end or a new step before the claim parks the
# instance as failed (``crash_loop``); the worker's ``--max-runs``.
DEFAULT_MAX_RUNS = 10
CRASH_LOOP = "crash_loop"
CRASH_LOOP_ERROR_TYPE = "kenning_worker.crashloop.CrashLoopError"
# The one text of a crash loop's error: stored by the claim that parks the instance (the
# statement fills it in with format()) and given to the failure hook (crash_loop_message).
_CRASH_LOOP_MESSAGE = (
    "crash loop: {runs} runs in a row ended without finishing cleanly or recording a step "
    "(--max-runs {max_runs}); fix the cause, then run kenning instances retry {instance_id}"
)


def crash_loop_message(instance_id: str, runs: int, max_runs: int) -> str:
    return _CRASH_LOOP_MESSAGE.format(runs=runs, max_runs=max_runs, instance_id=instance_id)


def _crash_loop_format(max_runs: int) -> str:
    """``_CRASH_LOOP_MESSAGE`` as a SQL string literal for format(runs, instance id)."""
    template = _CRASH_LOOP_MESSAGE.replace("%", "%%").format(runs="%1$s", max_runs=max_runs, instance_id="%2$s")
    return "'" + template.replace("'", "''") + "'"


# What the claim writes into each row it takes: a lease, or for a parked instance
# (``{park}`` true) none, and the crash-loop error with what ``kenning instances retry``
# needs to resume it (resume_status, previous_error).
_CLAIM_SET = """
        status = CASE WHEN {park} THEN 'failed' WHEN i.status = 'pending' THEN 'running' ELSE i.status END,
        lease_owner = CASE WHEN {park} THEN NULL ELSE :owner END,
        lease_token = CASE WHEN {park} THEN NULL ELSE gen_random_uuid() END,
        available_at = CASE WHEN {park} THEN NULL ELSE {now} + make_interval(secs => :lease_seconds) END,
        run_count = CASE WHEN {park} THEN i.run_count ELSE i.run_count + 1 END,
        runs_without_progress = {runs},
        error = CASE WHEN {park} THEN jsonb_build_object(
                    'type', '{error_type}', 'reason', '{reason}',
                    'message', format({message}, {runs}, i.id),
                    'args', jsonb_build_array(format({message}, {runs}, i.id)),
                    'runs_without_progress', {runs},
                    'resume_status', CASE WHEN i.status = 'compensating' THEN 'compensating' ELSE 'pending' END,
                    'previous_error', i.error)
                ELSE i.error END,
        finished_at = CASE WHEN {park} THEN now() ELSE i.finished_at END,
        started_at = coalesce(i.started_at, {now}),
        -- the database's own clock, as history rows' created_at: progress is judged by it
        claimed_at = now(),
        -- a pinned workflow's instance is pinned by its first claim to the claimer's code
        -- version (:pinned names this worker's pinned workflows); a pinned one keeps its own
        pinned_version = coalesce(i.pinned_version,
                                  CASE WHEN i.workflow_name = ANY(CAST(:pinned AS text[]))
                                       THEN CAST(:code_version AS text) END),
        updated_at = {now}"""

# The rows a worker may claim: not pinned, or pinned to its own code version. Read on the
# rows the claim's index already singles out, as workflow_name is: no index of its own.
PINNED_FILTER = "(pinned_version IS NULL OR pinned_version = CAST(:code_version AS text))"


@dataclass(frozen=True)
class ClaimParts:
    """What the plain claim and a queue's claim (``kenning/storage/queues.py``) share,
    written around a CTE ``candidates`` (id, suspect, runs_without_progress, claimed_at,
    available_at): ``chosen`` picks the rows to take, ``lease_filter`` narrows the
    candidates, ``park`` says which chosen row is parked, ``set_clause`` is the UPDATE's
    SET, ``returning`` the claimed rows' columns (``claimed_instances`` reads them)."""

    chosen: str
    lease_filter: str
    park: str
    set_clause: str
    returning: str


def _runs_counted(row: str) -> str:
    """The run a claim of ``row`` counts against it: 0 unless it was taken over (its
    lease still set) without recording a step since its claim; then one more than before."""
    return f"""CASE WHEN {row}.lease_token IS NULL THEN 0
                    WHEN EXISTS (SELECT FROM kenning_history AS h
                                 WHERE h.instance_id = {row}.id
                                   AND h.created_at >= coalesce({row}.claimed_at, CAST('-infinity' AS timestamptz)))
                    THEN 0
                    ELSE {row}.runs_without_progress + 1 END"""


def takeover_columns(row: str) -> str:
    """The candidates' columns ``claim_parts`` reads, for a row of kenning_instances named
    ``row``: whether it is taken over, and the run counted against it. CASE reads the
    history only for a row taken over (rare), so the common claim costs nothing more."""
    return f"{row}.lease_token IS NOT NULL AS taken_over, {_runs_counted(row)} AS runs"


@functools.cache
def claim_parts(max_runs: int, take_suspect: bool) -> ClaimParts:
    """The claim of a worker with this ``--max-runs`` that may (or may not, because it
    runs one already) take a suspect.

    A row whose lease is still set when claimed was *taken over*: its previous run did
    not end cleanly (its lease expired, or the run raised and ``instance_release_crashed``
    handed it back). The run counts against it unless it recorded a step since its claim.
    It is a *suspect* only with evidence: the run before died so too (this claim counts
    its second such run in a row or more). Suspects are taken one per claim and run one
    at a time per worker, so one that kills its process takes no other suspect down with
    it; every other takeover (all the instances a killed worker had in flight) is claimed
    together, as many as the claim's limit, so a dead worker's instances recover at once.

    Both are process constants, written into the statement as literals (``max_runs`` is a
    validated int): a worker runs at most two variants, each compiled once. The common
    path (nothing taken over) costs what the claim cost before crash loops were counted:
    one locked index range, one update; the history is read only for a row taken over.
    """
    # The OR stops at a row that is no suspect: the subquery runs only when one was offered.
    suspects = "c.id = (SELECT s.id FROM candidates AS s WHERE s.runs > 1 ORDER BY s.available_at, s.id LIMIT 1)"
    chosen = f"""SELECT c.id, c.runs > 1 AS suspect, c.taken_over, c.runs
        FROM candidates AS c
        WHERE c.runs <= 1{" OR " + suspects if take_suspect else ""}"""
    # A worker running a suspect leaves the others to other workers (or its next claim):
    # here, every row whose run before died too, whether or not it then recorded a step
    # (the filter needs no history read; one with a step is taken by the next such claim).
    lease_filter = "" if take_suspect else "AND (lease_token IS NULL OR runs_without_progress = 0)"
    park = f"(c.runs >= {max_runs:d})"
    set_clause = _CLAIM_SET.format(
        park=park,
        runs="c.runs",
        now=NOW,
        error_type=CRASH_LOOP_ERROR_TYPE,
        reason=CRASH_LOOP,
        message=_crash_loop_format(max_runs),
    )
    returning = f"""i.id, i.workflow_name, i.status, i.input, i.cancel_requested,
                  CAST(i.lease_token AS text) AS lease_token, i.run_count, i.attempts, i.trace_context,
                  c.suspect, c.taken_over, i.runs_without_progress,
                  -- a parked instance has finished: its awaiting clients are told
                  CASE WHEN {park} THEN {notify_result("i.id")} ELSE false END AS park"""
    return ClaimParts(chosen, lease_filter, park, set_clause, returning)


# Queued instances asked to cancel (index kenning_instances_queued_cancelled, migration
# 0028): the plain claim takes them, outside their queue's limits.
_QUEUED_CANCELLED = """status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL
          AND cancel_requested"""


@functools.cache
def _claim_statement(max_runs: int, take_suspect: bool) -> Statement:
    """The claim of instances in no queue: ``claim_parts`` around the claimable index's
    range, which leaves queued instances out (their queue's claim takes them), and the
    queued instances asked to cancel: their compensations run outside the queue's limits
    (no slot, no rate, no pause), so a cancel never waits for a full queue to drain
    (docs/architecture.md, Queues). They are rare: a second, small index range."""
    parts = claim_parts(max_runs, take_suspect)
    columns = f"id, {takeover_columns('kenning_instances')}, runs_without_progress, claimed_at, available_at"
    return statement(
        f"""
    WITH plain AS (
        SELECT {columns}
        FROM kenning_instances
        WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NULL
          AND available_at <= {NOW}
          AND workflow_name = ANY(:names)
          AND {PINNED_FILTER}
          {parts.lease_filter}
        ORDER BY available_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), cancelled AS (
        SELECT {columns}
        FROM kenning_instances
        WHERE {_QUEUED_CANCELLED}
          AND available_at <= {NOW}
          AND workflow_name = ANY(:names)
          AND {PINNED_FILTER}
          {parts.lease_filter}
        ORDER BY available_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), candidates AS (
        -- a cancel first: it is what an operator waits for; the claim's limit holds for both
        SELECT * FROM (SELECT *, 0 AS turn FROM cancelled UNION ALL SELECT *, 1 AS turn FROM plain) AS both_ranges
        ORDER BY turn, available_at
        LIMIT :limit
    ), chosen AS MATERIALIZED (
        -- materialized: each row's count is computed once, not once per column using it
        {parts.chosen}
    ), claimed AS (
        UPDATE kenning_instances AS i
        SET {parts.set_clause}
        FROM chosen AS c
        WHERE i.id = c.id
        RETURNING {parts.returning}
    )
    SELECT id, workflow_name, status, input, cancel_requested, lease_token, run_count, attempts,
           suspect, taken_over, park, runs_without_progress, trace_context,
           CAST(NULL AS float8) AS seconds_until_next
    FROM claimed
    UNION ALL
    -- one row saying when the next instance (other than those claimed now) becomes
    -- claimable, so a worker knows how long to sleep without a second round trip: idle,
    -- or having claimed some (a debounced burst due in a moment must not wait for the
    -- poll). min() stops at the claimable index's first entry of these workflows: a due
    -- suspect this worker leaves to others counts too (the worker does not spin on it,
    -- see Worker._claim_loop).
    SELECT NULL AS id, NULL AS workflow_name, NULL AS status, NULL AS input, NULL AS cancel_requested,
           NULL AS lease_token, NULL AS run_count, NULL AS attempts, NULL AS suspect, NULL AS taken_over,
           NULL AS park,
           NULL AS runs_without_progress, NULL AS trace_context,
           (SELECT CAST(extract(epoch FROM least(
                (SELECT min(available_at) FROM kenning_instances
                 WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NULL
                   AND workflow_name = ANY(:names) AND {PINNED_FILTER}
                   AND id NOT IN (SELECT c.id FROM claimed AS c)),
                -- a cancelled instance's compensation retried after a back-off
                (SELECT min(available_at) FROM kenning_instances
                 WHERE {_QUEUED_CANCELLED}
                   AND workflow_name = ANY(:names) AND {PINNED_FILTER}
                   AND id NOT IN (SELECT c.id FROM claimed AS c)))
                - {NOW}) AS float8))
               AS seconds_until_next
    """
    )


# The statement of a worker with the default settings (the benchmark's bare engine runs it).
_INSTANCE_CLAIM = _claim_statement(DEFAULT_MAX_RUNS, True)


@dataclass(frozen=True)
class Claim:
    instances: list[ClaimedInstance]
    # seconds until the next instance not claimed now becomes claimable (negative: due,
    # but locked by another claim), None if there is none
    seconds_until_next: float | None
    # instances this claim parked as failed (crash loop) instead of handing them out
    parked: list[ParkedInstance] = field(default_factory=list)


async def instance_claim(
    conn: Executor,
    *,
    owner: str,
    workflow_names: Sequence[str],
    limit: int,
    lease_seconds: float,
    max_runs: int = DEFAULT_MAX_RUNS,
    take_suspect: bool = True,
    code_version: str | None = None,
    pinned: Sequence[str] = (),
    now: datetime | None = None,
) -> Claim:
    """Claim up to ``limit`` runnable instances in one round trip.

    Runnable means pending and due, or leased with an expired lease: expired leases are
    reclaimed here, by the normal claim, not by a sweeper (docs/architecture.md invariant 4). An
    expired lease is a run that did not end cleanly; ``max_runs`` of them in a row
    without a step recorded park the instance (``Claim.parked``). ``take_suspect=False``
    leaves expired leases to other workers (this one runs such an instance already).
    """
    if max_runs < 1:
        raise ValueError("max_runs must be at least 1")
    result = await conn.execute(
        _claim_statement(max_runs, take_suspect),
        {
            "owner": owner,
            "names": list(workflow_names),
            "limit": limit,
            "lease_seconds": lease_seconds,
            "code_version": code_version,
            "pinned": list(pinned),
            "now": now,
        },
    )
    claim = Claim([], None)
    for row in result:
        if row.id is None:
            claim = Claim(claim.instances, seconds_or_none(row.seconds_until_next), claim.parked)
        else:
            claimed_row(claim, row)
    return claim


def claimed_row(claim: Claim, row: Any) -> None:
    """Add a row of ``ClaimParts.returning`` to ``claim``: an instance handed out, or parked."""
    if row.park:
        claim.parked.append(ParkedInstance(row.id, row.workflow_name, row.run_count, row.runs_without_progress))
        return
    try:
        opened, unreadable = codecs.unseal(row.input), None
    except codecs.CodecError as error:  # not raised here: the rest of the claim goes on
        opened, unreadable = {}, str(error)
    claim.instances.append(
        ClaimedInstance(
            id=row.id,
            workflow_name=row.workflow_name,
            status=row.status,
            input=opened,
            unreadable=unreadable,
            trace_context=row.trace_context,
            cancel_requested=row.cancel_requested,
            lease_token=row.lease_token,
            run_count=row.run_count,
            attempts=row.attempts,
            suspect=row.suspect,
            taken_over=row.taken_over,
        )
    )


# A queue's runnable instances: kenning_instances_queued's rows of :queue.
_QUEUED = "i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.status IN ('pending', 'running', 'compensating')"


@functools.cache
def _queue_claim_statement(max_runs: int, take_suspect: bool) -> Statement:
    parts = claim_parts(max_runs, take_suspect)
    next_key = f"""(SELECT i.partition_key FROM kenning_instances AS i
                    WHERE {_QUEUED} AND i.partition_key > {{after}}
                    ORDER BY i.partition_key LIMIT 1)"""
    first_key = f"""(SELECT i.partition_key FROM kenning_instances AS i
                     WHERE {_QUEUED} ORDER BY i.partition_key LIMIT 1)"""
    return statement(
        f"""
    WITH RECURSIVE locked AS MATERIALIZED (
        SELECT name, concurrency, worker_concurrency, rate_limit, rate_period_seconds, partition_concurrency,
               key_rate_limit, key_rate_period_seconds, claim_seq, partition_cursor
        FROM kenning_queues
        WHERE name = :queue AND NOT paused
        FOR UPDATE SKIP LOCKED
    ), queue AS MATERIALIZED (
        -- the lock returns the row's latest version; equal to the snapshot's, no claim of
        -- this queue committed since this statement's snapshot, so its counts are current
        SELECT l.* FROM locked AS l
        WHERE l.claim_seq = (SELECT s.claim_seq FROM kenning_queues AS s WHERE s.name = l.name)
    ), leased AS MATERIALIZED (
        SELECT i.partition_key, i.lease_owner
        FROM kenning_instances AS i
        WHERE i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.lease_token IS NOT NULL
          AND i.available_at > {NOW}
          AND EXISTS (SELECT FROM queue)
    ), budget AS MATERIALIZED (
        SELECT q.partition_concurrency AS per_key, q.partition_cursor AS cursor,
               q.key_rate_limit AS key_rate, q.key_rate_period_seconds AS key_period,
               -- least() skips NULLs: a limit the queue does not have
               greatest(0, least(
                   CAST(:limit AS integer),
                   q.concurrency - (SELECT count(*) FROM leased),
                   q.worker_concurrency - (SELECT count(*) FROM leased AS l WHERE l.lease_owner = :owner),
                   q.rate_limit - r.started)) AS n,
               CASE WHEN r.started >= q.rate_limit
                    THEN CAST(extract(epoch FROM r.oldest + make_interval(secs => q.rate_period_seconds) - {NOW})
                              AS float8) END AS rate_wait
        FROM queue AS q
        LEFT JOIN LATERAL (
            SELECT count(*) AS started, min(i.started_at) AS oldest
            FROM kenning_instances AS i
            WHERE i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.started_at IS NOT NULL
              AND i.started_at > {NOW} - make_interval(secs => q.rate_period_seconds)
        ) AS r ON q.rate_limit IS NOT NULL
    ), walk (key, depth, lapped) AS (
        -- the queue's partition keys from the one after the cursor, wrapping around once
        SELECT k.key, 1, k.key <= b.cursor
        FROM budget AS b
        -- OFFSET 0: evaluated once per row, not copied into every condition naming it
        CROSS JOIN LATERAL (SELECT coalesce({next_key.format(after="b.cursor")}, {first_key}) AS key OFFSET 0) AS k
        WHERE b.n > 0 AND k.key IS NOT NULL
        UNION ALL
        SELECT k.key, w.depth + 1, w.lapped OR k.key <= w.key
        FROM walk AS w
        CROSS JOIN budget AS b
        CROSS JOIN LATERAL (
            SELECT coalesce({next_key.format(after="w.key")}, CASE WHEN NOT w.lapped THEN {first_key} END) AS key
            OFFSET 0
        ) AS k
        WHERE w.depth < :walk_limit AND k.key IS NOT NULL
          AND NOT ((w.lapped OR k.key <= w.key) AND k.key > b.cursor)
    ), key_rate AS MATERIALIZED (
        -- a per-key rate limit's window for each key walked: its starts in the last period,
        -- and when the limit-th newest leaves the window (the next start of a full key)
        SELECT w.key, r.started, r.frees_at, r.started >= b.key_rate AS full
        FROM walk AS w
        CROSS JOIN budget AS b
        CROSS JOIN LATERAL (
            SELECT count(*) AS started,
                   (SELECT s.started_at + make_interval(secs => b.key_period)
                    FROM kenning_instances AS s
                    WHERE s.queue_name = :queue AND s.queue_name IS NOT NULL AND s.partition_key = w.key
                      AND s.started_at > {NOW} - make_interval(secs => b.key_period)
                    ORDER BY s.started_at DESC OFFSET b.key_rate - 1 LIMIT 1) AS frees_at
            FROM kenning_instances AS i
            WHERE i.queue_name = :queue AND i.queue_name IS NOT NULL AND i.partition_key = w.key
              AND i.started_at > {NOW} - make_interval(secs => b.key_period)
        ) AS r
        WHERE b.key_rate IS NOT NULL
    ), deferred AS (
        -- a full key's due instances wait durably until its window frees: not due before,
        -- so the walk serves other keys meanwhile and an idle worker knows when to look
        UPDATE kenning_instances AS i
        SET available_at = k.frees_at
        FROM key_rate AS k
        WHERE k.full AND i.id IN (
            SELECT d.id FROM kenning_instances AS d
            WHERE d.queue_name = :queue AND d.queue_name IS NOT NULL
              AND d.status IN ('pending', 'running', 'compensating') AND d.partition_key = k.key
              AND d.available_at <= {NOW} AND d.lease_token IS NULL AND d.started_at IS NULL
            FOR UPDATE SKIP LOCKED)
        RETURNING i.id
    ), offered AS (
        -- each key's first instances, as many as its free slots and its rate window
        -- allow (and the claim's budget)
        SELECT o.*, w.depth,
               row_number() OVER (PARTITION BY w.key ORDER BY o.priority, o.available_at, o.id) AS turn
        FROM walk AS w
        CROSS JOIN budget AS b
        CROSS JOIN LATERAL (
            SELECT i.id, i.partition_key, i.priority, {takeover_columns("i")},
                   i.runs_without_progress, i.claimed_at, i.available_at
            FROM kenning_instances AS i
            WHERE {_QUEUED} AND i.partition_key = w.key AND i.available_at <= {NOW}
              AND i.workflow_name = ANY(:names)
              AND (i.pinned_version IS NULL OR i.pinned_version = CAST(:code_version AS text))
              {parts.lease_filter}
            ORDER BY i.priority, i.available_at
            LIMIT greatest(0, least(b.n, b.per_key - (SELECT count(*) FROM leased AS l
                                                        WHERE l.partition_key = w.key),
                                    b.key_rate - (SELECT k.started FROM key_rate AS k WHERE k.key = w.key)))
            FOR UPDATE OF i SKIP LOCKED
        ) AS o
    ), candidates AS MATERIALIZED (
        -- round-robin: every key's first before any key's second
        SELECT * FROM offered ORDER BY turn, priority, depth LIMIT (SELECT n FROM budget)
    ), chosen AS MATERIALIZED (
        {parts.chosen}
    ), claimed AS (
        UPDATE kenning_instances AS i
        SET {parts.set_clause}
        FROM chosen AS c
        -- the ids as an array too: the planner cannot tell how few rows the budget leaves
        -- and would hash-join the whole table; this keeps it to primary-key lookups
        WHERE i.id = c.id AND i.id = ANY(ARRAY(SELECT id FROM chosen))
        RETURNING {parts.returning}
    ), advanced AS (
        UPDATE kenning_queues AS q
        SET claim_seq = q.claim_seq + CASE WHEN EXISTS (SELECT FROM candidates) THEN 1 ELSE 0 END,
            -- the last key served, or the last one looked at if none could be
            partition_cursor = coalesce((SELECT c.partition_key FROM candidates AS c ORDER BY c.depth DESC LIMIT 1),
                                        (SELECT w.key FROM walk AS w ORDER BY w.depth DESC LIMIT 1))
        FROM queue
        WHERE q.name = queue.name
          AND CASE WHEN EXISTS (SELECT FROM candidates) THEN true
                   WHEN NOT EXISTS (SELECT FROM walk) THEN false
                   -- nothing served: the walk moves on past keys that were full or had nothing
                   -- due, not past a key with a free slot and a due instance this claim could
                   -- not take (another worker's workflow, a row locked): that key keeps its turn
                   ELSE NOT EXISTS (
                       SELECT FROM walk AS w CROSS JOIN budget AS b
                       WHERE (b.per_key IS NULL
                              OR (SELECT count(*) FROM leased AS l WHERE l.partition_key = w.key) < b.per_key)
                         AND NOT EXISTS (SELECT FROM key_rate AS k WHERE k.key = w.key AND k.full)
                         AND EXISTS (SELECT FROM kenning_instances AS i
                                     WHERE {_QUEUED} AND i.partition_key = w.key AND i.available_at <= {NOW}
                                       {parts.lease_filter}))
              END
        RETURNING q.name
    )
    SELECT id, workflow_name, status, input, cancel_requested, lease_token, run_count, attempts,
           suspect, taken_over, park, runs_without_progress, trace_context,
           CAST(NULL AS boolean) AS busy, CAST(NULL AS float8) AS seconds_until_next,
           (SELECT count(*) FROM deferred) AS deferred
    FROM claimed
    UNION ALL
    -- nothing claimed: whether another claim holds the queue (try again soon), and when a
    -- rate limit that stopped this one (the queue's, or a key's) lets the next start through
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NOT EXISTS (SELECT FROM queue)
               AND EXISTS (SELECT FROM kenning_queues AS s WHERE s.name = :queue AND NOT s.paused),
           least((SELECT b.rate_wait FROM budget AS b),
                 (SELECT CAST(extract(epoch FROM min(k.frees_at) - {NOW}) AS float8)
                  FROM key_rate AS k WHERE k.full)),
           (SELECT count(*) FROM deferred)
    WHERE NOT EXISTS (SELECT FROM claimed)
    """
    )


@dataclass(frozen=True)
class QueueClaim(Claim):
    # nothing claimed because another worker's claim held the queue: worth trying again soon
    busy: bool = False
    # instances this claim held back for their partition key's rate limit
    rate_limited: int = 0


async def queue_claim(
    conn: Executor,
    *,
    queue: str,
    owner: str,
    workflow_names: Sequence[str],
    limit: int,
    lease_seconds: float,
    max_runs: int = DEFAULT_MAX_RUNS,
    take_suspect: bool = True,
    code_version: str | None = None,
    pinned: Sequence[str] = (),
    now: datetime | None = None,
) -> QueueClaim:
    """Claim up to ``limit`` instances of ``queue`` under its limits, in one round trip;
    ``seconds_until_next`` is set when a rate limit stopped it (when the next start may).
    ``code_version`` and ``pinned`` as ``instance_claim``'s."""
    if max_runs < 1:
        raise ValueError("max_runs must be at least 1")
    params = {
        "queue": queue,
        "owner": owner,
        "names": list(workflow_names),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "code_version": code_version,
        "pinned": list(pinned),
        "now": now,
        # keys looked at per claim: enough to fill it when most keys are full, bounded for
        # queues with many keys (the cursor carries the walk on in the next claim)
        "walk_limit": limit * 4 + 16,
    }
    claim = QueueClaim([], None)
    rate_limited = 0
    for row in await conn.execute(_queue_claim_statement(max_runs, take_suspect), params):
        rate_limited = int(row.deferred)
        if row.id is None:
            claim = QueueClaim(claim.instances, seconds_or_none(row.seconds_until_next), claim.parked, bool(row.busy))
        else:
            claimed_row(claim, row)
    return dataclasses.replace(claim, rate_limited=rate_limited) if rate_limited else claim
