"""The SQL invariant checker run after every end-to-end, multi-process and chaos test.

Each invariant is a function of its own that fails with the rows that break it, so a
failure names the instances, events or steps to look at. ``check_invariants`` runs them
all; ``tests.support`` re-exports it for the tests that import it from there.

Every unfinished instance must have a way forward at any moment (a lease, a due time, a
timer or a subscription). ``settled`` means the run is over and every process has had time
to finish what it was given (quiescence): then nothing accepted may still be pending either.
Tests that stop before that pass ``settled=False``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from types import ModuleType
from typing import Any

import psycopg

from kenning.activity import Activity
from kenning.retry import DEFAULT_RETRY_POLICY
from kenning.schedules import tick_instance_id, tick_key, ticks_between
from kenning.workflow import Workflow

Sql = psycopg.Connection[tuple[Any, ...]]

TERMINAL = ("completed", "failed", "cancelled")
# Side-channel lines of effects whose step must be recorded: ``step <instance id> <step id>``.
STEP_EFFECT = re.compile(r"^step (?P<instance>\S+) (?P<step>\S+)$")


def _rows(sql: Sql, query: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    return sql.execute(query, tuple(params)).fetchall()


def _fail_if(rows: list[tuple[Any, ...]], what: str, limit: int = 20) -> None:
    more = f" (and {len(rows) - limit} more)" if len(rows) > limit else ""
    assert rows == [], f"{what}: {rows[:limit]}{more}"


def no_step_recorded_twice(sql: Sql) -> None:
    """A step is recorded once (the primary key says so; this catches a schema that stops saying it)."""
    _fail_if(
        _rows(
            sql,
            "SELECT instance_id, step_id, count(*) AS records FROM kenning_history "
            "GROUP BY instance_id, step_id HAVING count(*) > 1",
        ),
        "steps recorded twice (instance, step, records)",
    )


def events_stored_once(sql: Sql, *, settled: bool = True) -> None:
    """Every accepted event is in the inbox once and, once settled, processed or parked."""
    _fail_if(
        _rows(
            sql,
            "SELECT kind, source, event_id, count(*) AS copies FROM kenning_inbox "
            "GROUP BY kind, source, event_id HAVING count(*) > 1",
        ),
        "events stored more than once (kind, source, id, copies)",
    )
    if settled:
        _fail_if(
            _rows(sql, "SELECT id, source, event_id, attempts, last_error FROM kenning_inbox WHERE status = 'pending'"),
            "accepted events neither processed nor parked (inbox id, source, event id, attempts, last error)",
        )


def leases_consistent(sql: Sql) -> None:
    """Running and compensating instances hold a lease; finished ones hold none."""
    _fail_if(
        _rows(
            sql,
            "SELECT id, status FROM kenning_instances "
            "WHERE status IN ('running', 'compensating') AND (lease_token IS NULL OR available_at IS NULL)",
        ),
        "running without a lease (instance, status)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT id, status FROM kenning_instances WHERE status IN ('completed', 'failed', 'cancelled') "
            "AND (lease_token IS NOT NULL OR available_at IS NOT NULL)",
        ),
        "finished but still leased or scheduled (instance, status)",
    )


def every_instance_has_a_way_forward(sql: Sql) -> None:
    """An unfinished instance is runnable (pending with a due or future time, or leased: an
    expired lease is reclaimed by the claim), or waits on a timer or a subscription."""
    _fail_if(
        _rows(
            sql,
            """
            SELECT i.id, i.status FROM kenning_instances AS i
            WHERE i.status NOT IN ('completed', 'failed', 'cancelled')
              AND NOT (i.status = 'pending' AND i.available_at IS NOT NULL)
              AND NOT (i.status IN ('running', 'compensating')
                       AND i.lease_token IS NOT NULL AND i.available_at IS NOT NULL)
              AND NOT (i.status = 'waiting_for_timer'
                       AND EXISTS (SELECT FROM kenning_timers AS t WHERE t.instance_id = i.id))
              AND NOT (i.status = 'waiting_for_event'
                       AND EXISTS (SELECT FROM kenning_event_subscriptions AS s WHERE s.instance_id = i.id))
              AND NOT (i.status = 'waiting_for_message'
                       AND EXISTS (SELECT FROM kenning_message_waits AS w WHERE w.instance_id = i.id))
            """,
        ),
        "instances with no way forward: nothing would ever run or wake them (instance, status)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT i.id, i.status FROM kenning_instances AS i WHERE i.status <> 'waiting_for_timer' "
            "AND EXISTS (SELECT FROM kenning_timers AS t WHERE t.instance_id = i.id)",
        ),
        "timers left behind by instances that no longer wait for one (instance, status)",
    )


# A message taken by the instance's current run: one an earlier run of a continue_as_new
# chain took has its receive's record deleted with that run's history (migration 0011).
_THIS_RUN = (
    "m.consumed_at > coalesce((SELECT max(r.ended_at) FROM kenning_instance_runs AS r "
    "WHERE r.instance_id = m.instance_id), '-infinity')"
)


def mailboxes_consistent(sql: Sql) -> None:
    """Messages (docs/architecture.md invariants 2 and 7): a receive waits only on an empty
    mailbox (a message for it would wait for nothing); wait rows belong to instances waiting
    for a message; a consumed message was taken by one receive step, whose record holds it."""
    _fail_if(
        _rows(
            sql,
            "SELECT w.instance_id, w.step_id, w.topic, m.seq FROM kenning_message_waits AS w "
            "JOIN kenning_instances AS i ON i.id = w.instance_id "
            "JOIN kenning_messages AS m ON m.instance_id = w.instance_id AND m.topic = w.topic "
            "AND m.consumed_step_id IS NULL WHERE i.status = 'waiting_for_message'",
        ),
        "receivers waiting while their mailbox holds a message for them (instance, step, topic, message seq)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT w.instance_id, w.step_id, i.status FROM kenning_message_waits AS w "
            "LEFT JOIN kenning_instances AS i ON i.id = w.instance_id "
            "WHERE i.status IS DISTINCT FROM 'waiting_for_message'",
        ),
        "receive waits left behind by instances that no longer wait for a message (instance, step, status)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT m.instance_id, m.seq, m.consumed_step_id, h.kind, h.payload ->> 'seq' AS recorded_seq "
            "FROM kenning_messages AS m "
            "LEFT JOIN kenning_history AS h ON h.instance_id = m.instance_id AND h.step_id = m.consumed_step_id "
            f"WHERE m.consumed_step_id IS NOT NULL AND {_THIS_RUN} "
            "AND (h.kind IS DISTINCT FROM 'MessageReceived' OR h.payload ->> 'seq' <> CAST(m.seq AS text))",
        ),
        "messages consumed without their receive's record (instance, seq, step, kind, recorded seq)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT m.instance_id, m.consumed_step_id, count(*) FROM kenning_messages AS m "
            f"WHERE m.consumed_step_id IS NOT NULL AND {_THIS_RUN} "
            "GROUP BY m.instance_id, m.consumed_step_id HAVING count(*) > 1",
        ),
        "receive steps that consumed more than one message (instance, step, messages)",
    )


def children_once_per_step(sql: Sql) -> None:
    """Each ``start_child`` step names one child, whose row names that parent and step, and
    every child is named by its parent's step (docs/architecture.md invariant 2). A fork
    keeps its original's records, so a fork's kept step names a child of the instance it
    was forked from (or of that one's original...): the child was not started again."""
    _fail_if(
        _rows(
            sql,
            "WITH RECURSIVE lineage (id, ancestor) AS ("
            "  SELECT id, id FROM kenning_instances"
            "  UNION SELECT l.id, i.forked_from FROM lineage AS l JOIN kenning_instances AS i ON i.id = l.ancestor"
            "  WHERE i.forked_from IS NOT NULL"
            ") "
            "SELECT h.instance_id, h.step_id, h.payload ->> 'child_id' FROM kenning_history AS h "
            "LEFT JOIN kenning_instances AS c ON c.id = h.payload ->> 'child_id' "
            "WHERE h.kind = 'ChildStarted' AND (c.id IS NULL OR NOT EXISTS ("
            "  SELECT FROM lineage AS l WHERE l.id = h.instance_id AND l.ancestor = c.parent_id))",
        ),
        "start_child steps whose child is missing or not theirs (parent, step, child)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT c.id, c.parent_id, c.parent_step FROM kenning_instances AS c "
            "WHERE c.parent_id IS NOT NULL AND NOT EXISTS (SELECT FROM kenning_history AS h "
            "WHERE h.instance_id = c.parent_id AND h.kind = 'ChildStarted' AND h.payload ->> 'child_id' = c.id)",
        ),
        "children no step of their parent started (child, parent, step)",
    )


