"""Statements fixed after the review of issue 14's restructuring, against real PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from kenning.db import Database
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from tests.support import backend_pid, backend_pids_held_together


async def _claimed(database: Database, instance_id: str) -> str:
    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn,
            instance_id=instance_id,
            workflow_name=instance_id,
            source_hash="h",
            input_json={},
            idempotency_key=None,
        )
        (claimed,) = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=[instance_id], limit=1, lease_seconds=30)
        ).instances
    return str(claimed.lease_token)


def _due_in(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> float:
    row = sql.execute(
        "SELECT extract(epoch FROM available_at - now()) FROM kenning_instances WHERE id = %s", (instance_id,)
    ).fetchone()
    assert row is not None
    return float(row[0])  # type: ignore[arg-type]


async def test_a_cancelled_sagas_compensation_back_off_is_kept(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A compensation's durable retry back-off holds for a cancelled saga too (it was
    due at once: a failing compensation retried in a tight loop, for ever under an
    infinite retry policy); a running instance's back-off still gives way to a cancel."""
    for instance_id in ("compensating", "running"):
        token = await _claimed(database, instance_id)
        async with database.connection() as conn:
            assert await instances_sql.instance_request_cancel(conn, instance_id) is not None
            if instance_id == "compensating":
                assert await instances_sql.instance_begin_compensating(conn, instance_id, token, None, [])
            assert await instances_sql.instance_release(conn, instance_id, token, 60.0)
    assert _due_in(sql, "compensating") > 50
    assert _due_in(sql, "running") <= 0


async def test_a_broken_connection_closes_the_idle_ones_without_probing_them(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Probing the idle connections in the caller's exit would block it for a TCP timeout
    per connection on a half-open network (and swallow its cancellation): they are closed
    instead, and opened again on demand."""
    db = Database(url=database.url, autocommit_pool_size=3)
    try:
        old = await backend_pids_held_together(db, 3)
        assert len(old) == 3
        never = asyncio.Event()

        async def half_open(conn: object) -> None:  # a probe no answer ever comes back to
            await never.wait()

        db.pool.check_connection = half_open  # type: ignore[method-assign]
        sql.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(old),))
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(backend_pid(db), timeout=10)  # the first statement meets a dead connection
        assert await asyncio.wait_for(backend_pid(db), timeout=10) not in old
    finally:
        await db.close_pool()
