"""The inbox and delivery SQL against real PostgreSQL: claims and fencing, retention,
and the race between an event's delivery and its wait's timeout."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg.errors import LockNotAvailable

from kenning.core.records import SuspendOutcome
from kenning.db import Database, Executor, statement
from kenning.storage import claims as claims_sql
from kenning.storage import inbox as inbox_sql
from kenning.storage import instances as instances_sql
from kenning.storage import subscriptions as subscriptions_sql
from kenning.storage import timers as timers_sql
from kenning.storage.inbox import NewEvent

Sql = psycopg.Connection[tuple[object, ...]]
ATTRIBUTES = {"specversion": "1.0"}


async def _waiting_instance(database: Database, instance_id: str, *, timeout: float | None = None) -> None:
    """An instance suspended in wait_event("order.paid", match={"order": instance_id})."""
    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn, instance_id=instance_id, workflow_name="wf", source_hash="", input_json={}, idempotency_key=None
        )
        (claim,) = (
            await claims_sql.instance_claim(conn, owner="w", workflow_names=["wf"], limit=1, lease_seconds=30)
        ).instances
        outcome = await subscriptions_sql.subscription_register_and_suspend(
            conn,
            instance_id=instance_id,
            token=claim.lease_token,
            step_id="wait:1",
            step_name="wait_event:order.paid",
            event_type="order.paid",
            match={"order": instance_id},
            since_at=None,
            since_seconds=None,
            timeout_seconds=timeout,
        )
    assert outcome is SuspendOutcome.SUSPENDED


async def _deliver(database: Database, instance_id: str, event_id: str) -> list[subscriptions_sql.Delivery]:
    async with database.transaction() as conn:
        return await _deliver_in(conn, instance_id, event_id)


async def _deliver_in(conn: Executor, instance_id: str, event_id: str) -> list[subscriptions_sql.Delivery]:
    clock = (await conn.execute(statement("SELECT now() AS now"))).one().now
    return await subscriptions_sql.subscription_deliver_event(
        conn,
        event_type="order.paid",
        source="s",
        event_id=event_id,
        received_at=clock + timedelta(seconds=1),
        data={"order": instance_id, "amount": 3},
        target_instance_id=None,
        payload={"type": "order.paid", "source": "s", "id": event_id, "data": {"order": instance_id}},
        payload_bytes=None,
    )


def _history(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()


async def test_a_delivery_in_flight_makes_the_timeout_skip_and_then_find_nothing(database: Database, sql: Sql) -> None:
    await _waiting_instance(database, "i1", timeout=0)
    async with database.transaction() as conn:
        assert [d.instance_id for d in await _deliver_in(conn, "i1", "e1")] == ["i1"]
        async with database.transaction() as other:  # the scheduler, while the delivery is uncommitted
            assert await timers_sql.subscription_timeout_fire_due(other, limit=10) == []
    async with database.transaction() as other:
        assert await timers_sql.subscription_timeout_fire_due(other, limit=10) == []
    assert _history(sql, "i1") == [("wait:1", "EventReceived")]
    assert sql.execute("SELECT status FROM kenning_instances WHERE id = 'i1'").fetchone() == ("pending",)


async def test_a_timeout_in_flight_makes_the_delivery_retry_and_then_find_nothing(database: Database, sql: Sql) -> None:
    await _waiting_instance(database, "i2", timeout=0)
    async with database.transaction() as scheduler:
        fired = await timers_sql.subscription_timeout_fire_due(scheduler, limit=10)
        assert [f.instance_id for f in fired] == ["i2"]
        with pytest.raises(LockNotAvailable):  # NOWAIT (55P03): never waits, never deadlocks
            await _deliver(database, "i2", "e2")
    assert await _deliver(database, "i2", "e2") == []  # retried after the timeout committed
    assert _history(sql, "i2") == [("wait:1", "EventTimeout")]


async def test_an_event_is_delivered_once_per_instance_and_only_on_a_match(database: Database, sql: Sql) -> None:
    await _waiting_instance(database, "i3")
    await _waiting_instance(database, "i4")
    assert [d.instance_id for d in await _deliver(database, "i3", "e3")] == ["i3"]
    assert await _deliver(database, "i3", "e3") == []  # i3 no longer waits; i4 does not match
    assert _history(sql, "i4") == []
    assert sql.execute("SELECT count(*) FROM kenning_event_subscriptions").fetchone() == (1,)


async def test_claims_count_attempts_and_fence_later_writes(database: Database, sql: Sql) -> None:
    async with database.transaction() as conn:
        stored = await inbox_sql.inbox_insert_events(
            conn,
            [
                NewEvent("s", "a", "t", ATTRIBUTES, {"n": 1}),
                NewEvent("s", "a", "t", ATTRIBUTES, {"n": 2}),  # a duplicate within the batch
                NewEvent("s", "b", "t", ATTRIBUTES, data_bytes=b"\x00"),
            ],
        )
        assert stored == [True, False, True]
        assert await inbox_sql.inbox_insert_events(conn, [NewEvent("s", "b", "t", ATTRIBUTES)]) == [False]
    async with database.transaction() as conn:
        first = await inbox_sql.inbox_claim_pending(conn, limit=10, lease_seconds=30)
    assert [(c.event.event_id, c.attempts, c.event.data, c.event.data_bytes) for c in first] == [
        ("a", 1, {"n": 1}, None),
        ("b", 1, None, b"\x00"),
    ]
    async with database.transaction() as conn:
        assert await inbox_sql.inbox_claim_pending(conn, limit=10, lease_seconds=30) == []  # leased
        later = (await conn.execute(statement("SELECT now() + interval '31 seconds' AS later"))).one().later
        second = await inbox_sql.inbox_claim_pending(conn, limit=1, lease_seconds=30, now=later)
    assert [(c.event.event_id, c.attempts) for c in second] == [("a", 2)]  # the lease ran out
    async with database.transaction() as conn:
        stale = (first[0].event.inbox_id, first[0].claim_token)
        assert await inbox_sql.inbox_mark_processed(conn, [stale]) == set()
        assert await inbox_sql.inbox_release(conn, [stale]) == 0
        assert await inbox_sql.inbox_release(conn, [(second[0].event.inbox_id, second[0].claim_token)]) == 1
    assert sql.execute("SELECT attempts, status FROM kenning_inbox WHERE event_id = 'a'").fetchone() == (1, "pending")


async def test_retention_deletes_old_processed_rows_in_batches(database: Database, sql: Sql) -> None:
    async with database.transaction() as conn:
        await inbox_sql.inbox_insert_events(conn, [NewEvent("s", f"e{n}", "t", ATTRIBUTES) for n in range(5)])
    sql.execute("UPDATE kenning_inbox SET status = 'processed', processed_at = now() WHERE event_id <> 'e4'")
    sql.execute("UPDATE kenning_inbox SET status = 'failed', processed_at = now() WHERE event_id = 'e3'")
    async with database.transaction() as conn:
        assert await inbox_sql.inbox_delete_processed(conn, retention_seconds=3600, limit=10) == 0
        later = (await conn.execute(statement("SELECT now() + interval '2 hours' AS later"))).one().later
        assert await inbox_sql.inbox_delete_processed(conn, retention_seconds=3600, limit=2, now=later) == 2
        assert await inbox_sql.inbox_delete_processed(conn, retention_seconds=3600, limit=2, now=later) == 1
        assert await inbox_sql.inbox_delete_processed(conn, retention_seconds=3600, limit=2, now=later) == 0
    rows = sql.execute("SELECT event_id, status FROM kenning_inbox ORDER BY event_id").fetchall()
    assert rows == [("e3", "failed"), ("e4", "pending")]