def parents_woken(sql: Sql) -> None:
    """A parent waiting for a child has a way forward: the child unfinished, or its end's
    event still on its way in the inbox (docs/architecture.md invariant 7)."""
    _fail_if(
        _rows(
            sql,
            """
            SELECT s.instance_id, c.id, c.status FROM kenning_event_subscriptions AS s
            JOIN kenning_instances AS i ON i.id = s.instance_id AND i.status = 'waiting_for_event'
            JOIN kenning_instances AS c ON c.id = s.match ->> 'child_id'
            WHERE s.event_type = 'kenning.child.finished' AND c.status IN ('completed', 'failed', 'cancelled')
              AND NOT EXISTS (SELECT FROM kenning_inbox AS x WHERE x.kind = 'event' AND x.source = 'kenning.children'
                              AND x.event_id = c.id AND x.status = 'pending')
              AND s.checked_at IS NOT NULL
            """,
        ),
        "parents waiting for a child that ended, with nothing to wake them (parent, child, status)",
    )


def outbox_published_or_dead(sql: Sql, *, settled: bool = True) -> None:
    """Every outbox row is published or a dead letter once settled; one being published holds a lease."""
    _fail_if(
        _rows(sql, "SELECT id FROM kenning_outbox WHERE status = 'publishing' AND lease_token IS NULL"),
        "outbox rows publishing without a lease",
    )
    if settled:
        _fail_if(
            _rows(
                sql,
                "SELECT id, status, attempts, last_error FROM kenning_outbox "
                "WHERE status NOT IN ('published', 'failed')",
            ),
            "outbox rows neither published nor dead (id, status, attempts, last error)",
        )


