"""The outbox SQL against real PostgreSQL: claim order, leases, fencing, retries, retention."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import psycopg
import pytest

from kenning.db import Database, statement
from kenning.storage import outbox as outbox_sql
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.publish import RetrySchedule
from tests.relayer_support import insert_events, outbox_row


async def _now(database: Database) -> datetime:
    async with database.connection() as conn:
        value = (await conn.execute(statement("SELECT now() AS now"))).one().now
    assert isinstance(value, datetime)
    return value


async def _claim(
    database: Database,
    token: str,
    *,
    owner: str = "r1",
    limit: int = 10,
    lease: float = 30,
    now: datetime | None = None,
) -> list[OutboxRow]:
    async with database.transaction() as conn:
        return await outbox_sql.outbox_claim_pending(
            conn, owner=owner, token=token, limit=limit, lease_seconds=lease, now=now
        )


async def _record(database: Database, token: str, *outcomes: OutboxOutcome, now: datetime | None = None) -> set[str]:
    async with database.transaction() as conn:
        return await outbox_sql.outbox_record_outcomes(conn, token, outcomes, now=now)


T1 = "00000000-0000-4000-8000-000000000001"
T2 = "00000000-0000-4000-8000-000000000002"
T3 = "00000000-0000-4000-8000-000000000003"


async def test_claim_takes_the_oldest_undelivered_event_of_each_instance(database: Database) -> None:
    a = await insert_events(database, 3, instance_id="A")
    b = await insert_events(database, 1, instance_id="B")
    loose = await insert_events(database, 2)  # no instance: no order to keep
    first = await _claim(database, T1)
    assert [r.id for r in first] == [a[0], b[0], *loose]
    assert {(r.status, r.attempts, r.lease_owner) for r in first} == {("publishing", 1, "r1")}
    # a[1] waits for a[0], which is leased
    assert await _claim(database, T2) == []
    assert await _record(database, T1, OutboxOutcome(a[0], "published")) == {a[0]}
    assert [r.id for r in await _claim(database, T2)] == [a[1]]
    # a dead letter does not hold its instance's later events back
    assert await _record(database, T2, OutboxOutcome(a[1], "failed", "rejected: HTTP 400")) == {a[1]}
    assert [r.id for r in await _claim(database, T3)] == [a[2]]


async def test_concurrent_claims_skip_locked_rows_and_respect_instance_order(
    database: Database, database_url: str
) -> None:
    a = await insert_events(database, 2, instance_id="A")
    loose = await insert_events(database, 1)
    async with database.transaction() as holder:
        held = await outbox_sql.outbox_claim_pending(holder, owner="r1", token=T1, limit=10, lease_seconds=30)
        assert {r.id for r in held} == {a[0], loose[0]}
        # Uncommitted: a second relayer skips the locked rows, and a[1] still waits for a[0].
        assert await _claim(database, T2, owner="r2") == []
    assert await _claim(database, T2, owner="r2") == []


async def test_an_expired_lease_is_reclaimed_and_the_stale_holder_is_fenced(database: Database) -> None:
    (event_id,) = await insert_events(database, 1)
    await _claim(database, T1, lease=30)
    assert await _claim(database, T2, owner="r2") == []  # the lease holds
    later = await _now(database) + timedelta(seconds=31)
    (second,) = await _claim(database, T2, owner="r2", now=later)
    assert (second.id, second.attempts, second.lease_owner) == (event_id, 2, "r2")
    # the relayer that lost the lease records nothing
    assert await _record(database, T1, OutboxOutcome(event_id, "published")) == set()
    assert await _record(database, T2, OutboxOutcome(event_id, "published")) == {event_id}


async def test_the_heartbeat_extends_the_lease_and_release_hands_rows_back_uncounted(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    ids = await insert_events(database, 2)
    await _claim(database, T1, lease=30)
    async with database.transaction() as conn:
        assert await outbox_sql.outbox_extend_lease(conn, T1, ids, 120) == 2
        assert await outbox_sql.outbox_extend_lease(conn, T2, ids, 120) == 0
    later = await _now(database) + timedelta(seconds=60)
    assert await _claim(database, T2, now=later) == []  # 60 s later the extended lease still holds
    async with database.transaction() as conn:
        assert await outbox_sql.outbox_release(conn, T2, ids) == 0  # not the holder
        assert await outbox_sql.outbox_release(conn, T1, ids[:1]) == 1
    released = outbox_row(sql, ids[0])
    assert (released["status"], released["attempts"], released["lease_token"]) == ("pending", 0, None)
    assert [r.id for r in await _claim(database, T3)] == ids[:1]


async def test_a_retry_is_scheduled_in_the_row_and_not_claimed_before_it_is_due(database: Database) -> None:
    (event_id,) = await insert_events(database, 1)
    await _claim(database, T1)
    now = await _now(database)
    assert await _record(database, T1, OutboxOutcome(event_id, "pending", "HTTP 503", 60.0), now=now) == {event_id}
    async with database.connection() as conn:
        until = await outbox_sql.outbox_seconds_until_next(conn, now=now)
        (row,) = await outbox_sql.outbox_list(conn, status="pending")
    assert until == pytest.approx(60.0, abs=0.01)
    assert (row.available_at - now).total_seconds() == pytest.approx(60.0, abs=0.01)
    assert (row.last_error, row.attempts) == ("HTTP 503", 1)
    assert await _claim(database, T2, now=now + timedelta(seconds=59)) == []
    (again,) = await _claim(database, T2, now=now + timedelta(seconds=61))
    assert (again.id, again.attempts) == (event_id, 2)


async def test_published_events_past_retention_are_deleted_in_batches(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    old = await insert_events(database, 25)
    recent = await insert_events(database, 3)
    failed = await insert_events(database, 2)
    now = await _now(database)
    assert len(await _claim(database, T1, limit=100)) == 30
    await _record(database, T1, *(OutboxOutcome(i, "published") for i in old), now=now - timedelta(hours=2, seconds=1))
    await _record(database, T1, *(OutboxOutcome(i, "published") for i in recent), now=now - timedelta(minutes=30))
    await _record(database, T1, *(OutboxOutcome(i, "failed", "HTTP 400") for i in failed), now=now - timedelta(hours=5))
    deleted = []
    for _ in range(4):
        async with database.transaction() as conn:
            deleted.append(await outbox_sql.outbox_delete_published(conn, retention_seconds=7200, limit=10, now=now))
    assert deleted == [10, 10, 5, 0]
    left = {str(r[0]) for r in sql.execute("SELECT id FROM kenning_outbox").fetchall()}
    assert left == set(recent) | set(failed)  # recent ones and dead letters stay


async def test_failed_events_are_retried_by_id_or_all_at_once(database: Database) -> None:
    ids = await insert_events(database, 3)
    await _claim(database, T1)
    await _record(database, T1, *(OutboxOutcome(i, "failed", "gave up") for i in ids[:2]))
    async with database.transaction() as conn:
        assert await outbox_sql.outbox_retry_failed(conn, [ids[0], ids[2]]) == [ids[0]]  # ids[2] is not failed
        assert await outbox_sql.outbox_statuses(conn, ids) == {
            ids[0]: "pending",
            ids[1]: "failed",
            ids[2]: "publishing",
        }
        assert await outbox_sql.outbox_retry_failed(conn, None) == [ids[1]]
        (row,) = await outbox_sql.outbox_list(conn, status="pending", limit=1)
    assert row.attempts == 0 and row.last_error == "gave up"


async def test_claim_uses_the_due_index_with_many_published_events(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    sql.execute(
        "INSERT INTO kenning_outbox (id, instance_id, event_type, source, status, published_at) "
        "SELECT gen_random_uuid(), 'i' || (g % 1000), 't', '/s', 'published', now() "
        "FROM generate_series(1, 50000) g"
    )
    await insert_events(database, 5, instance_id="i1")
    sql.execute("ANALYZE kenning_outbox")
    plan = "\n".join(
        str(r[0])
        for r in sql.execute(
            "EXPLAIN SELECT o.id FROM kenning_outbox AS o WHERE o.status IN ('pending', 'publishing') "
            "AND o.available_at <= now() AND (o.instance_id IS NULL OR NOT EXISTS (SELECT 1 FROM kenning_outbox "
            "AS earlier WHERE earlier.instance_id = o.instance_id AND earlier.created_seq < o.created_seq "
            "AND earlier.status IN ('pending', 'publishing'))) ORDER BY o.available_at, o.created_seq LIMIT 50 "
            "FOR UPDATE SKIP LOCKED"
        ).fetchall()
    )
    # every scan, the per-instance order check included, goes through a partial index over
    # undelivered rows only; which of the two the planner picks for the check varies
    scans = re.findall(r"(Seq Scan|Index Scan using \w+|Index Only Scan using \w+|Bitmap Index Scan on \w+)", plan)
    assert "Index Scan using kenning_outbox_due" in scans, plan
    assert all(s.endswith(("kenning_outbox_due", "kenning_outbox_instance_order")) for s in scans), plan


def test_retry_schedule_backs_off_exponentially_with_bounded_jitter() -> None:
    schedule = RetrySchedule(max_attempts=10, initial_seconds=1.0, max_seconds=20.0)
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0)):
        delays = {schedule.delay(attempt) for _ in range(50)}
        assert all(base <= d <= base + 1.0 for d in delays), (attempt, delays)
        assert len(delays) > 1  # jitter: not every relayer retries at the same instant
    assert schedule.delay(10) == 20.0  # capped
    assert 30.0 > schedule.delay(1, retry_after=15.0) >= 15.0  # Retry-After is a floor ...
    assert schedule.delay(1, retry_after=600.0) == 20.0  # ... within the cap
