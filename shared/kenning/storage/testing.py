"""SQL for ``kenning.testing``'s PostgreSQL mode: whether everything waits, when the next
wait is due, and time skipped by moving every stored time earlier.

Skipping moves the data, not the clock: the worker, the scheduler and the inbox keep
comparing with ``now()``, so they fire what became due exactly as they would have after
waiting. Every time a wait is measured from moves by the same amount (due times, workflow
timeouts' deadlines, a subscription's registration and ``since``, received events,
back-offs, the first failure ``max_duration`` counts from), so what was ordered before a skip stays ordered after it.
Never used by a deployed process.
"""

from __future__ import annotations

import re

from kenning.core.names import CHANNEL_INBOX, CHANNEL_INSTANCES, CHANNEL_TIMERS
from kenning.db import Executor, statement
from kenning.storage.clock import seconds_or_none
from kenning.storage.names import notify

# Work the worker, the inbox loop or the scheduler still has to do now (not later).
_TESTING_BUSY = statement(
    """
    SELECT
        EXISTS (SELECT 1 FROM kenning_instances
                WHERE status IN ('pending', 'running', 'compensating')
                  AND (lease_token IS NOT NULL OR coalesce(available_at, now()) <= now())) AS runnable,
        EXISTS (SELECT 1 FROM kenning_inbox
                WHERE status = 'pending' AND (claim_token IS NOT NULL OR available_at <= now())) AS inbox,
        EXISTS (SELECT 1 FROM kenning_event_subscriptions WHERE checked_at IS NULL) AS unchecked,
        EXISTS (SELECT 1 FROM kenning_timers WHERE due_at <= now())
            OR EXISTS (SELECT 1 FROM kenning_event_subscriptions WHERE timeout_at <= now())
            OR EXISTS (SELECT 1 FROM kenning_message_waits WHERE timeout_at <= now())
            OR EXISTS (SELECT 1 FROM kenning_instances
                       WHERE deadline_at <= now() AND NOT cancel_requested
                         AND status NOT IN ('completed', 'failed', 'cancelled', 'compensating')) AS due
    """
)


async def testing_busy(conn: Executor) -> list[str]:
    """What is left to do now (runnable instances, inbox rows, unchecked subscriptions,
    due waits), in one snapshot; empty when every instance waits or has ended."""
    row = (await conn.execute(_TESTING_BUSY)).one()
    return [name for name in ("runnable", "inbox", "unchecked", "due") if getattr(row, name)]


_TESTING_NEXT_DUE = statement(
    """
    SELECT extract(epoch FROM least(
        (SELECT min(due_at) FROM kenning_timers),
        (SELECT min(timeout_at) FROM kenning_event_subscriptions),
        (SELECT min(timeout_at) FROM kenning_message_waits),
        (SELECT min(available_at) FROM kenning_instances
         WHERE status IN ('pending', 'compensating') AND lease_token IS NULL),
        (SELECT min(available_at) FROM kenning_inbox WHERE status = 'pending' AND claim_token IS NULL),
        (SELECT min(deadline_at) FROM kenning_instances
         WHERE status NOT IN ('completed', 'failed', 'cancelled', 'compensating') AND NOT cancel_requested)
    ) - now()) AS seconds
    """
)


async def testing_next_due(conn: Executor) -> float | None:
    """Seconds until the next timer, timeout, back-off or inbox retry is due (None: none)."""
    return seconds_or_none((await conn.execute(_TESTING_NEXT_DUE)).one().seconds)


_TESTING_SKIP = statement(
    f"""
    WITH shift AS (SELECT make_interval(secs => CAST(:seconds AS float8)) AS by), timers AS (
        UPDATE kenning_timers SET due_at = due_at - shift.by, created_at = created_at - shift.by
        FROM shift RETURNING 1
    ), subscriptions AS (
        UPDATE kenning_event_subscriptions
        SET timeout_at = timeout_at - shift.by, since = since - shift.by,
            created_at = created_at - shift.by, checked_at = checked_at - shift.by
        FROM shift RETURNING 1
    ), receives AS (
        UPDATE kenning_message_waits SET timeout_at = timeout_at - shift.by, created_at = created_at - shift.by
        FROM shift RETURNING 1
    ), instances AS (
        UPDATE kenning_instances AS i
        SET available_at = CASE WHEN i.status IN ('pending', 'compensating') AND i.lease_token IS NULL
                                THEN i.available_at - shift.by ELSE i.available_at END,
            deadline_at = i.deadline_at - shift.by,  -- a workflow timeout's (NULL stays NULL)
            -- max_duration counts from an attempt's first failure
            attempts = CASE WHEN i.attempts = CAST('{{}}' AS jsonb) THEN i.attempts ELSE (
                SELECT jsonb_object_agg(a.step, CASE WHEN a.counted ? 'first_failed_at'
                    THEN jsonb_set(a.counted, '{{first_failed_at}}',
                                   to_jsonb(CAST(a.counted ->> 'first_failed_at' AS timestamptz) - shift.by))
                    ELSE a.counted END)
                FROM jsonb_each(i.attempts) AS a(step, counted)) END
        FROM shift
        WHERE i.status NOT IN ('completed', 'failed', 'cancelled')
        RETURNING 1
    ), inbox AS (
        UPDATE kenning_inbox
        SET received_at = received_at - shift.by, processed_at = processed_at - shift.by,
            available_at = CASE WHEN status = 'pending' AND claim_token IS NULL
                                THEN available_at - shift.by ELSE available_at END
        FROM shift RETURNING 1
    )
    SELECT (SELECT count(*) FROM timers) + (SELECT count(*) FROM subscriptions) + (SELECT count(*) FROM receives)
               + (SELECT count(*) FROM instances) + (SELECT count(*) FROM inbox) AS moved,
           {notify(CHANNEL_TIMERS)} AND {notify(CHANNEL_INSTANCES)} AND {notify(CHANNEL_INBOX)} AS notified
    """
)


async def testing_skip(conn: Executor, seconds: float) -> int:
    """Move every stored time a wait is measured from ``seconds`` earlier, then wake the
    scheduler, the workers and the inbox loop; returns the rows moved. Only while
    nothing runs (``testing_busy`` empty): a running instance's times are its worker's."""
    return int((await conn.execute(_TESTING_SKIP, {"seconds": seconds})).one().moved)


# ------------------------------------------------------------------ a database per test
#
# The pytest plugin's PostgreSQL mode gives each test a database of its own; a name is
# an identifier, never a parameter, so only Kenning's own names (checked) are spliced in.
_DATABASE_NAME = re.compile(r"kenning_env_[0-9a-f]{1,40}")


def _database(name: str) -> str:
    if not _DATABASE_NAME.fullmatch(name):
        raise ValueError(f"not a name of the test harness's databases: {name!r}")
    return f'"{name}"'


async def testing_create_database(conn: Executor, name: str) -> None:
    """``CREATE DATABASE`` (outside a transaction: ``conn`` autocommits)."""
    await conn.execute(statement(f"CREATE DATABASE {_database(name)}"))


async def testing_drop_database(conn: Executor, name: str) -> None:
    """``DROP DATABASE ... WITH (FORCE)``: its connections are ended."""
    await conn.execute(statement(f"DROP DATABASE IF EXISTS {_database(name)} WITH (FORCE)"))