def no_timer_fired_early(sql: Sql) -> None:
    _fail_if(
        _rows(
            sql,
            "SELECT instance_id, step_id, payload ->> 'due_at' AS due_at, payload ->> 'fired_at' AS fired_at "
            "FROM kenning_history WHERE kind = 'TimerExpired' "
            "AND CAST(payload ->> 'fired_at' AS timestamptz) < CAST(payload ->> 'due_at' AS timestamptz)",
        ),
        "timers fired before their due time (instance, step, due, fired)",
    )


def activity_policies(*modules: ModuleType) -> dict[str, int]:
    """``{activity name: max_attempts}`` of every ``@activity`` defined in ``modules``
    (Edda's default policy when an activity has none; unbounded ones are left out)."""
    found: dict[str, int] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, Activity):
                policy = value.retry_policy or DEFAULT_RETRY_POLICY
                if policy.max_attempts is not None:
                    found[value.name] = policy.max_attempts
    return found


def attempts_within_policy(sql: Sql, max_attempts: Mapping[str, int] | None = None) -> None:
    """No activity ran more attempts than its policy allows: the counters kept for steps
    still retrying, and the count an exhausted step's ``ActivityFailed`` states.

    ``max_attempts`` maps activity names to their policy's bound (``activity_policies``);
    without it only the shape of the counters is checked."""
    counters = _rows(
        sql,
        "SELECT i.id AS instance_id, a.key AS step_id, a.value ->> 'attempts' AS attempts "
        "FROM kenning_instances AS i, jsonb_each(i.attempts) AS a",
    )
    malformed = [row for row in counters if not str(row[2] or "").isdigit() or int(row[2]) < 1]
    _fail_if(malformed, "attempt counters that are not positive integers (instance, step, attempts)")
    if max_attempts is None:
        return
    over: list[tuple[Any, ...]] = []
    for instance_id, step_id, attempts in counters:
        name = str(step_id).rpartition(":")[0] or str(step_id)
        bound = max_attempts.get(name)
        # a counter is written only for an attempt that leaves more to make
        if bound is not None and int(attempts) >= bound:
            over.append((instance_id, step_id, int(attempts), bound))
    _fail_if(over, "attempts counted at or past the policy's bound (instance, step, attempts, max)")
    failed = _rows(
        sql,
        "SELECT instance_id, step_id, step_name, "
        "substring(payload ->> 'message' FROM 'failed after ([0-9]+) attempts') AS attempts "
        "FROM kenning_history WHERE kind = 'ActivityFailed'",
    )
    over = [
        (instance_id, step_id, int(attempts), max_attempts[name])
        for instance_id, step_id, name, attempts in failed
        if attempts is not None and name in max_attempts and int(attempts) > max_attempts[name]
    ]
    _fail_if(over, "steps that failed after more attempts than their policy allows (instance, step, attempts, max)")


def compensations_once_in_reverse(sql: Sql) -> None:
    """Every compensation record belongs to a registered compensation, each is recorded
    at most once, newest registration first; a saga that began undoing (any compensation
    record) or was cancelled has a record for every registered compensation once finished.

    The order holds for sagas no operator retried: ``kenning instances retry`` of a saga
    reruns its failed compensations after the ones that had succeeded, which is right but
    out of this order. Run it only where no test retried a saga."""
    _fail_if(
        _rows(
            sql,
            "SELECT h.instance_id, h.step_id FROM kenning_history AS h "
            "WHERE h.kind IN ('CompensationExecuted', 'CompensationFailed') AND NOT EXISTS "
            "(SELECT FROM kenning_compensations AS c "
            " WHERE c.instance_id = h.instance_id AND 'compensation:' || c.comp_id = h.step_id)",
        ),
        "compensation records of no registered compensation (instance, step)",
    )
    _fail_if(
        _rows(
            sql,
            """
            WITH ran AS (
                SELECT h.instance_id, h.seq, c.position,
                       lag(c.position) OVER (PARTITION BY h.instance_id ORDER BY h.seq) AS previous_position
                FROM kenning_history AS h
                JOIN kenning_compensations AS c
                  ON c.instance_id = h.instance_id AND h.step_id = 'compensation:' || c.comp_id
                WHERE h.kind IN ('CompensationExecuted', 'CompensationFailed')
            )
            SELECT instance_id, previous_position, position FROM ran WHERE position >= previous_position
            """,
        ),
        "compensations not run in reverse order of registration (instance, earlier position, later position)",
    )
    _fail_if(
        _rows(
            sql,
            """
            SELECT i.id, i.status, c.comp_id FROM kenning_instances AS i
            JOIN kenning_compensations AS c ON c.instance_id = i.id
            WHERE i.status IN ('failed', 'cancelled')
              AND (i.status = 'cancelled' OR EXISTS (
                    SELECT FROM kenning_history AS any_comp WHERE any_comp.instance_id = i.id
                    AND any_comp.kind IN ('CompensationExecuted', 'CompensationFailed')))
              AND NOT EXISTS (SELECT FROM kenning_history AS h WHERE h.instance_id = i.id
                              AND h.step_id = 'compensation:' || c.comp_id)
            """,
        ),
        "finished sagas with a compensation never run (instance, status, compensation)",
    )


def effects_recorded_once(sql: Sql, executions: Counter[str]) -> Counter[str]:
    """Every effect of the side channel (``step <instance> <step>`` lines) whose instance
    finished has its step recorded exactly once. Returns how often each such step ran
    outside the database (more than once: the at-least-once of outside effects)."""
    ran: Counter[str] = Counter()
    for line, count in executions.items():
        found = STEP_EFFECT.match(line)
        if found:
            ran[f"{found['instance']} {found['step']}"] += count
    if not ran:
        return ran
    keys = sorted(ran)
    recorded = _rows(
        sql,
        """
        SELECT k.key AS key, i.status AS status,
               (SELECT count(*) FROM kenning_history AS h
                WHERE h.instance_id = split_part(k.key, ' ', 1) AND h.step_id = split_part(k.key, ' ', 2)
                  AND h.kind IN ('ActivityCompleted', 'CompensationExecuted')) AS records
        FROM unnest(CAST(%s AS text[])) AS k(key)
        LEFT JOIN kenning_instances AS i ON i.id = split_part(k.key, ' ', 1)
        """,
        (keys,),
    )
    _fail_if(
        [(key, status, records) for key, status, records in recorded if status in TERMINAL and records != 1],
        "effects of finished instances whose step is not recorded exactly once (instance step, status, records)",
    )
    return ran


QUEUE_RUN = re.compile(r"^queue-run (?P<queue>\S+) (?P<instance>\S+) (?P<pid>\d+) (?P<edge>start|end) (?P<at>[0-9.]+)$")


def queue_concurrency(
    lines: Iterable[str],
    limits: Mapping[str, int],
    killed: Mapping[int, float] | None = None,
    read_at: float | None = None,
) -> dict[str, int]:
    """No queue ever ran more of its instances at once than its concurrency: from the
    side channel's ``queue-run <queue> <instance> <pid> start|end <time>`` lines (tests/
    apps/queues.py's activity writes them inside each instance's lease, so the overlap they
    show is at most what the claim let run). A run of a process in ``killed`` (pid: when it
    was killed) without its end ended then: its lease held the slot a little longer, so the
    claim was stricter than this count. ``read_at``: the lines were read while workers
    still ran (``time.time()`` then), so a run without its end was still running at that
    moment. Returns each queue's most at once."""
    edges: dict[str, list[tuple[float, int, str]]] = {}
    open_runs: dict[tuple[str, str, int], float] = {}
    for line in lines:
        match = QUEUE_RUN.match(line)
        if not match:
            continue
        queue, instance, pid, at = match["queue"], match["instance"], int(match["pid"]), float(match["at"])
        key = (queue, instance, pid)
        if match["edge"] == "start":
            open_runs[key] = at
        else:
            edges.setdefault(queue, []).append((open_runs.pop(key), 1, instance))
            edges[queue].append((at, 0, instance))  # an end sorts before a start at the same instant
    for (queue, instance, pid), started in open_runs.items():
        ended = killed[pid] if killed is not None and pid in killed else read_at
        assert ended is not None, f"queue {queue}: {instance}'s run in {pid} never ended"
        edges.setdefault(queue, []).extend([(started, 1, instance), (ended, 0, instance)])
    most: dict[str, int] = {}
    for queue, events in edges.items():
        running: Counter[str] = Counter()
        peak, worst = 0, (0.0, [""])
        for at, start, instance in sorted(events):
            running[instance] += 1 if start else -1
            now_running = sorted(i for i, n in running.items() if n > 0)
            if len(now_running) > peak:
                peak, worst = len(now_running), (at, now_running)
        most[queue] = peak
        limit = limits.get(queue)
        assert limit is None or peak <= limit, f"queue {queue}: {peak} ran at once (limit {limit}) at {worst}"
    return most


def queue_rate(sql: Sql, queue: str, count: int, seconds: float) -> int:
    """No ``seconds``-long window holds more than ``count`` starts of the queue (first
    claims, ``started_at``); returns the most any window held."""
    rows = _rows(
        sql,
        "SELECT a.id, a.started_at, count(*) AS starts FROM kenning_instances AS a "
        "JOIN kenning_instances AS b ON b.queue_name = a.queue_name "
        " AND b.started_at >= a.started_at AND b.started_at < a.started_at + make_interval(secs => %s) "
        "WHERE a.queue_name = %s AND a.started_at IS NOT NULL GROUP BY a.id, a.started_at ORDER BY starts DESC",
        (seconds, queue),
    )
    _fail_if([r for r in rows if r[2] > count], f"windows of {seconds} s from a start of {queue} with > {count} starts")
    return int(rows[0][2]) if rows else 0


def every_event_accounted(sql: Sql) -> None:
    """Every processed event is accounted for: it started a workflow (an instance keyed by
    its ``(source, id)``), was folded into a debounced burst or a batch, was delivered to
    a waiting instance (an ``EventReceived`` of its id), went to an ``on_event`` handler
    its type had declared, or is marked as having no receiver. A processed event that is
    none of these was consumed silently: what a fleet on two versions of the app did
    before workers declared their receivers."""
    _fail_if(
        _rows(
            sql,
            """
            SELECT x.id, x.event_type, x.source, x.event_id FROM kenning_inbox AS x
            WHERE x.kind = 'event' AND x.status = 'processed' AND NOT x.no_receiver
              AND NOT EXISTS (SELECT FROM kenning_instances AS i
                              WHERE i.idempotency_key = 'cloudevent:' || jsonb_build_array(x.source, x.event_id)::text)
              -- folded into a debounced burst or a batch (kenning/storage/flow.py)
              AND NOT EXISTS (SELECT FROM kenning_bursts AS b WHERE x.id = ANY(b.seqs))
              AND NOT EXISTS (SELECT FROM kenning_history AS h
                              WHERE h.kind = 'EventReceived' AND h.payload ->> 'id' = x.event_id
                                AND h.payload ->> 'source' = x.source)
              AND NOT EXISTS (SELECT FROM kenning_event_receivers AS r
                              WHERE r.event_type = x.event_type AND r.kind = 'handler')
              -- a child's end wakes its parent through the inbox; it is no outside event
              AND x.source <> 'kenning.children'
            """,
        ),
        "processed events that started nothing, reached nobody and are not marked no_receiver",
    )


def bursts_consistent(sql: Sql) -> None:
    """Flow control per key (kenning/storage/flow.py): no event is in two bursts or batches;
    a burst fed by events counts each once; a batch's instance holds exactly its events'
    data, in inbox (arrival) order, never more than its ``max_size``."""
    _fail_if(
        _rows(
            sql,
            "SELECT s.seq, count(*) FROM kenning_bursts AS b, unnest(b.seqs) AS s(seq) GROUP BY s.seq "
            "HAVING count(*) > 1",
        ),
        "events folded into more than one burst or batch (inbox id, bursts)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT instance_id, folded, cardinality(seqs) FROM kenning_bursts "
            "WHERE seqs IS NOT NULL AND folded <> cardinality(seqs)",
        ),
        "bursts whose fold count differs from their events (instance, folded, events)",
    )
    _fail_if(
        _rows(
            sql,
            """
            SELECT b.instance_id, b.folded, b.max_size FROM kenning_bursts AS b
            JOIN kenning_instances AS i ON i.id = b.instance_id
            WHERE b.kind = 'batch'
              AND (b.folded > b.max_size
                   OR i.input -> 'events' IS DISTINCT FROM (
                       SELECT jsonb_agg(x.data ORDER BY x.id) FROM kenning_inbox AS x WHERE x.id = ANY(b.seqs)))
            """,
        ),
        "batches whose input is not their events' data in arrival order, or over their size (instance)",
    )


# Side-channel lines of on_event handlers that name their transaction (tests/apps/chaos.py):
# ``handled <event type> <source> <event id> <pg_current_xact_id()>``.
HANDLED = re.compile(r"^handled (?P<type>\S+) (?P<source>\S+) (?P<id>\S+) (?P<xact>\d+)$")


def handler_runs(sql: Sql, executions: Counter[str]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """``{(event type, source, event id): (runs committed, runs rolled back)}`` from the
    side channel's ``handled`` lines: a handler runs in the transaction that marks its
    event processed, so a run cut short (a kill, a database restart, a lock conflict)
    rolls back, and only a committed one took effect."""
    runs: dict[tuple[str, str, str], list[str]] = {}
    for line, count in executions.items():
        found = HANDLED.match(line)
        if found:
            runs.setdefault((found["type"], found["source"], found["id"]), []).extend([found["xact"]] * count)
    xacts = sorted({x for listed in runs.values() for x in listed})
    status = {
        str(xact): str(state)
        for xact, state in _rows(
            sql,
            "SELECT x AS xact, pg_xact_status(CAST(x AS xid8)) AS state FROM unnest(CAST(%s AS text[])) AS x",
            (xacts,),
        )
    }
    return {
        key: (sum(status[x] == "committed" for x in listed), sum(status[x] != "committed" for x in listed))
        for key, listed in runs.items()
    }


def handlers_ran_once(sql: Sql, executions: Counter[str], event_types: Iterable[str]) -> int:
    """Every processed event of ``event_types`` (types whose ``on_event`` handler writes a
    ``handled`` line) ran its handler in exactly one transaction that committed, and no
    run committed for an event that is not processed. Returns the runs rolled back (the
    at-least-once of a handler's effects outside PostgreSQL)."""
    runs = handler_runs(sql, executions)
    processed = {
        (str(t), str(s), str(i))
        for t, s, i in _rows(
            sql,
            "SELECT event_type, source, event_id FROM kenning_inbox "
            "WHERE kind = 'event' AND status = 'processed' AND event_type = ANY(%s)",
            (sorted(set(event_types)),),
        )
    }
    _fail_if(
        sorted((*key, runs.get(key, (0, 0))[0]) for key in processed if runs.get(key, (0, 0))[0] != 1),
        "processed events whose handler did not commit exactly once (type, source, id, committed runs)",
    )
    _fail_if(
        sorted(key for key, (committed, _) in runs.items() if committed and key not in processed),
        "handler runs committed for events not processed (type, source, id)",
    )
    return sum(rolled_back for _, rolled_back in runs.values())


def event_outcomes(sql: Sql, executions: Counter[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """What became of each processed outside event, ``{(source, id): (type, outcome)}``:
    ``started`` a workflow (an instance keyed by its ``(source, id)``), ``folded`` into a
    debounced burst or a batch, ``handled`` (a
    handler run that committed, from ``handler_runs``), ``delivered`` to a waiting
    instance (an ``EventReceived`` of it), marked ``no receiver``, or ``unaccounted``."""
    committed = [key for key, (runs, _) in handler_runs(sql, executions).items() if runs]
    rows = _rows(
        sql,
        """
        WITH handled AS (
            SELECT * FROM unnest(CAST(%s AS text[]), CAST(%s AS text[])) AS h(source, event_id)
        )
        SELECT x.source, x.event_id, x.event_type,
               CASE
                   WHEN EXISTS (SELECT FROM kenning_instances AS i WHERE i.idempotency_key =
                                'cloudevent:' || jsonb_build_array(x.source, x.event_id)::text) THEN 'started'
                   WHEN EXISTS (SELECT FROM kenning_bursts AS b WHERE x.id = ANY(b.seqs)) THEN 'folded'
                   WHEN EXISTS (SELECT FROM handled AS h WHERE h.source = x.source AND h.event_id = x.event_id)
                       THEN 'handled'
                   WHEN EXISTS (SELECT FROM kenning_history AS h WHERE h.kind = 'EventReceived'
                                AND h.payload ->> 'id' = x.event_id AND h.payload ->> 'source' = x.source)
                       THEN 'delivered'
                   WHEN x.no_receiver THEN 'no receiver'
                   ELSE 'unaccounted'
               END AS outcome
        FROM kenning_inbox AS x
        WHERE x.kind = 'event' AND x.status = 'processed' AND x.source <> 'kenning.children'
        """,
        ([source for _, source, _ in committed], [event_id for _, _, event_id in committed]),
    )
    return {(str(source), str(event_id)): (str(kind), str(outcome)) for source, event_id, kind, outcome in rows}


def cron_ticks_started_once(sql: Sql, workflows: Iterable[Workflow[Any]], first: datetime, last: datetime) -> int:
    """Every tick of each scheduled workflow from ``first`` to ``last`` (a time in which a
    scheduler ran throughout, stopped or not) has exactly one instance, named and keyed by
    its tick: none lost, none started twice (issue 33). Returns how many ticks were due."""
    due = 0
    for wf in workflows:
        assert wf.cron is not None, f"{wf.name} has no schedule"
        ticks = ticks_between(wf.cron, first, last, limit=100_000)
        due += len(ticks)
        rows = _rows(
            sql,
            "SELECT idempotency_key, count(*), min(id) FROM kenning_instances WHERE workflow_name = %s GROUP BY 1",
            (wf.name,),
        )
        started = {str(key): (int(count), str(instance_id)) for key, count, instance_id in rows}
        _fail_if(
            [(wf.name, tick_key(t)) for t in ticks if tick_key(t) not in started],
            "cron ticks due while a scheduler ran and never started (workflow, tick)",
        )
        _fail_if(
            [
                (wf.name, tick_key(t), started[tick_key(t)])
                for t in ticks
                if started.get(tick_key(t), (1, tick_instance_id(wf.name, t))) != (1, tick_instance_id(wf.name, t))
            ],
            "cron ticks started more than once or under another id (workflow, tick, (count, id))",
        )
    return due


def streams_consistent(sql: Sql) -> None:
    """Durable streams (docs/streams.md): a stream's entries are offsets 0 to length - 1,
    each once, none without its header; an ended instance's streams are closed (a crash
    loop's parking aside: a reader judges those by the status); a stream closed by its
    instance's end belongs to an ended instance; and an instance in its first run holds one
    workflow-code entry per ``StreamWritten`` record (recorded once, never written again)."""
    _fail_if(
        _rows(
            sql,
            'SELECT s.instance_id, s.key, s.length, count(e."offset"), max(e."offset") FROM kenning_streams AS s '
            "LEFT JOIN kenning_stream_entries AS e ON e.instance_id = s.instance_id AND e.key = s.key "
            "GROUP BY s.instance_id, s.key, s.length "
            'HAVING count(e."offset") <> s.length OR coalesce(max(e."offset"), -1) <> s.length - 1',
        ),
        "streams whose entries are not offsets 0 to length - 1 (instance, key, length, entries, last offset)",
    )
    _fail_if(
        _rows(
            sql,
            'SELECT e.instance_id, e.key, e."offset" FROM kenning_stream_entries AS e '
            "LEFT JOIN kenning_streams AS s ON s.instance_id = e.instance_id AND s.key = e.key WHERE s.key IS NULL",
        ),
        "stream entries without their stream (instance, key, offset)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT s.instance_id, s.key, i.status FROM kenning_streams AS s "
            "JOIN kenning_instances AS i ON i.id = s.instance_id "
            "WHERE (i.status IN ('completed', 'failed', 'cancelled') AND s.closed_at IS NULL "
            "       AND coalesce(i.error ->> 'reason', '') <> 'crash_loop') "
            "   OR (s.ended AND i.status NOT IN ('completed', 'failed', 'cancelled'))",
        ),
        "streams open after their instance ended, or closed by the end of a live instance (instance, key, status)",
    )
    _fail_if(
        _rows(
            sql,
            "SELECT c.id, c.entries, c.records FROM ("
            "  SELECT i.id,"
            "    (SELECT count(*) FROM kenning_stream_entries AS e WHERE e.instance_id = i.id AND e.attempt = 0)"
            "      AS entries,"
            "    (SELECT count(*) FROM kenning_history AS h WHERE h.instance_id = i.id AND h.kind = 'StreamWritten')"
            "      AS records"
            "  FROM kenning_instances AS i"
            "  WHERE i.run = 1 AND EXISTS (SELECT FROM kenning_streams AS s WHERE s.instance_id = i.id)"
            ") AS c WHERE c.entries <> c.records",
        ),
        "workflow-code entries not one per StreamWritten record (instance, entries, records)",
    )


def check_invariants(
    sql: Sql,
    *,
    settled: bool = True,
    max_attempts: Mapping[str, int] | None = None,
    executions: Counter[str] | None = None,
    handled_types: Iterable[str] = (),
) -> None:
    """Every invariant; ``settled``: the run is over (see the module's docstring).
    ``handled_types``: event types whose ``on_event`` handlers write ``handled`` lines
    to the side channel (``executions``), each checked to have committed once per event."""
    no_step_recorded_twice(sql)
    events_stored_once(sql, settled=settled)
    leases_consistent(sql)
    every_instance_has_a_way_forward(sql)
    children_once_per_step(sql)
    parents_woken(sql)
    mailboxes_consistent(sql)
    streams_consistent(sql)
    outbox_published_or_dead(sql, settled=settled)
    no_timer_fired_early(sql)
    attempts_within_policy(sql, max_attempts)
    compensations_once_in_reverse(sql)
    every_event_accounted(sql)
    bursts_consistent(sql)
    if executions is not None:
        effects_recorded_once(sql, executions)
        handled_types = list(handled_types)
        if handled_types:
            handlers_ran_once(sql, executions, handled_types)


def key_rate(sql: Sql, queue: str, count: int, seconds: float) -> dict[str, int]:
    """No ``seconds``-long window holds more than ``count`` starts of one partition key of
    the queue (first claims, ``started_at``); returns each key's most in a window."""
    rows = _rows(
        sql,
        "SELECT a.partition_key, a.id, count(*) AS starts FROM kenning_instances AS a "
        "JOIN kenning_instances AS b ON b.queue_name = a.queue_name AND b.partition_key = a.partition_key "
        " AND b.started_at >= a.started_at AND b.started_at < a.started_at + make_interval(secs => %s) "
        "WHERE a.queue_name = %s AND a.started_at IS NOT NULL GROUP BY a.partition_key, a.id",
        (seconds, queue),
    )
    _fail_if([r for r in rows if r[2] > count], f"windows of {seconds} s of one key of {queue} with > {count} starts")
    most: dict[str, int] = {}
    for key, _id, starts in rows:
        most[str(key)] = max(most.get(str(key), 0), int(str(starts)))
    return most
